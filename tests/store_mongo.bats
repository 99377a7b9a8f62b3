#!/usr/bin/env bats
# The MongoDB store's own behaviour, looked at in its documents (rbq):
# the data model, claims that write no delivery document, fencing by lane
# epoch, takeovers that charge, the restarted-holder rule.  Runs with
# RELAYBUS_TEST_STORE=mongo (scripts/test's second pass); skips otherwise.

load test_helper

setup_file() { on_mongo || return 0; drop_schema; have_pg || return 0; rb-setup -s 'h1:job.*' -s 'k:keyed.*'; }
teardown_file() { on_mongo || return 0; drop_schema; }
setup() {
  on_mongo || skip "the MongoDB store's documents (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  mongo_fresh_store
}

ok_all() { jq -c '. + {ok: true}'; }
# the server's operations so far: serverStatus opcounters, summed
server_ops() {
  /usr/bin/python3 -c 'import sys, pymongo
print(sum(pymongo.MongoClient(sys.argv[1]).admin.command("serverStatus")["opcounters"].values()))' "$(mongo_file_url)"
}
field() { jq -r ".$1"; }

@test "rb-setup: the collections, 256 lanes per subscribed handler, idempotent and concurrent" {
  [ "$(rbq count lanes '{"handler":"h1"}')" = 256 ]
  [ "$(rbq count lanes '{"handler":"k"}')" = 256 ]
  [ "$(rbq count schema_version)" = 1 ]
  rb-setup -s 'h1:job.*' & p1=$!
  rb-setup -s 'h3:job.*' & p2=$!
  wait $p1
  wait $p2
  [ "$(rbq count lanes '{"handler":"h3"}')" = 256 ]
  [ "$(rbq count subscriptions '{"handler":"h1"}')" = 1 ]
  rb-setup --unsubscribe 'h3:job.*'
  [ "$(rbq count subscriptions '{"handler":"h3"}')" = 0 ]
}

@test "--print-sql on a mongodb:// URL: not supported by the mongodb backend (69)" {
  run --separate-stderr rb-setup --print-sql
  [ "$status" -eq 69 ]
  [ "$stderr" = "rb-setup: setup_script not supported by the mongodb backend" ]
}

@test "publish: handlers, dedup of a redelivered id, per-key sequences, lanes as rb_lane, delays" {
  printf '%s\n' '{"id":"a","name":"job.x","payload":{"n":1}}' \
    '{"id":"b","name":"job.x","key":"K","payload":2}' '{"id":"c","name":"job.x","key":"K","payload":3}' \
    '{"id":"later","name":"job.x","payload":0,"delay_ms":600000}' | rb-publish -q
  [ "$(rbq find deliveries '{"key":"K"}' eventId seq)" = "b 1
c 2" ]
  [ "$(rbq find events '{"_id":"a"}' handlers)" = '["h1"]' ]
  # a redelivery adds only the delivery of a handler subscribed to its name since
  rb-setup -q -s 'h2:job.*'
  run -0 --separate-stderr rb-publish --output <<<'{"id":"a","name":"job.x","payload":{"n":1},"handlers":["h1","h2","h9"]}'
  [ "$output" = '{"event_id":"a","deliveries":1,"duplicate":true,"handlers":["h2"],"line":1}' ]
  rb-setup -q --unsubscribe 'h2:job.*'
  [ "$(rbq find events '{"_id":"a"}' handlers)" = '["h1","h2"]' ]
  [ "$(rbq count deliveries '{"eventId":"a"}')" = 2 ]
  # the lane of PostgreSQL's relaybus_lane (publish.bats: event id foobar 104, key a 44)
  printf '%s\n' '{"id":"foobar","name":"job.x","payload":1}' '{"id":"z","name":"job.x","key":"a","payload":1}' | rb-publish -q
  [ "$(rbq find deliveries '{"eventId":{"$in":["foobar","z"]}}' eventId laneId)" = "foobar 104
z 44" ]
  [ "$(rbq count deliveries '{"eventId":"later","availableAt":{"$gt":{"$now":300000}}}')" = 1 ]
}

@test "a claim writes only lane documents; the lease is lane:epoch:claims of the lane's epoch" {
  gen_events 20 job.x | rb-publish -q
  before=$(rbq find deliveries '{}' _id updatedAt claims attempts)
  rb-claim -H h1 --owner w1 --batch 20 >"$BATS_TEST_TMPDIR/c"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/c")" = 20 ]
  [ "$(rbq find deliveries '{}' _id updatedAt claims attempts)" = "$before" ]
  lease=$(head -n 1 "$BATS_TEST_TMPDIR/c" | field lease)
  lane=${lease%%:*}
  epoch=$(rbq find lanes "{\"_id\":\"h1/$lane\"}" epoch)
  [ "$lease" = "$lane:$epoch:0" ]
  [ "$(rbq find lanes "{\"_id\":\"h1/$lane\"}" owner)" = w1 ]
  ok_all <"$BATS_TEST_TMPDIR/c" | rb-complete -o >"$BATS_TEST_TMPDIR/o"
  [ "$(grep -c '"outcome":"completed"' "$BATS_TEST_TMPDIR/o")" = 20 ]
  [ "$(rbq count deliveries)" = 0 ]
}

@test "a handler name of 200 characters (the longest allowed): 256 lanes, every delivery claimed and completed" {
  h=$(printf 'h%.0s' {1..200})
  rb-setup -s "$h:long.*"
  [ "$(rbq count lanes "{\"handler\":\"$h\"}")" = 256 ]
  [ "$(rbq count lanes "{\"_id\":\"$h/255\",\"laneId\":255}")" = 1 ]
  gen_events 40 long.x | rb-publish -q
  rb-claim -H "$h" --owner w1 --batch 40 | ok_all | rb-complete -o >"$BATS_TEST_TMPDIR/o"
  [ "$(grep -c '"outcome":"completed"' "$BATS_TEST_TMPDIR/o")" = 40 ]
  [ "$(rbq count deliveries)" = 0 ]
  rb-setup --unsubscribe "$h:long.*"
}

@test "two concurrent claimers never get the same delivery" {
  gen_events 300 job.x | rb-publish -q
  for w in a b c; do rb-claim -q -H h1 --owner "w$w" --batch 100 >"$BATS_TEST_TMPDIR/$w" & done
  wait
  cat "$BATS_TEST_TMPDIR"/[abc] | field event_id | sort >"$BATS_TEST_TMPDIR/all"
  [ "$(sort -u "$BATS_TEST_TMPDIR/all" | wc -l)" = "$(wc -l <"$BATS_TEST_TMPDIR/all")" ]
  [ "$(wc -l <"$BATS_TEST_TMPDIR/all")" -gt 0 ]
}

@test "keyed: only a key's head is claimed; the next after its completion; chains are rb-dispatch's" {
  printf '%s\n' '{"id":"k1","name":"keyed.x","key":"A","payload":1}' '{"id":"k2","name":"keyed.x","key":"A","payload":2}' | rb-publish -q
  run -0 rb-claim -H k --owner w1
  [ "$(field event_id <<<"$output")" = k1 ]
  run -1 rb-claim -H k --owner w2
  ok_all <<<"$(rb-claim -H k --owner w1 --lease 1ms 2>/dev/null || true)" >/dev/null
  rbq update lanes '{"handler":"k"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  # the lease expired: w3 takes the lane over, charging k1 one attempt, and runs k1 again
  run -0 rb-claim -H k --owner w3
  [ "$(field event_id <<<"$output")" = k1 ]
  [ "$(field attempt <<<"$output")" = 2 ]
  ok_all <<<"$output" | rb-complete >/dev/null
  run -0 rb-claim -H k --owner w3
  [ "$(field event_id <<<"$output")" = k2 ]
}

@test "a stale lease completes nothing (lost); the takeover charged one attempt; the new holder completes" {
  gen_events 1 job.x | rb-publish -q
  rb-claim -H h1 --owner w1 >"$BATS_TEST_TMPDIR/old"
  rbq update lanes '{"handler":"h1"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  rb-claim -H h1 --owner w2 >"$BATS_TEST_TMPDIR/new"
  [ "$(field attempt <"$BATS_TEST_TMPDIR/new")" = 2 ]
  [ "$(rbq find deliveries '{}' attempts lastError)" = "1 lease of w1 expired: attempt lost" ]
  run -0 rb-complete -o < <(ok_all <"$BATS_TEST_TMPDIR/old")
  [[ "$output" == *'"outcome":"lost"'* ]]
  [ "$(rbq count deliveries)" = 1 ]
  run -0 rb-complete -o < <(ok_all <"$BATS_TEST_TMPDIR/new")
  [[ "$output" == *'"outcome":"completed"'* ]]
  [ "$(rbq count deliveries)" = 0 ]
}

@test "a restarted process reusing its owner name does not adopt its predecessor's live lanes" {
  gen_events 1 job.x | rb-publish -q
  rb-claim -H h1 --owner same >"$BATS_TEST_TMPDIR/first"
  # a new process, the same owner name: the lane is live and runs something
  run -1 rb-claim -H h1 --owner same
  rbq update lanes '{"handler":"h1","owner":"same"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  # after the lease: a takeover, charged
  run -0 rb-claim -H h1 --owner same
  [ "$(field attempt <<<"$output")" = 2 ]
  [ "$(field lease <"$BATS_TEST_TMPDIR/first")" != "$(field lease <<<"$output")" ]
}

@test "retry with backoff, dead after the maximum attempts, explicit dead, release charges nothing" {
  gen_events 3 job.x | rb-publish -q
  rb-claim -H h1 --owner w1 --batch 3 >"$BATS_TEST_TMPDIR/c"
  jq -c 'if .event_id == "e1" then . + {ok: false, error: "boom", retry_ms: 60000}
         elif .event_id == "e2" then . + {ok: false, dead: true, error: "bad"}
         else . + {ok: false, release: true} end' <"$BATS_TEST_TMPDIR/c" | rb-complete -o >"$BATS_TEST_TMPDIR/o"
  [ "$(jq -r 'select(.event_id == "e1") | .outcome + " " + (.attempts | tostring)' "$BATS_TEST_TMPDIR/o")" = "rescheduled 1" ]
  [ "$(jq -r 'select(.event_id == "e2") | .outcome' "$BATS_TEST_TMPDIR/o")" = buried ]
  [ "$(jq -r 'select(.event_id == "e3") | .outcome + " " + (.attempts | tostring)' "$BATS_TEST_TMPDIR/o")" = "released 0" ]
  [ "$(rbq find deliveries '{}' eventId status attempts lastError)" = "e1 pending 1 boom
e2 dead 1 bad
e3 pending 0 null" ]
  [ "$(rbq count deliveries '{"eventId":"e1","availableAt":{"$gt":{"$now":50000}}}')" = 1 ]
  # the released one is due again at once, for anyone
  run -0 rb-claim -H h1 --owner w9
  [ "$(field event_id <<<"$output")" = e3 ]
  [ "$(field attempt <<<"$output")" = 1 ]
  # max attempts: a failure reaching it buries
  ok_all <<<"$output" | jq -c '. + {ok: false}' | rb-complete -o --max-attempts 1 >"$BATS_TEST_TMPDIR/o2"
  [[ "$(cat "$BATS_TEST_TMPDIR/o2")" == *'"outcome":"buried"'* ]]
}

@test "a poison delivery whose worker always dies still ends dead" {
  gen_events 1 job.x | rb-publish -q
  for i in 1 2 3; do
    rb-claim -q -H h1 --owner "w$i" --max-attempts 3 >/dev/null || true
    rbq update lanes '{"handler":"h1"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  done
  run -1 rb-claim -H h1 --owner w4 --max-attempts 3
  [ "$(rbq find deliveries '{}' status attempts)" = "dead 3" ]
}

@test "rb-dispatch renews its leases while a delivery runs long and hands its lanes back when done" {
  gen_events 1 job.x | rb-publish -q
  run -0 --separate-stderr timeout 60 rb-dispatch -H h1 --owner dx --lease 1s --exec 'sleep 3' --drain
  [ "$(rbq count deliveries)" = 0 ]
  [ "$(rbq count lanes '{"owner":"dx"}')" = 0 ]
  [[ "$stderr" != *lost* ]]
}

@test "a completion that started before a takeover and one after: exactly one of the two wins" {
  gen_events 1 job.x | rb-publish -q
  rb-claim -H h1 --owner w1 >"$BATS_TEST_TMPDIR/c"
  lease=$(field lease <"$BATS_TEST_TMPDIR/c")
  rbq update lanes '{"handler":"h1"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  # the C completion (rb_mongo_complete: rb-complete's transaction in a
  # session of tests/unit/mongo_race) has read the lane and deleted the
  # delivery in its open transaction while rb-claim takes over
  run -0 --separate-stderr "$RB_BUILDDIR/tests/unit/mongo_race" "$(mongo_file_url)" "$RB_SCHEMA" "$(cat "$BATS_TEST_TMPDIR/c")" before \
    rb-claim -H h1 --owner w2
  [ "$output" = "completion committed; takeover charged nothing" ]
  [ "$(rbq count deliveries)" = 0 ]
  # and one whose snapshot predates a takeover that charged: it conflicts
  rb-publish -q <<<'{"id":"r2","name":"job.x","payload":2}'
  mongo_free_lanes
  rb-claim -H h1 --owner w1 >"$BATS_TEST_TMPDIR/c"
  lease=$(field lease <"$BATS_TEST_TMPDIR/c")
  rbq update lanes '{"handler":"h1"}' '{"$set":{"leaseExpiresAt":{"$now":-1000}}}' >/dev/null
  run -0 --separate-stderr "$RB_BUILDDIR/tests/unit/mongo_race" "$(mongo_file_url)" "$RB_SCHEMA" "$(cat "$BATS_TEST_TMPDIR/c")" after \
    rb-claim -H h1 --owner w2
  [ "$output" = "completion conflicted; takeover charged 1" ]
  [ "$(rbq find deliveries '{}' attempts)" = 1 ]
}

@test "rb-dispatch drains through the synchronous slots; polling, no LISTEN" {
  gen_events 50 job.x | rb-publish -q
  printf '%s\n' '{"id":"q1","name":"keyed.x","key":"Q","payload":{"i":1}}' '{"id":"q2","name":"keyed.x","key":"Q","payload":{"i":2}}' | rb-publish -q
  run -0 --separate-stderr timeout 60 rb-dispatch -H h1 --exec true --drain
  run -0 --separate-stderr timeout 60 rb-dispatch -H k --pipe "rb-test-pipe $BATS_TEST_TMPDIR/k.out" --drain
  [ "$(rbq count deliveries)" = 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/k.out")" = "q1 Q 1 1
q2 Q 2 1" ]
}

@test "a failure due again at once runs again under the lane held: claimed once, its key's next behind it" {
  gen_events 20 job.x | rb-publish -q
  for i in 1 2 3 4 5 6 7 8; do
    printf '{"id":"r%d","name":"keyed.x","key":"R","payload":{"i":%d}}\n' "$i" "$i"
  done | rb-publish -q
  local out=$BATS_TEST_TMPDIR/again.out
  run -0 --separate-stderr timeout 60 rb-dispatch -H h1 --exec 'test "$(jq .attempt)" = 2' --settle -v
  [[ "$stderr" == *": 20 claimed, 20 completed, 20 failed and rescheduled, 0 dead, 0 released, 0 lost,"* ]]
  run -0 --separate-stderr timeout 60 rb-dispatch -H k --pipe "rb-test-pipe $out first-fails" --chain 4 --settle -v
  [[ "$stderr" == *": 8 claimed, 8 completed, 8 failed and rescheduled, 0 dead, 0 released, 0 lost,"* ]]
  [ "$(rbq count deliveries)" = 0 ]
  # each attempt 1 then 2, the key in order
  [ "$(awk '{ printf "%s:%s ", $3, $4 }' "$out")" = "1:1 1:2 2:1 2:2 3:1 3:2 4:1 4:2 5:1 5:2 6:1 6:2 7:1 7:2 8:1 8:2 " ]
  # kept in flight, then completed: nothing left in a lane
  [ "$(rbq count lanes '{"handler":"k","inFlight":{"$ne":[]}}')" = 0 ]
}

@test "rb-dispatch --drain of a handler with nothing to do ends (exit 0), subscribed or not" {
  # (it claimed 0 forever here before the store's face that does not wait)
  run -0 --separate-stderr timeout 30 rb-dispatch -H h1 --exec true --drain
  [[ "$stderr" != *"no subscription"* ]] || { echo "$stderr"; false; }
  run -0 --separate-stderr timeout 30 rb-dispatch -H js --exec true --drain -v
  [[ "$stderr" == *"drained: nothing due, nothing in flight"* ]] || { echo "$stderr"; false; }
  # and with work done before: it ends once that is completed
  echo '{"id":"dr-1","name":"job.x","payload":{}}' | rb-publish -q
  run -0 --separate-stderr timeout 30 rb-dispatch -H h1 --exec true --drain
  [ "$(rbq count deliveries '{}')" = 0 ]
  run -0 --separate-stderr timeout 30 rb-dispatch -H h1 --pipe cat --drain
}

@test "--sql on MongoDB is a usage error (64); rb-pageinspect is not supported (69)" {
  gen_events 1 job.x | rb-publish -q
  rb-claim -H h1 --owner w1 >"$BATS_TEST_TMPDIR/c"
  run --separate-stderr rb-complete --sql 'SELECT 1' <"$BATS_TEST_TMPDIR/c"
  [ "$status" -eq 64 ]
  [[ "$stderr" == *"--sql is not supported by the mongodb backend"* ]]
  [ "$(rbq count deliveries)" = 1 ]
  run --separate-stderr timeout 20 rb-dispatch -H h1 --sql 'SELECT 1' --drain
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-dispatch: h1: --sql: not supported by the mongodb backend" ]
}

@test "an unreachable MongoDB exits 69; a server that is not a replica set exits 69 with one line" {
  run --separate-stderr env RELAYBUS_URL='mongodb://127.0.0.1:1/x?serverSelectionTimeoutMS=500' rb-setup
  [ "$status" -eq 69 ]
  [ "${#stderr_lines[@]}" = 1 ]
  d=$BATS_TEST_TMPDIR/sa
  mkdir -p "$d"
  /usr/bin/python3 "$RB_SRCDIR/tests/mongo/server.py" --standalone --port-file "$d/port" 2>/dev/null & sp=$!
  for _ in $(seq 50); do [ -s "$d/port" ] && break; sleep 0.1; done
  run --separate-stderr env RELAYBUS_URL="mongodb://127.0.0.1:$(cat "$d/port")/x" rb-setup
  kill $sp
  [ "$status" -eq 69 ]
  [ "$stderr" = "rb-setup: MongoDB at mongodb://127.0.0.1:$(cat "$d/port")/x is not a replica set or sharded cluster: relaybus needs transactions" ]
}

@test "rb-admin on MongoDB: stats, list, show, bury, requeue, cancel, purge, lanes, subscriptions" {
  gen_events 3 job.x | rb-publish -q
  rb-claim -H h1 --owner w1 --batch 1 >"$BATS_TEST_TMPDIR/c"
  run -0 rb-admin --json stats
  [ "$(jq -r 'select(.handler == "h1") | "\(.pending) \(.processing) \(.dead)"' <<<"$output")" = "2 1 0" ]
  run -0 rb-admin stats --prometheus
  [[ "$output" == *'relaybus_handler_deliveries{schema="'"$RB_SCHEMA"'",handler="h1",state="processing"} 1'* ]]
  running=$(field event_id <"$BATS_TEST_TMPDIR/c")
  idle=$(rbq find deliveries "{\"eventId\":{\"\$ne\":\"$running\"}}" eventId | head -n 1)
  run -0 rb-admin --json bury "$running" "$idle"
  [ "$(jq -r '.outcome' <<<"$output" | tr '\n' ' ')" = "skipped buried " ]
  run -0 rb-admin --json list --status dead
  [ "$(field event_id <<<"$output")" = "$idle" ]
  run -0 rb-admin --json requeue "$idle"
  [[ "$output" == *'"outcome":"requeued"'* ]]
  run -0 rb-admin --json cancel "$idle"
  [[ "$output" == *'"outcome":"cancelled"'* ]]
  [ "$(rbq count deliveries "{\"eventId\":\"$idle\"}")" = 0 ]
  run -0 rb-admin --json show "$idle"
  [ "$(jq -r '.event_id + " " + (.deliveries | length | tostring)' <<<"$output")" = "$idle 0" ]
  run -0 rb-admin purge --completed-older-than 0s
  [ "$(rbq count events "{\"_id\":\"$idle\"}")" = 0 ]
  run -0 rb-admin --json lanes --handler h1
  [ "$(jq -r '.owner' <<<"$output")" = w1 ]
  run -0 rb-admin --json subscriptions
  [ "$(jq -r '.handler + ":" + .pattern' <<<"$output" | tr '\n' ' ')" = "h1:job.* k:keyed.* " ]
}

@test "rb-admin stats on MongoDB: events without deliveries, their ids interleaved with the others' in byte order" {
  # odd ids have a delivery (job.x: h1), even ones none (a name nobody
  # subscribed); é sorts after every ASCII id, as MongoDB orders bytes
  local i
  for i in 1 2 3 4 5 6 7 8 9 10 11; do
    printf '{"id":"e%d","name":"%s","payload":{}}\n' "$i" "$( ((i % 2)) && echo job.x || echo none.x)"
  done | rb-publish -q
  printf '{"id":"%s","name":"%s","payload":{}}\n' "é" none.x "éz" job.x "A" none.x "e1x" none.x | rb-publish -q
  # the reference: each event's deliveries counted one by one
  local want=0 id
  for id in $(rbq find events '{}' _id); do
    [ "$(rbq count deliveries "{\"eventId\":\"$id\"}")" = 0 ] && want=$((want + 1))
  done
  [ "$want" = 8 ]
  # ids that are not strings (written by hand): counted one by one
  rbq insert events '{"_id": 5, "name": "none.x", "payload": {}}' '{"_id": 6, "name": "job.x", "payload": {}}' >/dev/null
  rbq insert deliveries '{"_id": 900006, "eventId": 6, "handler": "h9", "status": "dead"}' >/dev/null
  want=$((want + 1))
  run -0 rb-admin --json stats
  [ "$(jq -r 'select(.handler == null) | .events_without_deliveries' <<<"$output")" = "$want" ]
  # and it reads them in a few commands, not one an event (serverStatus'
  # opcounters are the server's: another test beside this one adds some)
  awk 'BEGIN { for (i = 1; i <= 2000; i++) printf "{\"id\":\"n%d\",\"name\":\"%s\",\"payload\":{}}\n", i, (i % 2 ? "none.x" : "job.x") }' |
    rb-publish -q
  local ops0 ops1
  ops0=$(server_ops)
  run -0 rb-admin --json stats
  ops1=$(server_ops)
  [ "$(jq -r 'select(.handler == null) | .events_without_deliveries' <<<"$output")" = $((want + 1000)) ]
  echo "stats: $((ops1 - ops0)) operations for 2,015 events"
  [ $((ops1 - ops0)) -lt 1000 ]
}
