#!/usr/bin/env bats
# rb-admin: every command and filter on real data (pending, delayed, dead,
# keyed, a held lane, completion history), the JSON and table forms, the
# Prometheus output through a strict parser, requeue from a pipeline,
# purge in batches on 100,000 rows, and the error paths.

load test_helper

setup_file() { drop_schema; }
teardown_file() { drop_schema; }

# The data every test starts from:
#   e1 order.paid key k1  -> audit (pending, due), mailer (processing: claimed by w1)
#   e2 order.paid key k1  -> audit (pending), mailer (pending: behind e1 on k1)
#   e3 order.new          -> audit, mailer, both delayed by an hour
#   e4 user.gone          -> audit, dead (5 attempts, 'boom', two days ago)
#   e5 user.noop          -> no handler: an event without deliveries
#   history: e0 completed by mailer three days ago
fixture() {
  need_pg
  rb-setup --completion-history -s 'mailer:order.*' -s 'audit:*' >/dev/null
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys, relaybus_completions;
     UPDATE relaybus_lanes SET epoch = 0, lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}';
     SELECT count(*) FROM relaybus_publish('order.paid', '{\"n\":1}', 'k1', 'e1');
     SELECT count(*) FROM relaybus_publish('order.paid', '{\"n\":2}', 'k1', 'e2');
     SELECT count(*) FROM relaybus_publish('order.new', '{\"n\":3}', NULL, 'e3', NULL, NULL, 3600000);
     SELECT count(*) FROM relaybus_publish('user.gone', '{\"n\":4}', NULL, 'e4');
     SELECT count(*) FROM relaybus_publish('user.noop', '{\"n\":5}', NULL, 'e5', NULL, NULL, NULL, '{}');
     UPDATE relaybus_deliveries SET status = 'dead', attempts = 5, last_error = 'boom',
            updated_at = now() - interval '2 days' WHERE event_id = 'e4';
     UPDATE relaybus_deliveries SET created_at = coalesce(created_at, available_at) + (substr(event_id, 2)::int || ' ms')::interval;
     SELECT count(*) FROM relaybus_claim('mailer', 'w1', 1, 600000, 5);
     INSERT INTO relaybus_completions (event_id, handler, attempts, completed_at)
     VALUES ('e0', 'mailer', 1, now() - interval '3 days');" >/dev/null
}

# fields of JSON lines as "a b c" text, one line each
fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }

@test "stats: per handler and in total, as JSON lines" {
  fixture
  run --separate-stderr rb-admin stats
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 3 ]
  [ "$(echo "${lines[0]}" | fields '.handler,.pending,.due,.delayed,.processing,.dead,.completed')" = "audit 3 2 1 0 1 0" ]
  [ "$(echo "${lines[1]}" | fields '.handler,.pending,.due,.delayed,.processing,.dead,.completed')" = "mailer 2 1 1 1 0 1" ]
  [ "$(echo "${lines[2]}" | fields '.handler,.pending,.due,.delayed,.processing,.dead,.completed,.events_without_deliveries,.history')" = "null 5 3 2 1 1 1 1 true" ]
  # the oldest pending delivery was just created: an age in milliseconds, not null
  [ "$(echo "${lines[2]}" | jq '.oldest_pending_age_ms | type == "number" and . >= 0 and . < 60000')" = true ]
  # the age follows created_at
  q "UPDATE relaybus_deliveries SET created_at = now() - interval '1 hour' WHERE event_id = 'e2' AND handler = 'audit'"
  [ "$(rb-admin stats | jq -s '.[0].oldest_pending_age_ms >= 3600000 and .[1].oldest_pending_age_ms < 3600000')" = true ]
  # --handler keeps that handler's line and the bus total
  run rb-admin stats --handler mailer
  [ "$(printf '%s\n' "$output" | jq -r .handler | tr '\n' ' ')" = "mailer null " ]
  # -H as in rb-claim and rb-dispatch
  run rb-admin list -H audit
  [ "$(printf '%s\n' "$output" | jq -r .handler | sort -u)" = audit ]
}

@test "stats: an aligned table with --table" {
  fixture
  run --separate-stderr rb-admin stats --table
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "HANDLER  PENDING  DUE  DELAYED  PROCESSING  DEAD  COMPLETED  OLDEST_MS" ]
  [[ "${lines[1]}" =~ ^audit\ +3\ +2\ +1\ +0\ +1\ +0\ +[0-9]+$ ]]
  [[ "${lines[2]}" =~ ^mailer\ +2\ +1\ +1\ +1\ +0\ +1\ +[0-9]+$ ]]
  [[ "${lines[3]}" =~ ^TOTAL\ +5\ +3\ +2\ +1\ +1\ +1\ +[0-9]+$ ]]
  [ "${lines[4]}" = "events with every delivery done (or none), kept until purge: 1" ]
  # aligned: every row as long as the header
  [ "${#lines[1]}" -eq "${#lines[0]}" ]
  [ "${#lines[3]}" -eq "${#lines[0]}" ]
}

@test "stats --prometheus passes a strict exposition-format parser" {
  fixture
  run --separate-stderr rb-admin stats --prometheus
  [ "$status" -eq 0 ]
  printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/metrics.prom"
  run python3 "$RB_SRCDIR/tests/prom_lint.py" <"$BATS_TEST_TMPDIR/metrics.prom"
  [ "$status" -eq 0 ]
  # 20 families; 35 samples, 36 once autovacuum has run (relaybus_deliveries_vacuum_age_seconds)
  [[ "$output" =~ ^ok\ 20\ (35|36)$ ]] || { echo "$output"; false; }
  if command -v promtool >/dev/null; then promtool check metrics <"$BATS_TEST_TMPDIR/metrics.prom"; fi
  m="$BATS_TEST_TMPDIR/metrics.prom"
  grep -qx "relaybus_handler_deliveries{schema=\"$RB_SCHEMA\",handler=\"mailer\",state=\"processing\"} 1" "$m"
  grep -qx "relaybus_handler_deliveries{schema=\"$RB_SCHEMA\",handler=\"audit\",state=\"delayed\"} 1" "$m"
  grep -qx "relaybus_deliveries{schema=\"$RB_SCHEMA\",state=\"dead\"} 1" "$m"
  grep -qx "relaybus_completions{schema=\"$RB_SCHEMA\"} 1" "$m"
  grep -qx "relaybus_events_without_deliveries{schema=\"$RB_SCHEMA\"} 1" "$m"
  grep -qx '# TYPE relaybus_oldest_pending_age_seconds gauge' "$m"
  grep -Eqx "relaybus_oldest_pending_age_seconds\\{schema=\"$RB_SCHEMA\"\\} [0-9]+\\.[0-9]{3}" "$m"
  # the checker itself rejects what it should
  run python3 "$RB_SRCDIR/tests/prom_lint.py" <<<'bad-name 1'
  [ "$status" -eq 1 ]
  run python3 "$RB_SRCDIR/tests/prom_lint.py" <<<'m{l="a\q"} 1'
  [ "$status" -eq 1 ]
  run python3 "$RB_SRCDIR/tests/prom_lint.py" <<<'m{l="a"} one'
  [ "$status" -eq 1 ]
  run python3 "$RB_SRCDIR/tests/prom_lint.py" < <(printf 'm 1\n# TYPE m gauge\n')
  [ "$status" -eq 1 ]
}

@test "stats without completion history: completed is null and not exported" {
  fixture
  q "DROP TABLE relaybus_completions"
  run rb-admin stats
  [ "$(printf '%s\n' "$output" | jq -r .completed | sort -u)" = null ]
  [ "$(printf '%s\n' "${lines[2]}" | jq .history)" = false ]
  run rb-admin stats --prometheus
  [[ "$output" != *completions* ]]
  printf '%s\n' "$output" | python3 "$RB_SRCDIR/tests/prom_lint.py"
  run --separate-stderr rb-admin list --status completed
  [ "$status" -eq 78 ]
  [[ "$stderr" == *"keeps no completion history (rb-setup --completion-history)"* ]]
}

@test "list: every live delivery, oldest first, with attempts, error, due time, lane and owner" {
  fixture
  run --separate-stderr rb-admin list
  [ "$status" -eq 0 ]
  [ "$(printf '%s\n' "$output" | fields '.event_id,.handler,.status')" = "e1 audit pending
e1 mailer processing
e2 audit pending
e2 mailer pending
e3 audit pending
e3 mailer pending
e4 audit dead" ]
  # the processing one names its owner and lease; the others have none
  [ "$(printf '%s\n' "${lines[1]}" | fields '.owner,.attempts,.key,(.lane == '"$(q "SELECT relaybus_lane('k1')")"'),(.lease_expires_at|test("Z$"))')" = "w1 0 k1 true true" ]
  [ "$(printf '%s\n' "${lines[0]}" | jq -c '[.owner, .lease_expires_at, .last_error]')" = '[null,null,null]' ]
  # dead: attempts and last error; delayed: due in the future
  [ "$(printf '%s\n' "${lines[6]}" | fields '.attempts,.last_error')" = "5 boom" ]
  [ "$(printf '%s\n' "${lines[4]}" | jq -r '.available_at > (now | todate)')" = true ]
  [ "$(printf '%s\n' "${lines[0]}" | jq -r '.available_at <= (now + 1 | todate)')" = true ]
  # IDs are strings, times RFC 3339 UTC
  [ "$(printf '%s\n' "${lines[0]}" | jq -r '[.delivery_id, .event_id] | map(type) | join(",")')" = "string,string" ]
  [[ "$(printf '%s\n' "${lines[0]}" | jq -r .created_at)" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$ ]]
}

@test "list filters: --status, --handler, --key, --event, --limit" {
  fixture
  [ "$(rb-admin list --status pending | fields '.event_id,.handler' | tr '\n' ,)" = "e1 audit,e2 audit,e2 mailer,e3 audit,e3 mailer," ]
  [ "$(rb-admin list --status processing | fields '.event_id,.handler')" = "e1 mailer" ]
  [ "$(rb-admin list --status dead | fields '.event_id,.handler')" = "e4 audit" ]
  [ "$(rb-admin list --status completed | fields '.event_id,.handler,.status,.attempts,.delivery_id')" = "e0 mailer completed 1 null" ]
  [ "$(rb-admin list --status dead,processing | fields '.event_id' | tr '\n' ,)" = "e1,e4," ]
  [ "$(rb-admin list --handler mailer | fields '.event_id' | tr '\n' ,)" = "e1,e2,e3," ]
  [ "$(rb-admin list --key k1 --handler audit | fields '.event_id' | tr '\n' ,)" = "e1,e2," ]
  [ "$(rb-admin list --event e3 | fields '.handler' | tr '\n' ,)" = "audit,mailer," ]
  [ "$(rb-admin list --limit 2 | fields '.event_id,.handler' | tr '\n' ,)" = "e1 audit,e1 mailer," ]
  [ "$(rb-admin list -n 1 --status pending --handler mailer | fields '.event_id')" = "e2" ]
  [ -z "$(rb-admin list --event nope)" ]
}

@test "list --table: aligned columns, '-' for nothing" {
  fixture
  run --separate-stderr rb-admin --table list --handler mailer
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "EVENT_ID  HANDLER  STATUS      ATTEMPTS  DUE                       LANE  KEY  OWNER  LAST_ERROR" ]
  [[ "${lines[1]}" =~ ^e1\ +mailer\ +processing\ +0\ +20[0-9-]+T[0-9:.]+Z\ +[0-9]+\ +k1\ +w1\ +-$ ]]
  [[ "${lines[3]}" =~ ^e3\ +mailer\ +pending\ +0\ +.*\ +-\ +-\ +-$ ]]
  [ "${#lines[@]}" -eq 4 ]
  # the header and each column line up
  col=$(awk 'NR == 1 { print index($0, "STATUS") }' <<<"$output")
  [ "$(awk -v c="$col" 'NR > 1 { print substr($0, c, 1) }' <<<"$output" | sort -u)" = p ]
}

@test "show: the event, its payload and every delivery (completions too)" {
  fixture
  q "INSERT INTO relaybus_completions (event_id, handler, attempts) VALUES ('e1', 'billing', 2)"
  run --separate-stderr rb-admin show e1
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [ "$(jq -c '{event_id, name, key, payload, headers, handlers}' <<<"$output")" = '{"event_id":"e1","name":"order.paid","key":"k1","payload":{"n":1},"headers":{},"handlers":["audit","mailer"]}' ]
  [ "$(jq -r '.deliveries[] | "\(.handler) \(.status)"' <<<"$output" | tr '\n' ,)" = "audit pending,mailer processing,billing completed," ]
  run --separate-stderr rb-admin show --table e4
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "event_id    e4" ]
  [ "${lines[1]}" = "name        user.gone" ]
  [ "${lines[6]}" = 'payload     {"n": 4}' ] || [ "${lines[6]}" = 'payload     {"n":4}' ]
  [[ "${lines[7]}" == "EVENT_ID  HANDLER  STATUS  ATTEMPTS"* ]]
  [[ "${lines[8]}" =~ ^e4\ +audit\ +dead\ +5\ .*boom$ ]]
}

@test "show: an id that does not exist is reported, the others still shown, exit 65" {
  fixture
  run --separate-stderr rb-admin show nope e5
  [ "$status" -eq 65 ]
  [ "$stderr" = "rb-admin: show: no event 'nope'" ]
  [ "$(jq -c '[.event_id, .deliveries]' <<<"$output")" = '["e5",[]]' ]
}

@test "requeue from a pipeline: list --status dead | jq | requeue" {
  fixture
  q "SELECT count(*) FROM relaybus_publish('user.gone', '{}', NULL, 'e6'); UPDATE relaybus_deliveries SET status = 'dead', attempts = 3, claims = 4 WHERE event_id = 'e6'" >/dev/null
  claims_before=$(q "SELECT claims FROM relaybus_deliveries WHERE event_id = 'e4'")
  run --separate-stderr bash -c "rb-admin list --status dead | jq -c 'select(.event_id == \"e4\")' | rb-admin requeue"
  [ "$status" -eq 0 ]
  [ "$(fields '.event_id,.handler,.outcome,.status' <<<"$output")" = "e4 audit requeued pending" ]
  [ "$(q "SELECT status || ' ' || attempts || ' ' || (claims = $claims_before + 1) || ' ' || (available_at <= now()) || ' ' || (updated_at > now() - interval '1 minute') FROM relaybus_deliveries WHERE event_id = 'e4'")" = "pending 0 true true true" ]
  # e6 was not in the pipeline
  [ "$(q "SELECT status FROM relaybus_deliveries WHERE event_id = 'e6'")" = dead ]
  # and it is claimable again
  [ "$(q "SELECT event_id FROM relaybus_claim('audit', 'w2', 10, 60000, 5) WHERE event_id IN ('e4', 'e6')")" = e4 ]
  # bare ids on stdin work too; a pending one is skipped, not touched
  run --separate-stderr bash -c "printf 'e6\n\ne2\n' | rb-admin requeue --handler audit"
  [ "$status" -eq 0 ]
  [ "$(fields '.event_id,.outcome,.status' <<<"$output" | tr '\n' ,)" = "e6 requeued pending,e2 skipped pending," ]
}

@test "requeue: missing ids and bad lines are reported, the rest processed, exit 65" {
  fixture
  run --separate-stderr bash -c "printf '%s\n' '{\"event_id\":\"nope\",\"handler\":\"audit\"}' '{not json' '{\"handler\":\"x\"}' '{\"event_id\":\"e4\",\"handler\":\"audit\"}' | rb-admin requeue"
  [ "$status" -eq 65 ]
  [ "$(fields '.event_id,.outcome' <<<"$output" | tr '\n' ,)" = "nope missing,e4 requeued," ]
  [[ "$stderr" == *"rb-admin: stdin:2: invalid JSON"* ]]
  [[ "$stderr" == *"rb-admin: stdin:3: need a string 'event_id' (and 'handler')"* ]]
  [[ "$stderr" == *"rb-admin: requeue: no delivery of event 'nope' for handler 'audit'"* ]]
  [ "$(q "SELECT status FROM relaybus_deliveries WHERE event_id = 'e4'")" = pending ]
}

@test "requeue --all and filters select every matching dead delivery" {
  fixture
  q "SELECT count(*) FROM relaybus_publish('order.paid', '{}', 'k2', 'e7');
     UPDATE relaybus_deliveries SET status = 'dead', attempts = 9 WHERE event_id = 'e7'" >/dev/null
  run rb-admin requeue --all --handler mailer
  [ "$(fields '.event_id,.handler,.outcome' <<<"$output")" = "e7 mailer requeued" ]
  run rb-admin requeue --key k2
  [ "$(fields '.event_id,.handler,.outcome' <<<"$output")" = "e7 audit requeued" ]
  run rb-admin requeue --all
  [ "$(fields '.event_id,.handler,.outcome' <<<"$output")" = "e4 audit requeued" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'dead'")" = 0 ]
  # nothing left: nothing printed, exit 0
  run --separate-stderr rb-admin requeue --all
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

@test "bury: pending to dead with a reason; in flight is skipped" {
  fixture
  run --separate-stderr rb-admin bury --reason 'poison, by hand' e1
  [ "$status" -eq 0 ]
  [ "$(fields '.handler,.outcome,.status' <<<"$output" | tr '\n' ,)" = "audit buried dead,mailer skipped processing," ]
  [ "$(q "SELECT handler || ' ' || status || ' ' || coalesce(last_error, '-') FROM relaybus_deliveries WHERE event_id = 'e1' ORDER BY handler")" = "audit dead poison, by hand
mailer pending -" ]
  # by key, in table form
  run --separate-stderr rb-admin bury --table --key k1 --handler mailer
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "EVENT_ID  HANDLER  OUTCOME  STATUS" ]
  [[ "${lines[1]}" =~ ^e1\ +mailer\ +skipped\ +processing$ ]]
  [[ "${lines[2]}" =~ ^e2\ +mailer\ +buried\ +dead$ ]]
  [ "$(q "SELECT last_error FROM relaybus_deliveries WHERE event_id = 'e2' AND handler = 'mailer'")" = "buried by rb-admin" ]
  # a dead one is skipped by bury and requeued by requeue
  run rb-admin bury e4
  [ "$(fields '.outcome,.status' <<<"$output")" = "skipped dead" ]
}

@test "cancel: deletes pending deliveries, never one in flight; the event stays" {
  fixture
  run --separate-stderr rb-admin cancel --event e1
  [ "$status" -eq 0 ]
  [ "$(fields '.handler,.outcome' <<<"$output" | tr '\n' ,)" = "audit cancelled,mailer skipped," ]
  [ "$(q "SELECT string_agg(handler, ',') FROM relaybus_deliveries WHERE event_id = 'e1'")" = mailer ]
  [ "$(q "SELECT count(*) FROM relaybus_events WHERE id = 'e1'")" = 1 ]
  # delayed ones can be cancelled; limits count deliveries, oldest first
  run rb-admin cancel --handler audit --limit 1 --all
  [ "$(fields '.event_id,.outcome' <<<"$output")" = "e2 cancelled" ]
  run --separate-stderr rb-admin cancel e3 nope
  [ "$status" -eq 65 ]
  [ "$(fields '.event_id,.outcome' <<<"$output" | tr '\n' ,)" = "e3 cancelled,e3 cancelled,nope missing," ]
  [ "$stderr" = "rb-admin: cancel: no delivery of event 'nope'" ]
}

@test "a lane locked by a claim in progress makes bury wait, then see the claim" {
  fixture
  # an open transaction holds mailer's lane of e3 the way relaybus_claim does
  lane=$(q "SELECT lane FROM relaybus_deliveries WHERE event_id = 'e3' AND handler = 'mailer'")
  id=$(q "SELECT id FROM relaybus_deliveries WHERE event_id = 'e3' AND handler = 'mailer'")
  fifo=$BATS_TEST_TMPDIR/fifo
  mkfifo "$fifo"
  (sql <"$fifo" >/dev/null 2>&1) &
  exec 7>"$fifo"
  echo "BEGIN; SELECT 1 FROM relaybus_lanes WHERE handler = 'mailer' AND lane = $lane FOR NO KEY UPDATE;
        UPDATE relaybus_lanes SET lease_owner = 'w9', lease_expires_at = now() + interval '1 minute', in_flight = '{$id}' WHERE handler = 'mailer' AND lane = $lane;" >&7
  sleep 0.5
  rb-admin bury --event e3 --handler mailer >"$BATS_TEST_TMPDIR/out" &
  bury=$!
  sleep 0.5
  echo "COMMIT;" >&7
  exec 7>&-
  wait "$bury"
  [ "$(fields '.outcome,.status' <"$BATS_TEST_TMPDIR/out")" = "skipped processing" ]
  [ "$(q "SELECT status FROM relaybus_deliveries WHERE id = $id")" = pending ]
}

@test "lanes: who holds which lane, epoch, lease, in flight; --all and --handler" {
  fixture
  run --separate-stderr rb-admin lanes
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [ "$(fields '.handler,.lane,.epoch,.owner,.expired,.in_flight,(.in_flight_ids|length)' <<<"$output")" = "mailer $(q "SELECT relaybus_lane('k1')") 1 w1 false 1 1" ]
  [ "$(jq -r '.in_flight_ids[0]' <<<"$output")" = "$(q "SELECT id FROM relaybus_deliveries WHERE event_id = 'e1' AND handler = 'mailer'")" ]
  [ "$(rb-admin lanes --all | wc -l)" -eq 512 ]
  [ "$(rb-admin lanes --all --handler audit | jq -r .owner | sort -u)" = null ]
  run rb-admin lanes --table
  [ "${lines[0]}" = "HANDLER  LANE  EPOCH  OWNER  LEASE_EXPIRES_AT          EXPIRED  IN_FLIGHT" ]
  [[ "${lines[1]}" =~ ^mailer\ +[0-9]+\ +1\ +w1\ +20.*Z\ +no\ +1$ ]]
  # an expired lease shows as such
  q "UPDATE relaybus_lanes SET lease_expires_at = now() - interval '1 second' WHERE lease_owner = 'w1'"
  [ "$(rb-admin lanes | jq .expired)" = true ]
}

@test "subscriptions: JSON and table" {
  fixture
  run --separate-stderr rb-admin subscriptions
  [ "$status" -eq 0 ]
  [ "$(fields '.handler,.pattern' <<<"$output" | tr '\n' ,)" = "audit *,mailer order.*," ]
  run rb-admin subscriptions --handler mailer --table
  [ "${#lines[@]}" -eq 2 ]
  [[ "${lines[0]}" == "HANDLER  PATTERN  CREATED_AT" ]]
  [[ "${lines[1]}" =~ ^mailer\ +order\.\*\ +20[0-9-]+T ]]
}

@test "output: JSON lines when stdout is not a terminal, a table on one" {
  fixture
  command -v script >/dev/null || skip "no script(1)"
  run script -qec "rb-admin subscriptions" /dev/null
  [[ "$output" == HANDLER* ]]
  run script -qec "rb-admin subscriptions --json" /dev/null
  [[ "$output" == '{"handler":"audit"'* ]]
  run rb-admin subscriptions
  [[ "$output" == '{"handler":"audit"'* ]]
}

@test "purge: 100,000 rows of each kind in batches, young rows kept" {
  fixture
  q "INSERT INTO relaybus_deliveries (event_id, handler, lane, status, attempts, last_error, updated_at)
       SELECT 'd' || g, 'audit', g % 256, 'dead', 5, 'boom', now() - interval '8 days' FROM generate_series(1, 100000) g;
     INSERT INTO relaybus_events (id, name, payload, created_at)
       SELECT 'old' || g, 'x', '{}', now() - interval '40 days' FROM generate_series(1, 100000) g;
     INSERT INTO relaybus_completions (event_id, handler, attempts, completed_at)
       SELECT 'old' || g, 'audit', 1, now() - interval '31 days' FROM generate_series(1, 100000) g;
     INSERT INTO relaybus_completions (event_id, handler, attempts) VALUES ('young', 'audit', 1);"
  run --separate-stderr rb-admin purge --dead-older-than 7d --completed-older-than 30d \
      --history-older-than 30d --batch 5000
  [ "$status" -eq 0 ]
  [ "$(fields '.dead,.events,.history,.batches,.interrupted' <<<"$output")" = "100000 100000 100000 60 false" ]
  [ -z "$stderr" ]
  # e4's dead delivery is two days old, e5 (no deliveries) is new, e0's history three days old
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'dead'")" = 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 5 ]
  [ "$(q "SELECT count(*) FROM relaybus_completions")" = 2 ]
  # the default batch is 1000; a second run finds nothing
  run --separate-stderr rb-admin purge --dead-older-than 1d --completed-older-than 0s
  [ "$(fields '.dead,.events,.history,.batches' <<<"$output")" = "1 2 0 2" ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "e1,e2,e3" ]
  run --separate-stderr rb-admin purge --table --history-older-than 0s
  [[ "$output" =~ ^purged\ 0\ dead\ deliveries,\ 0\ events,\ 2\ history\ rows\ in\ 1\ batches\ \([0-9.]+s\)$ ]]
}

@test "purge interrupted by SIGINT commits the batches it finished and says so" {
  fixture
  q "INSERT INTO relaybus_deliveries (event_id, handler, lane, status, updated_at)
       SELECT 'd' || g, 'audit', g % 256, 'dead', now() - interval '8 days' FROM generate_series(1, 100000) g"
  rb-admin purge --dead-older-than 7d --batch 10 >"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" &
  pid=$!
  # signal once it has deleted something (its handlers are installed by then)
  for i in $(seq 100); do
    [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'dead'")" -lt 100001 ] && break
    sleep 0.1
  done
  kill -INT "$pid"
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 75 ]
  done=$(jq .dead <"$BATS_TEST_TMPDIR/out")
  [ "$(jq .interrupted <"$BATS_TEST_TMPDIR/out")" = true ]
  [ "$done" -gt 0 ]
  [ "$done" -lt 100000 ]
  [ "$(jq .batches <"$BATS_TEST_TMPDIR/out")" -eq $((done / 10)) ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'dead' AND updated_at < now() - interval '7 days'")" -eq $((100000 - done)) ]
  grep -q "^rb-admin: purge interrupted by SIGINT: the $((done / 10)) batches done are committed; run it again to go on$" "$BATS_TEST_TMPDIR/err"
}

@test "usage errors exit 64 with a usage line" {
  run --separate-stderr rb-admin
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: missing command" ]
  [[ "${stderr_lines[1]}" == "usage: rb-admin "* ]]
  [ "${stderr_lines[2]}" = "Try 'rb-admin --help' for more information." ]
  run --separate-stderr rb-admin frobnicate
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: unknown command 'frobnicate'" ]
  run --separate-stderr rb-admin list --frobnicate
  [ "$status" -eq 64 ]
  [[ "${stderr_lines[0]}" == *"unrecognized option '--frobnicate'" ]]
  [ "${stderr_lines[1]}" = "usage: rb-admin list [--status STATUS] [--handler NAME] [--key KEY] [--event ID] [--limit N]" ]
  run --separate-stderr rb-admin list --batch 10
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: list: --batch does not apply" ]
  run --separate-stderr rb-admin list --status sleeping
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: --status: 'sleeping' is not pending, processing, dead or completed" ]
  run --separate-stderr rb-admin list --limit 0
  [ "$status" -eq 64 ]
  run --separate-stderr rb-admin show
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: show: missing argument" ]
  run --separate-stderr rb-admin stats extra
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: stats: unexpected argument 'extra'" ]
  run --separate-stderr rb-admin purge
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: purge: give --dead-older-than, --completed-older-than, --history-older-than or --keys" ]
  run --separate-stderr rb-admin purge --dead-older-than soon
  [ "$status" -eq 64 ]
  [[ "${stderr_lines[0]}" == "rb-admin: --dead-older-than: 'soon' is not a duration"* ]]
  run --separate-stderr rb-admin requeue --all e1
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: requeue: give event ids or --all/--key/--event/--limit, not both" ]
  run --separate-stderr rb-admin lanes --handler 'bad name'
  [ "$status" -eq 64 ]
}

@test "an unreachable database exits 69; an unset schema 78" {
  run --separate-stderr rb-admin stats --db 'postgresql://app:hunter2@127.0.0.1:1/relay'
  [ "$status" -eq 69 ]
  [[ "$stderr" == "rb-admin: cannot connect to postgresql://app:xxxxx@127.0.0.1:1/relay: "* ]]
  need_pg
  run --separate-stderr rb-admin --schema nowhere_here list
  [ "$status" -eq 78 ]
  [[ "$stderr" == *'schema "nowhere_here" is not set up'* ]]
}

@test "--help and --version" {
  run rb-admin --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: rb-admin "* ]]
  for c in stats list show requeue bury cancel purge lanes subscriptions; do
    [[ "$output" == *"  $c "* ]] || [[ "$output" == *"  $c"$'\n'* ]]
  done
  run rb-admin -V
  [[ "$output" == "rb-admin 0.2.0 (backends: postgresql"* ]]
}

@test "stats --handler of a handler nobody subscribed and nothing reached: 78 in one line naming the subscribed ones" {
  fixture
  run --separate-stderr rb-admin stats --handler mailr
  [ "$status" -eq 78 ]
  [ -z "$output" ]
  [ "$stderr" = "rb-admin: handler 'mailr' has no subscription and no deliveries (subscribed: audit, mailer)" ]
  run -0 rb-admin stats --handler mailer
  [ "$(jq -r 'select(.handler == "mailer") | .handler' <<<"$output")" = mailer ]
}
