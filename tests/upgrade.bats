#!/usr/bin/env bats
# The upgrade of a relaybus 0.1.0 schema in place (tests/fixtures/schema-0.1.0.sql),
# schema versions (rb-setup --check, the refusal of every program), and the
# bad input around them: a set-up killed halfway, a schema of a newer
# relaybus, an unreachable database.

load test_helper

setup() {
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    drop_schema
    drop_other
  fi
}

teardown() {
  kill_pids_drop_schema
  drop_other
}

OTHER=${RB_SCHEMA:0:44}_other
drop_other() {
  psql "$_test_pg_url" -X -q -c "DROP SCHEMA IF EXISTS \"$OTHER\" CASCADE" >/dev/null 2>&1 || true
}

fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }

# A relaybus 0.1.0 schema (default: this file's) with deliveries in every
# state, keyed and unkeyed, for two handlers (payload i = publish order):
#   K1: o1 (mailer and audit completed), o2 (mailer processing, attempt 1
#       counted; audit pending), o3 (both pending)
#   K2: o4 (mailer dead after 10 attempts; audit completed), o5 (mailer pending)
#   unkeyed: u6 (mailer processing, 2 attempts), u7 (mailer completed),
#       u8 (mailer dead), u9 (mailer and audit pending)
load_010() {  # [schema]
  local s=${1:-$RB_SCHEMA}
  psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -c "CREATE SCHEMA \"$s\""
  PGOPTIONS="-c search_path=$s -c client_min_messages=warning" \
    psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -f "$RB_SRCDIR/tests/fixtures/schema-0.1.0.sql" \
      -c "INSERT INTO relaybus_events (id, name, key, payload) VALUES
            ('o1', 'order', 'K1', '{\"i\":1}'), ('o2', 'order', 'K1', '{\"i\":2}'),
            ('o3', 'order', 'K1', '{\"i\":3}'), ('o4', 'order', 'K2', '{\"i\":4}'),
            ('o5', 'order', 'K2', '{\"i\":5}'), ('u6', 'note', NULL, '{\"i\":6}'),
            ('u7', 'note', NULL, '{\"i\":7}'), ('u8', 'note', NULL, '{\"i\":8}'),
            ('u9', 'note', NULL, '{\"i\":9}');
          INSERT INTO relaybus_keys VALUES ('K1', 3), ('K2', 2);
          INSERT INTO relaybus_deliveries (event_id, handler, key, sequence, status, attempts,
                lease_owner, lease_token, lease_expires_at, last_error, updated_at, completed_at) VALUES
            ('o1', 'mailer', 'K1', 1, 'completed', 1, NULL, NULL, NULL, NULL, now() - interval '3 hours', now() - interval '2 hours'),
            ('o1', 'audit', 'K1', 1, 'completed', 1, NULL, NULL, NULL, NULL, now() - interval '3 hours', now() - interval '2 hours'),
            ('o2', 'mailer', 'K1', 2, 'processing', 1, 'w1', 'tok-a', now() + interval '1 minute', NULL, now(), NULL),
            ('o2', 'audit', 'K1', 2, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL),
            ('o3', 'mailer', 'K1', 3, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL),
            ('o3', 'audit', 'K1', 3, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL),
            ('o4', 'mailer', 'K2', 1, 'dead', 10, NULL, NULL, NULL, 'boom', now() - interval '1 day', NULL),
            ('o4', 'audit', 'K2', 1, 'completed', 2, NULL, NULL, NULL, NULL, now() - interval '3 hours', now() - interval '2 hours'),
            ('o5', 'mailer', 'K2', 2, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL),
            ('u6', 'mailer', NULL, NULL, 'processing', 2, 'w1', 'tok-b', now() - interval '1 minute', 'timeout', now(), NULL),
            ('u7', 'mailer', NULL, NULL, 'completed', 1, NULL, NULL, NULL, NULL, now() - interval '3 hours', now() - interval '2 hours'),
            ('u8', 'mailer', NULL, NULL, 'dead', 3, NULL, NULL, NULL, 'nope', now() - interval '1 day', NULL),
            ('u9', 'mailer', NULL, NULL, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL),
            ('u9', 'audit', NULL, NULL, 'pending', 0, NULL, NULL, NULL, NULL, now(), NULL);" >/dev/null
}

# the shape of a schema: tables and their columns (any order), indexes,
# constraints, storage parameters, functions
shape() {  # [schema]
  local s=${1:-$RB_SCHEMA}
  psql "$_test_pg_url" -X -A -t -q -v ON_ERROR_STOP=1 -c "
    SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '-') || ' '
           || (SELECT string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod)
                                 || CASE WHEN a.attnotnull THEN '!' ELSE '' END, ',' ORDER BY a.attname)
                 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = '$s' AND c.relkind = 'r'
    UNION ALL
    SELECT 'index ' || regexp_replace(pg_get_indexdef(i.indexrelid), '\"?$s\"?\.', '', 'g')
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = '$s'
    UNION ALL
    SELECT 'constraint ' || r.conrelid::regclass::text || ' ' || r.conname || ' ' || pg_get_constraintdef(r.oid)
      FROM pg_constraint r JOIN pg_namespace n ON n.oid = r.connamespace WHERE n.nspname = '$s'
    UNION ALL
    SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '$s'
    ORDER BY 1" | sed "s/\"\?$s\"\?\.//g"
}

# every row that matters, in a stable order
rows() {  # [schema]
  local s=${1:-$RB_SCHEMA}
  psql "$_test_pg_url" -X -A -t -q -v ON_ERROR_STOP=1 -c "
    SELECT 'd', event_id, handler, lane, key, sequence, status, attempts, claims, last_error, available_at, updated_at
      FROM \"$s\".relaybus_deliveries ORDER BY event_id, handler;
    SELECT 'e', id, handlers FROM \"$s\".relaybus_events ORDER BY id;
    SELECT 'k', key, sequence FROM \"$s\".relaybus_keys ORDER BY key;
    SELECT 'l', handler, count(*), sum(epoch) FROM \"$s\".relaybus_lanes GROUP BY handler ORDER BY handler;
    SELECT 'v', version FROM \"$s\".relaybus_schema_version ORDER BY version;"
}

@test "the fixture is the 0.1.0 schema: the lease columns and the ten indexes of the seed" {
  need_pg
  load_010
  [ "$(q "SELECT count(*) FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_deliveries'")" = 10 ]
  [ "$(q "SELECT string_agg(column_name, ',' ORDER BY column_name) FROM information_schema.columns
          WHERE table_schema = '$RB_SCHEMA' AND table_name = 'relaybus_deliveries' AND column_name LIKE 'lease%'")" = lease_expires_at,lease_owner,lease_token ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 14 ]
}

@test "every program refuses a 0.1.0 schema with one line naming rb-setup (exit 79)" {
  need_pg
  load_010
  msg="schema \"$RB_SCHEMA\" holds the 0.1.0 row-lease schema, this relaybus needs schema version 1: stop the 0.1.0 workers and run rb-setup"
  for cmd in "rb-publish" "rb-claim -H mailer" "rb-complete" "rb-admin stats" \
             "rb-dispatch -H mailer --exec true --drain" "rb-pageinspect watch -c 1"; do
    run --separate-stderr $cmd </dev/null
    [ "$status" -eq 79 ] || { echo "$cmd: exit $status: $stderr"; false; }
    [ "${#stderr_lines[@]}" -eq 1 ]
    [[ "$stderr" == "${cmd%% *}: "*"$msg" ]]  # (rb-dispatch: mailer: ...)
  done
  run --separate-stderr rb-setup --check
  [ "$status" -eq 79 ]
  [ "$output" = "schema $RB_SCHEMA: the 0.1.0 row-lease schema; relaybus 0.2.0 expects schema version 1: upgrade due, run rb-setup" ]
  [ -z "$stderr" ]
  # nothing was changed by any of them
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE lease_token IS NOT NULL")" = 2 ]
}

@test "rb-setup upgrades 0.1.0 in place: lanes, handlers, processing to pending, leases and old indexes gone" {
  need_pg
  load_010
  # at the default verbosity: a line before, and one after with what it converted and how long it took
  run --separate-stderr rb-setup
  [ "$status" -eq 0 ]
  [ "${#stderr_lines[@]}" -eq 2 ]
  [ "${stderr_lines[0]}" = "rb-setup: upgrading schema $RB_SCHEMA from the 0.1.0 row-lease schema to schema version 1, in one transaction (its workers stopped)" ]
  [[ "${stderr_lines[1]}" =~ ^"rb-setup: schema $RB_SCHEMA upgraded from the 0.1.0 row-lease schema to schema version 1: 14 deliveries converted in "[0-9]+\.[0-9]" s"$ ]]
  run rb-setup --check
  [ "$status" -eq 0 ]
  [ "$output" = "schema $RB_SCHEMA: schema version 1; relaybus 0.2.0 expects schema version 1: up to date" ]
  # every row is there, in the state 0.1.0 left it, processing as pending with its attempts
  [ "$(q "SELECT string_agg(event_id || ':' || handler || ':' || status || ':' || attempts || ':' || coalesce(last_error, '-'), ' ' ORDER BY event_id, handler)
          FROM relaybus_deliveries")" = "o1:audit:completed:1:- o1:mailer:completed:1:- o2:audit:pending:0:- o2:mailer:pending:1:- o3:audit:pending:0:- o3:mailer:pending:0:- o4:audit:completed:2:- o4:mailer:dead:10:boom o5:mailer:pending:0:- u6:mailer:pending:2:timeout u7:mailer:completed:1:- u8:mailer:dead:3:nope u9:audit:pending:0:- u9:mailer:pending:0:-" ]
  # the lane is the hash new deliveries get: of the key, else of the event id
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE lane <> relaybus_lane(coalesce(key, event_id))")" = 0 ]
  [ "$(q "SELECT count(DISTINCT lane) FROM relaybus_deliveries WHERE key = 'K1'")" = 1 ]
  echo '{"id":"n1","name":"order","key":"K1","payload":{"i":10},"handlers":["mailer"]}' | rb-publish -q
  [ "$(q "SELECT lane FROM relaybus_deliveries WHERE event_id = 'n1'")" = "$(q "SELECT lane FROM relaybus_deliveries WHERE event_id = 'o2' AND handler = 'mailer'")" ]
  # the key counter goes on where 0.1.0 left it
  [ "$(q "SELECT sequence FROM relaybus_deliveries WHERE event_id = 'n1'")" = 4 ]
  # a completed delivery keeps its row, its completion time as updated_at
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'completed' AND updated_at < now() - interval '110 minutes' AND updated_at > now() - interval '130 minutes'")" = 4 ]
  # events remember their handlers, completed ones included
  [ "$(q "SELECT string_agg(id || '=' || array_to_string(handlers, '+'), ' ' ORDER BY id) FROM relaybus_events")" = "n1=mailer o1=audit+mailer o2=audit+mailer o3=audit+mailer o4=audit+mailer o5=mailer u6=mailer u7=mailer u8=mailer u9=audit+mailer" ]
  # the lease columns, completed_at and the foreign key are gone; no 0.1.0 index is left
  [ "$(q "SELECT count(*) FROM information_schema.columns WHERE table_schema = '$RB_SCHEMA' AND table_name = 'relaybus_deliveries'
          AND column_name IN ('lease_owner', 'lease_token', 'lease_expires_at', 'completed_at')")" = 0 ]
  [ "$(q "SELECT count(*) FROM pg_constraint WHERE conrelid = 'relaybus_deliveries'::regclass AND contype = 'f'")" = 0 ]
  run q "SELECT indexname FROM pg_indexes WHERE schemaname = '$RB_SCHEMA' AND tablename = 'relaybus_deliveries' ORDER BY 1"
  [ "$output" = "relaybus_deliveries_completed_010_idx
relaybus_deliveries_dead_idx
relaybus_deliveries_due_idx
relaybus_deliveries_lane_due_idx
relaybus_deliveries_lane_kdue_idx
relaybus_deliveries_lane_key_idx
relaybus_deliveries_pkey
relaybus_deliveries_settled_idx" ]
  # the 256 lanes of each handler, and the storage parameters
  [ "$(q "SELECT string_agg(handler || ':' || n, ' ' ORDER BY handler) FROM (SELECT handler, count(*) AS n FROM relaybus_lanes GROUP BY handler) l")" = "audit:256 mailer:256" ]
  [ "$(q "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'relaybus_deliveries'::regclass")" = "autovacuum_vacuum_scale_factor=0.02" ]
  [ "$(q "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = 'relaybus_lanes'::regclass")" = "fillfactor=10" ]
}

@test "on a terminal the upgrade shows its steps in one line rewritten in place, then the summary line; -q shows neither" {
  need_pg
  load_010
  run script -qec "rb-setup" /dev/null
  [ "$status" -eq 0 ]
  out=$(tr -d '\r' <<<"$output" | sed 's/\x1b\[K/|/g')
  echo "$out"
  # each of the four steps, in order, each wiping the one before (ESC [K)
  [[ "$out" == *"|rb-setup: upgrading 14 deliveries: 1/4 events remember their handlers|rb-setup: upgrading 14 deliveries: 2/4 the deliveries rewritten with their lanes ("*" s so far)|rb-setup: upgrading 14 deliveries: 3/4 "*"|rb-setup: upgrading 14 deliveries: 4/4 the new indexes, lanes and functions ("*" s so far)|rb-setup: schema $RB_SCHEMA upgraded from the 0.1.0 row-lease schema to schema version 1: 14 deliveries converted in "* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 14 ]
  # -q on a terminal: nothing at all
  q "DROP SCHEMA \"$RB_SCHEMA\" CASCADE"
  load_010
  run script -qec "rb-setup -q" /dev/null
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

@test "the upgraded schema has the shape of a fresh one, and the index of the completed rows" {
  need_pg
  load_010
  rb-setup
  RELAYBUS_SCHEMA=$OTHER rb-setup
  # (column order aside: shape() sorts them)
  diff <(shape "$OTHER") <(shape) >"$BATS_TEST_TMPDIR/diff" || true
  [ "$(grep -c '^[<>]' "$BATS_TEST_TMPDIR/diff")" = 3 ]
  grep -q "^> index CREATE INDEX relaybus_deliveries_completed_010_idx ON relaybus_deliveries USING btree (updated_at, id) WHERE (status = 'completed'::text)$" "$BATS_TEST_TMPDIR/diff"
  grep -q "^< constraint relaybus_deliveries relaybus_deliveries_status_check CHECK ((status = ANY (ARRAY\['pending'::text, 'dead'::text\])))$" "$BATS_TEST_TMPDIR/diff"
  grep -q "^> constraint relaybus_deliveries relaybus_deliveries_status_check CHECK ((status = ANY (ARRAY\['pending'::text, 'dead'::text, 'completed'::text\])))$" "$BATS_TEST_TMPDIR/diff"
}

@test "a second rb-setup changes nothing" {
  need_pg
  load_010
  rb-setup
  before_shape=$(shape)
  before_rows=$(rows)
  rb-setup
  [ "$(shape)" = "$before_shape" ]
  [ "$(rows)" = "$before_rows" ]
}

@test "--print-sql applied with psql upgrades the same way, and a second time changes nothing" {
  need_pg
  load_010
  load_010 "$OTHER"
  rb-setup
  run --separate-stderr rb-setup --print-sql --schema "$OTHER"
  [ "$status" -eq 0 ]
  [[ "$output" == *'ALTER COLUMN lane TYPE smallint USING "'"$OTHER"'".relaybus_lane(coalesce(key, event_id))'* ]]
  printf '%s\n' "$output" >"$BATS_TEST_TMPDIR/setup.sql"
  psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -c "SET client_min_messages = warning" -f "$BATS_TEST_TMPDIR/setup.sql" >/dev/null
  [ "$(shape "$OTHER")" = "$(shape)" ]
  # the rows too (timestamps aside: both fixtures were loaded at their own now())
  strip() { cut -d'|' -f1-10; }
  [ "$(rows "$OTHER" | strip)" = "$(rows | strip)" ]
  before=$(rows "$OTHER")
  psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -c "SET client_min_messages = warning" -f "$BATS_TEST_TMPDIR/setup.sql" >/dev/null
  [ "$(rows "$OTHER")" = "$before" ]
  [ "$(RELAYBUS_SCHEMA=$OTHER rb-setup --check)" = "schema $OTHER: schema version 1; relaybus 0.2.0 expects schema version 1: up to date" ]
}

@test "after the upgrade a drain keeps each key's order and the attempts; dead stay dead; completed never run again" {
  need_pg
  load_010
  rb-setup
  # new events after the upgrade, behind the old ones of their keys
  printf '%s\n' '{"id":"n11","name":"order","key":"K1","payload":{"i":11},"handlers":["mailer","audit"]}' \
    '{"id":"n12","name":"order","key":"K2","payload":{"i":12},"handlers":["mailer","audit"]}' \
    '{"id":"n13","name":"note","payload":{"i":13},"handlers":["mailer","audit"]}' | rb-publish -q
  # a redelivery of events that completed under 0.1.0 adds nothing
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
  # dead stay dead with their attempts and errors; completed rows stay completed
  [ "$(q "SELECT string_agg(event_id || ':' || handler || ':' || status || ':' || attempts || ':' || coalesce(last_error, '-'), ' ' ORDER BY event_id, handler)
          FROM relaybus_deliveries")" = "o1:audit:completed:1:- o1:mailer:completed:1:- o4:audit:completed:2:- o4:mailer:dead:10:boom u7:mailer:completed:1:- u8:mailer:dead:3:nope" ]
  # a dead one requeued runs, before nothing else of its key is left
  run -0 rb-admin requeue --handler mailer o4
  run -0 --separate-stderr rb-dispatch -H mailer --pipe "rb-test-pipe $m" --drain
  [ "$(tail -1 "$m" | cut -d' ' -f1,2,4)" = "o4 K2 1" ]
}

@test "the completed deliveries of 0.1.0 are listed, counted and purged; new completions are deleted" {
  need_pg
  load_010
  rb-setup
  run -0 --separate-stderr rb-admin list --status completed
  [ "$(fields '.event_id,.handler,.status,.attempts' <<<"$output" | sort | tr '\n' ,)" = "o1 audit completed 1,o1 mailer completed 1,o4 audit completed 2,u7 mailer completed 1," ]
  # completed when 0.1.0 completed them, two hours ago
  ts=$(jq -r .completed_at <<<"${lines[0]}")
  [ "$(q "SELECT abs(extract(epoch FROM now() - interval '2 hours' - '$ts'::timestamptz)) < 60")" = t ]
  # a listing without --status is what is live, as before
  [ "$(rb-admin list | jq -r .status | sort | uniq -c | tr -s ' ' | tr '\n' ,)" = " 2 dead, 8 pending," ]
  run -0 rb-admin show o4
  [ "$(jq -r '[.deliveries[] | .handler + ":" + .status] | sort | join(",")' <<<"$output")" = "audit:completed,mailer:dead" ]
  run -0 rb-admin stats
  [ "$(fields '.handler,.completed' <<<"$output" | tr '\n' ,)" = "audit 2,mailer 2,null 4," ]
  [ "$(jq -r .history <<<"${lines[2]}")" = false ]
  run -0 rb-admin stats --prometheus
  [[ "$output" == *"relaybus_completions{schema=\"$RB_SCHEMA\"} 4"* ]]
  printf '%s\n' "$output" | python3 "$RB_SRCDIR/tests/prom_lint.py"
  # a new completion deletes its delivery: the count stays
  echo '{"id":"n1","name":"note","payload":{"i":1},"handlers":["audit"]}' | rb-publish -q
  run -0 rb-dispatch -H audit --exec true --drain
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'audit'")" = 2 ]
  [ "$(rb-admin stats | jq -r 'select(.handler == null) | .completed')" = 4 ]
  # purged by completion time: --completed-older-than, then their events
  run -0 --separate-stderr rb-admin purge --completed-older-than 3h
  [ "$(fields '.completed,.events' <<<"$output")" = "0 0" ]
  run -0 --separate-stderr rb-admin purge --completed-older-than 1h --batch 3
  [ "$(fields '.completed,.events,.batches' <<<"$output")" = "4 0 2" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE status = 'completed'")" = 0 ]
  run -0 rb-admin list --status completed
  [ -z "$output" ]
  q "UPDATE relaybus_events SET created_at = now() - interval '2 hours'"
  run -0 rb-admin purge --table --completed-older-than 1h
  # u7, o1 (their deliveries are gone), n1 (completed just now), and the drained ones
  [[ "$output" =~ ^purged\ 0\ dead\ deliveries,\ [0-9]+\ events,\ 0\ history\ rows\ in\ 1\ batches ]]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = "o2,o3,o4,o5,u6,u8,u9" ]
}

@test "a set-up killed halfway through the upgrade changes nothing; the next one upgrades" {
  need_pg
  load_010
  before_shape=$(shape)
  before_rows=$(psql "$_test_pg_url" -XAtq -c "SELECT * FROM \"$RB_SCHEMA\".relaybus_deliveries ORDER BY id; SELECT * FROM \"$RB_SCHEMA\".relaybus_events ORDER BY id")
  # a reader of deliveries holds it: the upgrade waits there, past its first steps
  fifo=$BATS_TEST_TMPDIR/fifo
  mkfifo "$fifo"
  (sql <"$fifo" >/dev/null 2>&1 3>&-) &
  PIDS=$!
  exec 7>"$fifo"
  HOLD_FD=7
  echo "BEGIN; LOCK TABLE relaybus_deliveries IN ACCESS SHARE MODE; SELECT 1;" >&7
  sleep 0.5
  # a name of its own (PGAPPNAME beats the programs' fallback_application_name): the
  # other files' set-ups run on the same server at the same time (make -j)
  local app=rbsetup$$
  PGAPPNAME=$app rb-setup 2>"$BATS_TEST_TMPDIR/err" 7>&- 3>&- & setup=$!
  PIDS="$PIDS $setup"
  # it waits for the lock (in attempts of 200 ms), holding what it took so
  # far (the events table's exclusive lock): killed there
  local killed=0
  for i in $(seq 200); do
    killed=$(q "SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
                 WHERE a.application_name = '$app' AND a.wait_event_type = 'Lock'
                   AND EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'relaybus_events'::regclass
                                 AND l.mode = 'AccessExclusiveLock' AND l.granted)")
    [ "$killed" = 1 ] && break
    sleep 0.05
  done
  [ "$killed" = 1 ]
  rc=0
  wait "$setup" || rc=$?
  [ "$rc" -eq 75 ]
  # the line that it upgrades, then the one of the lost connection
  [ "$(wc -l <"$BATS_TEST_TMPDIR/err")" -eq 2 ]
  tail -n 1 "$BATS_TEST_TMPDIR/err" | grep -q "^rb-setup: connection lost: "
  echo "COMMIT;" >&7
  # all of it rolled back: still 0.1.0, row for row
  [ "$(shape)" = "$before_shape" ]
  [ "$(psql "$_test_pg_url" -XAtq -c "SELECT * FROM \"$RB_SCHEMA\".relaybus_deliveries ORDER BY id; SELECT * FROM \"$RB_SCHEMA\".relaybus_events ORDER BY id")" = "$before_rows" ]
  run rb-setup --check
  [ "$status" -eq 79 ]
  run -0 rb-setup
  run -0 rb-setup --check
}

@test "--check: not set up 78, up to date 0, older 79, newer 76; one line on stdout each" {
  need_pg
  run --separate-stderr rb-setup --check
  [ "$status" -eq 78 ]
  [ "$output" = "schema $RB_SCHEMA: not set up; relaybus 0.2.0 expects schema version 1: run rb-setup" ]
  [ -z "$stderr" ]
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname = '$RB_SCHEMA'")" = 0 ]
  rb-setup
  run -0 rb-setup --check
  [ "$output" = "schema $RB_SCHEMA: schema version 1; relaybus 0.2.0 expects schema version 1: up to date" ]
  # an older version: what a set-up of an earlier relaybus left
  q "UPDATE relaybus_schema_version SET version = 0"
  run rb-setup --check
  [ "$status" -eq 79 ]
  [ "$output" = "schema $RB_SCHEMA: schema version 0; relaybus 0.2.0 expects schema version 1: upgrade due, run rb-setup" ]
  run --separate-stderr rb-setup -v
  [ "$status" -eq 0 ]
  [[ "$stderr" == *"upgraded from version 0 to 1"* ]]
  run -0 rb-setup --check
  # newer: a later relaybus set it up
  q "INSERT INTO relaybus_schema_version (version) VALUES (7)"
  run rb-setup --check
  [ "$status" -eq 76 ]
  [ "$output" = "schema $RB_SCHEMA: schema version 7; relaybus 0.2.0 understands up to schema version 1: use a newer relaybus" ]
  run --separate-stderr rb-setup --check --subscribe a:b
  [ "$status" -eq 64 ]
}

@test "every program refuses an older or a newer schema with one line, instead of failing later" {
  need_pg
  rb-setup -s mailer:order
  q "UPDATE relaybus_schema_version SET version = 0"
  older="schema \"$RB_SCHEMA\" is at version 0, this relaybus needs 1: run rb-setup"
  q "INSERT INTO relaybus_schema_version (version) VALUES (3)"
  newer="schema \"$RB_SCHEMA\" is at version 3, this relaybus understands up to 1: use a newer relaybus"
  for cmd in "rb-publish" "rb-claim -H mailer" "rb-complete" "rb-admin list" \
             "rb-dispatch -H mailer --exec true --drain" "rb-pageinspect watch -c 1"; do
    run --separate-stderr $cmd </dev/null
    [ "$status" -eq 76 ] || { echo "$cmd: exit $status: $stderr"; false; }
    [[ "$stderr" == "${cmd%% *}: "*"$newer" ]]
  done
  q "DELETE FROM relaybus_schema_version WHERE version = 3"
  for cmd in "rb-publish" "rb-claim -H mailer" "rb-admin stats"; do
    run --separate-stderr $cmd </dev/null
    [ "$status" -eq 79 ]
    [ "$stderr" = "${cmd%% *}: $older" ]
  done
}

@test "rb-setup refuses a newer schema before changing anything (76), --print-sql's script too" {
  need_pg
  rb-setup -s mailer:order
  q "INSERT INTO relaybus_schema_version (version) VALUES (2);
     DROP INDEX relaybus_deliveries_dead_idx;
     DELETE FROM relaybus_lanes WHERE lane > 10"
  before_shape=$(shape)
  before_rows=$(rows)
  run --separate-stderr rb-setup -s audit:order
  [ "$status" -eq 76 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [ "$stderr" = "rb-setup: schema \"$RB_SCHEMA\" is at version 2, this relaybus understands up to 1: use a newer relaybus" ]
  [ "$(shape)" = "$before_shape" ]
  [ "$(rows)" = "$before_rows" ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions")" = 1 ]
  # the guard in the script itself (what refuses it when two rb-setup race)
  run --separate-stderr sh -c "rb-setup --print-sql | psql '$_test_pg_url' -X -q -v ON_ERROR_STOP=1"
  [ "$status" -ne 0 ]
  [[ "$stderr" == *"ERROR:  schema \"$RB_SCHEMA\" is at version 2, this relaybus understands up to 1: use a newer relaybus"* ]]
  [ "$(shape)" = "$before_shape" ]
}

@test "--check with an unreachable database: one line, exit 69, password redacted" {
  run --separate-stderr rb-setup --check --db 'postgresql://app:hunter2@127.0.0.1:1/relay'
  [ "$status" -eq 69 ]
  [ -z "$output" ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-setup: cannot connect to postgresql://app:xxxxx@127.0.0.1:1/relay: "* ]]
}

@test "'not set up' names no internal function" {
  need_pg
  rb-setup
  # tables there, version there, a function gone: the statement's failure says so plainly
  # (a batch of one goes through relaybus_publish, larger ones through relaybus_publish_batch)
  q "DROP FUNCTION relaybus_publish_batch(jsonb)"
  run --separate-stderr rb-publish < <(printf '%s\n' '{"name":"x","payload":1}' '{"name":"x","payload":2}')
  [ "$status" -eq 78 ]
  [ "${stderr_lines[0]}" = "rb-publish: stdin:1: publish: schema \"$RB_SCHEMA\" is not set up: run rb-setup; committed through line 0" ]
  [[ "$stderr" != *relaybus_publish_batch* ]]
  q "DROP FUNCTION relaybus_publish(text, jsonb, text, text, jsonb, timestamptz, bigint, text[])"
  run --separate-stderr rb-publish <<<'{"name":"x","payload":1}'
  [ "$status" -eq 78 ]
  [ "${stderr_lines[0]}" = "rb-publish: stdin:1: publish: schema \"$RB_SCHEMA\" is not set up: run rb-setup; committed through line 0" ]
  [[ "$stderr" != *relaybus_publish* ]]
}

@test "the version is read once per program, not per delivery" {
  need_pg
  rb-setup -s mailer:order
  gen_events 2000 order | rb-publish -q
  scans() { q "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = 'relaybus_schema_version'::regclass"; }
  before=$(scans)
  run -0 rb-dispatch -H mailer --exec true --drain -c 20
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  # (statistics reach the view when the dispatcher's backend exits)
  for i in $(seq 50); do [ "$(scans)" -gt "$before" ] && break; sleep 0.1; done
  [ "$(( $(scans) - before ))" -eq 1 ]
}
