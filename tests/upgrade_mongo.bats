#!/usr/bin/env bats
# The upgrade of a relaybus 0.1.0 MongoDB database in place by rb-setup
# (tests/fixtures/mongo-0.1.0.json, loaded with rbq), looked at in its
# documents.  Runs with RELAYBUS_TEST_STORE=mongo (scripts/test's second
# pass); skips otherwise.  tests/upgrade.bats is the same for PostgreSQL.

load test_helper

setup() {
  on_mongo || skip "a MongoDB database of relaybus 0.1.0 (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  drop_schema
}

teardown() {
  on_mongo || return 0
  drop_schema
}

fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }
load_010() { rbq load "$RB_SRCDIR/tests/fixtures/mongo-0.1.0.json"; }
# every delivery: "event:handler:status:attempts:error"
deliveries() {
  rbq find deliveries '{}' eventId handler status attempts lastError | sort | tr ' ' : | tr '\n' ' '
}
# everything in the database, for "nothing changed" (one line per document, sorted)
dump() {
  local c
  for c in events deliveries lanes keys counters subscriptions schema_version; do
    /usr/bin/python3 - "$(mongo_file_url)" "$RB_SCHEMA.$c" <<'PY'
import sys, pymongo
db = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000).get_default_database()
for d in db[sys.argv[2]].find({}):
    print(sys.argv[2], sorted(d.items(), key=lambda kv: kv[0]))
for ix in db[sys.argv[2]].list_indexes():
    print(sys.argv[2], "index", ix["name"], sorted(ix.items()))
PY
  done | sort
}

@test "the fixture is 0.1.0: leases in the deliveries, dueAt, eight 0.1.0 indexes, no handlers" {
  load_010
  [ "$(rbq count deliveries)" = 14 ]
  [ "$(rbq count deliveries '{"leaseToken":{"$ne":null}}')" = 2 ]
  [ "$(rbq count deliveries '{"status":"processing"}')" = 2 ]
  [ "$(rbq count deliveries '{"laneId":{"$exists":true}}')" = 0 ]
  [ "$(rbq indexes deliveries | grep -vc '^_id_$')" = 8 ]
  [ "$(rbq count events '{"handlers":{"$exists":true}}')" = 0 ]
}

@test "every program refuses a 0.1.0 database with one line naming rb-setup (exit 79); nothing is changed" {
  load_010
  before=$(dump)
  msg="schema \"$RB_SCHEMA\" holds the 0.1.0 row-lease schema, this relaybus needs schema version 1: stop the 0.1.0 workers and run rb-setup"
  for cmd in "rb-publish" "rb-claim -H mailer" "rb-complete" "rb-admin stats" "rb-dispatch -H mailer --exec true --drain"; do
    run --separate-stderr $cmd </dev/null
    [ "$status" -eq 79 ] || { echo "$cmd: exit $status: $stderr"; false; }
    [ "${#stderr_lines[@]}" -eq 1 ]
    [[ "$stderr" == "${cmd%% *}: "*"$msg" ]]
  done
  run --separate-stderr rb-setup --check
  [ "$status" -eq 79 ]
  [ "$output" = "schema $RB_SCHEMA: the 0.1.0 row-lease schema; relaybus 0.2.0 expects schema version 1: upgrade due, run rb-setup" ]
  [ "$(dump)" = "$before" ]
}

@test "rb-setup upgrades 0.1.0 in place: processing to pending with its attempts, leases and dueAt gone, laneId, handlers, lanes, old indexes dropped" {
  load_010
  run --separate-stderr rb-setup -v
  [ "$status" -eq 0 ]
  [[ "$stderr" == *"schema $RB_SCHEMA upgraded from the 0.1.0 row-lease schema to schema version 1"* ]]
  [ "$(rb-setup --check)" = "schema $RB_SCHEMA: schema version 1; relaybus 0.2.0 expects schema version 1: up to date" ]
  [ "$(deliveries)" = "o1:audit:completed:1:null o1:mailer:completed:1:null o2:audit:pending:0:null o2:mailer:pending:1:null o3:audit:pending:0:null o3:mailer:pending:0:null o4:audit:completed:2:null o4:mailer:dead:10:boom o5:mailer:pending:0:null u6:mailer:pending:2:timeout u7:mailer:completed:1:null u8:mailer:dead:3:nope u9:audit:pending:0:null u9:mailer:pending:0:null " ]
  [ "$(rbq count deliveries '{"$or":[{"leaseOwner":{"$exists":true}},{"leaseToken":{"$exists":true}},{"leaseExpiresAt":{"$exists":true}},{"dueAt":{"$exists":true}}]}')" = 0 ]
  [ "$(rbq count deliveries '{"availableAt":{"$type":"date"},"claims":0,"laneId":{"$type":"int"}}')" = 14 ]
  # laneId is what a new delivery of the same key gets, and the key's counter goes on
  echo '{"id":"n1","name":"order","key":"K1","payload":{"i":10},"handlers":["mailer"]}' | rb-publish -q
  [ "$(rbq find deliveries '{"eventId":"n1"}' laneId seq)" = "$(rbq find deliveries '{"eventId":"o2","handler":"mailer"}' laneId) 4" ]
  [ "$(rbq find deliveries '{"key":"K1"}' laneId | sort -u | wc -l)" = 1 ]
  # and of an unkeyed one, the hash of its event id: the lane rb-admin list shows for a new one
  # (a redelivery reaches a handler subscribed to its name since, and no other)
  rb-setup -q -s audit:note
  echo '{"id":"u6","name":"note","payload":{"i":6},"handlers":["audit"]}' | rb-publish -q
  rb-setup -q --unsubscribe audit:note
  [ "$(rbq find deliveries '{"eventId":"u6","handler":"audit"}' laneId)" = "$(rbq find deliveries '{"eventId":"u6","handler":"mailer"}' laneId)" ]
  # events remember their handlers, completed ones included
  [ "$(rbq find events '{}' _id handlers | tr -d '"[]' | tr ' ' = | tr '\n' ' ')" = "n1=mailer o1=mailer,audit o2=mailer,audit o3=mailer,audit o4=mailer,audit o5=mailer u6=mailer,audit u7=mailer u8=mailer u9=mailer,audit " ]
  [ "$(rbq count events '{"createdAt":{"$type":"date"}}')" = 10 ]
  # the 256 lanes of each handler; the indexes are those of a fresh database
  [ "$(rbq count lanes '{"handler":"mailer"}') $(rbq count lanes '{"handler":"audit"}')" = "256 256" ]
  fresh=${RB_SCHEMA:0:44}_fresh
  RELAYBUS_SCHEMA=$fresh rb-setup
  for c in deliveries events lanes keys; do
    [ "$(rbq indexes $c)" = "$(/usr/bin/python3 "$RB_SRCDIR/tests/mongo/rbq.py" "$(mongo_file_url)" "$fresh" indexes $c)" ]
  done
  [ "$(rbq indexes deliveries | tr '\n' ' ')" = "_id_ dead event_handler ready_due ready_key " ]
}

@test "0.1.0's parked deliveries come back ready: a claim reads only ready ones, and 0.1.0 left no marker" {
  load_010
  # K1's mailer o3 parked behind o2 (processing), as 0.1.0 could leave it
  [ "$(rbq update deliveries '{"_id":5}' '{"$set":{"lane":"parked"}}')" = 1 ]
  rb-setup
  [ "$(rbq count deliveries '{"lane":{"$ne":"ready"}}')" = 0 ]
  # the lane_due and lane_key indexes of a set-up before parking go too
  /usr/bin/python3 - "$(mongo_file_url)" "$RB_SCHEMA.deliveries" <<'PY'
import sys, pymongo
c = pymongo.MongoClient(sys.argv[1], serverSelectionTimeoutMS=5000).get_default_database()[sys.argv[2]]
c.create_index([("handler", 1), ("laneId", 1), ("status", 1), ("key", 1), ("availableAt", 1)], name="lane_due")
c.create_index([("handler", 1), ("laneId", 1), ("status", 1), ("key", 1), ("seq", 1)], name="lane_key")
PY
  rb-setup
  [ "$(rbq indexes deliveries | tr '\n' ' ')" = "_id_ dead event_handler ready_due ready_key " ]
  # o2 (K1's head, its 0.1.0 lease gone), then o3: not left parked for ever
  run -0 rb-claim -H mailer -b 10 --owner c1
  [ "$(jq -r 'select(.key == "K1") | .event_id' <<<"$output" | tr '\n' ' ')" = "o2 " ]
  jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  run -0 rb-claim -H mailer -b 10 --owner c1
  [ "$(jq -r 'select(.key == "K1") | .event_id' <<<"$output" | tr '\n' ' ')" = "o3 " ]
}

@test "a second rb-setup changes nothing" {
  load_010
  rb-setup
  before=$(dump)
  run --separate-stderr rb-setup -v
  [ "$status" -eq 0 ]
  [[ "$stderr" != *upgraded* ]]
  [ "$(dump)" = "$before" ]
}

@test "after the upgrade a drain keeps each key's order and the attempts; dead stay dead; completed never run again" {
  load_010
  rb-setup
  printf '%s\n' '{"id":"n11","name":"order","key":"K1","payload":{"i":11},"handlers":["mailer","audit"]}' \
    '{"id":"n12","name":"order","key":"K2","payload":{"i":12},"handlers":["mailer","audit"]}' \
    '{"id":"n13","name":"note","payload":{"i":13},"handlers":["mailer","audit"]}' | rb-publish -q
  # a redelivery of an event that completed under 0.1.0 adds nothing
  run rb-publish -o <<<'{"id":"o1","name":"order","key":"K1","payload":{"i":1},"handlers":["mailer","audit"]}'
  [ "$(fields '.duplicate,.deliveries' <<<"$output")" = "true 0" ]
  local m=$BATS_TEST_TMPDIR/mailer a=$BATS_TEST_TMPDIR/audit
  run -0 --separate-stderr rb-dispatch -H mailer --pipe "rb-test-pipe $m" --chain 4 --drain
  run -0 --separate-stderr rb-dispatch -H audit --exec "rb-test-exec $a" --drain
  # what ran, in the order it ran per key ("event key i attempt")
  [ "$(grep ' K1 ' "$m" | cut -d' ' -f1,4 | tr '\n' ' ')" = "o2 2 o3 1 n11 1 " ]
  [ "$(grep ' K2 ' "$m" | cut -d' ' -f1,4 | tr '\n' ' ')" = "o5 1 n12 1 " ]
  [ "$(grep ' - ' "$m" | cut -d' ' -f1,4 | sort | tr '\n' ' ')" = "n13 1 u6 3 u9 1 " ]
  [ "$(wc -l <"$m")" -eq 8 ]
  [ "$(grep ' K1 ' "$a" | cut -d' ' -f1 | tr '\n' ' ')" = "o2 o3 n11 " ]
  [ "$(cut -d' ' -f1 "$a" | sort | tr '\n' ' ')" = "n11 n12 n13 o2 o3 u9 " ]
  # dead stay dead with their attempts and errors; completed ones stay completed
  [ "$(deliveries)" = "o1:audit:completed:1:null o1:mailer:completed:1:null o4:audit:completed:2:null o4:mailer:dead:10:boom u7:mailer:completed:1:null u8:mailer:dead:3:nope " ]
  # a dead one requeued runs
  run -0 rb-admin requeue --handler mailer o4
  run -0 --separate-stderr rb-dispatch -H mailer --pipe "rb-test-pipe $m" --drain
  [ "$(tail -1 "$m" | cut -d' ' -f1,2,4)" = "o4 K2 1" ]
}

@test "the completed deliveries of 0.1.0 are listed, counted, never buried or cancelled, and purged by completion time" {
  load_010
  rb-setup
  run -0 --separate-stderr rb-admin list --status completed
  [ "$(fields '.event_id,.handler,.status,.attempts' <<<"$output" | sort | tr '\n' ,)" = "o1 audit completed 1,o1 mailer completed 1,o4 audit completed 2,u7 mailer completed 1," ]
  ts=$(jq -r .completed_at <<<"${lines[0]}")
  [ $(( $(date +%s) - 7200 - $(date -d "$ts" +%s) )) -lt 60 ]
  [ "$(rb-admin list | jq -r .status | sort | uniq -c | tr -s ' ' | tr '\n' ,)" = " 2 dead, 8 pending," ]
  run -0 rb-admin show o4
  [ "$(jq -r '[.deliveries[] | .handler + ":" + .status] | sort | join(",")' <<<"$output")" = "audit:completed,mailer:dead" ]
  run -0 rb-admin stats
  [ "$(fields '.handler,.pending,.completed' <<<"$output" | tr '\n' ,)" = "audit 3 2,mailer 5 2,null 8 4," ]
  run -0 rb-admin stats --prometheus
  [[ "$output" == *"relaybus_completions{schema=\"$RB_SCHEMA\"} 4"* ]]
  printf '%s\n' "$output" | python3 "$RB_SRCDIR/tests/prom_lint.py"
  # bury and cancel leave them alone
  run -0 rb-admin bury --event o1
  run -0 rb-admin cancel --event o4
  [ "$(rbq count deliveries '{"status":"completed"}')" = 4 ]
  run -0 --separate-stderr rb-admin purge --completed-older-than 3h
  [ "$(fields '.completed' <<<"$output")" = 0 ]
  run -0 --separate-stderr rb-admin purge --completed-older-than 1h --batch 3
  [ "$(fields '.completed' <<<"$output")" = 4 ]
  [ "$(rbq count deliveries '{"status":"completed"}')" = 0 ]
  run -0 rb-admin list --status completed
  [ -z "$output" ]
}

@test "laneId and handlers are backfilled in batches: 2,500 deliveries of 2,500 events" {
  awk 'BEGIN {
    printf "{\"documents\": {\"events\": ["
    for (i = 1; i <= 2500; i++) printf "%s{\"_id\": \"b%d\", \"name\": \"bulk\", \"key\": \"B%d\", \"payload\": {\"i\": %d}, \"headers\": {}}", (i > 1 ? ", " : ""), i, i % 7, i
    printf "], \"deliveries\": ["
    for (i = 1; i <= 2500; i++) printf "%s{\"_id\": %d, \"eventId\": \"b%d\", \"handler\": \"bulk\", \"key\": \"B%d\", \"seq\": %d, \"status\": \"%s\", \"dueAt\": {\"$now\": 0}, \"attempts\": %d, \"leaseOwner\": %s, \"leaseToken\": %s, \"leaseExpiresAt\": null, \"lastError\": null, \"createdAt\": {\"$now\": 0}, \"updatedAt\": {\"$now\": 0}, \"completedAt\": null, \"lane\": \"ready\"}", (i > 1 ? ", " : ""), i, i, i % 7, int((i + 6) / 7), (i % 100 == 0 ? "processing" : "pending"), (i % 100 == 0 ? 1 : 0), (i % 100 == 0 ? "\"w\"" : "null"), (i % 100 == 0 ? "\"t\"" : "null")
    printf "], \"keys\": ["
    for (k = 0; k < 7; k++) printf "%s{\"_id\": \"B%d\", \"seq\": 358}", (k > 0 ? ", " : ""), k
    printf "], \"counters\": [{\"_id\": \"deliveries\", \"n\": 2500}]}}\n"
  }' >"$BATS_TEST_TMPDIR/bulk.json"
  rbq load "$BATS_TEST_TMPDIR/bulk.json"
  rb-setup
  [ "$(rbq count deliveries '{"laneId":{"$type":"int"}}')" = 2500 ]
  [ "$(rbq count events '{"handlers":["bulk"]}')" = 2500 ]
  [ "$(rbq count deliveries '{"status":"pending","attempts":1}')" = 25 ]
  # one lane per key, each the one a new delivery of the key gets
  [ "$(rbq find deliveries '{}' key laneId | sort -u | wc -l)" = 7 ]
  echo '{"id":"n","name":"bulk","key":"B3","payload":1,"handlers":["bulk"]}' | rb-publish -q
  [ "$(rbq find deliveries '{"key":"B3"}' laneId | sort -u | wc -l)" = 1 ]
  [ "$(rbq find deliveries '{"eventId":"n"}' seq)" = 359 ]
}
