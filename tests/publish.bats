#!/usr/bin/env bats
# rb-publish and the SQL publish function: atomicity, fan-out, inbox dedup,
# per-key commit order, delays, and every bad-input path.

load test_helper

setup_file() { drop_schema; have_pg || return 0; rb-setup -s 'mail:order.*' -s audit:order.created -s 'bill:invoice.?aid'; }
teardown_file() { drop_schema; }
setup() { need_pg; q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys"; }

count() { q "SELECT count(*) FROM $1"; }

@test "the SQL function publishes atomically inside the caller's transaction" {
  q "CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, paid boolean)"
  q "TRUNCATE orders"
  sql -c "BEGIN" -c "INSERT INTO orders VALUES (1, true)" \
      -c "SELECT * FROM relaybus_publish('order.paid', '{\"order\":1}', p_id => 'rolled')" -c "ROLLBACK" >/dev/null
  [ "$(count relaybus_events)" = 0 ]
  [ "$(count relaybus_deliveries)" = 0 ]
  [ "$(count orders)" = 0 ]
  run sql -c "BEGIN" -c "INSERT INTO orders VALUES (2, true)" \
      -c "SELECT event_id, deliveries, duplicate FROM relaybus_publish('order.paid', '{\"order\":2}', p_id => 'kept')" -c "COMMIT"
  [ "$status" -eq 0 ]
  [ "$output" = "kept|1|f" ]
  [ "$(q "SELECT handler FROM relaybus_deliveries WHERE event_id = 'kept'")" = mail ]
  [ "$(count orders)" = 1 ]
}

@test "fan-out: exact and glob subscriptions, and events that match no handler" {
  run --separate-stderr rb-publish -o <<'EOF2'
{"id":"a","name":"order.created","payload":{}}
{"id":"b","name":"order.shipped","payload":{}}
{"id":"c","name":"invoice.paid","payload":{}}
{"id":"d","name":"invoice.xaid","payload":{}}
{"id":"e","name":"invoice.unpaid","payload":{}}
{"id":"f","name":"order","payload":{}}
EOF2
  [ "$status" -eq 0 ]
  [ "$(q "SELECT string_agg(event_id || ':' || handler, ' ' ORDER BY event_id, handler) FROM relaybus_deliveries")" = "a:audit a:mail b:mail c:bill d:bill" ]
  [ "$(echo "$output" | jq -r 'select(.event_id=="a") | .handlers | join(",")')" = "audit,mail" ]
  # stored and reported
  [ "$(count relaybus_events)" = 6 ]
  [[ "$stderr" == *"stdin:5: event e (invoice.unpaid) matches no handler"* ]]
  [[ "$stderr" == *"stdin:6: event f (order) matches no handler"* ]]
  [[ "${stderr_lines[-1]}" == "rb-publish: 6 events, 5 deliveries, 0 duplicates, 2 without handlers, 0 rejected; committed through line 6" ]]
}

@test "events are stored as written; --output lines are JSON, whatever the id holds" {
  run --separate-stderr rb-publish -o <<'EOF2'
{"id":"q\"uote\\ \u00e9\t1","name":"order.created","payload":{"price":1.50,"n":[1,2.0]},"headers":{"h":"\u2603"}}
{ "name" : "order.shipped" , "payload" : "s" }
EOF2
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq -sc 'map({event_id, deliveries, duplicate, handlers, line}) | .[0]')" = \
    "$(jq -nc '{event_id:"q\"uote\\ \u00e9\t1", deliveries:2, duplicate:false, handlers:["audit","mail"], line:1}')" ]
  [ "$(echo "$output" | jq -s 'map(.line) | join(",")' -r)" = "1,2" ]
  # numbers keep their spelling (1.50, 2.0): the line is sent as written, not printed again
  [ "$(q "SELECT payload::text || ' ' || (headers->>'h') FROM relaybus_events WHERE name = 'order.created'")" = \
    "{\"n\": [1, 2.0], \"price\": 1.50} $(printf '\342\230\203')" ]
  [ "$(q "SELECT payload::text FROM relaybus_events WHERE name = 'order.shipped'")" = '"s"' ]
}

@test "publishing wakes listeners once per handler and transaction; relaybus.notify=off does not" {
  # a listener: the notifications that arrive while it sleeps are printed after its next statement
  listen() { sql -c "LISTEN relaybus_$RB_SCHEMA" -c "SELECT pg_sleep(1.5)" -c "SELECT 'done'" >"$1" 2>&1; }
  local f=$BATS_TEST_TMPDIR/heard
  listen "$f.on" & local l=$!
  sleep 0.5
  printf '%s\n' '{"name":"order.created","payload":1}' '{"name":"order.created","payload":2}' | rb-publish -q
  wait "$l"
  [ "$(grep -c 'Asynchronous notification "relaybus_'"$RB_SCHEMA"'" with payload "mail"' "$f.on")" = 1 ]
  [ "$(grep -c 'Asynchronous notification "relaybus_'"$RB_SCHEMA"'" with payload "audit"' "$f.on")" = 1 ]
  # off: for a role, a database or a session (PGOPTIONS here); the events are published all the same
  listen "$f.off" & l=$!
  sleep 0.5
  echo '{"name":"order.created","payload":3}' | PGOPTIONS="-c relaybus.notify=off" rb-publish -q
  sql -c "SET relaybus.notify = off" -c "SELECT deliveries FROM relaybus_publish('order.created', '4')" >/dev/null
  wait "$l"
  grep -q done "$f.off"
  ! grep -q 'Asynchronous notification' "$f.off"
  [ "$(count relaybus_events)" = 4 ]
  # a delayed event wakes nobody: nothing is due yet
  listen "$f.later" & l=$!
  sleep 0.5
  echo '{"name":"order.created","payload":5,"delay_ms":60000}' | rb-publish -q
  sql -c "SELECT deliveries FROM relaybus_publish('order.created', '6', p_delay_ms => 60000)" >/dev/null
  wait "$l"
  grep -q done "$f.later"
  ! grep -q 'Asynchronous notification' "$f.later"
}

@test "a batch without ids or keys, of many names: each event routed by its own name or its handlers, stored in batch order" {
  rb-publish -q <<'EOF2'
{"name":"order.created","payload":1}
{"name":"invoice.paid","payload":2}
{"name":"order.shipped","payload":3}
{"name":"order.created","payload":4,"handlers":["ledger"]}
{"name":"nothing.here","payload":5}
{"name":"invoice.xaid","payload":6}
{"name":"order.created","payload":7}
{"name":"nothing.here","payload":8,"handlers":["bill","audit"]}
EOF2
  [ "$(q "SELECT string_agg(e.payload::text || ':' || d.handler, ' ' ORDER BY e.payload::text::int, d.handler)
          FROM relaybus_deliveries d JOIN relaybus_events e ON e.id = d.event_id")" = \
    "1:audit 1:mail 2:bill 3:mail 4:ledger 6:bill 7:audit 7:mail 8:audit 8:bill" ]
  [ "$(q "SELECT string_agg(payload::text || '=' || array_to_string(handlers, ','), ' ' ORDER BY ctid) FROM relaybus_events")" = \
    "1=audit,mail 2=bill 3=mail 4=ledger 5= 6=bill 7=audit,mail 8=audit,bill" ]
}

@test "explicit handlers override the subscriptions" {
  echo '{"id":"x","name":"order.created","payload":1,"handlers":["ledger","mail","ledger"]}' | rb-publish -q
  [ "$(q "SELECT string_agg(handler, ',' ORDER BY handler) FROM relaybus_deliveries WHERE event_id = 'x'")" = "ledger,mail" ]
  [ "$(q "SELECT array_to_string(handlers, ',') FROM relaybus_events WHERE id = 'x'")" = "ledger,mail" ]
  # a handler without subscription gets its lanes when first claimed
  run rb-claim -H ledger
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq -r .event_id)" = x ]
}

@test "redelivery of an id adds nothing; a completed handler never runs again; a new handler gets one" {
  echo '{"id":"r1","name":"order.created","payload":{"v":1}}' | rb-publish -q
  rb-claim -H mail | jq -c '. + {ok: true}' | rb-complete -q >/dev/null
  [ "$(q "SELECT string_agg(handler, ',') FROM relaybus_deliveries WHERE event_id = 'r1'")" = audit ]
  run --separate-stderr rb-publish -o <<<'{"id":"r1","name":"order.created","payload":{"v":1}}'
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq -c '[.duplicate, .deliveries]')" = "[true,0]" ]
  [[ "${stderr_lines[-1]}" == *"1 duplicates"* ]]
  # mail completed and is not delivered again; audit is still the one pending
  [ "$(q "SELECT string_agg(handler, ',') FROM relaybus_deliveries WHERE event_id = 'r1'")" = audit ]
  # a handler subscribed later gets a delivery on redelivery, the others do not
  rb-setup -s 'crm:order.*'
  run rb-publish -o <<<'{"id":"r1","name":"order.created","payload":{"v":1}}'
  [ "$(echo "$output" | jq -c '[.duplicate, .deliveries, .handlers]')" = '[true,1,["crm"]]' ]
  [ "$(q "SELECT string_agg(handler, ',' ORDER BY handler) FROM relaybus_deliveries WHERE event_id = 'r1'")" = "audit,crm" ]
  [ "$(q "SELECT array_to_string(handlers, ',') FROM relaybus_events WHERE id = 'r1'")" = "audit,mail,crm" ]
  rb-setup --unsubscribe 'crm:order.*'
}

@test "the same id twice in one batch gives one set of deliveries" {
  printf '%s\n' '{"id":"d1","name":"order.created","payload":1}' '{"id":"d1","name":"order.created","payload":1}' | rb-publish -q
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'd1'")" = 2 ]
}

@test "per-key sequences follow commit order, not start order" {
  # A starts first but commits last; B starts later and commits first.
  sql -c "BEGIN" -c "SELECT pg_sleep(0.8)" -c "SELECT 1 FROM relaybus_publish('order.created', '1', 'K', 'A')" -c "COMMIT" >/dev/null &
  a=$!
  sleep 0.2
  sql -c "BEGIN" -c "SELECT 1 FROM relaybus_publish('order.created', '2', 'K', 'B')" -c "COMMIT" >/dev/null
  wait $a
  [ "$(q "SELECT string_agg(event_id || '=' || sequence, ' ' ORDER BY sequence) FROM relaybus_deliveries WHERE handler = 'mail'")" = "B=1 A=2" ]
  # C publishes first and holds the key; D publishes meanwhile and must wait for C's commit
  q "TRUNCATE relaybus_events, relaybus_deliveries"
  sql -c "BEGIN" -c "SELECT 1 FROM relaybus_publish('order.created', '3', 'K', 'C')" -c "SELECT pg_sleep(1)" -c "COMMIT" >/dev/null &
  c=$!
  sleep 0.3
  start=$(date +%s%N)
  sql -c "BEGIN" -c "SELECT 1 FROM relaybus_publish('order.created', '4', 'K', 'D')" -c "COMMIT" >/dev/null
  waited=$(( ($(date +%s%N) - start) / 1000000 ))
  wait $c
  [ "$waited" -ge 400 ]
  [ "$(q "SELECT string_agg(event_id || '=' || sequence, ' ' ORDER BY sequence) FROM relaybus_deliveries WHERE handler = 'mail'")" = "C=3 D=4" ]
}

@test "two rb-publish processes on one key: every sequence is unique and claims come in sequence order" {
  gen() { for i in $(seq 1 200); do echo "{\"id\":\"$1$i\",\"name\":\"order.created\",\"key\":\"hot\",\"payload\":$i}"; done; }
  gen p | rb-publish -q --batch 7 &
  gen q | rb-publish -q --batch 5
  wait
  [ "$(q "SELECT count(DISTINCT sequence) || '/' || count(*) FROM relaybus_deliveries WHERE handler = 'mail'")" = "400/400" ]
  # within each publisher, input order is sequence order
  [ "$(q "SELECT bool_and(s > lag_s) FROM (SELECT sequence s, lag(sequence) OVER (PARTITION BY left(event_id, 1) ORDER BY substr(event_id, 2)::int) lag_s FROM relaybus_deliveries WHERE handler = 'mail') x WHERE lag_s IS NOT NULL")" = t ]
}

@test "the lane is FNV-1a of the key, or of the id" {
  printf '%s\n' '{"id":"foobar","name":"order.created","payload":1}' '{"id":"z","name":"order.created","key":"a","payload":1}' | rb-publish -q
  [ "$(q "SELECT lane FROM relaybus_deliveries WHERE event_id = 'foobar' AND handler = 'mail'")" = 104 ]
  [ "$(q "SELECT lane FROM relaybus_deliveries WHERE event_id = 'z' AND handler = 'mail'")" = 44 ]
}

@test "events without an id get distinct version 4 UUIDs, and each delivery is in the lane of its id" {
  # a batch of 300 without ids or keys (ids past position 255 included), then
  # one that mixes them with keyed and named events (the function's other path)
  for i in $(seq 1 300); do printf '{"name":"order.created","payload":%d}\n' "$i"; done | rb-publish -q --batch 300
  { for i in $(seq 1 100); do
      printf '{"name":"order.created","payload":%d}\n{"name":"order.created","key":"k%d","payload":0}\n' "$i" "$((i % 7))"
    done
    printf '{"id":"named-1","name":"order.created","payload":0}\n'; } | rb-publish -q --batch 300
  [ "$(count relaybus_events)" = 501 ]
  [ "$(q "SELECT count(DISTINCT id) FROM relaybus_events WHERE id <> 'named-1'
           AND id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'")" = 500 ]
  # the lane of each delivery: FNV-1a of its key, else of its event id (both handlers of each event)
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 1002 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE lane = relaybus_lane(coalesce(key, event_id))")" = 1002 ]
  # and the lanes spread: a batch's 300 unkeyed events over more than half
  # the lanes.  Their lanes depend on the hash of the UUID's shared 30
  # characters (256 states) and on the six digits: over all 256 states, 300
  # positions reach 138 to 216 lanes (187 on average; 300 UUIDs: 177), so
  # "more than 150" failed for 6 states in 256 (CI of 5dcf162)
  [ "$(q "SELECT count(DISTINCT d.lane) > 128 FROM relaybus_deliveries d JOIN relaybus_events e ON e.id = d.event_id
           WHERE d.handler = 'mail' AND e.key IS NULL AND d.id <= (SELECT min(id) + 599 FROM relaybus_deliveries)")" = t ]
}

@test "delay_ms and available_at make a delivery due later" {
  printf '%s\n' '{"id":"later","name":"invoice.paid","payload":1,"delay_ms":600000}' \
    '{"id":"past","name":"invoice.paid","payload":1,"available_at":"2020-01-01T00:00:00Z"}' \
    '{"id":"future","name":"invoice.paid","payload":1,"available_at":"'"$(date -u -d '+20 days' +%Y-%m-%dT%H:%M:%S)"'+02:00"}' |
    rb-publish -q
  run rb-claim -H bill --batch 10
  [ "$status" -eq 0 ]
  [ "$(echo "$output" | jq -r .event_id)" = past ]
  run rb-claim -H bill --batch 10
  [ "$status" -eq 1 ]
  [ "$(q "SELECT available_at > now() + interval '9 minutes' FROM relaybus_deliveries WHERE event_id = 'later'")" = t ]
}

@test "a short delay becomes due on time" {
  echo '{"id":"soon","name":"invoice.paid","payload":1,"delay_ms":700}' | rb-publish -q
  run rb-claim -H bill
  [ "$status" -eq 1 ]
  sleep 0.8
  run rb-claim -H bill
  [ "$status" -eq 0 ]
}

bad_case() {  # stdin-content expected-message
  run --separate-stderr rb-publish --batch 2
  [ "$status" -eq 65 ]
}

@test "bad lines: one-line error naming the line, exit 65, and the batch is not committed" {
  ok='{"name":"order.created","payload":1}'
  for c in 'not json|invalid JSON: ' '[1,2]|not a JSON object' '{"payload":1}|missing field '"'"'name'"'" \
           '{"name":"x"}|missing field '"'"'payload'"'" '{"name":7,"payload":1}|field '"'"'name'"'"' must be a string' \
           '{"name":"x","payload":1,"headers":[]}|field '"'"'headers'"'"' must be an object' \
           '{"name":"x","payload":1,"delay_ms":"soon"}|field '"'"'delay_ms'"'"' must be a whole number >= 0' \
           '{"name":"x","payload":1,"key":""}|field '"'"'key'"'"' must not be empty' \
           '{"name":"x","payload":1,"handlers":"mail"}|field '"'"'handlers'"'"' must be an array of names' \
           '{"name":"x","payload":1,"lease":"1:2:3"}|unknown field '"'"'lease'"'"' (an event has id, name,' \
           '{"name":"x","payload":1,"id":"a","event_id":"b"}|fields '"'"'id'"'"' and '"'"'event_id'"'"' differ' \
           '{"name":"x","payload":1,"event_id":5}|field '"'"'event_id'"'"' must be a string'; do
    line=${c%%|*}; want=${c#*|}
    q "TRUNCATE relaybus_events, relaybus_deliveries"
    run --separate-stderr rb-publish --batch 2 < <(printf '%s\n' "$ok" "$ok" "$ok" "$line" "$ok")
    [ "$status" -eq 65 ]
    [[ "${stderr_lines[0]}" == "rb-publish: stdin:4: $want"* ]]
    # lines 1-2 are a committed batch; line 3 shared its batch with the bad line
    [ "$(count relaybus_events)" = 2 ]
    [[ "${stderr_lines[-1]}" == *"committed through line 2" ]]
  done
}

@test "event_id is the id too (rb-claim's name): a redelivery is a duplicate; acks and show say event_id" {
  run --separate-stderr rb-publish -o <<'EOF2'
{"event_id":"x-1","name":"order.created","payload":{"price":1.50}}
{"id":"x-1","name":"order.created","payload":{"price":1.50}}
{"id":"x-2","event_id":"x-2","name":"order.created","payload":2}
EOF2
  [ "$status" -eq 0 ]
  [ "$(jq -r '"\(.event_id) \(.duplicate)"' <<<"$output" | tr '\n' ,)" = "x-1 false,x-1 true,x-2 false," ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "x-1,x-2" ]
  # the line was sent as written: the payload keeps its spelling
  [ "$(q "SELECT payload::text FROM relaybus_events WHERE id = 'x-1'")" = '{"price": 1.50}' ]
  run --separate-stderr rb-admin --json show x-1
  [ "$(jq -r .event_id <<<"$output")" = x-1 ]
  [ "$(jq -r 'has("id")' <<<"$output")" = false ]
}

@test "invalid UTF-8 and overlong lines are bad input" {
  run --separate-stderr rb-publish < <(printf '{"name":"order.created","payload":"\xff"}\n')
  [ "$status" -eq 65 ]
  [[ "${stderr_lines[0]}" == "rb-publish: stdin:1: invalid JSON: "* ]]
  [ "$(count relaybus_events)" = 0 ]
  long=$(head -c 3000 /dev/zero | tr '\0' 'x')
  run --separate-stderr rb-publish --max-line 1000 < <(echo "{\"name\":\"order.created\",\"payload\":\"$long\"}")
  [ "$status" -eq 65 ]
  [ "${stderr_lines[0]}" = "rb-publish: stdin:1: line longer than 1000 bytes" ]
}

@test "--keep-going skips bad lines and --rejects saves them verbatim" {
  rej=$BATS_TEST_TMPDIR/rejects.jsonl
  run --separate-stderr rb-publish --keep-going --rejects "$rej" --batch 2 <<'EOF2'
{"id":"k1","name":"order.created","payload":1}
{oops
{"id":"k2","name":"order.created","payload":2}

{"id":"k3","name":"order.created"}
{"id":"k4","name":"order.created","payload":4}
EOF2
  [ "$status" -eq 65 ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "k1,k2,k4" ]
  [ "$(cat "$rej")" = '{oops
{"id":"k3","name":"order.created"}' ]
  [[ "$stderr" == *"stdin:2: invalid JSON"* ]]
  [[ "$stderr" == *"stdin:5: missing field 'payload'"* ]]
  [[ "${stderr_lines[-1]}" == *"3 events, 6 deliveries, 0 duplicates, 0 without handlers, 2 rejected; committed through line 6" ]]
}

@test "a data error found by the database: the batch is not committed; --keep-going rejects just that event" {
  bad='{"id":"m2","name":"order.created","payload":1,"available_at":"2026-13-45T00:00:00Z"}'
  run --separate-stderr rb-publish --batch 3 < <(printf '%s\n' '{"id":"m1","name":"order.created","payload":1}' "$bad" '{"id":"m3","name":"order.created","payload":1}')
  [ "$status" -eq 65 ]
  [[ "${stderr_lines[0]}" == "rb-publish: stdin:1-3: publish: "*"(this batch was not committed; committed through line 0)" ]]
  [ "$(count relaybus_events)" = 0 ]
  run --separate-stderr rb-publish --batch 3 --keep-going < <(printf '%s\n' '{"id":"m1","name":"order.created","payload":1}' "$bad" '{"id":"m3","name":"order.created","payload":1}')
  [ "$status" -eq 65 ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "m1,m3" ]
  [[ "$stderr" == *"stdin:2: publish: "* ]]
}

@test "unreachable database: exit 69 and nothing read" {
  run --separate-stderr rb-publish --db 'postgresql://u:secret@127.0.0.1:1/x' <<<'{"name":"a","payload":1}'
  [ "$status" -eq 69 ]
  [[ "$stderr" == *"u:xxxxx@"* ]]
  [[ "$stderr" != *secret* ]]
}

@test "connection lost mid-stream: exit 75 naming the last committed line; a rerun is idempotent" {
  local input=$BATS_TEST_TMPDIR/in.jsonl url
  for i in 1 2 3 4; do echo "{\"id\":\"s$i\",\"name\":\"order.created\",\"payload\":$i}"; done >"$input"
  # (a name of its own: other test files publish beside this one)
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rbpubcut" ;; *) url="$RELAYBUS_URL?application_name=rbpubcut" ;; esac
  run --separate-stderr bash -c "
    { sed -n 1,2p '$input'; sleep 0.5
      psql '$_test_pg_url' -XAtqc \"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rbpubcut'\" >/dev/null
      sed -n 3,4p '$input'; } | rb-publish --db '$url' --batch 2"
  [ "$status" -eq 75 ]
  [[ "$stderr" == *"stdin:3: "*"committed through line 2"* ]]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "s1,s2" ]
  rb-publish -q <"$input"
  [ "$(q "SELECT count(*) || '/' || count(DISTINCT (event_id, handler)) FROM relaybus_deliveries")" = "8/8" ]
}

@test "a partial batch is committed when input pauses" {
  coproc PUB { rb-publish --batch 1000 --flush 50ms -o; }
  echo '{"id":"t1","name":"order.created","payload":1}' >&"${PUB[1]}"
  read -r -t 5 ack <&"${PUB[0]}"
  [ "$(echo "$ack" | jq -r .event_id)" = t1 ]
  [ "$(count relaybus_events)" = 1 ]
  exec {PUB[1]}>&-
  wait
}

@test "memory stays flat however long the input" {
  # AddressSanitizer keeps freed memory in quarantine: RSS says nothing there
  [ -z "${RELAYBUS_TEST_ASAN:-}" ] || skip "RSS is not meaningful under AddressSanitizer"
  peak() {  # events -> peak RSS in kB of rb-publish (the kernel's maximum resident set size)
    gen_events "$1" order.created 50 >"$BATS_TEST_TMPDIR/in"
    /usr/bin/time -f %M -o "$BATS_TEST_TMPDIR/rss" rb-publish -q --batch 500 <"$BATS_TEST_TMPDIR/in"
    cat "$BATS_TEST_TMPDIR/rss"
  }
  small=$(peak 2000)
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys"
  big=$(peak 40000)
  echo "peak RSS: 2000 events ${small} kB, 40000 events ${big} kB" >&3
  [ "$big" -lt $(( small + 4096 )) ]
}

@test "a batch's deliveries are stored handler by handler: one handler's drain among many touches few pages" {
  pg_only "where rows lie on heap pages is PostgreSQL's"
  # 200 events for 20 handlers in one batch: 4,000 deliveries.  Handler h1's
  # 200 lie together (about four heap pages), not one on every page of the
  # batch, where completing them would dirty (and after a checkpoint
  # full-page-write) a page a delivery
  hs=$(jq -cn '[range(1; 21) | "h\(.)"]')
  run --separate-stderr bash -c "seq 1 200 | jq -c --argjson hs '$hs' '{name: \"fan.out\", payload: {n: .}, handlers: \$hs}' | rb-publish -q --batch 500"
  [ "$status" -eq 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 4000 ]
  pages=$(q "SELECT count(DISTINCT (ctid::text::point)[0]) FROM relaybus_deliveries WHERE handler = 'h1'")
  all=$(q "SELECT count(DISTINCT (ctid::text::point)[0]) FROM relaybus_deliveries")
  echo "h1's deliveries on $pages of $all pages" >&2
  [ "$pages" -le 8 ]
  [ "$all" -ge 40 ]
  # and each handler's deliveries still follow the batch's order
  [ "$(q "SELECT count(*) FROM (SELECT d.id, e.payload->>'n' AS n, lag(e.payload->>'n') OVER (ORDER BY d.id) AS prev
            FROM relaybus_deliveries d JOIN relaybus_events e ON e.id = d.event_id WHERE d.handler = 'h7') x
          WHERE x.n::int < x.prev::int")" = 0 ]
}
