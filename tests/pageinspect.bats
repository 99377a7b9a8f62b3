#!/usr/bin/env bats
# rb-pageinspect: the facts of one delivery's life on the pages (through
# --json and jq, not the layout), the 0.1.0 baseline, watch during a
# drain, the missing-pageinspect path, and the usage errors.

load test_helper

setup_file() { drop_schema; }
teardown_file() { drop_schema; }

setup() {
  command -v jq >/dev/null || skip "jq is not installed"
  case $BATS_TEST_DESCRIPTION in
  usage*|--help*|*"on MongoDB"*) ;;
  *) pg_only "rb-pageinspect reads PostgreSQL heap and index pages" ;;
  esac
}

# entries of one index in a lifecycle report on stdin
entries() { jq -r --arg n "relaybus_deliveries_$1" '.indexes[] | select(.name == $n) | .entries'; }

@test "lifecycle: one heap tuple, three index entries, lane updates all HOT" {
  need_pg
  run --separate-stderr rb-pageinspect lifecycle --json
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  echo "$output" >"$BATS_TEST_TMPDIR/r.json"
  r() { jq -r "$1" "$BATS_TEST_TMPDIR/r.json"; }
  [ "$(r .design)" = lane-lease ]
  # one heap tuple for the delivery: inserted once, never rewritten, deleted
  [ "$(r '[.heap.pages[].tuples[] | select(.state == "normal")] | length')" = 1 ]
  [ "$(r .summary.heap_tuples)" = 1 ]
  [ "$(r '.heap.pages[0].tuples[0].flags | index("XMAX_COMMITTED") != null')" = true ]
  [ "$(r '.heap.pages[0].tuples[0].flags | index("HOT_UPDATED") == null')" = true ]
  # no update of the delivery row at all, so none that was not HOT
  [ "$(r .counters.relaybus_deliveries.updated)" = 0 ]
  [ "$(r .counters.relaybus_deliveries.inserted)" = 1 ]
  [ "$(r .counters.relaybus_deliveries.deleted)" = 1 ]
  [ "$(r .summary.non_hot_updates)" = 0 ]
  # the exact index entries
  [ "$(entries pkey <"$BATS_TEST_TMPDIR/r.json")" = 1 ]
  [ "$(entries settled_idx <"$BATS_TEST_TMPDIR/r.json")" = 0 ]
  [ "$(entries lane_due_idx <"$BATS_TEST_TMPDIR/r.json")" = 1 ]
  [ "$(entries lane_key_idx <"$BATS_TEST_TMPDIR/r.json")" = 0 ]
  [ "$(entries dead_idx <"$BATS_TEST_TMPDIR/r.json")" = 0 ]
  # (the claim cursors' two: the handler's pending deliveries in time
  # order, and the lane's keyed ones, which this unkeyed one is not)
  [ "$(entries due_idx <"$BATS_TEST_TMPDIR/r.json")" = 1 ]
  [ "$(entries lane_kdue_idx <"$BATS_TEST_TMPDIR/r.json")" = 0 ]
  [ "$(r .summary.index_entries)" = 3 ]
  [ "$(r '[.indexes[].heap_tids[]] | unique')" = "$(r '[.heap.pages[0].tuples[0].ctid]')" ]
  # lane updates: claim and relinquish, both HOT
  [ "$(r .counters.relaybus_lanes.updated)" = 2 ]
  [ "$(r .counters.relaybus_lanes.hot_updated)" = 2 ]
  [ "$(r .counters.relaybus_lanes.inserted)" = 256 ]
  # the lane row's chain: HOT_UPDATED -> HOT_UPDATED|HEAP_ONLY -> HEAP_ONLY
  [ "$(r '.lane_versions.versions | length')" = 3 ]
  [ "$(r '[.lane_versions.versions[] | (.flags | map(select(. == "HOT_UPDATED" or . == "HEAP_ONLY")) | join("|"))] | join(" -> ")')" = \
    "HOT_UPDATED -> HOT_UPDATED|HEAP_ONLY -> HEAP_ONLY" ]
  [ "$(r '.lane_versions.lane == .lane')" = true ]
}

@test "lifecycle --baseline: three versions and seventeen index entries (0.1.0)" {
  need_pg
  run --separate-stderr rb-pageinspect lifecycle --baseline --json
  [ "$status" -eq 0 ]
  echo "$output" >"$BATS_TEST_TMPDIR/b.json"
  r() { jq -r "$1" "$BATS_TEST_TMPDIR/b.json"; }
  [ "$(r .design)" = row-lease ]
  [ "$(r .summary.heap_tuples)" = 3 ]
  # each version points at the next; none is HOT
  [ "$(r '[.heap.pages[0].tuples[].ctid] | join(" ")')" = "(0,2) (0,3) (0,3)" ]
  [ "$(r '[.heap.pages[0].tuples[].flags[] | select(. == "HOT_UPDATED" or . == "HEAP_ONLY")] | length')" = 0 ]
  [ "$(r .counters.relaybus_deliveries.updated)" = 2 ]
  [ "$(r .counters.relaybus_deliveries.hot_updated)" = 0 ]
  [ "$(r .summary.non_hot_updates)" = 2 ]
  [ "$(r '.indexes | length')" = 10 ]
  [ "$(r .summary.index_entries)" = 17 ]
  [ "$(entries pkey <"$BATS_TEST_TMPDIR/b.json")" = 3 ]
  [ "$(entries status_created_idx <"$BATS_TEST_TMPDIR/b.json")" = 3 ]
  [ "$(entries due_idx <"$BATS_TEST_TMPDIR/b.json")" = 2 ]
  [ "$(entries completed_idx <"$BATS_TEST_TMPDIR/b.json")" = 1 ]
  [ "$(r .lane_versions)" = null ]
}

@test "lifecycle prints the seed's blocks; --side-by-side shows both designs" {
  need_pg
  run --separate-stderr rb-pageinspect lifecycle
  [ "$status" -eq 0 ]
  [[ "$output" == *"heap page 0 of relaybus_deliveries (1 line pointers)"* ]]
  [[ "$output" == *"indexes of relaybus_deliveries: 7 -- 3 hold the row, 3 entries in all"* ]]
  [[ "$output" == *"relaybus_deliveries_pkey"*"entries=1 -> heap tids (0,1)"* ]]
  [[ "$output" == *"the lane row the claim touched"* ]]
  [[ "$output" == *"relaybus_lanes"*"inserted=256 updated=2 hot_updated=2 deleted=0"* ]]
  run --separate-stderr rb-pageinspect lifecycle --side-by-side
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "lane leases (relaybus)"*" | row leases (0.1.0)"* ]]
  [[ "$output" == *"17 entries in all"* ]]
  # a terminal of 100 columns: one after the other, every line inside it
  COLUMNS=100 run --separate-stderr rb-pageinspect lifecycle --side-by-side
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "lane leases (relaybus)"* ]]
  [[ "${lines[0]}" != *"|"* ]]
  [ "$(printf '%s\n' "$output" | grep -c '^row leases (0.1.0)')" = 1 ]
  [ "$(printf '%s\n' "$output" | awk '{ if (length > m) m = length } END { print m + 0 }')" -le 100 ]
  COLUMNS=250 run --separate-stderr rb-pageinspect lifecycle --side-by-side
  [[ "${lines[0]}" == "lane leases (relaybus)"*" | row leases (0.1.0)"* ]]
  run --separate-stderr rb-pageinspect lifecycle --side-by-side --json
  [ "$status" -eq 0 ]
  [ "$(jq -r '.lane_lease.summary.index_entries, .row_lease.summary.index_entries' <<<"$output" | tr '\n' ' ')" = "3 17 " ]
}

@test "lifecycle leaves no scratch schema behind" {
  need_pg
  rb-pageinspect lifecycle >/dev/null
  rb-pageinspect lifecycle --baseline >/dev/null
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rb\_inspect\_%'")" = 0 ]
}

@test "lifecycle drops the pageinspect extension it created, and keeps one that was there" {
  need_pg
  local db=rb_ext_$$ url
  psql "$_test_pg_url" -qX -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  url=$(sed -E "s#^(postgres(ql)?://[^/]*)/?[^?]*#\1/$db#" <<<"$_test_pg_url")
  run -0 --separate-stderr rb-pageinspect lifecycle --db "$url"
  [ "$(psql "$url" -XAtc "SELECT count(*) FROM pg_extension WHERE extname = 'pageinspect'")" = 0 ]
  psql "$url" -qX -c "CREATE EXTENSION pageinspect"
  run -0 --separate-stderr rb-pageinspect lifecycle --db "$url"
  [ "$(psql "$url" -XAtc "SELECT count(*) FROM pg_extension WHERE extname = 'pageinspect'")" = 1 ]
  psql "$_test_pg_url" -qX -c "DROP DATABASE $db" >/dev/null
}

@test "lifecycle without pageinspect and a role that may not create it: what to run, exit 69" {
  need_pg
  local db=rb_noext_$$ role=rb_noext_$$
  psql "$_test_pg_url" -qX -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" \
    -c "DROP ROLE IF EXISTS $role" -c "CREATE ROLE $role LOGIN PASSWORD '$role'" >/dev/null 2>&1
  # the same server, that role (and its password, where the server asks: pg_virtualenv), that database
  local url
  url=$(sed -E "s#^(postgres(ql)?://)([^@/]*@)?#\1$role@#; s#^(postgres(ql)?://[^/]*)/?[^?]*#\1/$db#; s#([?&]password=)[^&]*#\1$role#" <<<"$_test_pg_url")
  run --separate-stderr rb-pageinspect lifecycle --db "$url"
  psql "$_test_pg_url" -qX -c "DROP DATABASE $db" -c "DROP ROLE $role" >/dev/null 2>&1
  [ "$status" -eq 69 ]
  [ -z "$output" ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-pageinspect: the pageinspect extension is not installed in database \"$db\" and role \"$role\" may not create it: run 'CREATE EXTENSION pageinspect;' there as a superuser" ]]
}

@test "watch during a drain: completions per second, WAL per delivery, HOT lane updates" {
  setup_schema -s worker:'order.*'
  gen_events 2000 order.paid | rb-publish -q
  rb-pageinspect watch --interval 1s --count 4 --json >"$BATS_TEST_TMPDIR/w" 2>"$BATS_TEST_TMPDIR/werr" &
  local pid=$! end=$((SECONDS + 4))
  while [ $SECONDS -lt $end ]; do
    rb-claim -q -H worker --batch 50 --lease 1s | jq -c '.+{ok:true}' | rb-complete -q >/dev/null || true
  done
  wait "$pid"
  [ ! -s "$BATS_TEST_TMPDIR/werr" ]
  [ "$(wc -l <"$BATS_TEST_TMPDIR/w")" -eq 4 ]
  w() { jq -s -r "$1" "$BATS_TEST_TMPDIR/w"; }
  [ "$(w 'map(select(.completed > 0 and .completed_per_sec > 0)) | length')" -ge 1 ]
  [ "$(w 'map(select(.completed > 0)) | all(.wal_bytes_per_delivery > 0)')" = true ]
  [ "$(w 'map(select(.completed > 0)) | all(.wal_bytes > 0)')" = true ]
  [ "$(w 'map(select(.lane_updates > 0)) | length')" -ge 1 ]
  [ "$(w 'map(select(.lane_updates > 0)) | all(.lane_hot_share > 0)')" = true ]
  # the happy path never updates a delivery row
  [ "$(w 'map(.delivery_updates) | add')" = 0 ]
  [ "$(w '.[-1].dead_tuples | has("relaybus_deliveries") and has("relaybus_lanes")')" = true ]
  [ "$(w '.[0].autovacuum_runs | has("relaybus_deliveries")')" = true ]
  # the time of each sample as every program prints one: ISO 8601, UTC, ms, now
  [ "$(w 'all(.at | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}Z$"))')" = true ]
  local first=$(w '.[0].at | sub("[.][0-9]+Z$"; "Z") | fromdate')
  [ $(( $(date +%s) - first )) -ge 0 ] && [ $(( $(date +%s) - first )) -lt 60 ]
}

@test "watch prints a header and one line per interval" {
  setup_schema
  run --separate-stderr rb-pageinspect watch -i 100ms -c 2
  [ "$status" -eq 0 ]
  [ "${#lines[@]}" -eq 3 ]
  [[ "${lines[0]}" == "time"*"completed/s"*"WAL B/deliv"*"lane HOT"* ]]
}

@test "watch on a schema that is not set up: exit 78" {
  need_pg
  run --separate-stderr rb-pageinspect watch -c 1 -i 100ms --schema nothing_here_$$
  [ "$status" -eq 78 ]
  [[ "$stderr" == "rb-pageinspect: schema \"nothing_here_$$\" is not set up: run rb-setup" ]]
}

@test "usage errors exit 64" {
  run --separate-stderr rb-pageinspect
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-pageinspect: a command is required: lifecycle or watch" ]
  [[ "${stderr_lines[1]}" == "usage: rb-pageinspect lifecycle"* ]]
  [ "${stderr_lines[2]}" = "Try 'rb-pageinspect --help' for more information." ]
  run --separate-stderr rb-pageinspect frob
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-pageinspect: unknown command 'frob': use lifecycle or watch" ]
  run --separate-stderr rb-pageinspect lifecycle --count 3
  [ "$status" -eq 64 ]
  run --separate-stderr rb-pageinspect watch --baseline
  [ "$status" -eq 64 ]
  run --separate-stderr rb-pageinspect lifecycle --baseline --side-by-side
  [ "$status" -eq 64 ]
  run --separate-stderr rb-pageinspect watch --interval soon
  [ "$status" -eq 64 ]
  [[ "${stderr_lines[0]}" == "rb-pageinspect: --interval: 'soon' is not a duration"* ]]
}

@test "--help and --version" {
  run rb-pageinspect --help
  [ "$status" -eq 0 ]
  [[ "${lines[0]}" == "usage: rb-pageinspect lifecycle "* ]]
  run rb-pageinspect -V
  [ "$status" -eq 0 ]
  [[ "$output" == "rb-pageinspect "* ]]
}

@test "an interrupted lifecycle drops its scratch schema" {
  need_pg
  for d in 0.005 0.01 0.02 0.03; do
    run --separate-stderr timeout --preserve-status -s INT "$d" rb-pageinspect lifecycle
    # 130: the signal came before the handler was installed, before any connection
    [ "$status" -eq 0 ] || [ "$status" -eq 75 ] || [ "$status" -eq 130 ]
    [ "$status" -ne 75 ] || [ "$stderr" = "rb-pageinspect: interrupted" ]
  done
  [ "$(q "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rb\_inspect\_%'")" = 0 ]
}

@test "on MongoDB rb-pageinspect exits 69: not supported by the mongodb backend" {
  on_mongo || skip "the MongoDB store's refusal (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  run --separate-stderr rb-pageinspect lifecycle
  [ "$status" -eq 69 ]
  [[ "$stderr" == *"not supported by the mongodb backend"* ]]
}
