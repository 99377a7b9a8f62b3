#!/usr/bin/env bats
# scripts/demo, run once on a scratch folder with a PostgreSQL of its own
# (a free port), in a terminal of 100 columns: every step prints what it
# says it shows.  So a change of a program's output cannot silently empty
# the demo again (issue 38: its central step printed nothing).  The numbers
# are checked against each other and against what the demo published, not
# against fixed values.

load test_helper

setup_file() {
  [ -z "${_test_pg_url:-}${_require_pg:-}" ] && return 0
  on_mongo && return 0
  DEMO_DIR=$(mktemp -d /tmp/rb-demo.XXXXXX)
  chmod 755 "$DEMO_DIR"
  export DEMO_DIR
  # (no escape codes to strip: the steps' bold is taken out below)
  (cd "$RB_SRCDIR" && COLUMNS=100 RELAYBUS_DEMO_DIR=$DEMO_DIR scripts/demo 3>&-) \
    >"$DEMO_DIR/out.raw" 2>&1 && echo 0 >"$DEMO_DIR/rc" || echo $? >"$DEMO_DIR/rc"
  sed 's/\x1b\[[0-9;]*m//g' "$DEMO_DIR/out.raw" >"$DEMO_DIR/out"
}

teardown_file() {
  [ -n "${DEMO_DIR:-}" ] || return 0
  RELAYBUS_DEMO_DIR=$DEMO_DIR "$RB_SRCDIR/scripts/demo" stop >/dev/null 2>&1 3>&- || true
  rm -rf "$DEMO_DIR"
}

setup() {
  pg_only "scripts/demo runs on PostgreSQL"
  need_pg
  OUT=$DEMO_DIR/out
}

# the lines of step TITLE (from its "== TITLE" line to the next step)
step_of() { awk -v t="$1" 'index($0, "== ") == 1 { on = index($0, t) > 0; next } on' "$OUT"; }
# the count of OUTCOME the pipeline loop of HANDLER printed
counted() {  # handler outcome
  step_of "work: rb-claim" | awk -v h="$1" -v o="$2" '
    index($0, "$ while rb-claim") == 1 { on = index($0, "-H " h " ") > 0; next }
    on && $2 == o { print $1 }'
}

@test "demo: runs to its end, exit 0" {
  cat "$OUT"
  [ "$(cat "$DEMO_DIR/rc")" = 0 ]
  grep -q '^== done' "$OUT"
}

@test "demo: the pipeline loop prints its outcome counts: every delivery completed, and the retries it set up" {
  local pub h c r
  # what it published from the shell (and one event in SQL, for the mailer)
  pub=$(step_of "publish inside" | sed -n 's/^rb-publish: \([0-9]*\) events, .*/\1/p' | head -1)
  [ "${pub:-0}" -gt 0 ]
  for h in mailer ledger; do
    c=$(counted $h completed)
    r=$(counted $h rescheduled)
    echo "$h: $c completed, $r rescheduled ($pub published)"
    [ "${r:-0}" -gt 0 ]
    if [ $h = mailer ]; then [ "$c" = $((pub + 1)) ]; else [ "$c" = "$pub" ]; fi
  done
  step_of "work: rb-claim" | grep -qx 'deliveries left: 0 (a completed delivery is deleted; its event stays until rb-admin purge)'
}

@test "demo: the dead letter: three failed attempts, then buried, in the table" {
  [ "$(step_of "dead letters" | grep -c '"event_id":"bad","outcome":"rescheduled"')" = 2 ]
  step_of "dead letters" | grep -q '"event_id":"bad","outcome":"buried","attempts":3'
  step_of "dead letters" | grep -Eq '^ bad +\| mailer +\| dead +\| +3 \| cannot render template$'
}

@test "demo: zero non-HOT updates of a delivery row on the happy path, the rest accounted for by the retries and the dead letter" {
  local line n r d retries
  line=$(step_of "happy path wrote" | grep '^non-HOT updates of delivery rows: ')
  echo "$line"
  [[ "$line" =~ ^non-HOT\ updates\ of\ delivery\ rows:\ ([0-9]+)\ =\ ([0-9]+)\ retries\ \+\ ([0-9]+)\ failed\ attempts\ of\ the\ dead\ letter\ \+\ 0\ on\ the\ happy\ path$ ]]
  n=${BASH_REMATCH[1]} r=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]}
  [ "$n" = $((r + d)) ]
  [ "$d" = 3 ]
  # the retries are those the pipeline loop counted
  retries=$(step_of "work: rb-claim" | awk '$2 == "rescheduled" { n += $1 } END { print n + 0 }')
  [ "$r" = "$retries" ]
  [ "$r" -gt 0 ]
}

@test "demo: the worker daemon step drains as many events as it says, and each dispatcher prints its summary line" {
  local title m pub h
  title=$(grep '^== the worker daemon' "$OUT")
  m=$(echo "$title" | sed -n 's/.* drains \([0-9]*\) more events$/\1/p')
  [ "${m:-0}" -gt 0 ]
  pub=$(step_of "the worker daemon" | sed -n 's/^rb-publish: \([0-9]*\) events, .*/\1/p')
  [ "$pub" = "$m" ]
  for h in mailer ledger; do
    step_of "the worker daemon" | grep -q "^rb-dispatch: $h: claimed $m, completed $m, failed 0 (dead 0), .* in flight 0, "
  done
}

@test "demo: rb-admin stats says what the events without deliveries are: done, kept until purge" {
  step_of "rb-admin stats" | grep -Eq '^TOTAL +0 +0 +0 +0 +1 '
  step_of "rb-admin stats" | grep -Eq '^events with every delivery done \(or none\), kept until purge: [1-9][0-9]*$'
  ! grep -q 'events without deliveries' "$OUT"
}

@test "demo: the pageinspect summary of both designs, inside 100 columns (COLUMNS=100: one after the other)" {
  step_of "write amplification" | grep -q '^in short: 1 heap tuple, [0-9]* index entries, 0 updates of the delivery that were not HOT$'
  [ "$(step_of "write amplification" | grep -c '^in short: ')" = 2 ]
  step_of "write amplification" | grep -q '^row leases (0.1.0)'
  [ "$(step_of "write amplification" | awk '{ if (length > m) m = length } END { print m + 0 }')" -le 100 ]
}

@test "the build: ar without the 'u' modifier (no \"'u' modifier ignored\" warning)" {
  [ -n "${RB_BUILDDIR:-}" ] || skip "not run from make check"
  grep -qx 'ARFLAGS = cr' "$RB_BUILDDIR/Makefile"
}
