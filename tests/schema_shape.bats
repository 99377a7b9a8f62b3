#!/usr/bin/env bats
# The shape of the installed PostgreSQL schema as a newcomer reads it: no
# relaybus PL/pgSQL function longer than one sitting's worth (the claim is
# a driver and its steps, doc/claim.md), the steps taking one named state,
# a set-up that replaces a state of another shape, and event ids, keys and
# handler names compared as bytes (relaybus(7), TABLES).

load test_helper

setup_file() {
  drop_schema
  on_mongo && return 0
  have_pg || return 0
  rb-setup -s 'h:ev.*'
}
teardown_file() { drop_schema; }
setup() {
  pg_only "the schema's functions are PostgreSQL's"
  need_pg
}

# the relaybus PL/pgSQL functions of the schema longer than $1 lines, with their lengths
longer_than() {
  q "SELECT coalesce(string_agg(p.proname || '=' || n, ' ' ORDER BY p.proname), '-') FROM (
       SELECT p.proname, array_length(string_to_array(p.prosrc, chr(10)), 1) AS n FROM pg_proc p
        WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.proname LIKE 'relaybus\_%'
          AND p.prolang = (SELECT l.oid FROM pg_language l WHERE l.lanname = 'plpgsql')) p
      WHERE n > $1"
}

@test "no relaybus PL/pgSQL function is longer than 170 lines" {
  run longer_than 170
  echo "longer: $output"
  [ "$output" = - ]
  # (and the test sees them: the longest are well over 20)
  [ "$(longer_than 20)" != - ]
}

@test "the claim is a short driver over named steps, each taking the one relaybus_claim_state" {
  local steps="relaybus_claim_tick relaybus_claim_read_lanes relaybus_claim_held relaybus_claim_cut_dead relaybus_claim_search relaybus_claim_record relaybus_claim_cursors"
  local src
  src=$(q "SELECT prosrc FROM pg_proc WHERE oid = '$RB_SCHEMA.relaybus_claim_ids'::regproc")
  for f in $steps; do
    [[ $src == *".$f(s"* ]] || { echo "relaybus_claim_ids does not call $f"; false; }
    [ "$(q "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = '$RB_SCHEMA'::regnamespace AND p.proname = '$f'
             AND p.proargtypes[0] = '$RB_SCHEMA.relaybus_claim_state'::regtype AND NOT p.prosecdef
             AND 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig)
             AND NOT EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                              WHERE a.grantee = 0)")" = 1 ] || { echo "$f"; false; }
  done
  [ "$(longer_than 100 | tr ' ' '\n' | grep -c '^relaybus_claim_ids=')" = 0 ]
}

@test "a set-up over a claim state of another shape makes it and the steps again, and the claim works" {
  q "ALTER TYPE relaybus_claim_state ADD ATTRIBUTE old_field integer"
  rb-setup -q
  [ "$(q "SELECT count(*) FROM pg_attribute WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = '$RB_SCHEMA.relaybus_claim_state'::regtype) AND attname = 'old_field'")" = 0 ]
  [ "$(q "SELECT count(*) FROM pg_proc WHERE pronamespace = '$RB_SCHEMA'::regnamespace AND proname = 'relaybus_claim_search'")" = 1 ]
  printf '{"id":"s1","name":"ev.a","payload":{}}\n' | rb-publish -q
  run rb-claim -H h
  [ "$status" -eq 0 ]
  [ "$(jq -r .event_id <<<"$output")" = s1 ]
}

@test "a set-up over an earlier build's schema drops its top-up step, which could never pick anything (doc/claim.md)" {
  q "CREATE FUNCTION relaybus_claim_top_up(s relaybus_claim_state) RETURNS relaybus_claim_state LANGUAGE plpgsql AS 'BEGIN RETURN s; END'"
  [ "$(q "SELECT count(*) FROM pg_proc WHERE pronamespace = '$RB_SCHEMA'::regnamespace AND proname = 'relaybus_claim_top_up'")" = 1 ]
  rb-setup -q
  [ "$(q "SELECT count(*) FROM pg_proc WHERE pronamespace = '$RB_SCHEMA'::regnamespace AND proname = 'relaybus_claim_top_up'")" = 0 ]
}

@test "a new schema compares event ids, keys and handler names as bytes, in its tables and indexes; a key differing only in case keeps its own order" {
  # the columns an index holds them in: COLLATE "C" (bench/README.md, "Ids compared as bytes")
  local cols="('relaybus_events', 'id'), ('relaybus_deliveries', 'event_id'), ('relaybus_deliveries', 'handler'),
              ('relaybus_deliveries', 'key'), ('relaybus_lanes', 'handler'), ('relaybus_keys', 'key')"
  run q "SELECT string_agg(c.relname || '.' || a.attname || '=' || coalesce(l.collname, '-'), ' ' ORDER BY c.relname, a.attname)
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           LEFT JOIN pg_collation l ON l.oid = a.attcollation
          WHERE c.relnamespace = '$RB_SCHEMA'::regnamespace AND (c.relname, a.attname) IN ($cols)"
  echo "$output"
  [ "$output" = "relaybus_deliveries.event_id=C relaybus_deliveries.handler=C relaybus_deliveries.key=C relaybus_events.id=C relaybus_keys.key=C relaybus_lanes.handler=C" ]
  # and every index over them (indexes on such a column: some, and none under the database's collation)
  run q "SELECT count(*) || ' ' || count(*) FILTER (WHERE k.coll <> 'pg_catalog.\"C\"'::regcollation)
           FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
          CROSS JOIN LATERAL unnest(i.indkey::smallint[], i.indcollation::oid[]) k(attnum, coll)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
          WHERE c.relnamespace = '$RB_SCHEMA'::regnamespace AND (c.relname, a.attname) IN ($cols)"
  echo "index columns, of them not C: $output"
  [ "${output#* }" = 0 ]
  [ "${output% *}" -ge 6 ]
  # equality is unchanged: keys that differ only in case are two keys, each in
  # its own order, and an event found again by its id (inbox dedup)
  rb-setup -q -s 'hc:ec.*'
  printf '%s\n' '{"id":"Cs-1","name":"ec.a","key":"Kc","payload":{}}' '{"id":"cs-1","name":"ec.a","key":"kc","payload":{}}' \
    '{"id":"Cs-2","name":"ec.a","key":"Kc","payload":{}}' '{"id":"Cs-1","name":"ec.a","key":"Kc","payload":{}}' | rb-publish -q
  [ "$(q "SELECT string_agg(event_id || ':' || key || ':' || sequence, ' ' ORDER BY event_id) FROM relaybus_deliveries WHERE handler = 'hc'")" = "Cs-1:Kc:1 Cs-2:Kc:2 cs-1:kc:1" ]
  run rb-claim -H hc --batch 10
  [ "$status" -eq 0 ]
  [ "$(jq -r .event_id <<<"$output" | LC_ALL=C sort | tr '\n' ' ')" = "Cs-1 cs-1 " ]
}
