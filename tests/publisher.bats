#!/usr/bin/env bats
# A publisher stays inside its grant (the security review's findings 3, 4
# and 5, with real login roles): an existing event is never re-routed to
# a handler its subscriptions did not give it; an id published again with
# another name, key or payload is a conflict (rb-publish exit 81), not a
# silent duplicate, while a genuine redelivery stays one; a publisher
# granted some handlers publishes to those only; and no event is due past
# the schema's maximum delay (rb-setup --max-delay), so that no key can be
# frozen for a century.

load test_helper

R_PUB=${RB_SCHEMA}_pub     # publisher, every handler
R_PUBA=${RB_SCHEMA}_puba   # publisher, handler A only
R_WA=${RB_SCHEMA}_wa       # worker, handler A only
ROLES="$R_PUB $R_PUBA $R_WA"

setup_file() {
  drop_schema
  on_mongo && return 0
  have_pg || return 0
  drop_roles $ROLES
  for r in $ROLES; do q "CREATE ROLE \"$r\" LOGIN"; done
  rb-setup -q -s 'A:a.*' -s 'B:b.*' --grant "publisher=$R_PUB" --grant "publisher=$R_PUBA:A" --grant "worker=$R_WA:A"
}
teardown_file() {
  drop_schema
  [ -n "$_test_pg_url" ] && ! on_mongo && drop_roles $ROLES || true
}
setup() {
  pg_only "relaybus's roles are PostgreSQL's"
  need_pg
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys;
     UPDATE relaybus_lanes SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'"
}


@test "finding 3: a publisher cannot add a handler to an existing event and so read its payload" {
  echo '{"id":"eb1","name":"b.x","payload":{"secret":"B-only"}}' | rb-publish -q
  # the review's reproducer: another name and payload is a conflict now
  run asql "$R_PUB" -c "SELECT * FROM relaybus_publish('x', '{}', p_id => 'eb1', p_handlers => '{A}')"
  [ "$status" -ne 0 ]
  [[ $output == *'event id "eb1" exists with another name, key or payload (conflict)'* ]]
  # even with the stored name and payload, A is not subscribed to b.x: no delivery for it
  [ "$(asql "$R_PUB" -c "SELECT deliveries, duplicate, handlers FROM relaybus_publish('b.x', '{\"secret\":\"B-only\"}', p_id => 'eb1', p_handlers => '{A}')")" = "0|t|{}" ]
  [ "$(q "SELECT string_agg(handler, ',') FROM relaybus_deliveries WHERE event_id = 'eb1'")" = B ]
  [ "$(q "SELECT array_to_string(handlers, ',') FROM relaybus_events WHERE id = 'eb1'")" = B ]
  # A's worker sees nothing of it, through the view or a claim
  [ "$(asql "$R_WA" -c "SELECT count(*) FROM relaybus_worker_events WHERE id = 'eb1'")" = 0 ]
  run -1 as "$R_WA" rb-claim -H A
  [ -z "$output" ]
}

@test "finding 4: an id published again with another payload is a conflict (exit 81), not a silent duplicate" {
  asql "$R_PUB" -c "SELECT * FROM relaybus_publish('b.x', '{\"amount\":1000000,\"to\":\"attacker\"}', p_id => 'order-42')" >/dev/null
  run --separate-stderr rb-publish -o <<<'{"id":"order-42","name":"b.x","payload":{"amount":5,"to":"alice"}}'
  echo "$stderr"
  [ "$status" -eq 81 ]
  [ -z "$output" ]
  [[ ${stderr_lines[0]} == 'rb-publish: stdin:1-1: publish: event id "order-42" exists with another name, key or payload (conflict): not published'* ]]
  [ "${#stderr_lines[@]}" -le 2 ]
  # the single-event statement of the owner's session (rb-publish of one line
  # goes through it) and another key say the same
  run --separate-stderr rb-publish <<<'{"id":"order-42","name":"b.x","key":"k9","payload":{"amount":1000000,"to":"attacker"}}'
  [ "$status" -eq 81 ]
  # --keep-going: that line rejected (to --rejects), the others published, exit 81 at the end
  run --separate-stderr rb-publish -o --keep-going --rejects "$BATS_TEST_TMPDIR/rej" <<'EOF'
{"id":"ok-1","name":"b.x","payload":{}}
{"id":"order-42","name":"b.x","payload":{"amount":5,"to":"alice"}}
{"id":"ok-2","name":"b.x","payload":{}}
EOF
  echo "$stderr"
  [ "$status" -eq 81 ]
  [ "$(jq -r .event_id <<<"$output" | tr '\n' ,)" = "ok-1,ok-2," ]
  [ "$(cat "$BATS_TEST_TMPDIR/rej")" = '{"id":"order-42","name":"b.x","payload":{"amount":5,"to":"alice"}}' ]
  # the stored event is what the first writer wrote, and B has one delivery of it
  [ "$(q "SELECT payload->>'to' FROM relaybus_events WHERE id = 'order-42'")" = attacker ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'order-42'")" = 1 ]
}

@test "inbox dedup: a genuine redelivery (same name, key and payload, in any key order and spacing) stays a duplicate" {
  echo '{"id":"r1","name":"a.x","key":"k","payload":{"a":1,"b":[1,2]},"headers":{"traceparent":"00-aa-bb-01"}}' | rb-publish -q
  run --separate-stderr rb-publish -o <<<'{"id":"r1","name":"a.x","key":"k","payload":{ "b" : [1, 2], "a" : 1 },"headers":{"traceparent":"00-cc-dd-01"}}'
  [ "$status" -eq 0 ]
  [ "$(jq -c '[.duplicate, .deliveries]' <<<"$output")" = "[true,0]" ]
  [ "$(asql "$R_PUB" -c "SELECT duplicate FROM relaybus_publish('a.x', '{\"b\":[1,2],\"a\":1}', p_key => 'k', p_id => 'r1')")" = t ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'r1'")" = 1 ]
}

@test "publisher grants scoped to handlers: --grant publisher=ROLE:A publishes to A only, all or nothing" {
  run --separate-stderr as "$R_PUBA" rb-publish -o <<<'{"id":"pa-1","name":"a.x","payload":{}}'
  [ "$status" -eq 0 ]
  # b.x's subscription gives B: refused (77) in one line naming the grant that would allow it
  run --separate-stderr as "$R_PUBA" rb-publish <<'EOF'
{"id":"pa-2","name":"a.x","payload":{}}
{"id":"pa-3","name":"b.x","payload":{}}
EOF
  echo "$stderr"
  [ "$status" -eq 77 ]
  [[ $stderr == *"role \"$R_PUBA\" may not"*"handler \"B\""* ]]
  # explicit handlers too; nothing of the refused batch is kept
  run -77 --separate-stderr as "$R_PUBA" rb-publish <<<'{"id":"pa-4","name":"a.x","payload":{},"handlers":["A","B"]}'
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = pa-1 ]
  run asql "$R_PUBA" -c "SELECT * FROM relaybus_publish('zz', '{}', p_handlers => '{evil}')"
  [ "$status" -ne 0 ]
  [[ $output == *"may not"*'"evil"'* ]]
  # an unscoped publisher is as before
  run -0 --separate-stderr as "$R_PUB" rb-publish <<<'{"id":"p-1","name":"b.x","payload":{},"handlers":["B","C"]}'
  [ "$(q "SELECT string_agg(handler, ',' ORDER BY handler) FROM relaybus_deliveries WHERE event_id = 'p-1'")" = "B,C" ]
  # the scope is in rb-setup's grammar, and admin grants still name no handlers
  run -64 --separate-stderr rb-setup --print-sql --grant "admin=$R_PUB:A"
  [[ $stderr == *"an admin grant names no handlers"* ]]
}

@test "finding 5: no event is due past the maximum delay (30 days unless rb-setup --max-delay), so no key is frozen" {
  # the review's century-long head of a key
  run asql "$R_PUB" -c "SELECT relaybus_publish('b.x', '{}', p_key => 'k-victim', p_delay_ms => 3153600000000)"
  [ "$status" -ne 0 ]
  [[ $output == *"beyond the maximum delay of 30 days (rb-setup --max-delay)"* ]]
  run asql "$R_PUB" -c "SELECT relaybus_publish('b.x', '{}', p_key => 'k-victim', p_available_at => '2126-11-11')"
  [ "$status" -ne 0 ]
  [[ $output == *"beyond the maximum delay"* ]]
  # through rb-publish: the batch is refused (65), naming its lines; --keep-going rejects the one line
  run --separate-stderr rb-publish <<'EOF'
{"id":"d-1","name":"b.x","key":"k-victim","payload":{}}
{"id":"d-2","name":"b.x","key":"k-victim","payload":{},"delay_ms":3153600000000}
EOF
  echo "$stderr"
  [ "$status" -eq 65 ]
  [[ ${stderr_lines[0]} == "rb-publish: stdin:1-2: publish: relaybus_publish: event d-2 (the batch's event 2) would be due at "*", beyond the maximum delay of 30 days (rb-setup --max-delay) (this batch was not committed; committed through line 0)" ]]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 0 ]
  run -65 --separate-stderr rb-publish --keep-going <<'EOF'
{"id":"legit-0","name":"b.x","key":"k-victim","payload":{},"delay_ms":3153600000000}
{"id":"legit-1","name":"b.x","key":"k-victim","payload":{}}
EOF
  # the key is not held back: its due delivery is claimed
  [ "$(rb-claim -H B | jq -r .event_id)" = legit-1 ]
  # a delay within the maximum is fine, and the maximum is the set-up's to choose
  [ "$(asql "$R_PUB" -c "SELECT deliveries FROM relaybus_publish('b.x', '{}', p_delay_ms => 29 * 86400000::bigint)")" = 1 ]
  run asql "$R_PUB" -c "SELECT relaybus_publish('b.x', '{}', p_delay_ms => 300 * 86400000::bigint)"
  [ "$status" -ne 0 ]
  [[ $output == *"beyond the maximum delay of 30 days"* ]]
  rb-setup -q --max-delay 365d
  [ "$(asql "$R_PUB" -c "SELECT deliveries FROM relaybus_publish('b.x', '{}', p_delay_ms => 300 * 86400000::bigint)")" = 1 ]
  # a set-up run without the option keeps it
  rb-setup -q
  [ "$(q "SELECT value FROM relaybus_settings WHERE name = 'max_delay'")" = "31536000000 milliseconds" ]
  rb-setup -q --max-delay 30d
  run -64 --separate-stderr rb-setup --max-delay 500ms
  [[ $stderr == *"--max-delay: '500ms' is less than a second"* ]]
  run -64 --separate-stderr rb-setup --max-delay 4000d
  [[ $stderr == *"--max-delay: '4000d' is more than 3650d"* ]]
}

@test "finding 11: the SQL entry points keep the programs' limits, and what they take completes through rb-claim | rb-complete" {
  # the review's: a 1 MB name, a 2 MB payload, a 2 kB handler name
  run asql "$R_PUB" -c "SELECT relaybus_publish(repeat('n', 1000000), '{}', p_handlers => '{A}')"
  [ "$status" -ne 0 ]
  [[ $output == *"name, id and key take at most 1000 bytes"* ]]
  run asql "$R_PUB" -c "SELECT relaybus_publish('big', jsonb_build_object('blob', repeat('x', 2000000)), p_handlers => '{C}')"
  [ "$status" -ne 0 ]
  [[ $output == *"payload and headers take at most 1 MiB together"* ]]
  run asql "$R_PUB" -c "SELECT relaybus_publish('zz', '{}', p_handlers => ARRAY[repeat('h', 2016)])"
  [ "$status" -ne 0 ]
  [[ $output == *'invalid handler name "hhh'* ]]
  run asql "$R_PUB" -c "SELECT * FROM relaybus_publish_batch(jsonb_build_array(jsonb_build_object('name', 'a.x', 'payload', 1),
                                jsonb_build_object('name', 'a.x', 'payload', 1, 'handlers', jsonb_build_array(E'ev\u009b31m'))))"
  [ "$status" -ne 0 ]
  [[ $output == *"event without id (the batch's event 2): invalid handler name"* ]]
  run asql "$R_PUB" -c "SELECT * FROM relaybus_publish_batch(jsonb_build_array(jsonb_build_object('id', 'big-1', 'key', 'k', 'name', 'a.x',
                                'payload', jsonb_build_object('blob', repeat('x', 1100000)))))"
  [ "$status" -ne 0 ]
  [[ $output == *"event big-1 (the batch's event 1): payload and headers take at most 1 MiB"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 0 ]
  # the largest payload the store takes goes through the man page's pipeline
  asql "$R_PUB" -c "SELECT relaybus_publish('big', jsonb_build_object('blob', repeat('x', 1040000)), p_id => 'big-2', p_handlers => '{C}')" >/dev/null
  rb-claim -H C | sed 's/}$/,"ok":true}/' | rb-complete -q
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'big-2'")" = 0 ]
}
