#!/usr/bin/env bats
# A held snapshot: a long REPEATABLE READ transaction holds back the xmin
# horizon, so no dead tuple (a completed delivery's deleted row) can be
# removed while it is open.  A drain under it loses nothing and does not
# stall (issue 18 item 8; bench/snapshot measures the slowdown).

load test_helper

setup() {
  pg_only "the xmin horizon and pg_stat_activity are PostgreSQL's"
  need_pg
  drop_schema
  setup_schema
}

teardown() { kill_pids_drop_schema; }

# N events for handler H, ids PREFIX1..PREFIXN (default s), odd ones keyed over 50 keys
events() {  # n handler [prefix]
  awk -v n="$1" -v h="$2" -v p="${3:-s}" 'BEGIN {
    for (i = 1; i <= n; i++)
      if (i % 2) printf "{\"id\":\"%s%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i % 50, i, h
      else printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i, h
  }'
}

# the holder's backend_xmin ("" when it holds none)
holder_xmin() { q "SELECT backend_xmin FROM pg_stat_activity WHERE application_name = '$APP'"; }
dead_tuples() { q "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = '$RB_SCHEMA' AND relname = 'relaybus_deliveries'"; }
wait_for() {  # secs cond...
  local end=$(( $(date +%s) + $1 )); shift
  until eval "$*"; do
    [ "$(date +%s)" -lt "$end" ] || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.1
  done
}

@test "a held snapshot: a drain of 3,000 under it runs every event once, leaves nothing, does not stall, and the rows stay unvacuumable" {
  local n=3000 out=$BATS_TEST_TMPDIR/runs fifo=$BATS_TEST_TMPDIR/fifo x0 x1 t0 t1
  events "$n" snap | rb-publish -q
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'snap'")" = "$n" ]
  # the holder: a REPEATABLE READ transaction whose snapshot is taken by a
  # SELECT on a relaybus table and kept while the fifo stays open
  APP=rbsnap$$
  mkfifo "$fifo"
  (PGAPPNAME=$APP sql <"$fifo" >/dev/null 2>&1 3>&-) &
  PIDS=$!
  exec 7>"$fifo"
  HOLD_FD=7
  echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM relaybus_deliveries;" >&7
  wait_for 10 '[ -n "$(holder_xmin)" ]'
  x0=$(holder_xmin)
  t0=$(date +%s%3N)
  # no stall: the drain ends by itself (it takes a second or two on an
  # idle machine, a few under load; compared below with the same drain
  # without a snapshot, timed in this test)
  run -0 --separate-stderr timeout 120 rb-dispatch -H snap --pipe "rb-test-pipe $out" -c 200 -b 100 --drain 7>&- 3>&-
  t1=$(date +%s%3N)
  echo "# drained $n in $((t1 - t0)) ms under the snapshot" >&3
  # every event ran exactly once, nothing pending or dead
  [ "$(wc -l <"$out")" = "$n" ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = "$n" ]
  [ -z "$(cut -d' ' -f1 "$out" | sort | uniq -d)" ]
  [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  # the snapshot held the horizon the whole time: same xmin, still there
  x1=$(holder_xmin)
  [ "$x1" = "$x0" ]
  # ... so the deleted rows are dead tuples that VACUUM cannot remove
  wait_for 10 '[ "$(dead_tuples)" -ge "$n" ]'
  q "VACUUM relaybus_deliveries"
  wait_for 10 '[ "$(dead_tuples)" -ge "$n" ]'
  # released, the same VACUUM removes them (the check above can fail)
  exec 7>&-
  HOLD_FD=
  wait_for 10 '[ -z "$(holder_xmin)" ]'
  # (a VACUUM again until the horizon passed the deletions: a transaction
  # of a test file running beside this one, on the same server, may hold
  # it back a while too)
  wait_for 60 'q "VACUUM relaybus_deliveries"; [ "$(dead_tuples)" -lt "$n" ]'
  # the same drain without a snapshot: the one under it took at most four
  # times as long, and 5 s more (bench/snapshot measures the slowdown)
  local b0 b1
  events "$n" base b | rb-publish -q
  b0=$(date +%s%3N)
  run -0 --separate-stderr timeout 120 rb-dispatch -H base --pipe "rb-test-pipe $out.base" -c 200 -b 100 --drain 3>&-
  b1=$(date +%s%3N)
  echo "# drained $n in $((b1 - b0)) ms without a snapshot" >&3
  [ "$(wc -l <"$out.base")" = "$n" ]
  [ $((t1 - t0)) -lt $((4 * (b1 - b0) + 5000)) ]
}
