#!/usr/bin/env bats
# Every program through a real PgBouncer in transaction pooling mode
# (scripts/pgbouncer-tmp, in front of the test database) with
# RELAYBUS_PG_POOLER=transaction: no named prepared statement, no session
# setting, no LISTEN (polling).  The pool has more server connections than
# the programs have client connections and hands them out round robin, so
# that consecutive transactions of one client land on different ones.

load test_helper

setup_file() {
  have_pg || return 0
  on_mongo && return 0
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || return 0
  # (a folder of its own under /tmp: as root, pgbouncer runs as postgres,
  # who cannot reach bats' temporary folders)
  BOUNCER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rb-pooler.XXXXXX")
  export BOUNCER_DIR
  BOUNCER_URL=$(PGBOUNCER_POOL=8 "$RB_SRCDIR/scripts/pgbouncer-tmp" start "$BOUNCER_DIR" "$RELAYBUS_TEST_PG_URL" 3>&-)
  export BOUNCER_URL
}

teardown_file() {
  if [ -n "${BOUNCER_DIR:-}" ]; then
    "$RB_SRCDIR/scripts/pgbouncer-tmp" stop "$BOUNCER_DIR" >/dev/null 2>&1 3>&- || true
    rm -rf "$BOUNCER_DIR"
  fi
  drop_schema
}

setup() {
  need_pg
  pg_only "PgBouncer pools PostgreSQL connections"
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || skip "pgbouncer not installed (scripts/deps test)"
  [ -n "${BOUNCER_URL:-}" ] || skip "no PgBouncer in front of $RELAYBUS_TEST_PG_URL (scripts/pgbouncer-tmp)"
  drop_schema
  export RELAYBUS_URL=$BOUNCER_URL RELAYBUS_PG_POOLER=transaction
}

teardown() {
  local p
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
}

events() {  # n prefix [keys]
  awk -v n="$1" -v p="$2" -v keys="${3:-0}" 'BEGIN {
    for (i = 1; i <= n; i++)
      if (keys > 0 && i % 2 == 1)
        printf "{\"id\":\"%s%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":{\"i\":%d}}\n", p, i, i % keys, i
      else
        printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d}}\n", p, i, i
  }'
}

@test "pooler: two rb-dispatch --drain through a transaction-pooling PgBouncer drain 5,000 events exactly" {
  local out=$BATS_TEST_TMPDIR/runs
  run -0 rb-setup --subscribe 'pb:t'
  events 5000 e 40 | rb-publish -q
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'pb'")" = 5000 ]
  local rc1=0 rc2=0
  rb-dispatch -H pb --pipe "rb-test-pipe $out" --drain -c 400 2>"$BATS_TEST_TMPDIR/d1.err" 3>&- & local p1=$!
  rb-dispatch -H pb --pipe "rb-test-pipe $out" --drain -c 400 2>"$BATS_TEST_TMPDIR/d2.err" 3>&- & local p2=$!
  PIDS="$p1 $p2"
  wait "$p1" || rc1=$?
  wait "$p2" || rc2=$?
  cat "$BATS_TEST_TMPDIR/d1.err" "$BATS_TEST_TMPDIR/d2.err"
  [ "$rc1" = 0 ]
  [ "$rc2" = 0 ]
  [ "$(cat "$BATS_TEST_TMPDIR/d1.err" "$BATS_TEST_TMPDIR/d2.err" | grep -c 'prepared statement')" = 0 ]
  # nothing pending, nothing held
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'pb'")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'pb' AND lease_owner IS NOT NULL")" = 0 ]
  # every event ran, each once, on its first attempt, each key in order
  [ "$(wc -l <"$out")" = 5000 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 5000 ]
  [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
  [ "$(awk '$2 != "-" { if (($2 in l) && $3 + 0 <= l[$2]) bad++; l[$2] = $3 + 0 } END { print bad + 0 }' "$out")" = 0 ]
}

@test "pooler: rb-claim | rb-complete, rb-publish, rb-admin, rb-pageinspect, a retry and a dead letter through PgBouncer" {
  run -0 rb-setup --subscribe 'pc:t'
  events 30 c | rb-publish -q
  # claim and complete, in several transactions on different server connections
  run -0 --separate-stderr sh -c 'rb-claim -H pc --batch 10 | rb-complete -o'
  [ "$(printf '%s\n' "$output" | grep -c '"outcome":"completed"')" = 10 ]
  run -0 --separate-stderr sh -c 'rb-claim -H pc --batch 5 | sed "s/}\$/,\"ok\":false,\"error\":\"no\"}/" | rb-complete -o --max-attempts 1'
  [ "$(printf '%s\n' "$output" | grep -c '"outcome":"buried"')" = 5 ]
  run -0 --separate-stderr rb-admin --json stats --handler pc
  [[ "$output" == *'"dead":5'* ]] || { echo "$output"; false; }
  run -0 --separate-stderr rb-admin --json list --status dead --handler pc
  [ "${#lines[@]}" = 5 ]
  run -0 --separate-stderr rb-admin requeue --handler pc --all
  run -0 --separate-stderr rb-admin lanes --handler pc
  run -0 --separate-stderr rb-admin purge --dead-older-than 1d
  # a drain with retries: the rest ends completed
  run -0 rb-dispatch -H pc --exec "rb-test-exec $BATS_TEST_TMPDIR/x ok" --drain
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'pc'")" = 0 ]
  [ "$(wc -l <"$BATS_TEST_TMPDIR/x")" = 20 ]
  # rb-pageinspect: watch works; the demonstration needs a session and says so
  run -0 rb-pageinspect watch --interval 100ms --count 1
  run -78 --separate-stderr rb-pageinspect lifecycle
  [[ "$stderr" == *"needs a session of its own; give rb-pageinspect a direct URL"* ]]
}

@test "pooler: a new delivery is found by polling (no LISTEN through the pooler)" {
  local out=$BATS_TEST_TMPDIR/poll
  run -0 rb-setup --subscribe 'pp:t'
  rb-dispatch -H pp --exec "rb-test-exec $out ok" --poll 200ms -vv 2>"$BATS_TEST_TMPDIR/err" 3>&- & PIDS=$!
  sleep 0.5
  events 3 p | rb-publish -q
  local end=$((SECONDS + 10))
  until [ "$( [ -f "$out" ] && wc -l <"$out" || echo 0)" -ge 3 ]; do
    [ $SECONDS -lt $end ] || { cat "$BATS_TEST_TMPDIR/err"; false; }
    sleep 0.1
  done
  kill -TERM "$PIDS"; wait "$PIDS"
  grep -q 'no LISTEN, polling' "$BATS_TEST_TMPDIR/err"
  [ "$(grep -c 'woken by a notification' "$BATS_TEST_TMPDIR/err")" = 0 ]
}

@test "pooler: RELAYBUS_PG_POOLER takes transaction or session, else exits 78 naming it" {
  RELAYBUS_PG_POOLER=statement run -78 --separate-stderr rb-claim -H x
  [ "$stderr" = "rb-claim: invalid RELAYBUS_PG_POOLER 'statement': use transaction or session" ]
  RELAYBUS_PG_POOLER=session RELAYBUS_URL=$RELAYBUS_TEST_PG_URL run -0 rb-setup
}
