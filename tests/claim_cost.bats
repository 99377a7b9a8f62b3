#!/usr/bin/env bats
# The cost of a claim must not depend on when the tables were last
# analyzed (PostgreSQL): a claim on a table with a history (completed
# deliveries, dead tuples, statistics taken while it was empty) reads what
# it takes, not every due delivery of the handler; a completion reads the
# rows it completes.

load test_helper

setup() {
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    drop_schema
    setup_schema
  fi
}

teardown() { kill_pids_drop_schema; }

publish() {  # n prefix handler
  awk -v n="$1" -v p="$2" -v h="$3" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i, h
  }' | rb-publish -q
}

@test "a claim of 4 on a table analyzed while it was empty, now 4000 due: no plan inside it reads more than 100 deliveries" {
  pg_only
  need_pg
  local t=$RB_SCHEMA.relaybus_deliveries plans=$BATS_TEST_TMPDIR/plans
  # (no autovacuum: the statistics stay as the test makes them)
  q "ALTER TABLE $t SET (autovacuum_enabled = off)"
  publish 4000 old hist
  rb-dispatch -q -H hist --pipe "rb-test-pipe /dev/null" --drain 3>&-
  q "ANALYZE $t"
  [ "$(q "SELECT reltuples FROM pg_class WHERE oid = '$t'::regclass")" = 0 ]
  publish 4000 new hist
  # every statement the claim runs, with its plan and the rows each node gave
  sql -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
      -c "SET auto_explain.log_analyze = on" -c "SET auto_explain.log_nested_statements = on" \
      -c "SET auto_explain.log_level = notice" -c "SET client_min_messages = notice" \
      -c "SELECT count(*) FROM relaybus_claim('hist', 'w', 4, 60000, 5)" >"$plans" 2>&1
  grep -q 'relaybus_deliveries' "$plans"
  # the largest number of delivery rows one scan node returned
  local most
  most=$(awk '/Scan (using [a-z_]+ )?on relaybus_deliveries|Bitmap Index Scan on relaybus_deliveries/ {
      if (match($0, /actual time=[0-9.]+\.\.[0-9.]+ rows=[0-9]+ loops=[0-9]+/)) {
        split(substr($0, RSTART, RLENGTH), f, /[= ]/); n = f[5] * f[7]; if (n > m) m = n } }
      END { print m + 0 }' "$plans")
  echo "at most $most delivery rows read by one node" >&3
  [ "$most" -le 100 ]
}

@test "a claim never compiles with JIT, whatever the server's jit settings (the claim is short: compiling cost it 10-100 ms)" {
  pg_only
  need_pg
  [ "$(q "SELECT pg_jit_available()")" = t ] || skip "this server has no JIT (llvmjit)"
  publish 200 j jit
  local plans=$BATS_TEST_TMPDIR/plans
  # jit_above_cost 0: every statement of the session would be compiled
  sql -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
      -c "SET auto_explain.log_analyze = on" -c "SET auto_explain.log_nested_statements = on" \
      -c "SET auto_explain.log_level = notice" -c "SET client_min_messages = notice" \
      -c "SET jit = on" -c "SET jit_above_cost = 0" \
      -c "SELECT count(*) FROM relaybus_claim('jit', 'w', 10, 60000, 5)" >"$plans" 2>&1
  grep -q 'relaybus_deliveries' "$plans"
  # (the outer statement, typed here, is the caller's own)
  [ "$(grep -c "^JIT:" "$plans")" -le 1 ]
}

# lane rows visited by the plans in FILE: rows a scan node on relaybus_lanes
# gave and rows its filter removed, times its loops
lane_rows_read() {
  awk '/->|^[A-Z]/ { lanes = 0 }
       /Scan (using [a-z_]+ )?on relaybus_lanes( |$)/ && match($0, /rows=[0-9]+ loops=[0-9]+\)$/) {
         split(substr($0, RSTART, RLENGTH - 1), f, /[= ]/); lanes = 1; loops = f[4]; n += f[2] * loops; next }
       lanes && /Rows Removed by Filter:/ { n += $NF * loops }
       END { print n + 0 }' "$1"
}

@test "a claim reads the handler's 256 lane rows once, not once per purpose (under a held snapshot each read walks every version)" {
  pg_only
  need_pg
  # two due deliveries in two lanes, a claim that wants 6: before issue 25
  # item 3 the claim read every lane row three times (its own, the live
  # holders, the free ones), read the row of every free lane it probed for
  # work, and probed them all twice (once more with a larger step)
  publish 2 few lr
  local plans=$BATS_TEST_TMPDIR/plans n i
  for i in 1 2; do
    sql -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
        -c "SET auto_explain.log_analyze = on" -c "SET auto_explain.log_nested_statements = on" \
        -c "SET auto_explain.log_timing = off" \
        -c "SET auto_explain.log_level = notice" -c "SET client_min_messages = notice" \
        -c "SELECT count(*) FROM relaybus_claim('lr', 'w', 6, 60000, 5)" >"$plans.$i" 2>&1
    grep -q 'relaybus_lanes' "$plans.$i"
    n=$(lane_rows_read "$plans.$i")
    echo "claim $i: $n lane rows read" >&3
    [ "$n" -ge 256 ] && [ "$n" -le 300 ]
  done
  # the first claim took both, the second found them held and running
  [ "$(q "SELECT count(*) FROM $RB_SCHEMA.relaybus_lanes WHERE handler = 'lr' AND lease_owner = 'w'")" = 2 ]
}

# (the index entries of relaybus_deliveries read since the last call: rows
# fetched through an index, from the statistics of this schema's table)
idx_fetched() {
  q "SELECT pg_stat_clear_snapshot()" >/dev/null
  q "SELECT idx_tup_fetch FROM pg_stat_user_tables WHERE schemaname = '$RB_SCHEMA' AND relname = 'relaybus_deliveries'"
}

@test "a completion of every fourth delivery claimed reads the rows it completes, not the range of ids between them" {
  pg_only
  need_pg
  # 1,000 claimed of 2,000 spread over the lanes: their ids are interleaved
  # with those left, and the ids of every fourth span nearly all of them.
  # Until issue 42 the completion hashed the primary key's range between
  # the batch's least and greatest id: 2,117 rows read for 250 completed.
  publish 2000 e cc
  rb-claim -q -H cc --batch 1000 >"$BATS_TEST_TMPDIR/lines"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/lines")" -eq 1000 ]
  awk 'NR % 4 == 0' "$BATS_TEST_TMPDIR/lines" | jq -c '. + {ok: true}' >"$BATS_TEST_TMPDIR/results"
  local before after
  before=$(idx_fetched)
  rb-complete -q <"$BATS_TEST_TMPDIR/results"
  after=$(idx_fetched)
  echo "$((after - before)) rows read through an index for 250 completed" >&3
  [ "$(q "SELECT count(*) FROM $RB_SCHEMA.relaybus_deliveries WHERE handler = 'cc'")" = 1750 ]
  [ "$((after - before))" -le 500 ]
}

@test "one delivery's result twice in a batch of rb-complete: completed once, the second said not applied, the others completed" {
  pg_only
  need_pg
  publish 3 d dd
  rb-claim -q -H dd --batch 10 >"$BATS_TEST_TMPDIR/lines"
  { head -1 "$BATS_TEST_TMPDIR/lines"; cat "$BATS_TEST_TMPDIR/lines"; } | jq -c '. + {ok: true}' >"$BATS_TEST_TMPDIR/results"
  local first
  first=$(head -1 "$BATS_TEST_TMPDIR/lines" | jq -r .event_id)
  run --separate-stderr rb-complete <"$BATS_TEST_TMPDIR/results"
  [ "$status" -eq 0 ]
  [ "$stderr" = "rb-complete: stdin:2: delivery $first of dd does not exist (completed elsewhere, or never published): not applied" ]
  [ "$(q "SELECT count(*) FROM $RB_SCHEMA.relaybus_deliveries WHERE handler = 'dd'")" = 0 ]
}

@test "a completion that waits on a takeover's charge of its delivery (claims one up): not applied, the row as the charge left it" {
  pg_only
  need_pg
  publish 1 w ch
  rb-claim -q -H ch --batch 10 >"$BATS_TEST_TMPDIR/lines"
  local id p
  id=$(jq -r .delivery_id "$BATS_TEST_TMPDIR/lines")
  # the charge of a takeover (relaybus_claim_charge), not committed yet
  session rbcharge
  echo "BEGIN; UPDATE relaybus_deliveries SET claims = claims + 1, attempts = attempts + 1 WHERE id = $id;" >&7
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'rbcharge'"' AND state = '"'idle in transaction'"'")" = 1 ]'
  # the completion finds the row, then waits for the charge's lock on it
  jq -c '. + {ok: true}' "$BATS_TEST_TMPDIR/lines" | rb-complete -o >"$BATS_TEST_TMPDIR/out" 2>"$BATS_TEST_TMPDIR/err" &
  p=$!
  PIDS="$PIDS $p"
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = '"'Lock'"' AND application_name <> '"'rbcharge'"'")" -ge 1 ]'
  echo "COMMIT;" >&7
  wait "$p"
  cat "$BATS_TEST_TMPDIR/out"
  [ "$(jq -r .outcome "$BATS_TEST_TMPDIR/out")" = lost ]
  [ ! -s "$BATS_TEST_TMPDIR/err" ]
  [ "$(q "SELECT claims || ' ' || attempts || ' ' || status FROM $RB_SCHEMA.relaybus_deliveries WHERE id = $id")" = "1 1 pending" ]
}

@test "a completion at the claim's address that waits on a takeover's charge of its delivery: not applied, the row as the charge left it" {
  pg_only
  need_pg
  publish 1 a ca
  local id lane epoch claims addr p
  # claimed as rb-dispatch claims, with the row's address
  read -r id lane epoch claims addr < <(q "SELECT id, lane, epoch, claims, addr FROM relaybus_claim_ids('ca', 'A', 10, 60000, 5, '{}', true, 1, NULL)" | tr '|' ' ')
  [ "$addr" = "$(q "SELECT ctid FROM relaybus_deliveries WHERE id = $id")" ]
  session rbcharge
  echo "BEGIN; UPDATE relaybus_deliveries SET claims = claims + 1, attempts = attempts + 1 WHERE id = $id;" >&7
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'rbcharge'"' AND state = '"'idle in transaction'"'")" = 1 ]'
  # the completion finds the row at its address, then waits for the charge's lock on it; the charge
  # wrote a new version elsewhere, which a deletion by address does not follow (nor would its claims
  # pass the fence); the row found by its id in the statement's snapshot (ord:id) is not deleted
  # either: no -:id row
  q "SELECT coalesce(string_agg(coalesce(ord::text, '-') || ':' || coalesce(id::text, '-'), ' '), 'none') FROM relaybus_complete_batch(ARRAY['a1'], ARRAY['ca'], ARRAY[$lane]::smallint[],
       ARRAY[$epoch]::bigint[], ARRAY[$claims], ARRAY[$id]::bigint[], ARRAY['$addr']::tid[])" >"$BATS_TEST_TMPDIR/out" 2>&1 &
  p=$!
  PIDS="$PIDS $p"
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = '"'Lock'"' AND application_name <> '"'rbcharge'"'")" -ge 1 ]'
  echo "COMMIT;" >&7
  wait "$p"
  [ "$(cat "$BATS_TEST_TMPDIR/out")" = "1:$id" ]
  [ "$(q "SELECT claims || ' ' || attempts || ' ' || status FROM $RB_SCHEMA.relaybus_deliveries WHERE id = $id")" = "1 1 pending" ]
}
