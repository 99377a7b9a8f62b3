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
  rbq reset business >/dev/null 2>&1 || true
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
