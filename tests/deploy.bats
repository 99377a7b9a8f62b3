#!/usr/bin/env bats
# A deploy never stalls the workers: rb-setup re-run on a schema it made
# already (a new subscription, a deploy script's routine run) takes no
# lock that a reader, a claim or a completion waits for, and a real change
# takes its locks in the delivery path's order, so that a set-up run in a
# loop beside draining dispatchers deadlocks with none of them.

load test_helper

R_W=${RB_SCHEMA}_w
setup() {
  pg_only "PostgreSQL's locks"
  need_pg
  fresh_schema
  q "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$R_W') THEN CREATE ROLE \"$R_W\" LOGIN; END IF; END \$\$"
  rb-setup -q -s 'dep:dep.*' --grant "worker=$R_W:dep" --grant "admin=$R_W"
}
teardown() {
  kill_pids_drop_schema
  [ -z "${_test_pg_url:-}" ] || psql "$_test_pg_url" -X -q -c "DROP OWNED BY \"$R_W\"" -c "DROP ROLE IF EXISTS \"$R_W\"" >/dev/null 2>&1 || true
}

in_xact() { q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1' AND state = 'idle in transaction'"; }

@test "a re-run on an up-to-date schema waits for no reader of the tables (pg_dump's lock), and claims do not wait for it" {
  gen_events 20 dep.x | rb-publish -q
  # pg_dump holds ACCESS SHARE on every table for its whole run
  session dep_reader
  echo "BEGIN; SELECT count(*) FROM relaybus_lanes; SELECT count(*) FROM relaybus_deliveries; SELECT count(*) FROM relaybus_events;" >&7
  wait_for 10 '[ "$(in_xact dep_reader)" = 1 ]'
  # a new subscription and a routine re-run finish while the reader still holds its locks
  run -0 --separate-stderr timeout 60 rb-setup -s 'dep2:dep.*'
  run -0 --separate-stderr timeout 60 rb-setup --grant "worker=$R_W:dep2"
  [ "$(in_xact dep_reader)" = 1 ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'dep2'")" = 1 ]
  # the new subscription's lanes are there, and claims go on
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'dep2'")" = 256 ]
  run -0 timeout 60 rb-claim -H dep --batch 100
  [ "${#lines[@]}" = 20 ]
}

@test "a real change of the schema (an upgrade) takes its locks in the delivery path's order: a set-up loop beside two draining dispatchers deadlocks with none" {
  local log out=$BATS_TEST_TMPDIR/ran i before
  log=$(pg_dir)/server.log
  [ -f "$log" ] || skip "the server's log is not at hand (RELAYBUS_TEST_PG_DIR)"
  before=$(grep -c 'deadlock detected' "$log" || true)
  gen_events 3000 dep.x 40 | rb-publish -q --batch 500
  for i in 1 2; do
    rb-dispatch -H dep -c 8 --pipe "rb-test-pipe $out" --lease 30s 3>&- 2>>"$BATS_TEST_TMPDIR/disp.err" &
    PIDS="${PIDS:-} $!"
  done
  for i in $(seq 1 12); do
    # a schema whose fingerprint is not this script's: the whole DDL runs again
    q "UPDATE relaybus_settings SET value = 'an older relaybus' WHERE name = 'script'"
    timeout 120 rb-setup -q -s "dep$i:other.*"
    gen_events 50 dep.y | sed "s/\"e/\"loop$i-/" | rb-publish -q
  done
  wait_for 120 '[ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '\''dep'\''")" = 0 ]'
  [ "$(sort -u "$out" | awk '{print $1}' | sort -u | wc -l)" = 3600 ]
  [ "$(grep -c 'deadlock detected' "$log" || true)" = "$before" ]
  ! grep -i 'deadlock' "$BATS_TEST_TMPDIR/disp.err"
}

@test "a real change beside a reader that never lets go: rb-setup waits --lock-timeout, holding nothing between its attempts, then 75 naming the reader; nothing changed" {
  gen_events 20 dep.x | rb-publish -q
  session dep_dumper
  echo "BEGIN; SELECT count(*) FROM relaybus_deliveries;" >&7
  wait_for 10 '[ "$(in_xact dep_dumper)" = 1 ]'
  # a schema whose fingerprint is not this script's: the DDL must run
  q "UPDATE relaybus_settings SET value = 'an older relaybus' WHERE name = 'script'"
  local t0 t1 c0 c1
  t0=$(date +%s%N)
  run --separate-stderr timeout 60 rb-setup --lock-timeout 3s -s 'dep3:dep.*'
  t1=$(date +%s%N)
  echo "$stderr"
  [ "$status" -eq 75 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ $stderr == "rb-setup: the tables of schema $RB_SCHEMA are held by pid "*"application_name 'dep_dumper', in a transaction since "*": not granted within 3s (--lock-timeout); nothing was changed" ]]
  # it gave up after its timeout, not at once and not much later (a loaded machine)
  [ $(( (t1 - t0) / 1000000 )) -ge 3000 ] && [ $(( (t1 - t0) / 1000000 )) -lt 30000 ]
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'dep3'")" = 0 ]
  # meanwhile a claim waits no longer than one attempt: measured beside the set-up's waiting
  (timeout 60 rb-setup --lock-timeout 6s -s 'dep3:dep.*' 2>/dev/null 3>&-) & PIDS="${PIDS:-} $!"
  sleep 1
  c0=$(date +%s%N)
  run -0 timeout 60 rb-claim -H dep --batch 5
  c1=$(date +%s%N)
  [ "${#lines[@]}" = 5 ]
  [ $(( (c1 - c0) / 1000000 )) -lt 3000 ]
  # the reader gone, the change goes through
  echo "COMMIT;" >&7
  run -0 --separate-stderr timeout 60 rb-setup --lock-timeout 10s -s 'dep3:dep.*'
  [ "$(q "SELECT count(*) FROM relaybus_subscriptions WHERE handler = 'dep3'")" = 1 ]
}
