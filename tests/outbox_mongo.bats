#!/usr/bin/env bats
# MongoDB as a transactional outbox (issue 40): the documents contract of
# relaybus(7) "MONGODB DOCUMENTS" (tests/fixtures/mongo-documents.json,
# checked against rb-publish's own documents), the dedup and conflict rule
# of a redelivered id, an application that publishes inside its own
# transaction (examples/mongo_outbox.py), and key counters purged.
# Runs with RELAYBUS_TEST_STORE=mongo, on the test server (tests/mongo) or
# a real MongoDB 6+ replica set (RELAYBUS_TEST_MONGO_URL); skips otherwise.

load test_helper

setup_file() {
  on_mongo || return 0
  drop_schema
  have_pg || return 0
  rb-setup -q -s 'A:order.*' -s 'B:order.paid' -s 'C:invoice.*'
}
teardown_file() { on_mongo || return 0; drop_schema; }
setup() {
  on_mongo || skip "the MongoDB store's documents (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  mongo_fresh_store
  rbq reset orders
}

@test "an id published again with another name, key or payload is a conflict (exit 81), as on PostgreSQL" {
  echo '{"id":"order-42","name":"order.paid","payload":{"amount":1000000,"to":"attacker"}}' | rb-publish -q
  run --separate-stderr rb-publish -o <<<'{"id":"order-42","name":"order.paid","payload":{"amount":5,"to":"alice"}}'
  echo "$stderr"
  [ "$status" -eq 81 ]
  [ -z "$output" ]
  [[ ${stderr_lines[0]} == 'rb-publish: stdin:1-1: publish: event id "order-42" exists with another name, key or payload (conflict): not published'* ]]
  # another key, another name: the same
  run --separate-stderr rb-publish <<<'{"id":"order-42","name":"order.paid","key":"k9","payload":{"amount":1000000,"to":"attacker"}}'
  [ "$status" -eq 81 ]
  run --separate-stderr rb-publish <<<'{"id":"order-42","name":"order.shipped","payload":{"amount":1000000,"to":"attacker"}}'
  [ "$status" -eq 81 ]
  # --keep-going: that line rejected, the others published, exit 81 at the end
  run --separate-stderr rb-publish -o --keep-going --rejects "$BATS_TEST_TMPDIR/rej" <<'EOF'
{"id":"ok-1","name":"order.paid","payload":{}}
{"id":"order-42","name":"order.paid","payload":{"amount":5,"to":"alice"}}
{"id":"ok-2","name":"order.paid","payload":{}}
EOF
  echo "$stderr"
  [ "$status" -eq 81 ]
  [ "$(jq -r .event_id <<<"$output" | tr '\n' ,)" = "ok-1,ok-2," ]
  [ "$(cat "$BATS_TEST_TMPDIR/rej")" = '{"id":"order-42","name":"order.paid","payload":{"amount":5,"to":"alice"}}' ]
  # the stored event is the first writer's; no delivery was added, no key counter moved
  [ "$(rbq find events '{"_id":"order-42"}' payload)" = '{"amount":1000000,"to":"attacker"}' ]
  [ "$(rbq count deliveries '{"eventId":"order-42"}')" = 2 ]
  [ "$(rbq count keys)" = 0 ]
}

@test "a genuine redelivery (same name, key and payload, any key order) is a duplicate that reaches only handlers subscribed since" {
  echo '{"id":"r1","name":"order.paid","key":"k","payload":{"a":1,"b":[1,2]},"headers":{"t":"1"},"handlers":["A"]}' | rb-publish -q
  [ "$(rbq find keys '{"_id":"k"}' seq)" = 1 ]
  # same data, other key order and headers, asking for every handler and an unknown one:
  # B is subscribed to order.paid, C is not (invoice.*), X not at all
  run -0 --separate-stderr rb-publish -o <<<'{"id":"r1","name":"order.paid","key":"k","payload":{ "b" : [1, 2], "a" : 1 },"headers":{"t":"2"},"handlers":["A","B","C","X"]}'
  [ "$(jq -c '[.duplicate, .deliveries, .handlers]' <<<"$output")" = '[true,1,["B"]]' ]
  [ "$(rbq find deliveries '{"eventId":"r1"}' handler seq | tr '\n' ,)" = "A 1,B 2," ]
  [ "$(rbq find events '{"_id":"r1"}' handlers)" = '["A","B"]' ]
  # again: nothing new, no counter moved
  run -0 --separate-stderr rb-publish -o <<<'{"id":"r1","name":"order.paid","key":"k","payload":{"a":1,"b":[1,2]}}'
  [ "$(jq -c '[.duplicate, .deliveries]' <<<"$output")" = '[true,0]' ]
  [ "$(rbq find keys '{"_id":"k"}' seq)" = 2 ]
}

# an event line for C: id key i [extra fields]
kev() { printf '{"id":"%s","name":"invoice.x","key":"%s","payload":{"i":%d}%s}\n' "$1" "$2" "$3" "${4:-}"; }
counters() { rbq find keys '{}' _id seq | tr ' \n' '= ' | sed 's/ $//'; }
fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }

@test "purge --keys removes the counters no delivery needs and keeps pending, in-flight and dead ones (the PostgreSQL rule)" {
  # K1: all done; K2: pending, not due yet; K3: in flight; K4: dead
  kev a1 K1 1 | rb-publish -q
  rb-dispatch -q -H C --exec true --drain
  kev c1 K3 1 | rb-publish -q
  run -0 rb-claim -H C --lease 5m
  [ "$(jq -r .event_id <<<"$output")" = c1 ]
  kev b1 K2 1 ',"delay_ms":3600000' | rb-publish -q
  kev d1 K4 1 | rb-publish -q
  rb-claim -H C --owner other | jq -c '. + {dead: true, error: "no"}' | rb-complete -q >/dev/null
  [ "$(rbq find deliveries '{"eventId":"d1"}' status)" = dead ]
  [ "$(counters)" = "K1=1 K2=1 K3=1 K4=1" ]
  run -0 --separate-stderr rb-admin purge --keys
  echo "$output $stderr"
  [ "$(fields '.keys,.dead,.events,.interrupted' <<<"$output")" = "1 0 0 false" ]
  [ "$(counters)" = "K2=1 K3=1 K4=1" ]
  run -0 --separate-stderr rb-admin purge --keys
  [ "$(fields '.keys' <<<"$output")" = 0 ]
  # K1's sequence starts again; in batches of 1, every counter is looked at once
  printf '%s\n' "$(kev a2 K1 2)" "$(kev a3 K1 3)" | rb-publish -q
  [ "$(rbq find deliveries '{"key":"K1"}' eventId seq | tr '\n' ,)" = "a2 1,a3 2," ]
  rb-dispatch -q -H C --exec true --drain
  run -0 --separate-stderr rb-admin purge --keys --batch 1
  [ "$(fields '.keys,.batches' <<<"$output")" = "1 1" ]
  [ "$(counters)" = "K2=1 K3=1 K4=1" ]
}

@test "a publish in progress keeps its key: the purge waits for its transaction, sees its delivery, and the sequence goes on" {
  kev w1 W 1 | rb-publish -q
  rb-dispatch -q -H C --exec true --drain
  [ "$(counters)" = "W=1" ]
  # an application's transaction of key W held open: its counter taken, its delivery written
  mkfifo "$BATS_TEST_TMPDIR/go"
  /usr/bin/python3 - "$(mongo_file_url)" "$RB_SCHEMA" "$BATS_TEST_TMPDIR/go" >"$BATS_TEST_TMPDIR/held" 2>&1 <<'PY' &
import sys, datetime, pymongo
url, schema, go = sys.argv[1:4]
c = pymongo.MongoClient(url)
db = c.get_default_database("relaybus")
with c.start_session() as s:
    s.start_transaction()
    k = db[schema + ".keys"].find_one_and_update({"_id": "W"}, {"$inc": {"seq": 1}}, upsert=True,
        return_document=pymongo.ReturnDocument.AFTER, session=s)
    now = datetime.datetime.now(datetime.timezone.utc)
    db[schema + ".deliveries"].insert_one({"_id": 999999, "eventId": "w2", "handler": "C", "laneId": 214,
        "key": "W", "seq": k["seq"], "status": "pending", "availableAt": now, "attempts": 0, "claims": 0,
        "lastError": None, "createdAt": now, "updatedAt": now, "lane": "ready"}, session=s)
    print("held", flush=True)
    open(go).read()
    s.commit_transaction()
    print("committed", flush=True)
PY
  held=$!
  wait_for 10 grep -q held "$BATS_TEST_TMPDIR/held"
  rb-admin purge --keys >"$BATS_TEST_TMPDIR/purge" 2>"$BATS_TEST_TMPDIR/purge.err" &
  purge=$!
  sleep 1
  # the purge has not finished while the publish is open
  kill -0 $purge
  echo go >"$BATS_TEST_TMPDIR/go"
  wait $held
  wait $purge
  cat "$BATS_TEST_TMPDIR/purge"
  [ "$(fields '.keys' <"$BATS_TEST_TMPDIR/purge")" = 0 ]
  [ "$(counters)" = "W=2" ]
}

@test "the documents contract: rb-publish's documents are the test vectors' (tests/fixtures/mongo-documents.json)" {
  run -0 /usr/bin/python3 "$RB_SRCDIR/tests/mongo/vectors.py" "$RB_SRCDIR/tests/fixtures/mongo-documents.json" \
    "$(mongo_file_url)" "$RB_SCHEMA" rb-publish
  echo "$output"
  [ "$(grep -c '^ok ' <<<"$output")" = 3 ]
}

@test "the documents contract: examples/relaybus_mongo.py (an application's publisher) produces the same documents" {
  run -0 /usr/bin/python3 "$RB_SRCDIR/tests/mongo/vectors.py" "$RB_SRCDIR/tests/fixtures/mongo-documents.json" \
    "$(mongo_file_url)" "$RB_SCHEMA" python
  echo "$output"
  [ "$(grep -c '^ok ' <<<"$output")" = 3 ]
}

@test "examples/mongo_outbox.py: the order and its event in one transaction; an abort leaves nothing, a commit runs once, in key order with rb-publish's" {
  app() { /usr/bin/python3 "$RB_SRCDIR/examples/mongo_outbox.py" "$(mongo_file_url)" "$RB_SCHEMA" --orders "$RB_SCHEMA.orders" "$@"; }
  echo '{"id":"o1","name":"order.paid","key":"cust-7","payload":{"n":1}}' | rb-publish -q
  run -0 --separate-stderr app o2 --key cust-7
  [ "$(jq -c '[.event_id, .deliveries, .duplicate, .handlers]' <<<"$output")" = '["o2/paid",2,false,["A","B"]]' ]
  [ "$(rbq find orders '{}' _id paid)" = "o2 true" ]
  [ "$(rbq find keys '{"_id":"cust-7"}' seq)" = 2 ]
  # aborted: no order, no event, no delivery, the key's counter did not move
  run -0 --separate-stderr app o4 --key cust-7 --abort
  [ -z "$output" ]
  [ "$(rbq count orders '{"_id":"o4"}')" = 0 ]
  [ "$(rbq count events '{"_id":"o4/paid"}')" = 0 ]
  [ "$(rbq count deliveries '{"eventId":"o4/paid"}')" = 0 ]
  [ "$(rbq find keys '{"_id":"cust-7"}' seq)" = 2 ]
  echo '{"id":"o5","name":"order.paid","key":"cust-7","payload":{"n":5}}' | rb-publish -q
  # the same event again from the application: a duplicate, nothing new
  run -0 --separate-stderr app o2 --key cust-7
  [ "$(jq -c '[.deliveries, .duplicate]' <<<"$output")" = '[0,true]' ]
  # another payload under the same id: a conflict (81), and the order write rolled back with it
  echo '{"id":"o6/paid","name":"order.paid","key":"cust-7","payload":{"other":1}}' | rb-publish -q
  run -81 --separate-stderr app o6 --key cust-7
  [[ $stderr == *'event id "o6/paid" exists with another name, key or payload'* ]]
  [ "$(rbq count orders '{"_id":"o6"}')" = 0 ]
  # every delivery once, the key in its publish order: rb-publish's and the application's
  rb-dispatch -q -H A --exec "jq -r '.event_id' >>$BATS_TEST_TMPDIR/ran" --drain
  [ "$(tr '\n' , <"$BATS_TEST_TMPDIR/ran")" = "o1,o2/paid,o5,o6/paid," ]
  [ "$(rb-admin --json stats | jq -r 'select(.handler == "A") | "\(.pending) \(.dead)"')" = "0 0" ]
}
