#!/usr/bin/env bats
# The shape of the installed PostgreSQL schema as a newcomer reads it: no
# relaybus PL/pgSQL function longer than one sitting's worth (the claim is
# a driver and its steps, doc/claim.md), the steps taking one named state,
# and a set-up that replaces a state of another shape.

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
  local steps="relaybus_claim_tick relaybus_claim_read_lanes relaybus_claim_held relaybus_claim_cut_dead relaybus_claim_search relaybus_claim_top_up relaybus_claim_record relaybus_claim_cursors"
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
