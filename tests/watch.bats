#!/usr/bin/env bats
# tests/bats-watch, which `make check` runs every bats file under: a file
# still running after RELAYBUS_TEST_FILE_TIMEOUT seconds is stopped, its
# log saying what it waited on; a file that ends is passed through as it is.
# Not through test_helper: the files it runs are bats files of their own.

bats_require_minimum_version 1.5.0
RB_SRCDIR=${RB_SRCDIR:-$BATS_TEST_DIRNAME/..}
watch=$RB_SRCDIR/tests/bats-watch

setup() {
  cd "$BATS_TEST_TMPDIR"
  # a number of this test's own, to find its processes and its session by
  mark=$(( 100000 + RANDOM * 7 + BATS_TEST_NUMBER ))
}

# FILE from stdin, its tests written "%test" (so that this file's bats
# does not take them for its own)
bats_file() { sed 's/^%test/@test/' >"$1"; }

teardown() {
  pkill -KILL -f "sleep $mark" 2>/dev/null || true
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    psql "$RELAYBUS_TEST_PG_URL" -X -A -t -q -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
      WHERE query LIKE '%pg_sleep($mark)%' AND pid <> pg_backend_pid()" >/dev/null 2>&1 || true
  fi
}

@test "a file that waits forever: stopped after RELAYBUS_TEST_FILE_TIMEOUT, its log names what it waited on, nothing left running" {
  bats_file hang.bats <<EOF
%test "ends" { true; }
%test "waits" {
  if [ -n "\${RELAYBUS_TEST_PG_URL:-}" ]; then
    psql "\$RELAYBUS_TEST_PG_URL" -X -q -c "SELECT pg_sleep($mark)" &
  fi
  sleep $mark | cat
}
%test "never reached" { true; }
EOF
  start=$(date +%s)
  run --separate-stderr env RELAYBUS_TEST_FILE_TIMEOUT=6 bash "$watch" bats --tap hang.bats
  took=$(( $(date +%s) - start ))
  [ "$status" -ne 0 ]
  # 6 s, then 5 s for the processes to end: well within a minute on a busy machine
  [ "$took" -lt 60 ]
  [ "${lines[0]}" = "1..3" ]
  [ "${lines[1]}" = "ok 1 ends" ]
  [[ "$output" == *"# watch: hang.bats still running after 6 s; its processes:"* ]]
  # the process it waits on, with its kernel wait
  printf '%s\n' "$output" | grep -E "^# watch: .*nanosleep +sleep $mark\$"
  # the last lines: the bail-out, then the file's time
  [[ "${lines[${#lines[@]}-1]}" == "# time: hang.bats "*" s" ]]
  [ "${lines[${#lines[@]}-2]}" = "Bail out! hang.bats did not finish within 6 s (RELAYBUS_TEST_FILE_TIMEOUT): stopped; what it waited on is above (# watch:)" ]
  [[ "$output" != *"never reached"* ]]
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    # the database session, its wait event and its query
    printf '%s\n' "$output" | grep -E "^# watch: +[0-9]+ \| [^|]* \| active \| Timeout:PgSleep \| .*SELECT pg_sleep\($mark\)"
  fi
  # nothing of the file left running
  ! pgrep -f "sleep $mark"
}

@test "a file that ends: its TAP lines and exit status as bats gives them, then its wall time" {
  bats_file two.bats <<'EOF'
%test "passes" { true; }
%test "fails" { sleep 1; false; }
EOF
  run --separate-stderr bats --tap two.bats
  want_status=$status want_output=$output
  run --separate-stderr env RELAYBUS_TEST_FILE_TIMEOUT=60 bash "$watch" bats --tap two.bats
  [ "$status" = "$want_status" ] && [ "$status" = 1 ]
  # bats's lines, then the file's wall time (a second at least: the sleep)
  [ "${output%$'\n'*}" = "$want_output" ]
  [[ "${lines[${#lines[@]}-1]}" =~ ^"# time: two.bats "([0-9]+)" s"$ ]]
  [ "${BASH_REMATCH[1]}" -ge 1 ]
  [[ "$output" != *"# watch:"* ]]
}

@test "RELAYBUS_TEST_FILE_TIMEOUT not a number of seconds: exit 99 naming it, the file not run" {
  bats_file one.bats <<EOF
%test "runs" { touch $BATS_TEST_TMPDIR/ran; }
EOF
  run --separate-stderr env RELAYBUS_TEST_FILE_TIMEOUT=10m bash "$watch" bats --tap one.bats
  [ "$status" = 99 ]
  [ "$stderr" = "bats-watch: RELAYBUS_TEST_FILE_TIMEOUT: not a number of seconds: '10m'" ]
  [ ! -e ran ]
  run -0 env RELAYBUS_TEST_FILE_TIMEOUT=0 bash "$watch" bats --tap one.bats
  [ -e ran ]
}
