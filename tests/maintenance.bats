#!/usr/bin/env bats
# Maintenance that runs itself: the installed relaybus-purge@ and
# relaybus-stats@ service templates and their timers pass systemd-analyze
# verify, are not enabled by installing them, and their ExecStart lines,
# run for real against the test database with the Environment= defaults
# of the unit and an instance's environment file, remove what retention
# promises (events without deliveries, old dead letters) in short batches
# that pass over rows another session has locked, and write a textfile
# promtool accepts.  The cron.d example runs the same command lines.
# (systemd is not PID 1 here: the units are verified, and their command
# lines run as systemd would.)

load test_helper

setup_file() {
  [ -n "${RB_BUILDDIR:-}" ] && [ -f "$RB_BUILDDIR/Makefile" ] || return 0
  grep -q '^systemdsystemunitdir = ..*' "$RB_BUILDDIR/Makefile" || return 0
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$RB_BUILDDIR" install \
    DESTDIR="$BATS_FILE_TMPDIR/root" >"$BATS_FILE_TMPDIR/install.log" 2>&1
}

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }

need_units() {
  [ -n "${RB_BUILDDIR:-}" ] && [ -f "$RB_BUILDDIR/Makefile" ] || skip "not run from a build tree (RB_BUILDDIR)"
  grep -q '^systemdsystemunitdir = ..*' "$RB_BUILDDIR/Makefile" || skip "configured without a systemd unit directory"
  UNITDIR=$(dirname "$(find "$BATS_FILE_TMPDIR/root" -name 'relaybus-purge@.service')")
  [ -d "$UNITDIR" ]
}

# Run unit $1's ExecStart as systemd would for instance $2 with the
# environment file $3 (in place of the unit's EnvironmentFile=): the
# unit's Environment= lines first, the file's assignments over them, %i
# the instance; $VAR splits into words, ${VAR} is one word (systemd.service(5)).
run_exec_start() {  # unit instance envfile
  local unit=$1 inst=$2 envf=$3 line cmd
  cmd=$(sed -n 's/^ExecStart=//p' "$unit")
  [ -n "$cmd" ]
  cmd=${cmd//%i/$inst}
  # the program under test (on PATH) in place of the installed one
  cmd=$(sed -E 's|^/[^ ]*/(rb-[a-z]+) |\1 |' <<<"$cmd")
  [[ "$cmd" == rb-* ]]
  # ${VAR} -> "${VAR}" (one word); $VAR stays unquoted (split)
  cmd=$(sed -E 's/\$\{([A-Za-z_][A-Za-z0-9_]*)\}/"${\1}"/g' <<<"$cmd")
  (
    while IFS= read -r line; do
      line=${line#Environment=}
      line=${line#\"}; line=${line%\"}
      line=${line//%i/$inst}
      export "$line"
    done < <(grep '^Environment=' "$unit")
    set -a
    . "$envf"
    set +a
    eval "exec $cmd"
  )
}

@test "make install: relaybus-purge@ and relaybus-stats@ services and timers, none enabled, systemd-analyze verify clean" {
  need_units
  command -v systemd-analyze >/dev/null || skip "no systemd-analyze (Debian: systemd)"
  local u
  for u in relaybus-purge@.service relaybus-purge@.timer relaybus-stats@.service relaybus-stats@.timer; do
    [ -f "$UNITDIR/$u" ]
    [ "$(stat -c %a "$UNITDIR/$u")" = 644 ]
  done
  # installing enables nothing: no .wants links anywhere under the root
  [ -z "$(find "$BATS_FILE_TMPDIR/root" -path '*.wants*')" ]
  grep -qx 'WantedBy=timers.target' "$UNITDIR/relaybus-purge@.timer"
  grep -qx 'OnCalendar=hourly' "$UNITDIR/relaybus-purge@.timer"
  grep -qx 'OnUnitActiveSec=1min' "$UNITDIR/relaybus-stats@.timer"
  grep -qx 'Type=oneshot' "$UNITDIR/relaybus-purge@.service"
  # the documented defaults
  grep -qx 'Environment="RB_PURGE_OPTIONS=--dead-older-than 30d --completed-older-than 7d --batch 1000"' \
    "$UNITDIR/relaybus-purge@.service"
  grep -q '^EnvironmentFile=/.*/relaybus/%i.env$' "$UNITDIR/relaybus-purge@.service"
  # no password or URL on a command line
  ! grep -q -- '--db' "$UNITDIR"/relaybus-*@.service || false
  # verify checks ExecStart's program: the DESTDIR's
  local v=$BATS_TEST_TMPDIR/units bin
  mkdir "$v"
  bin=$(find "$BATS_FILE_TMPDIR/root" -name rb-admin -type f)
  for u in relaybus-purge@.service relaybus-purge@.timer relaybus-stats@.service relaybus-stats@.timer; do
    sed -E "s|^ExecStart=[^ ]*/rb-admin |ExecStart=$bin |" "$UNITDIR/$u" >"$v/$u"
  done
  grep -q "^ExecStart=$bin " "$v/relaybus-purge@.service"
  run systemd-analyze verify --man=no "$v/relaybus-purge@app.service" "$v/relaybus-purge@app.timer" \
    "$v/relaybus-stats@app.service" "$v/relaybus-stats@app.timer"
  echo "$output"
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

# Events that were delivered and completed (no delivery left), dead letters
# from a handler that always fails; then aged: old ones before the defaults'
# 7 and 30 days, young ones after.
aged_bus() {
  rb-setup -s 'ret:ret.*' -s 'bad:bad.*'
  awk 'BEGIN { for (i = 1; i <= 2500; i++) printf "{\"id\":\"done-%d\",\"name\":\"ret.x\",\"payload\":{}}\n", i }' | rb-publish -q
  awk 'BEGIN { for (i = 1; i <= 30; i++) printf "{\"id\":\"dead-%d\",\"name\":\"bad.x\",\"payload\":{}}\n", i }' | rb-publish -q
  rb-dispatch -q -H ret --exec true --drain --concurrency 50
  rb-dispatch -q -H bad --exec false --max-attempts 1 --drain
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 30 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'dead'")" = 30 ]
  q "UPDATE relaybus_events SET created_at = now() - interval '8 days' WHERE id LIKE 'done-%' AND id <> 'done-1';
     UPDATE relaybus_events SET created_at = now() - interval '40 days' WHERE id LIKE 'dead-%';
     UPDATE relaybus_deliveries SET updated_at = now() - interval '31 days' WHERE event_id <> 'dead-1'"
}

@test "relaybus-purge@.service's ExecStart, run for real with the unit's defaults: events without deliveries past 7 days and dead letters past 30 days go, in batches of 1000, the young stay" {
  need_units
  pg_only "aged rows are made with SQL"
  need_pg
  aged_bus
  printf 'RELAYBUS_URL=%s\nRELAYBUS_SCHEMA=%s\n' "$RELAYBUS_URL" "$RB_SCHEMA" >"$BATS_TEST_TMPDIR/app.env"
  run --separate-stderr run_exec_start "$UNITDIR/relaybus-purge@.service" app "$BATS_TEST_TMPDIR/app.env"
  echo "$output $stderr"
  [ "$status" -eq 0 ]
  # 29 dead deliveries, 2499 + 29 events, each kind in batches of at most 1000
  [ "$(fields '.dead,.events,.interrupted' <<<"$output")" = "29 2528 false" ]
  local b
  b=$(fields '.batches' <<<"$output")
  [ "$b" -ge 4 ]
  # what a user checks: the young event, the young dead letter and its event are there
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "dead-1,done-1" ]
  [ "$(q "SELECT event_id FROM relaybus_deliveries WHERE status = 'dead'")" = dead-1 ]
  # the environment file overrides the defaults: a second run with a smaller batch finds nothing
  echo 'RB_PURGE_OPTIONS="--dead-older-than 30d --completed-older-than 7d --batch 10"' >>"$BATS_TEST_TMPDIR/app.env"
  run --separate-stderr run_exec_start "$UNITDIR/relaybus-purge@.service" app "$BATS_TEST_TMPDIR/app.env"
  [ "$status" -eq 0 ]
  [ "$(fields '.dead,.events' <<<"$output")" = "0 0" ]
}

@test "relaybus-purge@: an old event another session holds locked is passed over, not waited for; the next run takes it" {
  need_units
  pg_only "the lock is taken with SQL"
  need_pg
  aged_bus
  printf 'RELAYBUS_URL=%s\nRELAYBUS_SCHEMA=%s\nRB_PURGE_OPTIONS="--completed-older-than 7d --batch 100"\n' \
    "$RELAYBUS_URL" "$RB_SCHEMA" >"$BATS_TEST_TMPDIR/app.env"
  # a session holding a row lock on done-2 for the whole run
  coproc HOLD { PGOPTIONS="-c search_path=$RB_SCHEMA" psql "$RELAYBUS_URL" -X -A -t -q; }
  HOLD_FD=${HOLD[1]}
  echo "BEGIN; SELECT id FROM relaybus_events WHERE id = 'done-2' FOR UPDATE;" >&"${HOLD[1]}"
  read -r -t 20 locked <&"${HOLD[0]}"
  [ "$locked" = done-2 ]
  # (a generous bound: the run takes well under a second on an idle machine)
  run --separate-stderr timeout 60 bash -c "$(declare -f run_exec_start); run_exec_start \"\$@\"" _ \
    "$UNITDIR/relaybus-purge@.service" app "$BATS_TEST_TMPDIR/app.env"
  echo "$output $stderr"
  [ "$status" -eq 0 ]
  [ "$(fields '.events' <<<"$output")" = 2498 ]
  [ "$(fields '.batches' <<<"$output")" -ge 25 ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events WHERE id LIKE 'done-%'")" = "done-1,done-2" ]
  echo "COMMIT;" >&"${HOLD[1]}"
  run --separate-stderr run_exec_start "$UNITDIR/relaybus-purge@.service" app "$BATS_TEST_TMPDIR/app.env"
  [ "$status" -eq 0 ]
  [ "$(fields '.events' <<<"$output")" = 1 ]
}

@test "relaybus-stats@.service's ExecStart, run for real: the instance's textfile, atomic, promtool-clean; relaybus_up 0 and exit 69 with the database down" {
  need_units
  need_pg
  local dir=$BATS_TEST_TMPDIR/node-exporter
  mkdir "$dir"
  rb-setup -s 'st:*'
  echo '{"id":"s1","name":"x","payload":{}}' | rb-publish -q
  printf 'RELAYBUS_URL=%s\nRELAYBUS_SCHEMA=%s\nRB_STATS_OUTPUT=%s/relaybus-app.prom\n' \
    "$RELAYBUS_URL" "$RB_SCHEMA" "$dir" >"$BATS_TEST_TMPDIR/app.env"
  run --separate-stderr run_exec_start "$UNITDIR/relaybus-stats@.service" app "$BATS_TEST_TMPDIR/app.env"
  [ "$status" -eq 0 ]
  [ -z "$output" ]
  [ "$(ls "$dir")" = relaybus-app.prom ]
  [ "$(stat -c %a "$dir/relaybus-app.prom")" = 644 ]
  grep -qx "relaybus_up{schema=\"$RB_SCHEMA\"} 1" "$dir/relaybus-app.prom"
  grep -qx "relaybus_handler_deliveries{schema=\"$RB_SCHEMA\",handler=\"st\",state=\"due\"} 1" "$dir/relaybus-app.prom"
  if command -v promtool >/dev/null; then promtool check metrics <"$dir/relaybus-app.prom"; fi
  # the unit's own default path is Debian's node_exporter textfile folder
  grep -qx 'Environment=RB_STATS_OUTPUT=/var/lib/prometheus/node-exporter/relaybus-%i.prom' \
    "$UNITDIR/relaybus-stats@.service"
  printf 'RELAYBUS_URL=postgresql://127.0.0.1:1/x\nRB_STATS_OUTPUT=%s/relaybus-down.prom\n' "$dir" >"$BATS_TEST_TMPDIR/down.env"
  run --separate-stderr run_exec_start "$UNITDIR/relaybus-stats@.service" down "$BATS_TEST_TMPDIR/down.env"
  [ "$status" -eq 69 ]
  grep -q '^relaybus_up{.*} 0$' "$dir/relaybus-down.prom"
}

@test "the cron.d example's command lines, run for real: the same purge and textfile" {
  pg_only "aged rows are made with SQL"
  need_pg
  aged_bus
  local cron=$RB_SRCDIR/contrib/cron.d/relaybus dir=$BATS_TEST_TMPDIR/ne line n=0
  mkdir "$dir"
  printf 'RELAYBUS_URL=%s\nRELAYBUS_SCHEMA=%s\n' "$RELAYBUS_URL" "$RB_SCHEMA" >"$BATS_TEST_TMPDIR/app.env"
  # every job line: five time fields, the user, the command (run by sh, as cron does)
  while read -r _ _ _ _ _ user line; do
    [ "$user" = relaybus ]
    line=${line//\/etc\/relaybus\/app.env/$BATS_TEST_TMPDIR/app.env}
    line=${line//\/var\/lib\/prometheus\/node-exporter/$dir}
    env -i PATH="$PATH" RELAYBUS_MODULE_DIR="${RELAYBUS_MODULE_DIR:-}" sh -c "$line"
    n=$((n + 1))
  done < <(grep -E '^[0-9*]' "$cron")
  [ "$n" -eq 2 ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "dead-1,done-1" ]
  grep -qx "relaybus_up{schema=\"$RB_SCHEMA\"} 1" "$dir/relaybus-app.prom"
}
