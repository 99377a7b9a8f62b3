#!/usr/bin/env bats
# The cost of a claim must not depend on when the tables were last
# analyzed (PostgreSQL): a claim on a table with a history (completed
# deliveries, dead tuples, statistics taken while it was empty) reads what
# it takes, not every due delivery of the handler.

load test_helper

setup() {
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    drop_schema
    setup_schema
  fi
}

teardown() { drop_schema; }

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
