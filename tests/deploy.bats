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
  fresh_schema
  q "DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$R_W') THEN CREATE ROLE \"$R_W\" LOGIN; END IF; END \$\$"
  rb-setup -q -s 'dep:dep.*' --grant "worker=$R_W:dep" --grant "admin=$R_W"
}
teardown() {
  kill_pids_drop_schema
  [ -z "${_test_pg_url:-}" ] || psql "$_test_pg_url" -X -q -c "DROP OWNED BY \"$R_W\"" -c "DROP ROLE IF EXISTS \"$R_W\"" >/dev/null 2>&1 || true
}

# a psql session fed through a fifo, kept open on fd 7 (HOLD_FD)
session() {  # application name
  local fifo=$BATS_TEST_TMPDIR/fifo
  mkfifo "$fifo"
  (PGAPPNAME=$1 sql <"$fifo" >"$BATS_TEST_TMPDIR/session.out" 2>&1 3>&-) &
  PIDS="${PIDS:-} $!"
  exec 7>"$fifo"
  HOLD_FD=7
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
