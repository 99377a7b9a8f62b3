#!/usr/bin/env bats
# Claim cursors (relaybus(7), "Claim cursors"; issue 25 item 3): a
# long-lived claimer's claims start where its last one found the first
# pending entry, never past a bound B from the ticks of its own claims.
# What a user relies on: a transaction that commits late is delivered at
# once; a row written outside the rule is found by the safety net
# (RELAYBUS_PG_RESCAN); and under a held snapshot a drain reads about what
# it reads without one.

load test_helper

setup() {
  pg_only "claim cursors are the PostgreSQL backend's"
  need_pg
  drop_schema
  setup_schema
}

teardown() { kill_pids_drop_schema; }

# N events for handler H, ids PREFIX1..N; odd ones keyed over KEYS keys (0: none)
events() {  # n prefix handler keys
  awk -v n="$1" -v p="$2" -v h="$3" -v keys="$4" 'BEGIN {
    for (i = 1; i <= n; i++)
      if (keys > 0 && i % 2) printf "{\"id\":\"%s%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i % keys, i, h
      else printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i, h
  }'
}
handled() { [ -f "$1" ] || { echo 0; return; }; grep -c "^$2 " "$1" || true; }
in_xact() { q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1' AND state = 'idle in transaction' AND backend_xid IS NOT NULL"; }

@test "a publish that commits late, from a transaction older than many claims, is delivered at once (not by the safety net), keyed or not, in its key's order" {
  local out=$BATS_TEST_TMPDIR/runs t0 t1 i
  # before: five events of key kl
  for i in 1 2 3 4 5; do
    echo "{\"id\":\"b$i\",\"name\":\"t\",\"key\":\"kl\",\"payload\":{\"i\":$i},\"handlers\":[\"late\"]}"
  done | rb-publish -q
  RELAYBUS_PG_RESCAN=1h rb-dispatch -H late --pipe "rb-test-pipe $out" 3>&- &
  PIDS=$!
  wait_for 10 '[ "$(handled "$out" b5)" = 1 ]'
  # the late transaction: it began before the claims below, and its
  # publish reads its time only after its xid (a second later)
  session rblate$$
  echo "BEGIN; SELECT pg_sleep(1); SELECT pg_current_xact_id() IS NOT NULL;
        SELECT deliveries FROM relaybus_publish('t', '{\"i\":6}', 'kl', 'late-k', NULL, NULL, NULL, '{late}');
        SELECT deliveries FROM relaybus_publish('t', '{\"i\":0}', NULL, 'late-u', NULL, NULL, NULL, '{late}');" >&7
  wait_for 10 '[ "$(in_xact rblate$$)" = 1 ]'
  # meanwhile many claims: 400 events of other keys and none, all run
  events 400 m late 20 | rb-publish -q
  wait_for 30 '[ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '"'late'"'")" = 0 ]'
  [ "$(handled "$out" late-u)" = 0 ]
  [ "$(handled "$out" late-k)" = 0 ]
  t0=$(date +%s%3N)
  echo "COMMIT;" >&7
  wait_for 20 '[ "$(handled "$out" late-u)" = 1 ] && [ "$(handled "$out" late-k)" = 1 ]'
  t1=$(date +%s%3N)
  echo "# handled $((t1 - t0)) ms after the commit" >&3
  # (the safety net would take an hour: a bound a busy machine meets)
  [ $((t1 - t0)) -lt 15000 ]
  # after: three more of key kl
  for i in 7 8 9; do
    echo "{\"id\":\"a$i\",\"name\":\"t\",\"key\":\"kl\",\"payload\":{\"i\":$i},\"handlers\":[\"late\"]}"
  done | rb-publish -q
  wait_for 10 '[ "$(handled "$out" a9)" = 1 ]'
  # every event once, and key kl in its order: b1..b5, late-k, a7..a9
  [ "$(wc -l <"$out")" = 410 ]
  [ -z "$(cut -d' ' -f1 "$out" | sort | uniq -d)" ]
  [ "$(awk '$2 == "kl" { printf "%s ", $1 }' "$out")" = "b1 b2 b3 b4 b5 late-k a7 a8 a9 " ]
}

@test "a delivery inserted by hand with an old available_at: the cursors are past it; the safety net (RELAYBUS_PG_RESCAN) finds it" {
  local out v h
  for v in 1h 2s; do
    h=hand$v out=$BATS_TEST_TMPDIR/$h.runs
    events 300 "w$v-" "$h" 10 | rb-publish -q
    RELAYBUS_PG_RESCAN=$v rb-dispatch -H "$h" --pipe "rb-test-pipe $out" 3>&- &
    PIDS=$!
    wait_for 30 '[ "$(wc -l <"$out")" = 300 ]'
    sleep 1
    # outside the cursors' rule: an hour old, written as no relaybus
    # statement writes one
    q "INSERT INTO relaybus_events (id, name, payload, handlers) VALUES ('old-$v', 't', '{\"i\":0}', '{$h}');
       INSERT INTO relaybus_deliveries (event_id, handler, lane, available_at)
       VALUES ('old-$v', '$h', relaybus_lane('old-$v'), now() - interval '1 hour')"
    if [ "$v" = 1h ]; then
      # (the dispatcher polls and claims meanwhile: its cursors are past it)
      sleep 4
      [ "$(handled "$out" "old-$v")" = 0 ]
    else
      wait_for 8 '[ "$(handled "$out" "old-$v")" = 1 ]'
    fi
    kill -TERM "$PIDS"
    wait "$PIDS" || true
    PIDS=
  done
  [ "$(wc -l <"$BATS_TEST_TMPDIR/hand2s.runs")" = 301 ]
  # a claim without cursors (rb-claim, as a pipeline runs it) takes it at once
  run -0 --separate-stderr rb-claim -H hand1h
  [ "$(jq -r .event_id <<<"$output")" = old-1h ]
}

# buffers the drain read from relaybus_deliveries, table and indexes
# (its backends flushed their statistics when they exited)
read_buffers() { q "SELECT coalesce(sum(heap_blks_hit + heap_blks_read + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)), 0)
                    FROM pg_statio_user_tables WHERE schemaname = '$RB_SCHEMA' AND relname = 'relaybus_deliveries'"; }
# The count once every backend of application APP has gone and what they
# read has reached the views: the same twice, half a second apart (a
# backend flushes its statistics when it exits, a moment after its client;
# on a busy machine a fixed wait can end before, and the reads would land
# in the next drain's count)
settled_buffers() {  # app
  local a b i
  wait_for 30 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'$1'"'")" = 0 ]'
  a=$(read_buffers)
  for i in $(seq 1 40); do
    sleep 0.5
    b=$(read_buffers)
    [ "$a" != "$b" ] || { echo "$b"; return; }
    a=$b
  done
  echo "the statistics of $1 never settled" >&2
  return 1
}

# A steady load's drain: ROUNDS times publish 60 events (half keyed over 20
# keys) and wait until they ran, with one rb-dispatch; prints the buffers
# it read.  RESCAN: its RELAYBUS_PG_RESCAN.
steady() {  # handler rescan rounds
  local h=$1 out=$BATS_TEST_TMPDIR/$1.runs b0 b1 r
  b0=$(read_buffers)
  events 60 "$h-1-" "$h" 20 | rb-publish -q
  PGAPPNAME=rbsteady-$h RELAYBUS_PG_RESCAN=$2 rb-dispatch -vv -H "$h" --pipe "rb-test-pipe $out" \
    3>&- 7>&- 2>"$BATS_TEST_TMPDIR/$h.log" &
  local dp=$! t0
  t0=$(date +%s%3N)
  for r in $(seq 1 "$3"); do
    [ "$r" = 1 ] || events 60 "$h-$r-" "$h" 20 | rb-publish -q
    wait_for 20 '[ "$(lines_of "$out")" = $((r * 60)) ]'
    # (every tenth round, the other sessions that hold an xid or a
    # snapshot: an xid older than a claim's tick keeps its cursors back)
    [ $((r % 10)) != 5 ] || q "SELECT application_name || ' (' || state || CASE WHEN backend_xid IS NOT NULL
                                  THEN ', an xid' ELSE '' END || ')|' || round(extract(epoch FROM now() - xact_start))
                             FROM pg_stat_activity WHERE pid <> pg_backend_pid()
                              AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
                             UNION ALL SELECT 'prepared ' || gid || '|0' FROM pg_prepared_xacts" >>"$BATS_TEST_TMPDIR/$h.xids"
  done
  # (what the reads are made of, for a run that reads more than it should:
  # how long, how many claims, how many found nothing or read held lanes
  # only, which sessions held an xid or a snapshot)
  kill -TERM "$dp"; wait "$dp" || true
  echo "# $h: drained in $(($(date +%s%3N) - t0)) ms; claims $(grep -c ': claimed ' "$BATS_TEST_TMPDIR/$h.log"), of them empty $(grep -c ': claimed 0 ' "$BATS_TEST_TMPDIR/$h.log"), held lanes only $(grep -c 'held lanes only)' "$BATS_TEST_TMPDIR/$h.log")" >&3
  echo "# $h: sessions with an xid or a snapshot (rounds seen of 10, oldest transaction):$(awk -F'|' '{ n[$1]++; if ($2 > a[$1]) a[$1] = $2 }
    END { for (k in n) printf " %s: %d, %d s;", k, n[k], a[k] }' "$BATS_TEST_TMPDIR/$h.xids" 2>/dev/null)" >&3
  b1=$(settled_buffers "rbsteady-$h")
  [ -z "$(cut -d' ' -f1 "$out" | sort | uniq -d)" ]
  echo $((b1 - b0))
}
lines_of() { [ -f "$1" ] && wc -l <"$1" || echo 0; }

@test "under a held snapshot a steady drain with cursors reads at most 3x what it reads without the snapshot, and under half of what it reads without cursors" {
  local clean held off_clean off_held n=100
  clean=$(steady cl 5s $n)
  off_clean=$(steady ocl 0 $n)
  # the holder: REPEATABLE READ, its snapshot taken, kept while fd 7 is open
  session rbhold$$
  echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM relaybus_deliveries;" >&7
  wait_for 10 '[ -n "$(q "SELECT backend_xmin FROM pg_stat_activity WHERE application_name = '"'rbhold$$'"'")" ]'
  held=$(steady hd 5s $n)
  off_held=$(steady ohd 0 $n)
  echo "# buffers of $((n * 60)) deliveries: with cursors clean $clean, held $held; without cursors clean $off_clean, held $off_held" >&3
  # the snapshot held the whole time
  [ -n "$(q "SELECT backend_xmin FROM pg_stat_activity WHERE application_name = 'rbhold$$'")" ]
  [ "$clean" -gt 0 ] && [ "$held" -gt 0 ]
  [ "$held" -le $((3 * clean)) ]
  [ $((2 * held)) -lt "$off_held" ]
}

# a claim with cursors, as rb-dispatch calls it: owner, batch, the lanes it
# holds (p_mine), those others held (p_others) and the lane rows' versions
# (p_mine_t) it was given; its rows' ids, the versions it hands back on fd 3
cclaim() {  # owner batch mine others versions
  q "SELECT coalesce(string_agg(c.id::text, ',' ORDER BY c.id) FILTER (WHERE c.id IS NOT NULL), '') || ' '
            || coalesce(max(c.event_id) FILTER (WHERE c.id IS NULL AND c.handler = 'mine_t'), '-')
       FROM relaybus_claim_ids('v', '$1', $2, 60000, 5, '{}', true, 1, NULL, 7, false, false,
                               '{}'::timestamptz[], '{}'::xid8[], NULL, NULL, NULL, NULL,
                               $3, $4, $5) c"
}
# the pending deliveries of v not in flight and not in lanes owner B holds
expect_ids() {
  q "SELECT coalesce(string_agg(d.id::text, ',' ORDER BY d.id), '') FROM relaybus_deliveries d
      WHERE d.handler = 'v' AND d.status = 'pending'
        AND NOT EXISTS (SELECT 1 FROM relaybus_lanes x WHERE x.handler = 'v' AND x.lane = d.lane
                         AND (x.lease_owner = 'B' OR d.id = ANY (x.in_flight)))"
}

@test "lane-row versions given to a claim that are wrong or stale change nothing: it claims what it would without them, leaves another owner's lanes alone" {
  local want got vers lane0
  q "SELECT relaybus_seed_lanes('v')" >/dev/null
  events 60 v v 0 | rb-publish -q
  # B holds the lanes of its 8
  [ "$(q "SELECT count(*) FROM relaybus_claim_ids('v', 'B', 8, 60000, 5, '{}', true, 1, NULL)")" = 8 ]
  want=$(expect_ids)
  [ -n "$want" ]
  # every lane's version given as that of a lane row of B's (a row of
  # another lane, and one leased): A claims all the rest, nothing of B's
  lane0=$(q "SELECT ctid FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'B' ORDER BY lane LIMIT 1")
  read -r got vers < <(cclaim A 100 "'{}'" "'{}'" "array_fill('$lane0'::tid, ARRAY[256])")
  [ "$got" = "$want" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'B'")" -gt 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes x WHERE handler = 'v' AND lease_owner = 'B'
                AND cardinality(in_flight) > 0 AND NOT EXISTS (
                    SELECT 1 FROM relaybus_deliveries d WHERE d.id = ANY (x.in_flight) AND d.id = ANY ('{$got}'))")" \
       = "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'B'")" ]
  # the versions handed back of the lanes A holds now are their rows' own
  [ "$(q "SELECT count(*) FROM unnest('$vers'::tid[]) WITH ORDINALITY v(t, o)
            JOIN relaybus_lanes x ON x.handler = 'v' AND x.lane = v.o - 1 AND x.ctid = v.t
           WHERE x.lease_owner = 'A'")" = "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'A'")" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'A'")" -gt 0 ]
  # every lane row rewritten since (an operator), more work, some of it in
  # A's lanes: the stale versions find nothing, the rows are found by key
  q "UPDATE relaybus_lanes SET buried = buried WHERE handler = 'v'" >/dev/null
  events 40 w v 0 | rb-publish -q
  want=$(expect_ids)
  [ -n "$want" ]
  read -r got vers < <(cclaim A 100 \
    "(SELECT array_agg(lane ORDER BY lane) FROM relaybus_lanes WHERE handler = 'v' AND lease_owner = 'A')" \
    "'{}'" "'$vers'::tid[]")
  # (p_live empty: A says it runs nothing, so what it had in flight in
  # its lanes is claimed again with the new work)
  [ -n "$got" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries d JOIN relaybus_lanes x ON x.handler = 'v' AND x.lane = d.lane
            WHERE d.id = ANY ('{$got}') AND x.lease_owner = 'B'")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries d JOIN relaybus_lanes x ON x.handler = 'v' AND x.lane = d.lane
            WHERE d.id = ANY ('{$got}') AND x.lease_owner = 'A' AND d.id = ANY (x.in_flight)")" \
       = "$(echo "$got" | tr ',' '\n' | wc -l)" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries d WHERE d.handler = 'v' AND d.event_id LIKE 'w%'
            AND NOT EXISTS (SELECT 1 FROM relaybus_lanes x WHERE x.handler = 'v' AND x.lane = d.lane AND x.lease_owner = 'B')
            AND NOT (d.id = ANY ('{$got}'))")" = 0 ]
}

# the shared buffers of the claim a long-lived claimer makes third, from
# the cursors its first two returned (generic plans, as a session's cached
# ones become; auto_explain, loaded for this session only, says them)
third_claim_buffers() {  # handler
  sql -v h="$1" 2>&1 <<'EOF' | sed -n 's/^ *Buffers: shared hit=\([0-9]*\).*/\1/p' | tail -1
SET plan_cache_mode = force_generic_plan;
SELECT max(event_id) FILTER (WHERE handler = 'tick_c') AS tc, max(event_id) FILTER (WHERE handler = 'tick_x') AS tx,
       max(event_id) FILTER (WHERE handler = 'mine') AS mine, max(event_id) FILTER (WHERE handler = 'mine_t') AS mt
  FROM relaybus_claim_ids(:'h', 'A', 32, 60000, 5, '{}', true, 1, '{}', 7, false, false,
                          '{}'::timestamptz[], '{}'::xid8[], NULL, NULL, NULL, NULL, NULL, NULL, NULL) \gset
SELECT max(event_id) FILTER (WHERE handler = 'cl') AS cl, max(event_id) FILTER (WHERE handler = 'cu') AS cu,
       max(event_id) FILTER (WHERE handler = 'ck') AS ck, max(event_id) FILTER (WHERE handler = 'g') AS g,
       max(event_id) FILTER (WHERE handler = 'mine') AS mine, max(event_id) FILTER (WHERE handler = 'mine_t') AS mt
  FROM relaybus_claim_ids(:'h', 'A', 32, 60000, 5, '{}', true, 1, '{}', 7, false, false,
                          ARRAY[:'tc']::timestamptz[], ARRAY[:'tx']::xid8[], NULL, NULL, NULL, NULL, :'mine', '{}', :'mt') \gset
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_timing = off;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SELECT count(*) FROM relaybus_claim_ids(:'h', 'A', 32, 60000, 5, '{}', true, 1, '{}', 7, false, false,
                          ARRAY[:'tc']::timestamptz[], ARRAY[:'tx']::xid8[], :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt');
EOF
}

@test "under a held snapshot a claim with cursors does not walk its lanes' completed keyed entries, whatever the statistics say (an analyze during the hold, generic plans)" {
  local out=$BATS_TEST_TMPDIR/an.runs b
  session rbanalyze$$
  echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM relaybus_deliveries;" >&7
  wait_for 10 '[ -n "$(q "SELECT backend_xmin FROM pg_stat_activity WHERE application_name = '"'rbanalyze$$'"'")" ]'
  # 4,000 deliveries of 4 keys (4 lanes, 1,000 each) run under the hold
  awk 'BEGIN { for (i = 1; i <= 4000; i++) printf "{\"id\":\"a%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{},\"handlers\":[\"an\"]}\n", i, i % 4 }' |
    rb-publish -q
  rb-dispatch -H an --pipe "rb-test-pipe $out" --drain 3>&- 7>&-
  [ "$(wc -l <"$out")" = 4000 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 0 ]
  # one more of each key, and the statistics an autovacuum would take now
  awk 'BEGIN { for (i = 1; i <= 4; i++) printf "{\"id\":\"z%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{},\"handlers\":[\"an\"]}\n", i, i % 4 }' |
    rb-publish -q
  q "ANALYZE relaybus_deliveries" >/dev/null
  b=$(third_claim_buffers an)
  echo "# the claim read $b buffers (1,000 completed entries a lane behind its cursors)" >&3
  [ -n "$b" ] && [ "$b" -gt 0 ]
  # (a scan of the dead entries of its 4 lanes reads about 400 more)
  [ "$b" -lt 250 ]
  # the snapshot held the whole time
  [ -n "$(q "SELECT backend_xmin FROM pg_stat_activity WHERE application_name = 'rbanalyze$$'")" ]
}

@test "a session plans the claim's statements once: its second claim already runs the plan it keeps (parameters, not the call's values)" {
  local plans
  events 40 g v 0 | rb-publish -q
  # (auto_explain, for this session only, says the plans of the second
  # claim's statements: a custom plan has the call's values in it, 'v'
  # for the handler; the generic plan a session keeps has parameters)
  plans=$(sql 2>&1 <<'EOF'
SELECT count(*) FROM relaybus_claim_ids('v', 'A', 4, 60000, 5, NULL, true, 1, NULL);
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
SET client_min_messages = notice;
SELECT count(*) FROM relaybus_claim_ids('v', 'A', 4, 60000, 5, NULL, true, 1, NULL);
EOF
)
  echo "$plans" | grep -E "Index Cond: .*handler = " | sed 's/^ *//' | cut -c1-100 | sort | uniq -c | sort -rn | head -5
  # the picks of the lanes held and the lanes' cursors, by parameter
  [ "$(echo "$plans" | grep -cE 'Index Cond: \(\(handler = \$[0-9]+\)')" -gt 0 ]
  [ "$(echo "$plans" | grep -c "handler = 'v'::text")" = 0 ]
}

@test "rb-dispatch --drain exits on the 'nothing' of a claim without cursors: a delivery its cursors are past is run before it exits" {
  local out=$BATS_TEST_TMPDIR/dr.runs p
  events 200 d- dr 10 | rb-publish -q
  # (no safety net: RELAYBUS_PG_RESCAN 1h)
  RELAYBUS_PG_RESCAN=1h rb-dispatch -H dr --drain -c 1 --exec "rb-test-exec $out sleep:0.02" 2>"$BATS_TEST_TMPDIR/dr.err" 3>&- &
  p=$!
  PIDS=$p
  wait_for 30 '[ "$(lines_of "$out")" -ge 40 ]'
  # outside the cursors' rule, as in the test above: an hour old
  q "INSERT INTO relaybus_events (id, name, payload, handlers) VALUES ('old-dr', 't', '{\"i\":0}', '{dr}');
     INSERT INTO relaybus_deliveries (event_id, handler, lane, available_at)
     VALUES ('old-dr', 'dr', relaybus_lane('old-dr'), now() - interval '1 hour')"
  [ "$(lines_of "$out")" -lt 200 ]
  wait "$p"
  PIDS=
  [ "$(handled "$out" old-dr)" = 1 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 201 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'dr'")" = 0 ]
}

# Claims of owner A for handler kf, as a long-lived claimer makes them, each
# from the cursors the one before handed back (a psql script; \gset keeps
# them).  After two claims, the third from their cursors (in transactions
# rolled back: the same lanes, the same rows each time), it prints: the
# lanes it names in kf given none | its ids | its ids given kf = $1 | its ids
# given a kf of one NULL (a caller's bad array: no lane's keys lost) | after
# all but $2 of key ka's deliveries are gone, the kf it names given none (a
# pass) | and given $1.
kf_claims() {  # kf-to-give keep
  sql -v kf="$1" -v keep="$2" <<'EOF2'
SELECT max(event_id) FILTER (WHERE handler = 'tick_c') AS tc, max(event_id) FILTER (WHERE handler = 'tick_x') AS tx,
       max(event_id) FILTER (WHERE handler = 'mine') AS mine, max(event_id) FILTER (WHERE handler = 'mine_t') AS mt,
       max(event_id) FILTER (WHERE handler = 'cl') AS cl, max(event_id) FILTER (WHERE handler = 'cu') AS cu,
       max(event_id) FILTER (WHERE handler = 'ck') AS ck, max(event_id) FILTER (WHERE handler = 'g') AS g,
       coalesce(string_agg(id::text, ',') FILTER (WHERE id IS NOT NULL), '') AS live
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 1, NULL, 7, false, false,
                          '{}'::timestamptz[], '{}'::xid8[], NULL, NULL, NULL, NULL, NULL, NULL, NULL) \gset
SELECT max(event_id) FILTER (WHERE handler = 'tick_c') AS tc2, max(event_id) FILTER (WHERE handler = 'tick_x') AS tx2,
       max(event_id) FILTER (WHERE handler = 'mine') AS mine, max(event_id) FILTER (WHERE handler = 'mine_t') AS mt,
       max(event_id) FILTER (WHERE handler = 'cl') AS cl, max(event_id) FILTER (WHERE handler = 'cu') AS cu,
       max(event_id) FILTER (WHERE handler = 'ck') AS ck, max(event_id) FILTER (WHERE handler = 'g') AS g
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, ('{' || :'live' || '}')::bigint[], true, 1, NULL, 7, false, false,
                          ARRAY[:'tc']::timestamptz[], ARRAY[:'tx']::xid8[], :'cl', :'cu', :'ck', :'g',
                          :'mine', '{}', :'mt') \gset
BEGIN;
SELECT coalesce(string_agg(id::text, ',' ORDER BY id) FILTER (WHERE id IS NOT NULL), '') AS without_kf,
       max(event_id) FILTER (WHERE handler = 'kf') AS found_kf
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 3, NULL, 7, false, false,
                          ARRAY[:'tc', :'tc2']::timestamptz[], ARRAY[:'tx', :'tx2']::xid8[],
                          :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt', NULL) \gset
ROLLBACK;
BEGIN;
SELECT coalesce(string_agg(id::text, ',' ORDER BY id) FILTER (WHERE id IS NOT NULL), '') AS with_kf
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 3, NULL, 7, false, false,
                          ARRAY[:'tc', :'tc2']::timestamptz[], ARRAY[:'tx', :'tx2']::xid8[],
                          :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt', :'kf') \gset
ROLLBACK;
BEGIN;
SELECT coalesce(string_agg(id::text, ',' ORDER BY id) FILTER (WHERE id IS NOT NULL), '') AS with_null
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 3, NULL, 7, false, false,
                          ARRAY[:'tc', :'tc2']::timestamptz[], ARRAY[:'tx', :'tx2']::xid8[],
                          :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt', '{NULL}') \gset
ROLLBACK;
DELETE FROM relaybus_deliveries d WHERE d.handler = 'kf' AND d.key = 'ka'
   AND d.sequence > (SELECT min(x.sequence) FROM relaybus_deliveries x WHERE x.handler = 'kf' AND x.key = 'ka') + :keep - 1;
BEGIN;
SELECT max(event_id) FILTER (WHERE handler = 'kf') AS pass_kf
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 3, NULL, 7, false, false,
                          ARRAY[:'tc', :'tc2']::timestamptz[], ARRAY[:'tx', :'tx2']::xid8[],
                          :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt', NULL) \gset
ROLLBACK;
BEGIN;
SELECT max(event_id) FILTER (WHERE handler = 'kf') AS kept_kf
  FROM relaybus_claim_ids('kf', 'A', 100, 60000, 5, '{}', true, 3, NULL, 7, false, false,
                          ARRAY[:'tc', :'tc2']::timestamptz[], ARRAY[:'tx', :'tx2']::xid8[],
                          :'cl', :'cu', :'ck', :'g', :'mine', '{}', :'mt', :'kf') \gset
ROLLBACK;
SELECT :'found_kf' || '|' || :'without_kf' || '|' || :'with_kf' || '|' || :'with_null' || '|' || :'pass_kf' || '|' || :'kept_kf';
EOF2
}

@test "a lane of 64 keyed deliveries or more is remembered until the next pass: the claim names it (kf), and a claim given it picks what it would without it" {
  local la lb heads r found without with with_null pass kept
  la=$(q "SELECT relaybus_lane('ka')")
  lb=$(q "SELECT relaybus_lane('kb')")
  [ "$la" != "$lb" ]
  # key ka: 100 deliveries on lane la; key kb: 10 on lane lb
  awk 'BEGIN { for (i = 1; i <= 100; i++) printf "{\"id\":\"a%d\",\"name\":\"t\",\"key\":\"ka\",\"payload\":{},\"handlers\":[\"kf\"]}\n", i
               for (i = 1; i <= 10; i++) printf "{\"id\":\"b%d\",\"name\":\"t\",\"key\":\"kb\",\"payload\":{},\"handlers\":[\"kf\"]}\n", i }' |
    rb-publish -q
  # each key's first three (a chain of 3 from its head)
  heads=$(q "SELECT string_agg(id::text, ',' ORDER BY id) FROM (SELECT id, row_number() OVER (PARTITION BY key ORDER BY sequence) n
                                                                  FROM relaybus_deliveries WHERE handler = 'kf') d WHERE n <= 3")
  # given kf, lb named too (wrongly: it has 10): the skip scan for both
  r=$(kf_claims "{$la,$lb}" 40)
  echo "# kf found, picks without kf, with it and with {NULL}, kf at a pass and given it: $r" >&3
  IFS='|' read -r found without with with_null pass kept <<<"$r"
  [ "$found" = "{$la}" ]
  [ "$with" = "$heads" ]
  [ "$with_null" = "$heads" ]
  [ "$without" = "$heads" ]
  # 40 of ka left: a pass forgets la; a claim given it keeps it
  [ "$pass" = "{}" ]
  [ "$kept" = "{$(printf '%s\n' "$la" "$lb" | sort -n | paste -sd,)}" ]
}
