#!/usr/bin/env bats
# Effectively-once handlers (relaybus(7) "Effectively-once handlers"): a
# handler that writes its business row and calls relaybus_complete in one
# transaction, answering "completed": true (--exec: exit 80).  Real
# processes: the handlers of tests/bin (rb-test-eo-psql, rb-test-eo-python)
# kill themselves, or the rb-dispatch above them, with kill -9 at chosen
# points of chosen events (before COMMIT, between COMMIT and the answer),
# once each (marker files), so that every run crashes at the same places.
# At the end every event has exactly one business row and no delivery is
# left, pending or dead.

load test_helper

setup() {
  [ -n "${RELAYBUS_TEST_PG_URL:-}${RELAYBUS_TEST_MONGO_URL:-}" ] || return 0
  drop_schema
  setup_schema
  on_mongo && return 0
  q "CREATE TABLE eo_rows (event_id text NOT NULL, handler text NOT NULL, attempt integer NOT NULL)"
  export EO_DB=$RELAYBUS_URL EO_SCHEMA=$RB_SCHEMA EO_MARK=$BATS_TEST_TMPDIR
}

teardown() {
  local p f
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  # a handler still waiting inside its transaction (EO_HOLD*) goes on
  for f in "${EO_MARK:-/nonexistent}"/*.early "${EO_MARK:-/nonexistent}"/*.held; do
    [ -e "$f" ] && : >"${f%.*}.go"
  done
  drop_schema
}

# N events for HANDLER, ids e1..eN, the odd ones keyed (3 keys: chains)
publish() {  # n handler
  # (the ids are published again for another handler: a redelivery reaches
  # a handler subscribed to its name)
  rb-setup -q -s "$2:t"
  awk -v n="$1" -v h="$2" 'BEGIN {
    for (i = 1; i <= n; i++)
      if (i % 2) printf "{\"id\":\"e%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", i, i % 3, i, h
      else printf "{\"id\":\"e%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", i, i, h
  }' | rb-publish -q
}

# every one of the N events of HANDLER has exactly one business row, and
# no delivery of HANDLER is left (pending or dead)
exactly_once() {  # n handler
  local rows
  rows=$(q "SELECT count(DISTINCT event_id) || ' ' || count(*) FROM eo_rows WHERE handler = '$2'")
  [ "$rows" = "$1 $1" ] || { echo "business rows (events, rows): $rows, want $1 $1" >&2; return 1; }
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$2'")" = 0 ]
}
# ID of HANDLER crashed after its COMMIT the first time it ran, and never
# ran again (each run that ends logs a line in eo.log)
crashed_after() {  # handler id
  [ -e "$EO_MARK/$2.crash_after" ] && ! grep -q "^$2 " "$EO_MARK/eo.log"
}
# ID crashed before its COMMIT, and ran again: completed once
crashed_before() {  # handler id
  [ -e "$EO_MARK/$2.crash_before" ] && [ "$(grep -c "^$2 .* completed\$" "$EO_MARK/eo.log")" = 1 ]
}
attempt_of() { q "SELECT string_agg(attempt::text, ',') FROM eo_rows WHERE handler = '$1' AND event_id = '$2'"; }

@test "--pipe, psql handler: kill -9 before and after its COMMIT; one row per event, all completed by the handler, none lost" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  publish 12 p1
  EO_CRASH_BEFORE="e3" EO_CRASH_AFTER="e5 e8" \
    run -0 --separate-stderr timeout 120 rb-dispatch -v -H p1 --pipe rb-test-eo-psql --settle --lease 5s
  exactly_once 12 p1
  # e5, e8: committed, then the handler died before answering: their
  # deliveries gone under the still-held lease, completed by the handler
  [[ "$stderr" == *"e5: completed by the handler (its delivery is gone, the lease held)"* ]]
  [[ "$stderr" == *"e8: completed by the handler (its delivery is gone, the lease held)"* ]]
  crashed_after p1 e5 && crashed_after p1 e8
  # e3: rolled back with the handler, ran again
  crashed_before p1 e3
  [[ "$stderr" == *" 12 completed, "*", 0 lost, 12 completed by the handler"* ]]
}

@test "--pipe, Python handler (psycopg): kill -9 before and after its COMMIT; one row per event, none lost" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  /usr/bin/python3 -c 'import psycopg' || skip "no python3-psycopg"
  publish 10 p2
  EO_CRASH_BEFORE="e2" EO_CRASH_AFTER="e4 e7" \
    run -0 --separate-stderr timeout 120 rb-dispatch -v -H p2 --pipe rb-test-eo-python --settle --lease 5s
  exactly_once 10 p2
  [[ "$stderr" == *"e4: completed by the handler"* && "$stderr" == *"e7: completed by the handler"* ]]
  crashed_after p2 e4 && crashed_after p2 e7
  crashed_before p2 e2
  [[ "$stderr" == *" 10 completed, "*", 0 lost, 10 completed by the handler"* ]]
}

@test "--exec: exit 80 says completed by the handler; killed after its COMMIT it still counts as completed" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  publish 8 x1
  EO_CRASH_BEFORE="e2" EO_CRASH_AFTER="e3 e6" \
    run -0 --separate-stderr timeout 120 rb-dispatch -v -H x1 --exec "rb-test-eo-psql --exec" --settle --lease 5s
  exactly_once 8 x1
  # (killed by signal 9, or exit 137 from the shell around it)
  [[ "$stderr" == *"e3: attempt 1/10 failed: "* ]]
  [[ "$stderr" == *"e3: completed by the handler (its delivery is gone, the lease held)"* ]]
  crashed_after x1 e3 && crashed_after x1 e6
  crashed_before x1 e2
  [ "$(attempt_of x1 e2)" = 2 ]
  [[ "$stderr" == *" 8 completed, 1 failed and rescheduled, 0 dead, "*", 0 lost, 8 completed by the handler"* ]]
}

# rb-claim | HANDLER | rb-complete -o until nothing is left (a crashed
# round leaves its lanes leased: the next round takes them over after --lease)
pipeline() {  # handler-name cmd out
  local i
  for i in $(seq 1 60); do
    [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$1'")" = 0 ] && return 0
    { rb-claim -q -H "$1" --lease 1s --batch 4 | $2 | rb-complete -o; } >>"$3" 2>>"$3.err" || true
    sleep 0.2
  done
  return 1
}

@test "rb-claim | psql handler | rb-complete: crashes before and after COMMIT; \"completed\" lines count as completed by the handler" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  local out=$BATS_TEST_TMPDIR/out
  publish 10 c1
  EO_CRASH_BEFORE="e6" EO_CRASH_AFTER="e2 e9" pipeline c1 rb-test-eo-psql "$out"
  exactly_once 10 c1
  crashed_after c1 e2 && crashed_after c1 e9
  crashed_before c1 e6
  # one outcome line per answer; the crashed ones answered nothing
  [ "$(jq -r '"\(.outcome) \(.by)"' "$out" | sort | uniq -c | awk '{ print $1, $2, $3 }')" = "8 completed handler" ]
  [ "$(jq -r .event_id "$out" | sort | tr '\n' ' ')" = "e1 e10 e3 e4 e5 e6 e7 e8 " ]
}

@test "rb-claim | Python handler | rb-complete: the same" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  /usr/bin/python3 -c 'import psycopg' || skip "no python3-psycopg"
  local out=$BATS_TEST_TMPDIR/out
  publish 10 c2
  EO_CRASH_BEFORE="e1" EO_CRASH_AFTER="e4" pipeline c2 rb-test-eo-python "$out"
  exactly_once 10 c2
  crashed_after c2 e4 && crashed_before c2 e1
  [ "$(jq -r '"\(.outcome) \(.by)"' "$out" | sort | uniq -c | awk '{ print $1, $2, $3 }')" = "9 completed handler" ]
}

@test "kill -9 of the dispatcher before and after the handler's COMMIT: the next one takes over, runs the rest once" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  publish 12 k1
  local a b n
  # A dies after the COMMIT of the first delivery it runs (before the
  # answer), B while the transaction of its first one is open (its guard
  # kills the handler with it: the transaction rolls back, and the next
  # dispatcher runs that delivery again); one delivery at a time, so that
  # what a dead dispatcher leaves is its lanes
  EO_KILL_DISP_AFTER=ANY run -137 timeout 60 rb-dispatch -H k1 --pipe rb-test-eo-psql --lease 2s --chain 1 --batch 1 -c 1
  a=$(cat "$EO_MARK/any.disp_after")
  [ "$(attempt_of k1 "$a")" = 1 ]
  sleep 2.5	# (A's lanes free up: its lease ends)
  EO_KILL_DISP_BEFORE=ANY run -137 timeout 60 rb-dispatch -H k1 --pipe rb-test-eo-psql --lease 2s --chain 1 --batch 1 -c 1
  b=$(cat "$EO_MARK/any.disp_before")
  # B's handler died with B, its transaction rolled back: no row of b
  wait_for 10 '! running "$(cat "$EO_MARK/disp_before.handler")"'
  [ "$(attempt_of k1 "$b")" = "" ]
  sleep 2.5	# (B's lanes free up)
  run -0 --separate-stderr timeout 120 rb-dispatch -v -H k1 --pipe rb-test-eo-psql --settle --lease 2s
  exactly_once 12 k1
  # b again, on the attempt the takeover charged
  [ "$(attempt_of k1 "$a"),$(attempt_of k1 "$b")" = 1,2 ]
  # the last one ran the other eleven (after taking the lanes over), all
  # completed by the handler, nothing lost
  [[ "$stderr" == *" 11 completed, "*", 0 lost, 11 completed by the handler"* ]]
}

@test "a takeover while the handler's transaction is open: a stale completion rolls back; a locked lane waits" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  publish 4 t1
  local a b
  # 1. A's handler is inside e1's transaction, before relaybus_complete,
  # when A stops (SIGSTOP: a paused machine; its handler goes on, as a
  # dead dispatcher's would not, its guard killing them); B takes the
  # lanes over and runs e1; A's handler then completes with its stale
  # lease: lost, rolled back
  EO_HOLD_EARLY=e1 rb-dispatch -q -H t1 --pipe rb-test-eo-psql --lease 1s 2>/dev/null 3>&- & a=$!
  PIDS=$a
  wait_for 20 '[ -e "$EO_MARK/e1.early" ]'
  kill -STOP $a
  sleep 1.5	# (A's lease ends)
  run -0 --separate-stderr timeout 60 rb-dispatch -v -H t1 --pipe rb-test-eo-psql --settle --lease 1s
  [ "$(attempt_of t1 e1)" = 2 ]
  : >"$EO_MARK/e1.go"
  # (A's handler: its relaybus_complete said lost, it rolled back)
  wait_for 20 '[ "$(grep -c "^e1 " "$EO_MARK/eo.log")" = 2 ]'
  [ "$(grep "^e1 " "$EO_MARK/eo.log" | awk '{ print $3 }' | tr '\n' ' ')" = "completed lost " ]
  exactly_once 4 t1
  # 2. A's handler has called relaybus_complete (the lane row locked FOR
  # KEY SHARE) when A stops: B cannot take that lane over until it commits
  # (the ids e1..e4 again, for t2: the events of part 1, all done, go
  # first, or the same ids would be duplicates, which reach no handler
  # their name is not subscribed to)
  q "DELETE FROM relaybus_events"
  publish 4 t2
  export EO_MARK=$BATS_TEST_TMPDIR/2
  mkdir "$EO_MARK"
  EO_HOLD=e1 rb-dispatch -q -H t2 --pipe rb-test-eo-psql --lease 1s --chain 1 2>/dev/null 3>&- & a=$!
  PIDS="$PIDS $a"
  wait_for 20 '[ -e "$EO_MARK/e1.held" ]'
  local lane epoch
  lane=$(q "SELECT lane || ' ' || epoch FROM relaybus_lanes WHERE handler = 't2' AND lane = (SELECT lane FROM relaybus_deliveries WHERE handler = 't2' AND event_id = 'e1')")
  kill -STOP $a
  rb-dispatch -v -H t2 --pipe rb-test-eo-psql --lease 1s 2>"$BATS_TEST_TMPDIR/b.err" 3>&- & b=$!
  PIDS="$PIDS $b"
  # the other events go through B; e1's lane stays A's, at its epoch
  wait_for 30 '[ "$(q "SELECT count(*) FROM eo_rows WHERE handler = '"'"'t2'"'"'")" = 3 ]'
  sleep 2
  [ "$(q "SELECT lane || ' ' || epoch FROM relaybus_lanes WHERE handler = 't2' AND lane = ${lane%% *}")" = "$lane" ]
  [ "$(q "SELECT count(*) FROM eo_rows WHERE handler = 't2' AND event_id = 'e1'")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 't2' AND event_id = 'e1'")" = 1 ]
  : >"$EO_MARK/e1.go"
  wait_for 20 '[ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '"'"'t2'"'"'")" = 0 ]'
  kill -TERM $b; wait $b || true
  exactly_once 4 t2
  [ "$(attempt_of t2 e1)" = 1 ]
  grep -qE " ([0-9]+) completed, .*, 0 lost, \1 completed by the handler" "$BATS_TEST_TMPDIR/b.err"
}

@test "a stale lease returns lost and changes nothing; a \"completed\" the store cannot see is not taken on trust" {
  pg_only "relaybus_complete is a PostgreSQL function"
  need_pg
  publish 1 s1
  local old new snap
  old=$(rb-claim -q -H s1 --lease 1s --owner o1)
  sleep 1.2
  new=$(rb-claim -q -H s1 --lease 30s --owner o2)
  [ "$(jq -r .lease <<<"$old")" != "$(jq -r .lease <<<"$new")" ]
  snap="SELECT (SELECT jsonb_agg(to_jsonb(d)) FROM relaybus_deliveries d WHERE handler = 's1')::text
     || (SELECT jsonb_agg(to_jsonb(l)) FROM relaybus_lanes l WHERE handler = 's1' AND lease_owner IS NOT NULL)::text"
  local before
  before=$(q "$snap")
  [ "$(q "SELECT relaybus_complete('$old'::jsonb)")" = lost ]
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$old")', 'e1', 's1')")" = lost ]
  # and as a result line: lost, nothing applied
  run -0 rb-complete -o --no-relinquish <<<"$(jq -c '. + {completed: true}' <<<"$old")"
  [ "$(jq -r .outcome <<<"$output")" = lost ]
  [ "$(q "$snap")" = "$before" ]
  # the current lease, "completed": true, but the handler never completed
  # it (no relaybus_complete, or no COMMIT): not completed, a failure that
  # runs again (its second attempt: the takeover charged o1's)
  run -0 rb-complete -o <<<"$(jq -c '. + {completed: true}' <<<"$new")"
  [ "$(jq -r .outcome <<<"$output")" = rescheduled ]
  [ "$(q "SELECT status || ' ' || attempts || ' ' || last_error FROM relaybus_deliveries WHERE handler = 's1'")" = \
    "pending 2 \"completed\": true, but the delivery is still pending under this lease (the handler's transaction did not commit, or did not call relaybus_complete)" ]
  # "completed" must be a boolean, and not beside "ok": false
  run -65 --separate-stderr rb-complete <<<"$(jq -c '. + {completed: "yes"}' <<<"$new")"
  [[ "$stderr" == *"stdin:1: field 'completed' must be true or false: not applied"* ]]
  run -65 --separate-stderr rb-complete <<<"$(jq -c '. + {ok: false, completed: true}' <<<"$new")"
  [[ "$stderr" == *"field 'completed' is true, but 'ok' is false"* ]]
}

@test "MongoDB: a \"completed\": true result whose delivery is still pending under its lease fails with the reason" {
  on_mongo || skip "MongoDB only (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  publish 1 m1
  run -0 --separate-stderr sh -c 'rb-claim -q -H m1 | jq -c ". + {completed: true}" | rb-complete -o'
  [ "$(jq -r .outcome <<<"$output")" = rescheduled ]
  [ "$(rbq find deliveries '{}' attempts lastError)" = \
    "1 \"completed\": true, but the delivery is still pending under this lease (the handler's transaction did not commit, or did not call rb_mongo_complete)" ]
}
