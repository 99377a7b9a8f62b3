#!/usr/bin/env bats
# bench/run on tiny sizes, so that the harness cannot rot: it must build its
# drivers, run every scenario against the test database (schemas of its own,
# dropped at the end), print the tables, and find every run VALID.  Not a
# measurement: nothing here is timed.

load test_helper

@test "bench/run --tiny prints the tables and every run is valid" {
  need_pg
  command -v jq >/dev/null || skip "jq is not installed"
  command -v cc >/dev/null && pkg-config --exists libpq || skip "cc or libpq-dev is missing"
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/run" --tiny \
    --db "$RELAYBUS_TEST_PG_URL" --out "$BATS_TEST_TMPDIR/out"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [[ "$output" == *"### pg: publish only (scenario 1)"* ]]
  [[ "$output" == *"### pg: dispatch (scenario 2, 600 preloaded events"* ]]
  [[ "$output" == *"### pg: mixed steady state (scenario 5)"* ]]
  [[ "$output" == *"| P=1 batch=1 | "*" -> **"*"| VALID |"* ]]
  [[ "$output" == *"| P=1 batch=100 | "*"| VALID |"* ]]
  # relaybus_publish() once a transaction beside the minimal outbox, and issue 22's target line
  [[ "$output" == *"| config | minimal outbox events/s | relaybus_publish() events/s (ratio) |"* ]]
  [[ "$output" == *"Target (issue 22, reported, not asserted): rb-publish at least 0.8x the minimal outbox"* ]]
  [[ "$output" == *"| 1 proc, plain-SQL limit"*"| VALID |"* ]]
  [[ "$output" == *"| 1 proc, row-lease 0.1.0"*"| VALID |"* ]]
  [[ "$output" == *"| 1 x shell pipeline loop"*" -> **"*"| VALID |"* ]]
  [[ "$output" == *"| 1 x streaming pipeline (rb-claim --follow"*" -> **"*"| VALID |"* ]]
  [[ "$output" != *INVALID* ]]
  # rb-dispatch runs when built, else its rows say why they were skipped
  if [ -x "$RB_BINDIR/rb-dispatch" ]; then
    [[ "$output" == *"| 1 inst, defaults"*"| VALID |"* ]]
    # the same drain under a held snapshot, and its ratio to the drain without it
    [[ "$output" == *"| 1 inst, held snapshot: defaults"*"| VALID |"* ]]
    [[ "$output" == *"| config | deliveries/s (without -> with the snapshot) |"* ]]
    [[ "$output" == *"| 1 inst, defaults"*" -> **"*"x) | "*"| VALID |"* ]]
    # a large unkeyed backlog at the defaults (issue 43), this build only without RB_DISPATCH_BASE
    [[ "$output" == *"### pg: a large unkeyed backlog at the defaults (unkeyed)"* ]]
    [[ "$output" == *"| 1 (no RB_DISPATCH_BASE: this build only) | "*"| VALID |"* ]]
  else
    [[ "$output" == *"skipped: cmd/rb-dispatch is not built"* ]]
  fi
  # raw results beside the tables, and no schema left behind
  [ "$(jq -s 'map(select(.valid == "VALID")) | length' "$BATS_TEST_TMPDIR/out/results.jsonl")" -ge 7 ]
  [ -s "$BATS_TEST_TMPDIR/out/results.csv" ]
  # the dispatch chart: a bar per row, each with its median and the range of its runs
  if command -v gnuplot >/dev/null; then
    [ -s "$BATS_TEST_TMPDIR/out/dispatch.svg" ]
    grep -q '"1x streaming pipeline"' "$BATS_TEST_TMPDIR/out/dispatch.dat"
    grep -q '"1x pipeline loop"' "$BATS_TEST_TMPDIR/out/dispatch.dat"
    awk -F'" ' '{ n = split($2, v, " "); if (n != 9 || v[5] > v[4] || v[6] < v[4]) bad = 1 } END { exit bad }' \
      "$BATS_TEST_TMPDIR/out/dispatch.dat"
  fi
  jq -e '.cores > 0 and .synchronous_commit != null and .shared_buffers != null' "$BATS_TEST_TMPDIR/out/machine.json"
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rbbench\_%'")" = 0 ]
}

@test "bench/run --tiny --only unkeyed with RB_DISPATCH_BASE: each build publishes and drains its own backlog, a row per process count with both builds" {
  need_pg
  command -v jq >/dev/null || skip "jq is not installed"
  command -v cc >/dev/null && pkg-config --exists libpq || skip "cc or libpq-dev is missing"
  [ -x "$RB_BINDIR/rb-dispatch" ] || skip "cmd/rb-dispatch is not built"
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" RB_DISPATCH_BASE="$RB_BINDIR/rb-dispatch" "$RB_SRCDIR/bench/run" --tiny \
    --only unkeyed --db "$RELAYBUS_TEST_PG_URL" --out "$BATS_TEST_TMPDIR/out"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [[ "$output" != *"### pg: publish only"* ]]
  [[ "$output" == *"### pg: a large unkeyed backlog at the defaults (unkeyed)"* ]]
  [[ "$output" == *"| 1 | "*" -> **"*"x) | "*"x | "*" -> "*"| VALID |"* ]]
  [[ "$output" != *INVALID* ]]
  [ "$(jq -s 'map(select(.scenario == "unkeyed" and .valid == "VALID")) | map(.build) | sort' "$BATS_TEST_TMPDIR/out/results.jsonl" | jq -c .)" = '["base","this"]' ]
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rbbench\_%'")" = 0 ]
}

@test "bench/run --tiny --only curve,rss,counters prints their tables and every run is valid" {
  need_pg
  command -v jq >/dev/null || skip "jq is not installed"
  command -v cc >/dev/null && pkg-config --exists libpq || skip "cc or libpq-dev is missing"
  [ -x "$RB_BINDIR/rb-dispatch" ] || skip "cmd/rb-dispatch is not built"
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/run" --tiny --only curve,rss,counters \
    --db "$RELAYBUS_TEST_PG_URL" --out "$BATS_TEST_TMPDIR/out"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [[ "$output" != *"### pg: publish only"* ]]
  [[ "$output" == *"### pg: the curve"* ]]
  [[ "$output" == *"| 1 | "*" -> **"*"x) | "*"| VALID |"* ]]
  [[ "$output" == *"| 2 | "*" -> **"*"x) | "*"| VALID |"* ]]
  # beside each, the minimal at-least-once outbox drained the same events, exactly
  [[ "$output" == *"minimal at-least-once outbox (its ratio to the limit)"* ]]
  [ "$(jq -sc 'map(select(.scenario == "curve" and .kind == "txlock" and .valid == "VALID")) | map(.P) | sort' \
    "$BATS_TEST_TMPDIR/out/results.jsonl")" = '[1,2]' ]
  [[ "$output" == *"| backlog 300 -> 1,200 (1 process) | "*"| VALID |"* ]]
  [[ "$output" == *"| subscribed handlers 1 -> 5 "*"| VALID |"* ]]
  [[ "$output" == *"| a held snapshot "*"| VALID |"* ]]
  [[ "$output" == *"| defaults (conc 3200, batch 800, chain 32) | **"*" | VALID |"* ]]
  [[ "$output" == *"| conc 10000 (the maximum) | **"*" | VALID |"* ]]
  [[ "$output" == *"| fail once, then succeed (no RB_DISPATCH_BASE: this build only) | "*"| VALID |"* ]]
  [[ "$output" != *INVALID* ]]
  # every delivery of the counters drain failed once: the handler's log of first attempts
  [ "$(jq -s 'map(select(.scenario == "counters")) | .[0] | .failed_first == .deliveries and .deliveries == 600' \
    "$BATS_TEST_TMPDIR/out/results.jsonl")" = true ]
  if command -v gnuplot >/dev/null; then [ -s "$BATS_TEST_TMPDIR/out/curve.svg" ]; fi
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rbbench\_%'")" = 0 ]
}

@test "bench/run --store mongo --tiny: scenarios 1 and 2 on MongoDB, every run valid, the test server named, nothing left" {
  on_mongo || skip "MongoDB (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  command -v cc >/dev/null && pkg-config --exists libpq || skip "cc or libpq-dev is missing"
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/run" --store mongo --tiny \
    --db "$RELAYBUS_URL" --out "$BATS_TEST_TMPDIR/out"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [[ "$output" == *"### mongo: publish only (scenario 1)"* ]]
  [[ "$output" == *"### mongo: dispatch (scenario 2, 600 preloaded events"* ]]
  [[ "$output" == *"| P=1 batch=1 | "*"| VALID |"* ]]
  [[ "$output" == *"| P=1 batch=100 | "*"| VALID |"* ]]
  [[ "$output" == *"| 1 inst, defaults | "*"| VALID |"* ]]
  [[ "$output" != *INVALID* ]]
  # operations counted from serverStatus; the test server is named as what it is
  [ "$(jq -s 'map(select(.valid == "VALID" and .ops > 0)) | length' "$BATS_TEST_TMPDIR/out/results.jsonl")" = 3 ]
  if [ "$(/usr/bin/python3 -c 'import sys, pymongo; print(pymongo.MongoClient(sys.argv[1]).admin.command("buildInfo").get("gitVersion"))' "$RELAYBUS_URL")" = relaybus-mongo-test-server ]; then
    [[ "$output" == *"a correctness run, not a performance claim"* ]]
  fi
  # its collections are gone
  [ "$(/usr/bin/python3 -c 'import sys, pymongo; print(len([c for c in pymongo.MongoClient(sys.argv[1]).get_default_database("relaybus").list_collection_names() if c.startswith("rbbench_")]))' "$RELAYBUS_URL")" = 0 ]
  # --only is PostgreSQL's: refused with the usage (64)
  run env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/run" --store mongo --db "$RELAYBUS_URL" --only s1
  [ "$status" -eq 64 ]
}

@test "bench/hold-buffers --steps 30: clean and held rows of the claim without and with cursors, every delivery but the last step's completed, its server stopped" {
  need_pg
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/hold-buffers" --steps 30
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [[ "$output" == *"| phase | claims | deliveries a claim (completed) | buffers a claim |"* ]]
  # 30 steps of 6 events, the last step's claim never completed: 174 in each
  # phase, the claim with cursors included
  [ "$(echo "$output" | awk -F'|' '$2 ~ /^ (clean|held)(-cursors)? $/ && $3 + 0 == 30 && $12 + 0 == 174 { n++ } END { print n + 0 }')" = 4 ]
  [[ "$output" == *"| held | \`"* ]]
  # the throwaway server is gone (its own: another run may have one now)
  pgdir=$(echo "$stderr" | sed -n 's/^hold-buffers: throwaway server in //p')
  [ -n "$pgdir" ]
  [ ! -e "$pgdir" ]
}

@test "bench/publish-fn --rounds 2 BUILD BUILD: a row a round and the medians, each build's batch function and lane hash timed, its server stopped" {
  need_pg
  pg_only "bench/publish-fn runs its own PostgreSQL"
  local before
  before=$(ls -d /tmp/rbpfn.* 2>/dev/null | wc -l)
  run --separate-stderr "$RB_SRCDIR/bench/publish-fn" --rounds 2 "$RB_BINDIR" "$RB_BINDIR"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  [ "${lines[0]}" = "round  batch us/event old new   lane us/call old new  ratio new/old" ]
  # rounds 1 and 2 and the median: four times and two ratios each, all positive
  [ "$(echo "$output" | awk '$1 ~ /^(1|2|median)$/ && NF == 7 && $2 > 0 && $3 > 0 && $4 > 0 && $5 > 0 && $6 > 0 && $7 > 0 { n++ } END { print n + 0 }')" = 3 ]
  [ "$(ls -d /tmp/rbpfn.* 2>/dev/null | wc -l)" = "$before" ]
  run "$RB_SRCDIR/bench/publish-fn" --rounds 2 "$RB_BINDIR"
  [ "$status" -eq 64 ]
  [[ "$output" == "usage: bench/publish-fn [--rounds N] OLD_BINDIR NEW_BINDIR" ]]
}

@test "bench/drain-cost --events 400 --reps 1: the limit, the minimal at-least-once outbox and the build each drain every delivery, a line and their statements each, its server stopped" {
  need_pg
  pg_only "bench/drain-cost runs its own PostgreSQL"
  [ -x /usr/bin/time ] || skip "/usr/bin/time is not installed"
  local before
  before=$(ls -d /tmp/relaybus-bench-pg.* 2>/dev/null | wc -l)
  run --separate-stderr env RB_BINDIR="$RB_BINDIR" "$RB_SRCDIR/bench/drain-cost" --events 400 --reps 1 "$RB_BINDIR/rb-dispatch"
  echo "$stderr" | tail -n 20 >&2
  [ "$status" -eq 0 ]
  # each drain's line: its server CPU a delivery (a number: 400 deliveries
  # may take less than a clock tick of the server's)
  for l in "plain-SQL limit (fused DELETE, batch 100)" "minimal at-least-once outbox (sqlloop txlock, batch 100)" \
           "round 1, 1: $RB_BINDIR/rb-dispatch"; do
    echo "$output" | grep -A1 -xF "$l" | awk 'NR == 2 && $2 == "server" && $3 ~ /^[0-9]+\.[0-9]$/ && $4 == "us" { ok = 1 } END { exit !ok }'
  done
  # the statements of each: the fused DELETE; the lock and read, the
  # delete; the claim, the fetch, the completion
  for k in fused lock+read delete claim fetch complete; do
    echo "$output" | awk -v k="$k" '$1 == k && $3 == "calls/1000" { ok = 1 } END { exit !ok }'
  done
  [ "$(ls -d /tmp/relaybus-bench-pg.* 2>/dev/null | wc -l)" = "$before" ]
  run "$RB_SRCDIR/bench/drain-cost" --reps x "$RB_BINDIR/rb-dispatch"
  [ "$status" -eq 64 ]
}
