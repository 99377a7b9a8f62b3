#!/usr/bin/env bats
# Effectively-once handlers on MongoDB (issue 40; relaybus(7) MONGODB
# DOCUMENTS, "Completing in the handler's transaction"): a Python handler
# (tests/bin/rb-test-eo-mongo, with examples/relaybus_mongo.py) inserts
# its business document and completes its delivery in one MongoDB
# transaction, answering "completed": true (--exec: exit 80).  Real
# processes, killed with kill -9 at chosen points of chosen events (before
# the commit, between the commit and the answer, while a takeover happens),
# once each.  At the end every event has exactly one business document and
# no delivery is left, pending or dead.  The C completion itself
# (rb_mongo_complete: rb-complete's transaction in the caller's session)
# races a takeover in tests/unit/mongo_race.  Runs with
# RELAYBUS_TEST_STORE=mongo; skips otherwise.

load test_helper

setup() {
  on_mongo || skip "MongoDB only (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  drop_schema
  rb-setup -q
  # the business collection exists before the handlers' transactions (two
  # transactions that would create it implicitly conflict)
  rbq insert eo_docs '{"setup":1}'
  rbq reset eo_docs
  export EO_DB=$RELAYBUS_URL EO_SCHEMA=$RB_SCHEMA EO_MARK=$BATS_TEST_TMPDIR
}

teardown() {
  local p f
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  for f in "${EO_MARK:-/nonexistent}"/*.early; do
    [ -e "$f" ] && : >"${f%.*}.go"
  done
  on_mongo && drop_schema || true
}

# N events for HANDLER, ids e1..eN, the odd ones keyed (3 keys: chains)
publish() {  # n handler
  awk -v n="$1" -v h="$2" 'BEGIN {
    for (i = 1; i <= n; i++)
      if (i % 2) printf "{\"id\":\"e%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", i, i % 3, i, h
      else printf "{\"id\":\"e%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", i, i, h
  }' | rb-publish -q
}

# every one of the N events of HANDLER has exactly one business document,
# and no delivery of HANDLER is left (pending or dead)
exactly_once() {  # n handler
  local docs
  docs=$(/usr/bin/python3 -c '
import sys, pymongo
db = pymongo.MongoClient(sys.argv[1]).get_default_database()
c = db[sys.argv[2] + ".eo_docs"]
evs = [d["event_id"] for d in c.find({"handler": sys.argv[3]})]
print(len(set(evs)), len(evs))' "$(mongo_file_url)" "$RB_SCHEMA" "$2")
  [ "$docs" = "$1 $1" ] || { echo "business documents (events, documents): $docs, want $1 $1" >&2; return 1; }
  [ "$(rbq count deliveries "{\"handler\":\"$2\"}")" = 0 ]
}
# ID committed, was killed before answering, and never ran again
crashed_after() {  # handler id
  [ -e "$EO_MARK/$2.crash_after" ] && [ "$(grep -c "^$2 " "$EO_MARK/eo.log")" = 1 ] &&
    [ "$(grep -c "^$2 .* completed\$" "$EO_MARK/eo.log")" = 1 ]
}
# ID was killed inside its transaction, and ran again: completed once
crashed_before() {  # handler id
  [ -e "$EO_MARK/$2.crash_before" ] && [ "$(grep -c "^$2 .* completed\$" "$EO_MARK/eo.log")" = 1 ]
}
attempt_of() { rbq find eo_docs "{\"handler\":\"$1\",\"event_id\":\"$2\"}" attempt | paste -sd, -; }

@test "--pipe, Python handler: kill -9 before and after its commit; one document per event, all completed by the handler, none lost" {
  publish 12 p1
  EO_CRASH_BEFORE="e3" EO_CRASH_AFTER="e5 e8" \
    run -0 --separate-stderr timeout 120 rb-dispatch -v -H p1 --pipe rb-test-eo-mongo --settle --lease 5s
  echo "$stderr" | tail -5
  exactly_once 12 p1
  # e5, e8: committed, then the handler died before answering: their
  # deliveries gone under the still-held lease, completed by the handler
  [[ "$stderr" == *"e5: completed by the handler (its delivery is gone, the lease held)"* ]]
  [[ "$stderr" == *"e8: completed by the handler (its delivery is gone, the lease held)"* ]]
  crashed_after p1 e5
  crashed_after p1 e8
  # e3: aborted with the handler, ran again
  crashed_before p1 e3
  [[ "$stderr" == *" 12 completed, "*", 0 lost, 12 completed by the handler"* ]]
}

@test "--exec: exit 80 says completed by the handler; killed after its commit it still counts as completed" {
  publish 8 x1
  EO_CRASH_BEFORE="e2" EO_CRASH_AFTER="e3 e6" \
    run -0 --separate-stderr timeout 120 rb-dispatch -v -H x1 --exec "rb-test-eo-mongo --exec" --settle --lease 5s
  echo "$stderr" | tail -5
  exactly_once 8 x1
  [[ "$stderr" == *"e3: completed by the handler (its delivery is gone, the lease held)"* ]]
  crashed_after x1 e3
  crashed_after x1 e6
  crashed_before x1 e2
  [ "$(attempt_of x1 e2)" = 2 ]
  [[ "$stderr" == *" 8 completed, 1 failed and rescheduled, 0 dead, "*", 0 lost, 8 completed by the handler"* ]]
}

@test "rb-claim | Python handler | rb-complete: crashes before and after the commit; \"completed\" lines count as completed by the handler" {
  publish 10 c1
  local out=$BATS_TEST_TMPDIR/out i
  export EO_CRASH_BEFORE="e1" EO_CRASH_AFTER="e4"
  for i in $(seq 1 60); do
    [ "$(rbq count deliveries '{"handler":"c1"}')" = 0 ] && break
    { rb-claim -q -H c1 --lease 1s --batch 4 | rb-test-eo-mongo | rb-complete -o; } \
      >>"$out" 2>>"$out.err" || true
    sleep 0.2
  done
  exactly_once 10 c1
  crashed_after c1 e4
  crashed_before c1 e1
  # e4's answer never came (its round crashed): 9 lines, each completed by the handler
  [ "$(jq -r '"\(.outcome) \(.by)"' "$out" | sort | uniq -c | awk '{ print $1, $2, $3 }')" = "9 completed handler" ]
}

@test "a takeover while the handler's transaction is open: the stale completion aborts, the new holder's counts" {
  publish 4 t1
  local a
  # A's handler is inside e1's transaction (its business document written,
  # not completed) when A stops (SIGSTOP: a paused machine; a dead
  # dispatcher's guard would kill its handlers); B takes the lanes over and
  # runs e1; A's handler then completes with its stale lease: lost, aborted
  EO_HOLD_EARLY=e1 rb-dispatch -q -H t1 --pipe rb-test-eo-mongo --lease 1s 2>/dev/null 3>&- & a=$!
  PIDS=$a
  wait_for 20 '[ -e "$EO_MARK/e1.early" ]'
  kill -STOP $a
  sleep 1.5	# (A's lease ends)
  run -0 --separate-stderr timeout 60 rb-dispatch -v -H t1 --pipe rb-test-eo-mongo --settle --lease 1s
  [ "$(attempt_of t1 e1)" = 2 ]
  : >"$EO_MARK/e1.go"
  wait_for 20 '[ "$(grep -c "^e1 " "$EO_MARK/eo.log")" = 2 ]'
  [ "$(grep "^e1 " "$EO_MARK/eo.log" | awk '{ print $3 }' | tr '\n' ' ')" = "completed lost " ]
  exactly_once 4 t1
}

@test "a \"completed\": true whose delivery is still pending under the lease is not taken on trust: it fails and runs again" {
  publish 1 m1
  local line
  line=$(rb-claim -q -H m1)
  run -0 --separate-stderr rb-complete -o <<<"$(jq -c '. + {completed: true}' <<<"$line")"
  [ "$(jq -r .outcome <<<"$output")" = rescheduled ]
  [ "$(rbq find deliveries '{}' attempts lastError)" = \
    "1 \"completed\": true, but the delivery is still pending under this lease (the handler's transaction did not commit, or did not call rb_mongo_complete)" ]
  # a stale lease: lost, nothing applied
  run -0 --separate-stderr rb-complete -o <<<"$(jq -c '. + {completed: true}' <<<"$line")"
  [ "$(jq -r .outcome <<<"$output")" = lost ]
}
