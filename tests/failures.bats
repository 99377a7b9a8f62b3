#!/usr/bin/env bats
# rb-dispatch: a failing handler is loud at the default verbosity (issue
# 39 item 2): one warning per failed attempt naming the handler, the
# event, the attempt out of --max-attempts and the first line of the
# error, rate-limited; --drain's summary line; --fail-exit; the same
# fields as fields of their own in --log-format json.  Real processes
# against a real store.

load test_helper

setup() { fresh_schema; }
teardown() { kill_pids_drop_schema; }


@test "a handler that cannot start: one warning per attempt naming handler, event, attempt of the maximum and exit 127 (command not found)" {
  need_pg
  publish_for 1 nosuch- ledger
  cd "$BATS_TEST_TMPDIR"
  run -0 --separate-stderr rb-dispatch -H ledger --exec ./nosuch --max-attempts 4 --drain
  [[ "$stderr" == *"rb-dispatch: ledger: nosuch-1: attempt 1/4 failed: cannot run the handler: exit 127 (command not found)"* ]]
  printf '#!/bin/sh\nexit 0\n' >notexec
  chmod -x notexec
  sleep 1.1	# the retry's backoff (1s)
  run -0 --separate-stderr rb-dispatch -H ledger --exec ./notexec --max-attempts 4 --drain
  [[ "$stderr" == *"rb-dispatch: ledger: nosuch-1: attempt 2/4 failed: cannot run the handler: exit 126 (not executable)"* ]]
  # a --pipe co-process the shell cannot run: said so at each restart (the
  # drain ends, 0, if its line failed the attempt, else the timeout, 124)
  publish_for 1 pipe- pipeh
  run --separate-stderr timeout 2 rb-dispatch -H pipeh --pipe ./nosuch --drain
  [ "$status" -eq 0 ] || [ "$status" -eq 124 ]
  [[ "$stderr" == *"rb-dispatch: pipeh: co-process 0: cannot run the handler: exit 127 (command not found); restarting in "* ]]
}

@test "the first line of the error only: a --pipe handler's multi-line error, and --sql's syntax error" {
  need_pg
  publish_for 1 ml- multi
  run -0 --separate-stderr rb-dispatch -H multi --drain \
    --pipe "jq -c --unbuffered '. + {ok: false, error: \"first line\\nsecond line\"}'"
  [[ "$stderr" == *"multi: ml-1: attempt 1/10 failed: first line"* ]]
  [[ "$stderr" != *"second line"* ]]
  pg_only "--sql"
  publish_for 1 sq- stats
  run -0 --separate-stderr rb-dispatch -H stats --sql 'INSRT 1' --drain
  [[ "$stderr" == *"stats: sq-1: attempt 1/10 failed: --sql failed: syntax error at or near \"INSRT\""* ]]
  [ "$(grep -c 'attempt 1/10 failed' <<<"$stderr")" = 1 ]
}

@test "30 failures in a drain: 10 warnings, then one line for the other 20, and the summary line" {
  need_pg
  publish_for 30 f- flood
  run -0 --separate-stderr rb-dispatch -H flood --exec 'exit 3' --drain
  [ "$(grep -c ': attempt 1/10 failed: exit 3$' <<<"$stderr")" = 10 ]
  [ "$(grep -c '^rb-dispatch: flood: \.\.\. and 20 more failed attempts in the last 10 s$' <<<"$stderr")" = 1 ]
  [[ "${stderr_lines[-1]}" == "rb-dispatch: flood: drained: 0 completed, 30 failed and rescheduled, 0 dead, in "*" s" ]]
  # -q: errors only, no warnings nor summary
  run -0 --separate-stderr rb-dispatch -q -H flood --exec 'exit 3' --settle --max-attempts 2
  [ -z "$stderr" ]
}

@test "--drain's summary counts completed, rescheduled and dead; --fail-exit exits 82 when an attempt failed, 0 when none did" {
  need_pg
  publish_for 3 ok- sum
  run -0 --separate-stderr rb-dispatch -H sum --exec true --drain --fail-exit
  [[ "${stderr_lines[-1]}" == "rb-dispatch: sum: drained: 3 completed, 0 failed and rescheduled, 0 dead, in "*" s" ]]
  publish_for 2 bad- sum
  run -82 --separate-stderr rb-dispatch -H sum --exec 'exit 3' --settle --max-attempts 2 --fail-exit
  [[ "${stderr_lines[-1]}" == "rb-dispatch: sum: drained: 0 completed, 2 failed and rescheduled, 2 dead, in "*" s" ]]
  # without --fail-exit, a drain with failures exits 0 as before
  publish_for 1 bad2- sum
  run -0 --separate-stderr rb-dispatch -H sum --exec 'exit 3' --settle --max-attempts 1
  [[ "$stderr" == *"drained: 0 completed, 0 failed and rescheduled, 1 dead, in "* ]]
  run -64 --separate-stderr rb-dispatch -H sum --exec true --fail-exit
  [ "${stderr_lines[0]}" = "rb-dispatch: --fail-exit: only with --drain or --settle" ]
}

@test "--log-format json: handler, event_id, attempt, max_attempts, lane and error are fields, not in msg" {
  need_pg
  publish_for 1 j- jh
  run -0 --separate-stderr rb-dispatch --log-format json -H jh --exec 'exit 3' --drain
  line=$(grep '"attempt failed"' <<<"$stderr")
  [ "$(jq -r '[.handler, .event_id, .attempt, .max_attempts, .error, .level] | @tsv' <<<"$line")" = \
    "$(printf 'jh\tj-1\t1\t10\texit 3\twarning')" ]
  [ "$(jq -r '.lane | type' <<<"$line")" = number ]
  [ "$(jq -r '.msg' <<<"$line")" = "attempt failed" ]
  summary=$(jq -c 'select(.msg == "drained")' <<<"$stderr")
  [ "$(jq -r '[.completed, .rescheduled, .dead, .level] | @tsv' <<<"$summary")" = "$(printf '0\t1\t0\tnotice')" ]
}

@test "the 10 s window closes while the dispatcher runs: the count of the others comes then, not only at exit" {
  need_pg
  local err=$BATS_TEST_TMPDIR/err p
  publish_for 15 w- win
  rb-dispatch -H win --exec 'exit 3' --backoff 1h 2>"$err" 3>&- & p=$!
  PIDS=$p
  wait_for 40 'grep -q "^rb-dispatch: win: \.\.\. and 5 more failed attempts in the last 10 s$" "$err"'
  kill -0 "$p"	# still running: said when the window closed
  [ "$(grep -c ': attempt 1/10 failed: exit 3$' "$err")" = 10 ]
  kill -TERM "$p"
  wait "$p"
  # the count is not said again at exit
  [ "$(grep -c 'more failed attempts' "$err")" = 1 ]
}

@test "relaybus_fail's 'again': a failure due at once stays in its lane's in_flight (its claims one up); one due later, or at the last attempt, leaves it" {
  need_pg
  publish_for 3 ag- again
  run -0 --separate-stderr rb-claim -H again --batch 3
  local ids=() lanes=() epochs=() claims=() evs=() line lease
  while IFS= read -r line; do
    evs+=("$(jq -r .event_id <<<"$line")")
    ids+=("$(jq -r .delivery_id <<<"$line")")
    lease=$(jq -r .lease <<<"$line")
    IFS=: read -r l e c <<<"$lease"
    lanes+=("$l") epochs+=("$e") claims+=("$c")
  done <<<"$output"
  [ "${#ids[@]}" = 3 ]
  arr() { local IFS=,; echo "{$*}"; }
  # ag-1 due at once, ag-2 in 1 s, ag-3 at its last attempt (max 1)
  run -0 sql -At -F' ' -c "SELECT ord, outcome, attempts FROM relaybus_fail('$(arr "${evs[@]}")', '{again,again,again}',
      '$(arr "${lanes[@]}")', '$(arr "${epochs[@]}")', '$(arr "${claims[@]}")', '{again,again,again}',
      '{0,1000,0}', '{boom,boom,boom}', 10, 1000, 300000, 2, '$(arr "${ids[@]}")')"
  [ "${lines[0]}" = "1 again 1" ]
  [ "${lines[1]}" = "2 rescheduled 1" ]
  # (the third: kept only while attempts are left; --max-attempts 10 here)
  [ "${lines[2]}" = "3 again 1" ]
  # in flight still: ag-1 and ag-3, each with its claims one up; ag-2 not
  [ "$(q "SELECT count(*) FROM relaybus_lanes l, relaybus_deliveries d WHERE l.handler = 'again' AND d.id = ANY (l.in_flight)")" = 2 ]
  [ "$(q "SELECT string_agg(event_id || ':' || attempts || ':' || claims || ':' || last_error, ' ' ORDER BY event_id) FROM relaybus_deliveries WHERE handler = 'again'")" = "ag-1:1:$((claims[0] + 1)):boom ag-2:1:$((claims[1] + 1)):boom ag-3:1:$((claims[2] + 1)):boom" ]
  # the kept one completes under its lease, its claims one up
  run -0 rb-complete -o <<<"{\"event_id\":\"${evs[0]}\",\"handler\":\"again\",\"lease\":\"${lanes[0]}:${epochs[0]}:$((claims[0] + 1))\",\"ok\":true}"
  [ "$(jq -r .outcome <<<"$output")" = completed ]
  # at the last attempt: buried, out of in_flight
  run -0 sql -At -F' ' -c "SELECT outcome, attempts FROM relaybus_fail('{${evs[2]}}', '{again}', '{${lanes[2]}}',
      '{${epochs[2]}}', '{$((claims[2] + 1))}', '{again}', '{0}', '{boom}', 2, 1000, 300000, 2, '{${ids[2]}}')"
  [ "$output" = "buried 2" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes l, relaybus_deliveries d WHERE l.handler = 'again' AND d.id = ANY (l.in_flight)")" = 0 ]
  [ "$(q "SELECT sum(failed) || ' ' || sum(buried) FROM relaybus_lanes WHERE handler = 'again'")" = "4 1" ]
}
