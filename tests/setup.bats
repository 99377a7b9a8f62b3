#!/usr/bin/env bats
# rb-setup: the schema through the catalog, idempotence, concurrency,
# --print-sql, subscriptions and every error path.

load test_helper

setup_file() { drop_schema; }
teardown_file() { drop_schema; }

catalog() {  # a stable description of the schema's tables, indexes and options
  local s=${1:-$RB_SCHEMA}
  q "SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '-')
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = '$s' AND c.relkind IN ('r', 'i')
      ORDER BY 1;
     SELECT indexrelid::regclass::text || ' ' || regexp_replace(pg_get_indexdef(indexrelid), '\"?$s\"?\.', '', 'g')
       FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = '$s' ORDER BY 1;
     SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '$s' ORDER BY 1;" \
  | sed "s/\"\?$s\"\?\.//g"
}

@test "rb-setup creates the tables of the seed's design" {
  setup_schema
  run q "SELECT table_name FROM information_schema.tables WHERE table_schema = '$RB_SCHEMA' ORDER BY 1"
  [ "$status" -eq 0 ]
  [ "$output" = "relaybus_deliveries
relaybus_events
relaybus_grants
relaybus_keys
relaybus_lanes
relaybus_schema_version
relaybus_settings
relaybus_subscriptions
relaybus_worker_events" ]
  [ "$(q "SELECT version FROM relaybus_schema_version")" = 1 ]
  # events remember their handlers
  [ "$(q "SELECT data_type FROM information_schema.columns WHERE table_schema = '$RB_SCHEMA' AND table_name = 'relaybus_events' AND column_name = 'handlers'")" = ARRAY ]
}

@test "deliveries carry exactly the four indexes of the seed, the claim cursors' two and the primary key" {
  setup_schema
  run q "SELECT indexname FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_deliveries' ORDER BY 1"
  [ "$output" = "relaybus_deliveries_dead_idx
relaybus_deliveries_due_idx
relaybus_deliveries_lane_due_idx
relaybus_deliveries_lane_kdue_idx
relaybus_deliveries_lane_key_idx
relaybus_deliveries_pkey
relaybus_deliveries_settled_idx" ]
  # the cursors' two: pending only; the global one leads with an
  # expression no statement but the cursors' search names
  [ "$(q "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'relaybus_deliveries_lane_kdue_idx'::regclass")" = "((key IS NOT NULL) AND (status = 'pending'::text))" ]
  [ "$(q "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'relaybus_deliveries_due_idx'::regclass")" = "((status = 'pending'::text) AND ((handler || ''::text) IS NOT NULL))" ]
  [[ "$(q "SELECT pg_get_indexdef('relaybus_deliveries_due_idx'::regclass)")" == *"(((handler || ''::text)), available_at) WHERE"* ]]
  # no index covers a column a happy-path statement writes: claims, attempts, in_flight...
  run q "SELECT DISTINCT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
          WHERE i.indrelid = 'relaybus_deliveries'::regclass ORDER BY 1"
  [ "$output" = "available_at
event_id
handler
id
key
lane
sequence
updated_at" ]
  # the partial ones
  [ "$(q "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'relaybus_deliveries_lane_due_idx'::regclass")" = "((status = 'pending'::text) AND (key IS NULL))" ]
  [ "$(q "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'relaybus_deliveries_dead_idx'::regclass")" = "(status = 'dead'::text)" ]
  # event_id is indexed only for settled deliveries: a publish writes no entry there
  [ "$(q "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'relaybus_deliveries_settled_idx'::regclass")" = "(status <> 'pending'::text)" ]
}

@test "the index on event_id of an existing schema is dropped in place; everything by event still works" {
  drop_schema
  setup_schema -s h1:a.* -s h2:a.b
  # the schema of the last release: a hash index on every delivery's event_id
  q "DROP INDEX IF EXISTS relaybus_deliveries_settled_idx; CREATE INDEX IF NOT EXISTS relaybus_deliveries_event_idx ON relaybus_deliveries USING hash (event_id)"
  run -0 rb-setup -s h1:a.* -s h2:a.b
  [ "$(q "SELECT count(*) FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND indexname = 'relaybus_deliveries_event_idx'")" = 0 ]
  [ "$(q "SELECT count(*) FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND indexname = 'relaybus_deliveries_settled_idx'")" = 1 ]
  # a backlog around them, so that their lanes hold others
  gen_events 600 a.b | rb-publish -q
  printf '%s\n' '{"id":"u1","name":"a.b","payload":{}}' '{"id":"k1","name":"a.b","key":"K","payload":{}}' | rb-publish -q
  # rb-admin by event: show, list, bury, requeue, cancel (unkeyed, keyed, dead)
  [ "$(rb-admin show u1 | jq -r '[.deliveries[] | .handler + ":" + .status] | join(",")')" = "h1:pending,h2:pending" ]
  [ "$(rb-admin show k1 | jq -r '[.deliveries[] | .handler + ":" + .status] | join(",")')" = "h1:pending,h2:pending" ]
  [ "$(rb-admin list --event k1 --handler h2 | jq -r '.event_id + ":" + .handler')" = "k1:h2" ]
  [ "$(rb-admin bury --handler h1 u1 | jq -r '.outcome + ":" + .status')" = "buried:dead" ]
  [ "$(rb-admin show u1 | jq -r '[.deliveries[] | .handler + ":" + .status] | join(",")')" = "h1:dead,h2:pending" ]
  [ "$(q "SELECT relaybus_delivery_exists('u1', 'h1') AND relaybus_delivery_exists('k1', 'h2') AND NOT relaybus_delivery_exists('u1', 'h9')")" = t ]
  [ "$(rb-admin requeue u1 | jq -r '.handler + ":" + .outcome' | tr '\n' ,)" = "h1:requeued,h2:skipped," ]
  [ "$(rb-admin cancel --handler h2 k1 | jq -r .outcome)" = cancelled ]
  [ "$(rb-admin show k1 | jq -r '[.deliveries[] | .handler + ":" + .status] | join(",")')" = "h1:pending" ]
  # a redelivered id adds only the delivery of a handler subscribed since, in the lane of its key
  rb-setup -q -s 'h3:a.*'
  [ "$(q "SELECT deliveries || ' ' || duplicate FROM relaybus_publish('a.b', '{}', 'K', 'k1', p_handlers => '{h1,h3}')")" = "1 true" ]
  [ "$(q "SELECT key || ' ' || (lane = relaybus_lane('K')) FROM relaybus_deliveries WHERE event_id = 'k1' AND handler = 'h3'")" = "K true" ]
  rb-setup -q --unsubscribe 'h3:a.*'
  # a result without its delivery id completes through its lane (and a second time is lost, missing)
  rb-claim -H h2 --batch 1000 | jq -c 'select(.event_id == "u1") | del(.delivery_id) + {ok: true}' >"$BATS_TEST_TMPDIR/r"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/r")" = 1 ]
  run -0 rb-complete -o <"$BATS_TEST_TMPDIR/r"
  [ "$(jq -r .outcome <<<"$output")" = completed ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'u1' AND handler = 'h2'")" = 0 ]
  run --separate-stderr rb-complete -o <"$BATS_TEST_TMPDIR/r"
  [ "$(jq -r '.outcome + " " + (.missing | tostring)' <<<"$output")" = "lost true" ]
  # effectively-once from SQL: relaybus_complete(lease, event_id, handler)
  line=$(rb-claim -H h1 --batch 1000 | jq -c 'select(.event_id == "k1")')
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$line")', 'k1', 'h1')")" = completed ]
  [ "$(q "SELECT relaybus_complete('$(jq -r .lease <<<"$line")', 'k1', 'h1')")" = lost ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'k1' AND handler = 'h1'")" = 0 ]
  # (its backlog is no other test's)
  drop_schema
}

@test "lanes have no secondary index and fillfactor 10; deliveries vacuum at 2%" {
  setup_schema
  [ "$(q "SELECT count(*) FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_lanes'")" = 1 ]
  [ "$(q "SELECT indexname FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_lanes'")" = relaybus_lanes_pkey ]
  [ "$(q "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'relaybus_lanes'::regclass")" = "fillfactor=10" ]
  [ "$(q "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'relaybus_deliveries'::regclass")" = "autovacuum_vacuum_scale_factor=0.02" ]
}

@test "the completion history table exists only with --completion-history" {
  setup_schema
  [ "$(q "SELECT to_regclass('relaybus_completions') IS NULL")" = t ]
  rb-setup --completion-history
  [ "$(q "SELECT to_regclass('relaybus_completions') IS NOT NULL")" = t ]
}

@test "a subscription creates the handler's 256 lanes; glob and exact patterns" {
  setup_schema --subscribe mailer:order.created --subscribe 'audit:order.*' -s audit:invoice.paid
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'mailer'")" = 256 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'audit'")" = 256 ]
  [ "$(q "SELECT min(lane) || '-' || max(lane) || ' ' || count(DISTINCT lane) FROM relaybus_lanes WHERE handler = 'audit'")" = "0-255 256" ]
  run q "SELECT handler || ' ' || pattern FROM relaybus_subscriptions ORDER BY 1"
  [ "$output" = "audit invoice.paid
audit order.*
mailer order.created" ]
  # the glob matches what a user expects, and only that
  [ "$(q "SELECT string_agg(handler, ',' ORDER BY handler) FROM relaybus_subscriptions WHERE 'order.shipped' LIKE like_pattern")" = audit ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE 'orderXcreated' LIKE like_pattern")" = 0 ]
  rb-setup --unsubscribe 'audit:order.*'
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'audit'")" = 1 ]
  # lanes stay: pending deliveries may still need them
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'audit'")" = 256 ]
}

@test "a second run changes nothing" {
  setup_schema -s h1:a.b
  before=$(catalog)
  q "INSERT INTO relaybus_events (id, name, payload) VALUES ('keep', 'x', '{}')"
  rb-setup -s h1:a.b
  [[ "$before" == *"relaybus_lanes r fillfactor=10"* ]]
  [ "$(catalog)" = "$before" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'h1'")" = 256 ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'h1'")" = 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 1 ]
}

@test "lanes of a schema from before the holder column get it in place; a lease held then is nobody's holder" {
  setup_schema -s h1:a.b
  q "ALTER TABLE relaybus_lanes DROP COLUMN holder;
     UPDATE relaybus_lanes SET lease_owner = 'old', lease_expires_at = now() + interval '1 hour' WHERE handler = 'h1' AND lane = 3"
  run -0 rb-setup -s h1:a.b
  [ "$(q "SELECT lease_owner || ' ' || coalesce(holder::text, 'none') FROM relaybus_lanes WHERE handler = 'h1' AND lane = 3")" = "old none" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'h1'")" = 256 ]
  # no index on it: lane updates stay HOT
  [ "$(q "SELECT string_agg(indexname, ',') FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_lanes'")" = relaybus_lanes_pkey ]
}

@test "a new delivery stores no updated_at (rb-admin shows its created_at); an older schema gets the column in place" {
  setup_schema -s h1:a.b
  # the schema of the last release: updated_at NOT NULL DEFAULT now(), rows holding it
  q "ALTER TABLE relaybus_deliveries ALTER COLUMN updated_at SET DEFAULT now(), ALTER COLUMN updated_at SET NOT NULL"
  printf '%s\n' '{"id":"u0","name":"a.b","payload":{}}' | rb-publish -q
  run -0 rb-setup -s h1:a.b
  [ "$(q "SELECT is_nullable || ' ' || coalesce(column_default, 'none') FROM information_schema.columns
          WHERE table_schema = '$RB_SCHEMA' AND table_name = 'relaybus_deliveries' AND column_name = 'updated_at'")" = "YES none" ]
  [ "$(q "SELECT updated_at IS NOT NULL FROM relaybus_deliveries WHERE event_id = 'u0'")" = t ]
  printf '%s\n' '{"id":"u1","name":"a.b","payload":{}}' | rb-publish -q
  [ "$(q "SELECT updated_at IS NULL FROM relaybus_deliveries WHERE event_id = 'u1'")" = t ]
  run -0 rb-admin list --event u1
  [ "$(jq -r '.updated_at == .created_at and (.created_at | length) == 24' <<<"$output")" = true ]
  # a failure sets it
  rb-claim -H h1 | jq -c 'select(.event_id == "u1") + {ok: false, error: "e"}' | rb-complete -q >/dev/null
  [ "$(q "SELECT updated_at IS NOT NULL FROM relaybus_deliveries WHERE event_id = 'u1'")" = t ]
}

@test "a delivery due at its publish stores no created_at (it is its available_at), kept through a retry; a delayed one stores it" {
  setup_schema -s h1:a.b
  printf '%s\n' '{"id":"c1","name":"a.b","payload":{}}' '{"id":"c2","name":"a.b","payload":{},"delay_ms":60000}' | rb-publish -q
  [ "$(q "SELECT string_agg(event_id || ':' || (created_at IS NULL), ',' ORDER BY event_id) FROM relaybus_deliveries WHERE event_id IN ('c1', 'c2')")" = "c1:true,c2:false" ]
  [ "$(q "SELECT is_nullable FROM information_schema.columns WHERE table_schema = '$RB_SCHEMA'
          AND table_name = 'relaybus_deliveries' AND column_name = 'created_at'")" = YES ]
  created=$(q "SELECT relaybus_ts(available_at) FROM relaybus_deliveries WHERE event_id = 'c1'")
  run -0 rb-admin list --event c1
  [ "$(jq -r .created_at <<<"$output")" = "$created" ]
  # a retry moves available_at, not created_at (claim output and listings)
  sleep 0.05
  rb-claim -H h1 | jq -c 'select(.event_id == "c1") | . + {ok: false, error: "e", retry_ms: 0}' | rb-complete -q >/dev/null
  [ "$(q "SELECT relaybus_ts(created_at) || ' ' || (available_at > created_at) FROM relaybus_deliveries WHERE event_id = 'c1'")" = "$created true" ]
  run -0 rb-admin list --event c1
  [ "$(jq -r .created_at <<<"$output")" = "$created" ]
  [ "$(rb-claim -H h1 | jq -r 'select(.event_id == "c1") | .created_at')" = "$created" ]
}

@test "an event without headers stores none; claims, rb-admin show and relaybus_worker_events give {}" {
  setup_schema -s h1:a.b
  # the schema of the last release: headers NOT NULL
  q "UPDATE relaybus_events SET headers = '{}' WHERE headers IS NULL;
     ALTER TABLE relaybus_events ALTER COLUMN headers SET NOT NULL"
  run -0 rb-setup -s h1:a.b -s h9:z.z
  printf '%s\n' '{"id":"h1","name":"a.b","payload":{}}' '{"id":"h2","name":"a.b","payload":{},"headers":{"x":"1"}}' | rb-publish -q
  q "SELECT relaybus_publish('a.b', '{}', NULL, 'h3')" >/dev/null
  [ "$(q "SELECT string_agg(id || ':' || coalesce(headers::text, 'none'), ',' ORDER BY id) FROM relaybus_events WHERE id IN ('h1', 'h2', 'h3')")" = 'h1:none,h2:{"x": "1"},h3:none' ]
  [ "$(q "SELECT string_agg(id || ':' || headers::text, ',' ORDER BY id) FROM relaybus_worker_events WHERE id IN ('h1', 'h2', 'h3')")" = 'h1:{},h2:{"x": "1"},h3:{}' ]
  run -0 rb-admin show h1
  [ "$(jq -c .headers <<<"$output")" = '{}' ]
  [ "$(rb-claim -H h1 --batch 100 | jq -c 'select(.event_id | test("^h[123]$")) | [.event_id, .headers]' | sort | tr -d '\n')" = '["h1",{}]["h2",{"x":"1"}]["h3",{}]' ]
  q "SELECT relaybus_publish('z.z', '{}', NULL, 'h4')" >/dev/null
  [ "$(q "SELECT event_id || ':' || headers::text FROM relaybus_claim('h9', 'psql', 100, 60000, 5)")" = 'h4:{}' ]
}

@test "four rb-setup at the same moment all succeed and agree" {
  need_pg
  export RELAYBUS_SCHEMA=${RB_SCHEMA}_c
  pids=()
  for i in 1 2 3 4; do rb-setup -s "h$i:x.*" 2>"$BATS_TEST_TMPDIR/err$i" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p"; done
  for i in 1 2 3 4; do [ ! -s "$BATS_TEST_TMPDIR/err$i" ]; done
  [ "$(q "SELECT count(*) FROM ${RB_SCHEMA}_c.relaybus_lanes")" = 1024 ]
  [ "$(catalog "${RB_SCHEMA}_c")" = "$(RB_SCHEMA=${RB_SCHEMA}_c catalog)" ]
  psql "$_test_pg_url" -qX -c "DROP SCHEMA ${RB_SCHEMA}_c CASCADE" >/dev/null
}

@test "--print-sql applied with psql yields the same catalog" {
  setup_schema --completion-history -s "x:y"
  run rb-setup --print-sql --schema "${RB_SCHEMA}_p" --completion-history -s "x:y"
  [ "$status" -eq 0 ]
  [[ "${lines[1]}" == "BEGIN;" ]]
  [[ "$output" == *"pg_advisory_xact_lock"* ]]
  [[ "${lines[-1]}" == "COMMIT;" ]]
  printf '%s\n' "$output" | psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 >/dev/null 2>&1
  [ "$(catalog "${RB_SCHEMA}_p")" = "$(catalog)" ]
  [ "$(q "SELECT count(*) FROM ${RB_SCHEMA}_p.relaybus_lanes WHERE handler = 'x'")" = 256 ]
  # and it is idempotent as a script too
  printf '%s\n' "$output" | psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 >/dev/null 2>&1
  psql "$_test_pg_url" -qX -c "DROP SCHEMA ${RB_SCHEMA}_p CASCADE" >/dev/null
}

@test "--print-sql --no-transaction: for a migration tool's own transaction (psql -1), without NOTICEs, run twice" {
  setup_schema --completion-history -s "x:y"
  run -0 --separate-stderr rb-setup --print-sql --no-transaction --schema "${RB_SCHEMA}_m" --completion-history -s "x:y"
  ! grep -qx 'BEGIN;' <<<"$output"
  ! grep -qx 'COMMIT;' <<<"$output"
  printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/V1__relaybus.sql"
  # as Flyway, sqitch or dbmate do: the file in one transaction of theirs
  run -0 --separate-stderr psql "$_test_pg_url" -X -q -1 -v ON_ERROR_STOP=1 -f "$BATS_TEST_TMPDIR/V1__relaybus.sql"
  [ -z "$stderr" ] || { echo "$stderr"; false; }
  run -0 --separate-stderr psql "$_test_pg_url" -X -q -1 -v ON_ERROR_STOP=1 -f "$BATS_TEST_TMPDIR/V1__relaybus.sql"
  [ -z "$stderr" ] || { echo "$stderr"; false; }
  [ "$(catalog "${RB_SCHEMA}_m")" = "$(catalog)" ]
  # the form with its own transaction is quiet too
  run -0 --separate-stderr rb-setup --print-sql --schema "${RB_SCHEMA}_m" --completion-history -s "x:y"
  run -0 --separate-stderr psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 <<<"$output"
  [ -z "$stderr" ] || { echo "$stderr"; false; }
  psql "$_test_pg_url" -qX -c "DROP SCHEMA ${RB_SCHEMA}_m CASCADE" >/dev/null
  run -64 --separate-stderr rb-setup --no-transaction
  [[ $stderr == "rb-setup: --no-transaction goes with --print-sql"* ]]
}

@test "--print-sql needs no database" {
  run --separate-stderr env RELAYBUS_URL=postgresql://nobody@127.0.0.1:1/none rb-setup --print-sql
  [ "$status" -eq 0 ]
  [[ "$output" == *'CREATE TABLE IF NOT EXISTS "public".relaybus_lanes'* ]]
}

@test "the SQL lane function agrees with FNV-1a" {
  setup_schema
  # vectors: fnv1a32('a') = e40c292c, fnv1a32('foobar') = bf9cf968, fnv1a32('') = 811c9dc5
  [ "$(q "SELECT relaybus_lane('a') || ',' || relaybus_lane('foobar') || ',' || relaybus_lane('')")" = "44,104,197" ]
}

@test "unreachable database: one line, exit 69, password redacted" {
  run --separate-stderr rb-setup --db 'postgresql://app:hunter2@127.0.0.1:1/relay'
  [ "$status" -eq 69 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-setup: cannot connect to postgresql://app:xxxxx@127.0.0.1:1/relay: "* ]]
  [[ "$stderr" != *hunter2* ]]
}

# A role with a password, and one pg_hba.conf line that asks for it (the
# test cluster trusts everyone else), put back by teardown.
_hba=
teardown() {
  [ -n "$_hba" ] || return 0
  cat "$BATS_TEST_TMPDIR/hba.orig" >"$_hba"
  q "SELECT pg_reload_conf()" >/dev/null
  q "DROP ROLE IF EXISTS $_auth_role" >/dev/null
}

@test "a wrong or missing password: one line, exit 77, password redacted" {
  need_pg
  local hba port
  hba=$(q "SHOW hba_file")
  [ -w "$hba" ] || skip "cannot write the server's $hba"
  port=$(q "SHOW port")
  _auth_role="${RB_SCHEMA}_pw"
  q "DROP ROLE IF EXISTS $_auth_role; CREATE ROLE $_auth_role LOGIN PASSWORD 'right-pw'"
  cp "$hba" "$BATS_TEST_TMPDIR/hba.orig"
  _hba=$hba
  { echo "host all $_auth_role 127.0.0.1/32 scram-sha-256"; cat "$BATS_TEST_TMPDIR/hba.orig"; } >"$BATS_TEST_TMPDIR/hba.new"
  cat "$BATS_TEST_TMPDIR/hba.new" >"$hba"   # (in place: the file stays the server's)
  q "SELECT pg_reload_conf()" >/dev/null
  # the server reads the file again soon after the signal
  for _ in $(seq 50); do
    PGPASSWORD=wrong psql -X -w "host=127.0.0.1 port=$port user=$_auth_role dbname=postgres" -c 'SELECT 1' \
      >/dev/null 2>&1 || break
    sleep 0.1
  done
  # (the right one is let in: the line asks for this role's password, nothing else)
  [ "$(PGPASSWORD=right-pw psql -X -w -At "host=127.0.0.1 port=$port user=$_auth_role dbname=postgres" \
    -c 'SELECT 1')" = 1 ]
  run --separate-stderr rb-setup --db "postgresql://$_auth_role:hunter2@127.0.0.1:$port/postgres"
  [ "$status" -eq 77 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-setup: cannot connect to postgresql://$_auth_role:xxxxx@127.0.0.1:$port/postgres: "* ]]
  [[ "$stderr" == *"password authentication failed"* ]]
  [[ "$stderr" != *hunter2* ]]
  run --separate-stderr env PGPASSFILE="$BATS_TEST_TMPDIR/no-such-file" rb-admin stats --db "host=127.0.0.1 port=$port user=$_auth_role dbname=postgres"
  [ "$status" -eq 77 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-admin: cannot connect to "* ]]
}

@test "RELAYBUS_URL is used and redacted too" {
  run --separate-stderr env RELAYBUS_URL='host=127.0.0.1 port=1 password=hunter2' rb-setup
  [ "$status" -eq 69 ]
  [[ "$stderr" == *"password=xxxxx"* ]]
  [[ "$stderr" != *hunter2* ]]
}

@test "bad options: usage and exit 64" {
  run --separate-stderr rb-setup --frobnicate
  [ "$status" -eq 64 ]
  [[ "$stderr" == *"unrecognized option '--frobnicate'"* ]]
  [[ "$stderr" == *"usage: rb-setup"* ]]
  [[ "$stderr" == *"Try 'rb-setup --help' for more information."* ]]
  run --separate-stderr rb-setup --subscribe nocolon
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-setup: --subscribe: 'nocolon' is not HANDLER:PATTERN" ]
  run --separate-stderr rb-setup --subscribe 'bad handler:x'
  [ "$status" -eq 64 ]
  run --separate-stderr rb-setup --schema 'Robert"; drop'
  [ "$status" -eq 64 ]
  [[ "${stderr_lines[0]}" == "rb-setup: --schema: 'Robert\"; drop' is not a schema name"* ]]
  run --separate-stderr rb-setup extra-arg
  [ "$status" -eq 64 ]
}

@test "psql's -h -p -U -d connect as psql's do, over RELAYBUS_URL; -h is never help" {
  need_pg
  local host port user db
  IFS='|' read -r host port user db < <(q "SELECT coalesce(host(inet_server_addr()),
      split_part(current_setting('unix_socket_directories'), ',', 1)), current_setting('port'),
      current_user, current_database()")
  # the environment names a server that is not there: the options win
  run --separate-stderr env RELAYBUS_URL='postgresql://nobody@127.0.0.1:1/none' \
    rb-setup -h "$host" -p "$port" -U "$user" -d "$db" --subscribe 'psqlopt:x.*'
  [ "$status" -eq 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'psqlopt'")" = 1 ]
  run --separate-stderr env -u RELAYBUS_URL rb-admin --host "$host" --port "$port" --username "$user" \
    --dbname "$db" subscriptions --json
  [ "$status" -eq 0 ]
  [[ "$output" == *'"psqlopt"'* ]]
  # -d with a URL is --db
  run --separate-stderr env -u RELAYBUS_URL rb-admin -d "$_test_pg_url" subscriptions --json
  [ "$status" -eq 0 ]
  [[ "$output" == *'"psqlopt"'* ]]
  # the cron line of the users' review: no usage text in the metrics file
  run --separate-stderr bash -c "rb-admin -h 127.0.0.1 -p 1 stats --prometheus >'$BATS_TEST_TMPDIR/relaybus.prom'"
  [ "$status" -eq 69 ]
  [[ "$stderr" == *'port 1 failed'* ]]
  ! grep -q usage "$BATS_TEST_TMPDIR/relaybus.prom"
  # -h without its argument says what it is; --help is help
  run --separate-stderr rb-admin -h
  [ "$status" -eq 64 ]
  [[ "$stderr" == *"rb-admin: -h is the database host, as in psql; --help for help"* ]]
  [ -z "$output" ]
  run --separate-stderr rb-claim -p 0 -H x
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-claim: --port: '0' is not a whole number from 1 to 65535" ]
}

@test "an unknown URL scheme is a configuration error (78)" {
  run --separate-stderr rb-setup --db 'mysql://u:pw@h/d'
  [ "$status" -eq 78 ]
  [[ "$stderr" == *"mysql://u:xxxxx@h/d"* ]]
}

@test "--help and --version" {
  run rb-setup --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: rb-setup "* ]]
  run rb-setup -V
  [ "$status" -eq 0 ]
  [[ "$output" == "rb-setup 0.2.0 (backends: postgresql"* ]]
  # libpq's version as its users write it (15.18, not 150018)
  [[ "$output" =~ \;\ libpq\ [0-9]+\.[0-9]+(\.[0-9]+)?,\ (libmongoc\ [0-9.]+,\ )?jansson\  ]]
}

@test "MongoDB: --grant and --revoke exit 69 (not supported by the backend) and set nothing up" {
  need_pg
  on_mongo || skip "MongoDB only (PostgreSQL's roles: roles.bats)"
  run rb-setup --check
  before="$status $output"
  run --separate-stderr rb-setup -s 'h:x' --grant worker=w
  [ "$status" -eq 69 ]
  [ "$stderr" = "rb-setup: grant not supported by the mongodb backend" ]
  run --separate-stderr rb-setup --revoke admin=a
  [ "$status" -eq 69 ]
  [ "$stderr" = "rb-setup: grant not supported by the mongodb backend" ]
  run rb-setup --check
  [ "$status $output" = "$before" ]
}
