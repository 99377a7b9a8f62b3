#!/usr/bin/env bats
# A connection cut by the server (pg_terminate_backend: SQLSTATE 57P01),
# in every program, both ways it happens: while a statement runs (held on
# a lock that a transaction of the test keeps) and while the program waits
# between statements (idle).  Each reports it in one line, "PROG: ...
# connection lost: terminating connection due to administrator command",
# exit 75 (rb-dispatch reconnects and goes on, from its start); the server's CONTEXT, LINE,
# QUERY and internal function signatures only with -v.

load test_helper

setup() { need_pg; fresh_schema; rb-setup -q -s 'h:*'; }
teardown() { exec 8>&- 2>/dev/null || true; kill_pids_drop_schema; }

APP=rbcut$$
# the URL of the program under test: its connections named $APP
victim_url() {
  case $RELAYBUS_URL in *\?*) echo "$RELAYBUS_URL&application_name=$APP" ;; *) echo "$RELAYBUS_URL?application_name=$APP" ;; esac
}

# a psql session of the test fed through a fifo on fd 7 (HOLD_FD): TABLE
# locked (ACCESS EXCLUSIVE) until the test closes it
hold_lock() {  # table
  local fifo=$BATS_TEST_TMPDIR/lockfifo
  mkfifo "$fifo"
  (PGAPPNAME=rbhold$$ sql <"$fifo" >"$BATS_TEST_TMPDIR/hold.out" 2>&1 3>&-) &
  PIDS="${PIDS:-} $!"
  exec 7>"$fifo"
  HOLD_FD=7
  echo "BEGIN; LOCK TABLE $1 IN ACCESS EXCLUSIVE MODE; SELECT 'locked';" >&7
  wait_for 10 'grep -q locked "$BATS_TEST_TMPDIR/hold.out"'
}
release_lock() { exec 7>&-; HOLD_FD=; }

# the program's connection: waiting for the lock, or idle
blocked() { q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$APP' AND wait_event_type = 'Lock'"; }
idle() { q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$APP' AND state = 'idle'"; }
cut() {
  local n
  n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '$APP'")
  [ "$n" -ge 1 ]
}

# stderr of PROG in FILE: the cut in exactly one line, none of the server's other text
one_line() {  # file prog
  echo "--- $1:"; cat "$1"
  [ "$(grep -c "^$2: .*connection lost: terminating connection due to administrator command" "$1")" = 1 ]
  ! grep -E 'FATAL|CONTEXT|QUERY|LINE [0-9]|PL/pgSQL|relaybus_[a-z_]*\(|server closed' "$1" || false
}

# a line of rb-claim's output for handler h, made a success for rb-complete
claimed_ok() {
  local l
  echo "{\"id\":\"c$1\",\"name\":\"t\",\"payload\":{},\"handlers\":[\"h\"]}" | rb-publish -q
  l=$(rb-claim -H h --lease 60s)
  printf '%s\n' "${l%\}},\"ok\":true}"
}

# PROG ARGS run with stdin from a fifo (fd 8), its connection left idle
start_idle() {  # out err prog args...
  local out=$1 err=$2 fifo=$BATS_TEST_TMPDIR/infifo
  shift 2
  mkfifo "$fifo"
  (rc=0; "$@" <"$fifo" >"$out" 2>"$err" 3>&- 8>&- || rc=$?; echo "$rc" >"$err.rc") &
  PIDS="${PIDS:-} $!"
  exec 8>"$fifo"
  wait_for 10 '[ "$(idle)" -ge 1 ]'
}

@test "rb-claim: its claim terminated while it waits on a lock: one line, exit 75; the server's CONTEXT only with -v" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  local v
  for v in "" -v; do
    hold_lock relaybus_deliveries
    (rc=0; rb-claim $v --db "$(victim_url)" -H h 2>"$BATS_TEST_TMPDIR/e$v" 3>&- 7>&- || rc=$?; echo $rc >"$BATS_TEST_TMPDIR/rc$v") &
    PIDS="${PIDS:-} $!"
    wait_for 10 '[ "$(blocked)" -ge 1 ]'
    cut
    wait_for 10 '[ -s "$BATS_TEST_TMPDIR/rc$v" ]'
    release_lock
    rm -f "$BATS_TEST_TMPDIR/lockfifo"
    [ "$(cat "$BATS_TEST_TMPDIR/rc$v")" = 75 ]
  done
  one_line "$BATS_TEST_TMPDIR/e" rb-claim
  [ "$(wc -l <"$BATS_TEST_TMPDIR/e")" = 1 ]
  grep -qx 'rb-claim: connection lost: terminating connection due to administrator command' "$BATS_TEST_TMPDIR/e"
  # -v: the server's whole text, then the same line
  grep -q 'CONTEXT' "$BATS_TEST_TMPDIR/e-v"
  grep -qx 'rb-claim: connection lost: terminating connection due to administrator command' "$BATS_TEST_TMPDIR/e-v"
}

@test "rb-claim --follow: terminated while it waits idle: one line, exit 75" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  (rc=0; rb-claim --db "$(victim_url)" -H h --follow 2>"$BATS_TEST_TMPDIR/e" 3>&- 7>&- || rc=$?; echo $rc >"$BATS_TEST_TMPDIR/rc") &
  PIDS="${PIDS:-} $!"
  wait_for 10 '[ "$(idle)" -ge 1 ]'
  cut
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/rc" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e" rb-claim
  [ "$(wc -l <"$BATS_TEST_TMPDIR/e")" = 1 ]
}

@test "rb-dispatch: its claim terminated on a lock, and its idle connection terminated: one line each, reconnects, drains" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  local out=$BATS_TEST_TMPDIR/runs
  echo '{"id":"d1","name":"t","payload":{},"handlers":["h"]}' | rb-publish -q
  hold_lock relaybus_deliveries
  rb-dispatch --db "$(victim_url)" -H h --pipe "rb-test-pipe $out" 2>"$BATS_TEST_TMPDIR/e" 3>&- 7>&- &
  PIDS="${PIDS:-} $!"
  local pid=$!
  wait_for 10 '[ "$(blocked)" -ge 1 ]'
  cut
  wait_for 10 'grep -q reconnected "$BATS_TEST_TMPDIR/e"'
  release_lock
  wait_for 10 '[ -s "$out" ]' || { cat "$BATS_TEST_TMPDIR/e"; false; }
  one_line "$BATS_TEST_TMPDIR/e" rb-dispatch
  # now idle: the cut comes between statements
  : >"$BATS_TEST_TMPDIR/e"
  wait_for 10 '[ "$(idle)" -ge 1 ]'
  cut
  wait_for 10 'grep -q reconnected "$BATS_TEST_TMPDIR/e"'
  kill -TERM "$pid"
  wait "$pid"
  one_line "$BATS_TEST_TMPDIR/e" rb-dispatch
}

@test "rb-dispatch: its connection terminated while it starts (reading the schema's version): one line, connects again, drains" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  local out=$BATS_TEST_TMPDIR/runs pid
  echo '{"id":"d1","name":"t","payload":{},"handlers":["h"]}' | rb-publish -q
  # the first thing a program reads when it starts
  hold_lock relaybus_schema_version
  rb-dispatch --db "$(victim_url)" -H h --drain --pipe "rb-test-pipe $out" 2>"$BATS_TEST_TMPDIR/e" 3>&- 7>&- &
  pid=$!
  PIDS="${PIDS:-} $pid"
  wait_for 10 '[ "$(blocked)" -ge 1 ]'
  cut
  wait_for 10 'grep -q "connecting again" "$BATS_TEST_TMPDIR/e"' || { cat "$BATS_TEST_TMPDIR/e"; false; }
  kill -0 "$pid"
  release_lock
  wait "$pid"
  # it ran once, on its first attempt (the handler's line: id key seq attempt)
  [ "$(awk '{ print $1, $4 }' "$out")" = "d1 1" ]
  one_line "$BATS_TEST_TMPDIR/e" rb-dispatch
}

@test "rb-complete: terminated on a lock, and while it waits for input: one line, exit 75" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  claimed_ok 1 >"$BATS_TEST_TMPDIR/r1"
  hold_lock relaybus_deliveries
  (rc=0; rb-complete --db "$(victim_url)" <"$BATS_TEST_TMPDIR/r1" 2>"$BATS_TEST_TMPDIR/e" 3>&- 7>&- || rc=$?; echo $rc >"$BATS_TEST_TMPDIR/rc") &
  PIDS="${PIDS:-} $!"
  wait_for 10 '[ "$(blocked)" -ge 1 ]'
  cut
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/rc" ]'
  release_lock
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e" rb-complete
  # idle: reading its input when the cut comes
  start_idle "$BATS_TEST_TMPDIR/o2" "$BATS_TEST_TMPDIR/e2" rb-complete --db "$(victim_url)"
  cut
  cat "$BATS_TEST_TMPDIR/r1" >&8
  exec 8>&-
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/e2.rc" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/e2.rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e2" rb-complete
}

@test "rb-publish: terminated on a lock, and while it waits for input: one line, exit 75" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  hold_lock relaybus_events
  (rc=0; echo '{"id":"p1","name":"t","payload":{}}' |
    rb-publish --db "$(victim_url)" 2>"$BATS_TEST_TMPDIR/e" 3>&- 7>&- || rc=$?; echo $rc >"$BATS_TEST_TMPDIR/rc") &
  PIDS="${PIDS:-} $!"
  wait_for 10 '[ "$(blocked)" -ge 1 ]'
  cut
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/rc" ]'
  release_lock
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e" rb-publish
  start_idle "$BATS_TEST_TMPDIR/o2" "$BATS_TEST_TMPDIR/e2" rb-publish --db "$(victim_url)"
  cut
  echo '{"id":"p2","name":"t","payload":{}}' >&8
  exec 8>&-
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/e2.rc" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/e2.rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e2" rb-publish
}

@test "rb-admin: terminated on a lock, and while it waits for input: one line, exit 75" {
  pg_only "SQLSTATE 57P01 is PostgreSQL's"
  hold_lock relaybus_deliveries
  (rc=0; rb-admin --db "$(victim_url)" stats 2>"$BATS_TEST_TMPDIR/e" >/dev/null 3>&- 7>&- || rc=$?; echo $rc >"$BATS_TEST_TMPDIR/rc") &
  PIDS="${PIDS:-} $!"
  wait_for 10 '[ "$(blocked)" -ge 1 ]'
  cut
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/rc" ]'
  release_lock
  [ "$(cat "$BATS_TEST_TMPDIR/rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e" rb-admin
  [ "$(wc -l <"$BATS_TEST_TMPDIR/e")" = 1 ]
  # idle: requeue reading event ids on stdin
  start_idle "$BATS_TEST_TMPDIR/o2" "$BATS_TEST_TMPDIR/e2" rb-admin --db "$(victim_url)" requeue
  cut
  echo nosuch >&8
  exec 8>&-
  wait_for 10 '[ -s "$BATS_TEST_TMPDIR/e2.rc" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/e2.rc")" = 75 ]
  one_line "$BATS_TEST_TMPDIR/e2" rb-admin
  [ "$(wc -l <"$BATS_TEST_TMPDIR/e2")" = 1 ]
}
