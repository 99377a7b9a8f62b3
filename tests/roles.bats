#!/usr/bin/env bats
# rb-setup --grant/--revoke: real LOGIN roles, each program run as each
# role, what works and what is refused (exit 77, one line); a worker held
# to its handlers; the catalog (PUBLIC revoked, SECURITY DEFINER with a
# fixed search_path); idempotence, --print-sql, --revoke.

load test_helper

# the roles of this file (cluster-wide: named after the file's schema)
R_PUB=${RB_SCHEMA}_pub     # publisher
R_WRK=${RB_SCHEMA}_wrk     # worker, every handler
R_WM=${RB_SCHEMA}_wm       # worker, mailer only
R_HM=${RB_SCHEMA}_hm       # handler, mailer only
R_ADM=${RB_SCHEMA}_adm     # admin
R_NONE=${RB_SCHEMA}_none   # LOGIN, granted nothing
ROLES="$R_PUB $R_WRK $R_WM $R_HM $R_ADM $R_NONE"

GRANTS=()
setup_file() {
  drop_schema
  on_mongo && return 0
  have_pg || return 0
  drop_roles $ROLES
  for r in $ROLES; do q "CREATE ROLE \"$r\" LOGIN"; done
  rb-setup -q -s 'mailer:order.*' -s 'billing:invoice.*' --completion-history \
    --grant "publisher=$R_PUB" --grant "worker=$R_WRK" --grant "worker=$R_WM:mailer" \
    --grant "handler=$R_HM:mailer" --grant "admin=$R_ADM"
}
teardown_file() {
  drop_schema
  [ -n "$_test_pg_url" ] && drop_roles $ROLES "${RB_SCHEMA}_gone" || true
}
setup() {
  pg_only "relaybus's roles are PostgreSQL's (MongoDB's --grant: setup.bats)"
  need_pg
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys, relaybus_completions;
     UPDATE relaybus_lanes SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'"
}

publish() {  # name id...
  local n=$1
  shift
  for id in "$@"; do printf '{"id":"%s","name":"%s","payload":{"n":1}}\n' "$id" "$n"; done | rb-publish -q
}
# refused: exit 77 and one line on stderr that says so
refused() {  # what-the-line-says
  echo "status $status, stderr: $stderr"
  [ "$status" -eq 77 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ ${stderr_lines[0]} == *"$1"* ]]
}
# rb-dispatch says it in its first line, and then that it could not hand
# back its lanes (the same refusal)
refused_dispatch() {
  echo "status $status, stderr: $stderr"
  [ "$status" -eq 77 ]
  [[ ${stderr_lines[0]} == *"$1"* ]]
  [ "${#stderr_lines[@]}" -eq 1 ] || [[ ${stderr_lines[1]} == *"could not hand back the lanes"*"permission denied"* ]] ||
    [[ ${stderr_lines[1]} == *"could not hand back the lanes"*"$1"* ]]
}
# the relaybus functions a role may execute, by name
executes() {
  q "SELECT coalesce(string_agg(DISTINCT p.proname, ' ' ORDER BY p.proname), '-') FROM pg_proc p
      WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.proname LIKE 'relaybus\_%'
        AND has_function_privilege('$1', p.oid, 'EXECUTE')"
}
# the relaybus tables and views a role has any privilege on, with them
tables_of() {
  q "SELECT coalesce(string_agg(c.relname || ':' || (SELECT string_agg(pr, ',' ORDER BY pr) FROM unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE']) pr
                      WHERE has_table_privilege('$1', c.oid, pr) OR (pr = 'UPDATE' AND has_any_column_privilege('$1', c.oid, 'UPDATE'))),
                      ' ' ORDER BY c.relname), '-')
       FROM pg_class c WHERE c.relnamespace = '$RB_SCHEMA'::regnamespace AND c.relkind IN ('r', 'v')
        AND (has_any_column_privilege('$1', c.oid, 'SELECT,INSERT,UPDATE') OR has_table_privilege('$1', c.oid, 'DELETE,TRUNCATE'))"
}

@test "--grant and --revoke: a bad spec is a usage error naming the option" {
  for spec in worker '=bob' 'boss=bob' 'worker=' 'worker=pg_monitor' 'worker=public' 'worker=none' \
      'worker=a"b' "worker=a'b" 'worker=a b' 'worker=1abc' "worker=$(printf 'r%.0s' {1..64})" \
      'admin=bob:mailer' 'worker=bob:' 'worker=bob:a,,b' 'worker=bob:a b'; do
    run --separate-stderr rb-setup --print-sql --grant "$spec"
    [ "$status" -eq 64 ]
    [[ ${stderr_lines[0]} == "rb-setup: --grant: '$spec'"* ]] || [[ ${stderr_lines[0]} == "rb-setup: --grant: '$spec' is not"* ]]
    [ -z "$output" ]
    run --separate-stderr rb-setup --print-sql --revoke "$spec"
    [ "$status" -eq 64 ]
    [[ ${stderr_lines[0]} == "rb-setup: --revoke: '$spec'"* ]]
  done
  # 63 bytes, mixed case, dots and dashes are fine
  run rb-setup --print-sql --grant "worker=$(printf 'r%.0s' {1..63})" --grant 'handler=App.Worker-2:a.b:c,d-e'
  [ "$status" -eq 0 ]
  [[ $output == *"relaybus_grant('handler', 'App.Worker-2', '{a.b:c,d-e}');"* ]]
}

@test "--grant of a role that does not exist: 64 in one line, and nothing of the set-up is kept" {
  run --separate-stderr rb-setup -s 'newh:new.*' --grant "worker=${RB_SCHEMA}_nosuch"
  [ "$status" -eq 64 ]
  [ "$stderr" = "rb-setup: --grant worker=${RB_SCHEMA}_nosuch: role \"${RB_SCHEMA}_nosuch\" does not exist" ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'newh'")" = 0 ]
}

@test "the catalog: no relaybus function for PUBLIC, the definers' search_path fixed, each kind exactly its functions and tables" {
  [ "$(q "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.proname LIKE 'relaybus\_%'
           AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0))")" = 0 ]
  [ "$(q "SELECT string_agg(DISTINCT p.proname, ' ' ORDER BY p.proname) FROM pg_proc p
           WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.prosecdef")" = "relaybus_allowed relaybus_complete relaybus_complete_batch relaybus_delivery_exists relaybus_delivery_state relaybus_extend relaybus_lock_lane relaybus_publish relaybus_publish_batch relaybus_relinquish relaybus_relinquish_leases relaybus_relinquish_owner relaybus_worker_claim relaybus_worker_claim_ids relaybus_worker_done relaybus_worker_fail" ]
  # the owner's claim and failure stay SECURITY INVOKER (its sessions pay nothing for the roles)
  [ "$(q "SELECT string_agg(DISTINCT p.proname || '=' || p.prosecdef, ' ' ORDER BY p.proname || '=' || p.prosecdef) FROM pg_proc p
           WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.proname IN ('relaybus_claim', 'relaybus_claim_ids', 'relaybus_fail')")" = "relaybus_claim=false relaybus_claim_ids=false relaybus_fail=false" ]
  # every relaybus function resolves names in pg_catalog only, definer or not (but the two
  # that are inlined into the claim's statements, the lane hash and its tail, inlined into
  # the publish, whose every name is qualified: hijack.bats)
  [ "$(q "SELECT string_agg(p.proname, ' ' ORDER BY p.proname) FROM pg_proc p WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace
           AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)")" = "relaybus_lane relaybus_lane_candidates relaybus_lane_tail relaybus_ts" ]
  [ "$(executes "$R_PUB")" = "relaybus_publish relaybus_publish_batch" ]
  [ "$(executes "$R_WRK")" = "relaybus_allowed relaybus_complete relaybus_complete_batch relaybus_delivery_exists relaybus_delivery_state relaybus_extend relaybus_hold relaybus_lock_lane relaybus_relinquish relaybus_relinquish_leases relaybus_relinquish_owner relaybus_worker_claim relaybus_worker_claim_ids relaybus_worker_done relaybus_worker_fail" ]
  [ "$(executes "$R_WM")" = "$(executes "$R_WRK")" ]
  [ "$(executes "$R_HM")" = relaybus_complete ]
  # (rb-admin by event finds deliveries through relaybus_event_deliveries and the lane hash)
  [ "$(executes "$R_ADM")" = "relaybus_event_deliveries relaybus_lane relaybus_ts" ]
  [ "$(executes "$R_NONE")" = - ]
  [ "$(tables_of "$R_PUB")" = relaybus_schema_version:SELECT ]
  [ "$(tables_of "$R_HM")" = relaybus_schema_version:SELECT ]
  [ "$(tables_of "$R_NONE")" = - ]
  [ "$(tables_of "$R_WRK")" = "relaybus_schema_version:SELECT relaybus_worker_events:SELECT" ]
  [ "$(tables_of "$R_ADM")" = "relaybus_completions:DELETE,SELECT,UPDATE relaybus_deliveries:DELETE,SELECT,UPDATE relaybus_events:DELETE,SELECT,UPDATE relaybus_keys:INSERT,SELECT,UPDATE relaybus_lanes:SELECT,UPDATE relaybus_schema_version:SELECT relaybus_subscriptions:SELECT" ]
  # where admin only locks rows: UPDATE of one column, not of the table
  [ "$(q "SELECT has_table_privilege('$R_ADM', 'relaybus_events', 'UPDATE') || ' ' || has_column_privilege('$R_ADM', 'relaybus_events', 'payload', 'UPDATE')")" = "false false" ]
}

@test "publisher: rb-publish and relaybus_publish in its own transaction; everything else refused with 77" {
  run as "$R_PUB" rb-publish -q <<<'{"id":"p1","name":"order.paid","payload":{"n":1}}'
  [ "$status" -eq 0 ]
  run asql "$R_PUB" -c "BEGIN; SELECT deliveries FROM relaybus_publish('invoice.paid', '{\"n\":2}', NULL, 'p2'); COMMIT;"
  [ "$status" -eq 0 ]
  [ "$output" = 1 ]
  [ "$(q "SELECT string_agg(event_id || ':' || handler, ' ' ORDER BY event_id) FROM relaybus_deliveries")" = "p1:mailer p2:billing" ]
  run --separate-stderr as "$R_PUB" rb-claim -H mailer
  refused "permission denied for function relaybus_worker_claim"
  run --separate-stderr as "$R_PUB" rb-complete <<<'{"event_id":"p1","handler":"mailer","lease":"1:1:0","ok":true}'
  refused "permission denied for function relaybus_complete_batch"
  run --separate-stderr as "$R_PUB" rb-admin stats
  refused "permission denied"
  run --separate-stderr as "$R_PUB" rb-dispatch -H mailer --exec true --drain
  refused_dispatch "permission denied for function relaybus_worker_claim"
  run --separate-stderr as "$R_PUB" rb-setup
  refused "permission denied"
  run asql "$R_PUB" -c "SELECT count(*) FROM relaybus_events"
  [ "$status" -ne 0 ]
  [[ $output == *"42501: permission denied for table relaybus_events"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 2 ]
}

# calls of the schema's functions named (pg_stat_user_functions; a session
# counts them with track_functions = all)
calls() {  # funcname...
  local l
  l=$(printf "'%s'," "$@")
  q "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE schemaname = '$RB_SCHEMA' AND funcname IN (${l%,})"
}

@test "the owner's sessions claim through relaybus_claim itself; a worker's through the SECURITY DEFINER door" {
  publish order.paid o1 o2
  own0=$(calls relaybus_claim relaybus_claim_ids)
  door0=$(calls relaybus_worker_claim relaybus_worker_claim_ids)
  run --separate-stderr env PGOPTIONS="-c track_functions=all" rb-claim -H mailer -b 1
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [ "$(calls relaybus_claim relaybus_claim_ids)" -gt "$own0" ]
  [ "$(calls relaybus_worker_claim relaybus_worker_claim_ids)" = "$door0" ]
  q "ALTER ROLE \"$R_WRK\" SET track_functions = 'all'"
  run --separate-stderr as "$R_WRK" rb-claim -H mailer -b 1
  q "ALTER ROLE \"$R_WRK\" RESET track_functions"
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 1 ]
  [ "$(calls relaybus_worker_claim relaybus_worker_claim_ids)" -gt "$door0" ]
}

@test "worker: claims, completes, fails, extends, relinquishes, listens (rb-claim, rb-complete, rb-dispatch); no publish, purge or table" {
  publish order.paid w1 w2 w3 w4 w5
  # claim and complete, and the lanes handed back after
  run --separate-stderr as "$R_WRK" rb-claim -H mailer --batch 2 --owner W
  [ "$status" -eq 0 ]
  run --separate-stderr as "$R_WRK" rb-complete --output < <(jq -c '. + {ok: true}' <<<"$output")
  [ "$status" -eq 0 ]
  [ "$(jq -r .outcome <<<"$output" | sort -u)" = completed ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE lease_owner = 'W'")" = 0 ]
  # a failure (relaybus_fail), and a lost one (the "missing" check)
  line=$(as "$R_WRK" rb-claim -H mailer --batch 1 --owner W)
  run --separate-stderr as "$R_WRK" rb-complete --output < <(jq -c '. + {ok: false, error: "no"}' <<<"$line")
  [ "$(jq -r .outcome <<<"$output")" = rescheduled ]
  run --separate-stderr as "$R_WRK" rb-complete --output < <(jq -c '. + {ok: true}' <<<"$line")
  [ "$status" -eq 0 ]
  [ "$(jq -r '.outcome + " " + (.missing|tostring)' <<<"$output")" = "lost null" ]
  # renewals of a 300ms lease while the handler runs 0.8s, then the lane
  # lock and the operator's SQL (--sql), and the hand-back at the end
  q "UPDATE relaybus_deliveries SET available_at = now()"
  run --separate-stderr as "$R_WRK" rb-dispatch -vv -H mailer --exec 'sleep 0.8' --lease 300ms --drain --owner D -c 1 -b 1
  [ "$status" -eq 0 ]
  [[ $stderr == *"renewed 1 lanes of D"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'mailer'")" = 0 ]
  publish order.paid w6
  run --separate-stderr as "$R_WRK" rb-dispatch -H mailer --sql 'SELECT 1' --drain --owner D
  [ "$status" -eq 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'mailer'")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE lease_owner IS NOT NULL")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_completions")" = 6 ]
  # LISTEN
  run as "$R_WRK" rb-claim -H mailer --wait 300ms
  [ "$status" -eq 1 ]
  # and the rest is refused
  run --separate-stderr as "$R_WRK" rb-publish -q <<<'{"name":"order.paid","payload":1}'
  refused "permission denied for function relaybus_publish"
  run --separate-stderr as "$R_WRK" rb-admin purge --dead-older-than 1ms
  refused "permission denied"
  run --separate-stderr as "$R_WRK" rb-admin stats
  refused "permission denied"
  for stmt in "SELECT count(*) FROM relaybus_deliveries" "DELETE FROM relaybus_deliveries" "SELECT count(*) FROM relaybus_events" \
      "UPDATE relaybus_lanes SET lease_owner = 'x'" "SELECT count(*) FROM relaybus_grants"; do
    run asql "$R_WRK" -c "$stmt"
    [ "$status" -ne 0 ]
    [[ $output == *"42501: permission denied for table"* ]]
  done
  run asql "$R_WRK" -c "SELECT * FROM relaybus_publish('order.paid', '1')"
  [[ $output == *"42501: permission denied for function relaybus_publish"* ]]
  run asql "$R_WRK" -c "SELECT relaybus_grant('worker', current_user)"
  [[ $output == *"42501: permission denied for function relaybus_grant"* ]]
}

@test "a worker granted one handler: works it, every other handler refused with 77 and one line" {
  publish order.paid m1
  publish invoice.paid i1
  run --separate-stderr as "$R_WM" rb-claim -H mailer --owner M
  [ "$status" -eq 0 ]
  run --separate-stderr as "$R_WM" rb-complete --output < <(jq -c '. + {ok: true}' <<<"$output")
  [ "$(jq -r .outcome <<<"$output")" = completed ]
  run --separate-stderr as "$R_WM" rb-claim -H billing
  [ "$stderr" = "rb-claim: claim: role \"$R_WM\" may not work handler \"billing\" (rb-setup --grant worker=$R_WM:billing)" ]
  refused "may not work handler \"billing\""
  run --separate-stderr as "$R_WM" rb-dispatch -H billing --exec true --drain
  refused_dispatch "may not work handler \"billing\""
  # billing's delivery claimed by its owner: this worker cannot touch it
  line=$(rb-claim -H billing --owner B)
  for r in '{ok: true}' '{ok: false, error: "x"}' '{ok: false, dead: true}' '{ok: false, release: true}'; do
    run --separate-stderr as "$R_WM" rb-complete --no-relinquish < <(jq -c ". + $r" <<<"$line")
    refused "may not work handler \"billing\""
  done
  lease=$(jq -r .lease <<<"$line")
  for stmt in "SELECT relaybus_extend('billing', 'B', 60000, 1)" "SELECT relaybus_relinquish_owner('billing', 'B', 1)" \
      "SELECT relaybus_relinquish('billing', 'B', 1)" "SELECT relaybus_complete('$lease', 'i1', 'billing')" \
      "SELECT relaybus_lock_lane('billing', 1::smallint, 1)" "SELECT relaybus_delivery_exists('i1', 'billing')" \
      "SELECT relaybus_relinquish_leases('{billing}', '{1}', '{1}')"; do
    run asql "$R_WM" -c "$stmt"
    [[ $output == *"42501: role \"$R_WM\" may not work handler \"billing\""* ]]
  done
  [ "$(q "SELECT l.lease_owner || ' ' || (d.id = ANY (l.in_flight)) FROM relaybus_deliveries d JOIN relaybus_lanes l ON l.handler = d.handler AND l.lane = d.lane WHERE d.event_id = 'i1'")" = "B true" ]
  # the events it reads are its handlers' only (the worker that may work
  # every handler reads them all)
  [ "$(asql "$R_WM" -c "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_worker_events")" = m1 ]
  [ "$(asql "$R_WRK" -c "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_worker_events")" = i1,m1 ]
}

@test "handler role: relaybus_complete in its own transaction, for its handler only; nothing else" {
  publish order.paid h1
  publish invoice.paid h2
  line=$(rb-claim -H mailer --owner A)
  run asql "$R_HM" -v line="$line" <<<"BEGIN; SELECT relaybus_complete(:'line'); COMMIT;"
  [ "$status" -eq 0 ]
  [ "$output" = completed ]
  [ "$(q "SELECT string_agg(event_id || ':' || attempts, ',') FROM relaybus_completions")" = h1:1 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'mailer'")" = 0 ]
  line=$(rb-claim -H billing --owner A)
  run asql "$R_HM" -v line="$line" <<<"SELECT relaybus_complete(:'line');"
  [[ $output == *"42501: role \"$R_HM\" may not work handler \"billing\""* ]]
  run --separate-stderr as "$R_HM" rb-claim -H mailer
  refused "permission denied for function relaybus_worker_claim"
  run --separate-stderr as "$R_HM" rb-complete < <(jq -c '. + {ok: true}' <<<"$line")
  refused "permission denied for function relaybus_complete_batch"
  run asql "$R_HM" -c "SELECT count(*) FROM relaybus_deliveries"
  [[ $output == *"42501: permission denied for table relaybus_deliveries"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'billing'")" = 1 ]
}

@test "admin: every rb-admin command; no publishing, claiming or set-up" {
  publish order.paid a1 a2 a3 a4
  rb-claim -H mailer --batch 1 --owner A | jq -c '. + {ok: false, dead: true, error: "bad"}' | rb-complete -q >/dev/null
  dead=$(q "SELECT event_id FROM relaybus_deliveries WHERE status = 'dead'")
  read -r bury cancel keep <<<"$(q "SELECT string_agg(event_id, ' ' ORDER BY event_id) FROM relaybus_deliveries WHERE status = 'pending'")"
  for cmd in "stats" "stats --prometheus" "list" "list --status dead" "show a1" "lanes --all" "subscriptions" \
      "requeue $dead" "bury --reason r $bury" "cancel $cancel" "purge --dead-older-than 1ms --completed-older-than 1ms --history-older-than 1ms"; do
    # shellcheck disable=SC2086
    run --separate-stderr as "$R_ADM" rb-admin --json $cmd
    echo "$cmd: $status $stderr"
    [ "$status" -eq 0 ]
  done
  # requeued, buried then purged, cancelled: two pending left, and the
  # events of the other two purged
  [ "$(q "SELECT string_agg(event_id || ':' || status, ' ' ORDER BY event_id) FROM relaybus_deliveries")" = "$(printf '%s\n' "$dead:pending" "$keep:pending" | sort | tr '\n' ' ' | sed 's/ $//')" ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 2 ]
  run --separate-stderr as "$R_ADM" rb-publish -q <<<'{"name":"order.paid","payload":1}'
  refused "permission denied for function relaybus_publish"
  run --separate-stderr as "$R_ADM" rb-claim -H mailer
  refused "permission denied for function relaybus_worker_claim"
  run --separate-stderr as "$R_ADM" rb-setup
  refused "permission denied"
  for stmt in "INSERT INTO relaybus_events (id, name, payload) VALUES ('x', 'y', '1')" \
      "INSERT INTO relaybus_subscriptions VALUES ('h', 'p', 'p')" "UPDATE relaybus_events SET payload = '2'" \
      "UPDATE relaybus_lanes SET lease_owner = 'x'" "TRUNCATE relaybus_deliveries"; do
    run asql "$R_ADM" -c "$stmt"
    [[ $output == *"42501: permission denied for table"* ]]
  done
}

@test "a LOGIN role granted nothing: every program exits 77 with one line naming the --grant it lacks" {
  publish order.paid n1
  line=$(rb-claim -H mailer --owner A)
  run --separate-stderr as "$R_NONE" rb-publish -q <<<'{"name":"order.paid","payload":1}'
  refused "permission denied"
  [[ $stderr == *"(role \"$R_NONE\" lacks the grant rb-publish needs: rb-setup --grant publisher=$R_NONE)" ]]
  run --separate-stderr as "$R_NONE" rb-claim -H mailer
  refused "permission denied"
  [[ $stderr == *"rb-setup --grant worker=$R_NONE:HANDLER)" ]]
  run --separate-stderr as "$R_NONE" rb-complete < <(jq -c '. + {ok: true}' <<<"$line")
  refused "permission denied"
  [[ $stderr == *"rb-setup --grant worker=$R_NONE:HANDLER)" ]]
  run --separate-stderr as "$R_NONE" rb-dispatch -H mailer --exec true --drain
  refused_dispatch "permission denied"
  [[ ${stderr_lines[0]} == *"rb-setup --grant worker=$R_NONE:HANDLER)" ]]
  run --separate-stderr as "$R_NONE" rb-admin stats
  refused "permission denied"
  [[ $stderr == *"rb-setup --grant admin=$R_NONE)" ]]
  run asql "$R_NONE" -c "SELECT \"$RB_SCHEMA\".relaybus_complete('$(jq -r .lease <<<"$line")', 'n1', 'mailer')"
  [[ $output == *"42501: permission denied for schema"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 1 ]
}

# every privilege on relaybus objects, as a comparable text
acls() {
  q "SELECT string_agg(x, ' ' ORDER BY x) FROM (
       SELECT p.oid::regprocedure::text || '=' || coalesce(p.proacl::text, 'null') || ':' || p.prosecdef || ':' || coalesce(p.proconfig::text, '') AS x
         FROM pg_proc p WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace
       UNION ALL SELECT c.relname || '=' || coalesce(c.relacl::text, 'null') || coalesce((SELECT string_agg(a.attname || a.attacl::text, ',') FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL), '')
         FROM pg_class c WHERE c.relnamespace = '$RB_SCHEMA'::regnamespace AND c.relkind IN ('r', 'v')
       UNION ALL SELECT 'schema=' || nspacl::text FROM pg_namespace WHERE nspname = '$RB_SCHEMA') s"
}

@test "grants are idempotent, survive a set-up that recreates the functions, and --print-sql applies the same" {
  before=$(acls)
  rb-setup -q
  [ "$(acls)" = "$before" ]
  rb-setup -q --grant "publisher=$R_PUB" --grant "worker=$R_WM:mailer" --grant "admin=$R_ADM"
  [ "$(acls)" = "$before" ]
  [ "$(q "SELECT count(*) FROM relaybus_grants")" = 5 ]
  # a worker still works after the plain set-up
  publish order.paid g1
  run as "$R_WM" rb-claim -H mailer
  [ "$status" -eq 0 ]
  # --print-sql for another schema, applied by psql: the same privileges
  other=${RB_SCHEMA:0:44}_print
  run rb-setup --print-sql --schema "$other" -s 'mailer:order.*' --grant "worker=$R_WM:mailer" --grant "handler=$R_HM:mailer"
  [ "$status" -eq 0 ]
  [[ $output == *"SELECT \"$other\".relaybus_grant('worker', '$R_WM', '{mailer}');"* ]]
  [[ $output == *"SELECT \"$other\".relaybus_apply_grants();"*"COMMIT;" ]]
  PGOPTIONS="-c client_min_messages=warning" psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 <<<"$output" >/dev/null
  run psql "$_test_pg_url" -X -A -t -c "SELECT has_function_privilege('$R_WM', '\"$other\".relaybus_worker_claim_ids(text,text,integer,bigint,integer,bigint[],boolean,integer,smallint[],bigint,boolean,boolean,timestamptz[],xid8[],smallint[],timestamptz[],timestamptz[],timestamptz,smallint[],smallint[],tid[],smallint[])', 'EXECUTE'),
      has_function_privilege('$R_HM', '\"$other\".relaybus_complete(text,text,text)', 'EXECUTE'),
      has_function_privilege('$R_HM', '\"$other\".relaybus_worker_claim_ids(text,text,integer,bigint,integer,bigint[],boolean,integer,smallint[],bigint,boolean,boolean,timestamptz[],xid8[],smallint[],timestamptz[],timestamptz[],timestamptz,smallint[],smallint[],tid[],smallint[])', 'EXECUTE'),
      (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = '\"$other\"'::regnamespace AND p.proname LIKE 'relaybus\_%'
          AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0)))"
  psql "$_test_pg_url" -X -q -c "DROP SCHEMA \"$other\" CASCADE" >/dev/null
  [ "$output" = "t|t|f|0" ]
}

@test "--revoke takes one grant back; the role's other grants stay" {
  rb-setup -q --grant "handler=$R_WRK"
  rb-setup -q --revoke "worker=$R_WRK"
  publish order.paid v1
  run --separate-stderr as "$R_WRK" rb-claim -H mailer
  refused "permission denied for function relaybus_worker_claim"
  [ "$(executes "$R_WRK")" = relaybus_complete ]
  [ "$(tables_of "$R_WRK")" = relaybus_schema_version:SELECT ]
  line=$(rb-claim -H mailer --owner A)
  [ "$(asql "$R_WRK" -c "SELECT relaybus_complete('$(jq -r .lease <<<"$line")', 'v1', 'mailer')")" = completed ]
  # back as it was
  rb-setup -q --revoke "handler=$R_WRK" --grant "worker=$R_WRK"
  [ "$(q "SELECT string_agg(kind || ':' || handler, ',') FROM relaybus_grants WHERE grantee = '$R_WRK'")" = "worker:*" ]
  [ "$(tables_of "$R_WRK")" = "relaybus_schema_version:SELECT relaybus_worker_events:SELECT" ]
}

@test "a grant dies with its role: a later set-up removes it with a warning, and a new role of that name gets nothing" {
  gone=${RB_SCHEMA}_gone
  q "CREATE ROLE \"$gone\" LOGIN"
  rb-setup -q --grant "publisher=$gone" --grant "worker=$gone:mailer"
  [ "$(asql "$gone" -c "SELECT count(*) FROM $RB_SCHEMA.relaybus_worker_events")" = 0 ]
  q "DROP OWNED BY \"$gone\"; DROP ROLE \"$gone\""
  # the review's finding 14: a new, unrelated role takes the name
  q "CREATE ROLE \"$gone\" LOGIN"
  run --separate-stderr rb-setup -s 'other:x.*'
  [ "$status" -eq 0 ]
  [[ $stderr == *"role \"$gone\" (granted publisher, worker) was dropped: its grants are removed"* ]]
  [ "$(q "SELECT count(*) FROM relaybus_grants WHERE grantee = '$gone'")" = 0 ]
  [ "$(executes "$gone")" = - ]
  run asql "$gone" -c "SELECT id FROM $RB_SCHEMA.relaybus_worker_events"
  [ "$status" -ne 0 ]
  [[ $output == *"permission denied"* ]]
  rb-setup -q --unsubscribe 'other:x.*'
  q "DROP OWNED BY \"$gone\"; DROP ROLE \"$gone\""
}
