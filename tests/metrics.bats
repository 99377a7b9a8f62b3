#!/usr/bin/env bats
# rb-admin stats --prometheus for a metrics pipeline: --output FILE is
# written atomically (node_exporter's textfile collector); relaybus_up
# says whether the bus could be read, and the file is still written when
# it cannot; the counters come from PostgreSQL's cumulative statistics of
# the deliveries table; the ages, dead letters and dead tuples are what
# relaybus(7) OPERATIONS says to alert on.  Every output passes
# tests/prom_lint.py and, when installed, promtool check metrics.

load test_helper

setup() {
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    drop_schema
    setup_schema -s 'mx:*'
  fi
}

teardown() { drop_schema; }

# the strict parser, then Prometheus's own linter (naming: _total on counters, ...)
prom_check() {  # file
  python3 "$RB_SRCDIR/tests/prom_lint.py" <"$1" >/dev/null
  if command -v promtool >/dev/null; then
    promtool check metrics <"$1"
  else
    echo "# no promtool (Debian: prometheus): tests/prom_lint.py only" >&3
  fi
}

# the value of one sample (the whole series as printed, labels in order)
value() {  # file series
  awk -v s="$2" '$1 == s { print $2 }' "$1"
}

publish_n() {  # n prefix
  awk -v n="$1" -v p="$2" 'BEGIN { for (i = 1; i <= n; i++)
    printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{}}\n", p, i }' | rb-publish -q
}

@test "--output FILE: mode 0644 whatever the umask, renamed into place (a reader keeps the old whole file), no temporary left" {
  need_pg
  local dir=$BATS_TEST_TMPDIR/textfile m
  mkdir "$dir"
  m=$dir/relaybus.prom
  (umask 077 && rb-admin stats --prometheus --output "$m")
  [ "$(stat -c %a "$m")" = 644 ]
  prom_check "$m"
  grep -qx "relaybus_up{schema=\"$RB_SCHEMA\"} 1" "$m"
  # nothing on stdout with --output
  run --separate-stderr rb-admin stats --prometheus --output "$m"
  [ "$status" -eq 0 ]
  [ -z "$output" ]
  # a new inode each time: a reader that opened the old file reads it whole
  local before after
  exec 4<"$m"
  before=$(stat -c %i "$m")
  publish_n 3 o-
  rb-admin stats --prometheus --output "$m"
  after=$(stat -c %i "$m")
  [ "$before" != "$after" ]
  grep -qx "relaybus_deliveries{schema=\"$RB_SCHEMA\",state=\"due\"} 0" /dev/fd/4
  exec 4<&-
  grep -qx "relaybus_deliveries{schema=\"$RB_SCHEMA\",state=\"due\"} 3" "$m"
  # only the file itself is in the folder (the temporary is a dot file: *.prom is not matched)
  [ "$(ls -A "$dir")" = relaybus.prom ]
  # the JSON form can be written the same way
  rb-admin stats --output "$dir/stats.json"
  [ "$(jq -s length "$dir/stats.json")" -eq 2 ]
  # a relative name: in the current folder
  (cd "$dir" && rb-admin stats --prometheus --output rel.prom)
  prom_check "$dir/rel.prom"
}

@test "--output: an unwritable folder is 73 and leaves nothing; other commands refuse it (64)" {
  need_pg
  run --separate-stderr rb-admin stats --prometheus --output "$BATS_TEST_TMPDIR/nosuch/relaybus.prom"
  [ "$status" -eq 73 ]
  [[ "$stderr" == *"--output $BATS_TEST_TMPDIR/nosuch/relaybus.prom: cannot create"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/nosuch" ]
  run --separate-stderr rb-admin list --output "$BATS_TEST_TMPDIR/l.json"
  [ "$status" -eq 64 ]
  [[ "$stderr" == *"list: --output does not apply"* ]]
  [ ! -e "$BATS_TEST_TMPDIR/l.json" ]
}

@test "the database down: relaybus_up 0 still written (file or stdout), with exit 69; a missing schema: 0 with 78" {
  local m=$BATS_TEST_TMPDIR/tf/relaybus.prom
  mkdir "$BATS_TEST_TMPDIR/tf"
  echo 'relaybus_up{schema="old"} 1' >"$m"
  run --separate-stderr rb-admin --db postgresql://127.0.0.1:1/x --schema shop stats --prometheus --output "$m"
  [ "$status" -eq 69 ]
  [[ "$stderr" == *"cannot connect"* ]]
  [ -z "$output" ]
  prom_check "$m"
  [ "$(grep -v '^#' "$m")" = 'relaybus_up{schema="shop"} 0' ]
  [ "$(stat -c %a "$m")" = 644 ]
  [ "$(ls -A "$BATS_TEST_TMPDIR/tf")" = relaybus.prom ]
  # without --output: the same on stdout
  run --separate-stderr env RELAYBUS_SCHEMA=shop2 rb-admin --db postgresql://127.0.0.1:1/x stats --prometheus
  [ "$status" -eq 69 ]
  [[ "$output" == *'relaybus_up{schema="shop2"} 0'* ]]
  # JSON stats: no half-written file, the old one stays
  run --separate-stderr rb-admin --db postgresql://127.0.0.1:1/x stats --output "$m"
  [ "$status" -eq 69 ]
  [ "$(grep -v '^#' "$m")" = 'relaybus_up{schema="shop"} 0' ]
  need_pg
  run --separate-stderr rb-admin --schema nosuch_schema_mx stats --prometheus --output "$m"
  [ "$status" -eq 78 ]
  [ "$(grep -v '^#' "$m")" = 'relaybus_up{schema="nosuch_schema_mx"} 0' ]
  prom_check "$m"
}

@test "counters from the deliveries table's statistics: published, deleted (completed), updated (failed, buried); dead tuples; vacuum age" {
  need_pg
  local m=$BATS_TEST_TMPDIR/m.prom s="{schema=\"$RB_SCHEMA\"}"
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  [ "$(grep -c '^# TYPE relaybus_deliveries_[a-z]*_total counter$' "$m")" -eq 4 ]
  local ins0 del0 upd0
  ins0=$(value "$m" "relaybus_deliveries_inserted_total$s")
  del0=$(value "$m" "relaybus_deliveries_deleted_total$s")
  upd0=$(value "$m" "relaybus_deliveries_updated_total$s")
  # 20 published; 12 completed; 8 fail once, with --max-attempts 1: buried
  publish_n 12 ok-
  publish_n 8 bad-
  rb-dispatch -H mx --exec 'case "$(jq -r .event_id)" in bad-*) exit 1;; esac' --max-attempts 1 --drain -q
  # the server publishes a backend's counts when it ends (or within a second)
  wait_for 10 'rb-admin stats --prometheus --output "$m" &&
    [ "$(value "$m" "relaybus_deliveries_deleted_total$s")" -ge $((del0 + 12)) ] &&
    [ "$(value "$m" "relaybus_deliveries_updated_total$s")" -ge $((upd0 + 8)) ]'
  prom_check "$m"
  [ "$(value "$m" "relaybus_deliveries_inserted_total$s")" -eq $((ins0 + 20)) ]
  [ "$(value "$m" "relaybus_deliveries_deleted_total$s")" -eq $((del0 + 12)) ]
  [ "$(value "$m" "relaybus_deliveries_updated_total$s")" -eq $((upd0 + 8)) ]
  # dead letters per handler
  [ "$(value "$m" "relaybus_handler_deliveries{schema=\"$RB_SCHEMA\",handler=\"mx\",state=\"dead\"}")" -eq 8 ]
  # the 12 deleted rows are dead tuples until a vacuum (8 updates may be HOT-pruned)
  [ "$(value "$m" "relaybus_deliveries_dead_tuples$s")" -ge 12 ]
  grep -q '^# TYPE relaybus_deliveries_vacuum_age_seconds gauge$' "$m"
  q "VACUUM relaybus_deliveries"
  sleep 1
  wait_for 10 'rb-admin stats --prometheus --output "$m" &&
    [ -n "$(value "$m" "relaybus_deliveries_vacuum_age_seconds$s")" ]'
  prom_check "$m"
  [ "$(value "$m" "relaybus_deliveries_dead_tuples$s")" -eq 0 ]
  awk -v s="relaybus_deliveries_vacuum_age_seconds$s" '$1 == s { exit !($2 >= 0 && $2 < 60) }' "$m"
  [ "$(value "$m" "relaybus_deliveries_vacuums_total$s")" -ge 1 ]
}

@test "oldest due age: how long the oldest due delivery has waited to be claimed; a delayed one does not count" {
  need_pg
  local m=$BATS_TEST_TMPDIR/m.prom
  rb-admin stats --prometheus --output "$m"
  [ "$(value "$m" "relaybus_oldest_due_age_seconds{schema=\"$RB_SCHEMA\"}")" = 0.000 ]
  publish_n 2 d-
  # d-1 was published two hours ago and due one hour ago; d-2 is due in an hour
  q "UPDATE relaybus_deliveries SET created_at = now() - interval '2 hours',
       available_at = now() - interval '1 hour' WHERE event_id = 'd-1';
     UPDATE relaybus_deliveries SET available_at = now() + interval '1 hour' WHERE event_id = 'd-2'"
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  awk -v s="relaybus_oldest_due_age_seconds{schema=\"$RB_SCHEMA\"}" \
    '$1 == s { exit !($2 >= 3600 && $2 < 3660) }' "$m"
  awk -v s="relaybus_handler_oldest_due_age_seconds{schema=\"$RB_SCHEMA\",handler=\"mx\"}" \
    '$1 == s { exit !($2 >= 3600 && $2 < 3660) }' "$m"
  awk -v s="relaybus_oldest_pending_age_seconds{schema=\"$RB_SCHEMA\"}" \
    '$1 == s { exit !($2 >= 7200 && $2 < 7260) }' "$m"
  # the JSON form has it too
  [ "$(rb-admin stats --handler mx | jq -s '.[0].oldest_due_age_ms >= 3600000')" = true ]
}

@test "exact counters by handler on either store, through the programs: completions, failed attempts, burials" {
  need_pg
  local m=$BATS_TEST_TMPDIR/m.prom h="{schema=\"$RB_SCHEMA\",handler=\"mx\"}" o=$BATS_TEST_TMPDIR/o
  rb-setup --completion-history
  # 12 complete; 8 fail twice (--settle: the retry at once) and are buried
  publish_n 12 ok-
  rb-dispatch -q -H mx --drain --exec "rb-test-exec $o ok"
  publish_n 8 bad-
  rb-dispatch -q -H mx --settle --max-attempts 2 --exec "rb-test-exec $o fail"
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  [ "$(value "$m" "relaybus_handler_completed_total$h")" = 12 ]
  [ "$(value "$m" "relaybus_handler_failed_total$h")" = 16 ]
  [ "$(value "$m" "relaybus_handler_buried_total$h")" = 8 ]
  [ "$(rb-admin stats | jq -r 'select(.handler == null) | "\(.completed_total) \(.failed_total) \(.buried_total)"')" = "12 16 8" ]
  # rb-admin bury counts; a release does not; a takeover charges an attempt
  publish_n 3 more-
  rb-admin bury more-1 >/dev/null
  rb-claim -H mx --owner A --batch 1 | jq -c '. + {release: true}' | rb-complete -q
  rb-claim -H mx --owner A --batch 1 --lease 300ms >/dev/null
  sleep 1
  rb-claim -H mx --owner B --batch 5 | jq -c '. + {ok: true}' | rb-complete -q
  # the history purged: the gauge drops, the counter stays
  rb-admin purge --history-older-than 0s >/dev/null
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  [ "$(value "$m" "relaybus_completions{schema=\"$RB_SCHEMA\"}")" = 0 ]
  [ "$(value "$m" "relaybus_handler_completed_total$h")" = 14 ]
  [ "$(value "$m" "relaybus_handler_failed_total$h")" = 17 ]
  [ "$(value "$m" "relaybus_handler_buried_total$h")" = 9 ]
}

@test "exact counters by handler: completed (the history, kept across purges), failed attempts, burials" {
  need_pg
  pg_only "the counters live in the PostgreSQL lane rows"
  local m=$BATS_TEST_TMPDIR/m.prom h="{schema=\"$RB_SCHEMA\",handler=\"mx\"}"
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  # without a completion history there is no exact count of completions: no such family
  ! grep -q '^# TYPE relaybus_handler_completed_total' "$m" || false
  [ "$(value "$m" "relaybus_handler_failed_total$h")" = 0 ]
  rb-setup --completion-history
  # 12 complete; 8 fail twice (--settle: the retry at once) and are buried: their
  # --sql statement fails, and the completing transaction rolls back
  publish_n 12 ok-
  publish_n 8 bad-
  rb-dispatch -q -H mx --settle --max-attempts 2 \
    --sql "SELECT CASE WHEN (\$1::jsonb)->>'event_id' LIKE 'bad-%' THEN 1/0 END"
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  grep -q '^# TYPE relaybus_handler_completed_total counter$' "$m"
  [ "$(value "$m" "relaybus_handler_completed_total$h")" = 12 ]
  [ "$(value "$m" "relaybus_handler_failed_total$h")" = 16 ]
  [ "$(value "$m" "relaybus_handler_buried_total$h")" = 8 ]
  # rb-admin bury counts; a release does not; a takeover charges an attempt
  publish_n 3 more-
  rb-admin bury more-1 >/dev/null
  rb-claim -H mx --owner A --batch 1 | jq -c '. + {release: true}' | rb-complete -q
  rb-claim -H mx --owner A --batch 1 --lease 300ms >/dev/null
  sleep 1
  rb-claim -H mx --owner B --batch 5 | jq -c '. + {ok: true}' | rb-complete -q
  # the history purged: the gauge drops, the counter stays
  rb-admin purge --history-older-than 0s >/dev/null
  rb-admin stats --prometheus --output "$m"
  prom_check "$m"
  [ "$(value "$m" "relaybus_completions{schema=\"$RB_SCHEMA\"}")" = 0 ]
  [ "$(value "$m" "relaybus_handler_completed_total$h")" = 14 ]
  [ "$(value "$m" "relaybus_handler_failed_total$h")" = 17 ]
  [ "$(value "$m" "relaybus_handler_buried_total$h")" = 9 ]
}
