#!/usr/bin/env bats
# Failover to a streaming standby (relaybus(7), HA AND FAILOVER), with real
# servers: each test starts a primary of its own (scripts/pg-tmp) and a
# standby streaming from it (pg-tmp standby: pg_basebackup -R), kills the
# primary's postmaster with -9, promotes the standby (pg_ctl promote) and
# checks what rb-dispatch and rb-publish --reconnect do, over a multi-host
# URL listing the primary first.

load test_helper

setup() {
  pg_only "streaming replication"
  if [ -z "$(ls /usr/lib/postgresql/*/bin/pg_basebackup 2>/dev/null)" ] && ! command -v pg_basebackup >/dev/null; then
    [ "${RELAYBUS_REQUIRE_PG:-}" != 1 ] || { echo "RELAYBUS_REQUIRE_PG=1 but no PostgreSQL server" >&2; return 1; }
    skip "no PostgreSQL server binaries (apt-get install postgresql)"
  fi
  # (the postgres user must reach it when the tests run as root)
  FO_DIR=$(mktemp -d /tmp/rb-failover.XXXXXX)
  chmod 755 "$FO_DIR"
  export RELAYBUS_SCHEMA=$RB_SCHEMA
  PIDS=
}

teardown() {
  local p
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  if [ -n "${FO_DIR:-}" ]; then
    for d in a b; do "$RB_SRCDIR/scripts/pg-tmp" stop "$FO_DIR/$d" >/dev/null 2>&1 3>&- || true; done
    rm -rf "$FO_DIR"
  fi
}

pgtmp() { "$RB_SRCDIR/scripts/pg-tmp" "$@" 3>&-; }

# A primary in $FO_DIR/a and a standby of it in $FO_DIR/b (extra settings
# on the primary: ALTER SYSTEM statements), the schema set up on the
# primary; URL_A, URL_B, and URL: both hosts, read-write only.
pair() {
  URL_A=$(pgtmp start "$FO_DIR/a")
  PORT_A=$(cat "$FO_DIR/a/port")
  rb-setup --db "$URL_A" -q
  psql "$URL_A" -X -q -c "CREATE TABLE $RB_SCHEMA.sink (h text, id text)"
  URL_B=$(pgtmp standby "$FO_DIR/a" "$FO_DIR/b")
  PORT_B=$(cat "$FO_DIR/b/port")
  URL="postgresql://postgres@127.0.0.1:$PORT_A,127.0.0.1:$PORT_B/postgres?target_session_attrs=read-write"
}

on() { psql "$1" -X -A -t -q -v ON_ERROR_STOP=1 -c "$2"; }
sink_ids() { on "$1" "SELECT string_agg(id, ',' ORDER BY id) FROM $RB_SCHEMA.sink"; }

# kill -9 of the primary's postmaster (its backends exit on their own)
kill_primary() {
  kill -9 "$(head -n 1 "$FO_DIR/a/data/postmaster.pid")"
  wait_for 20 '! (exec 3<>"/dev/tcp/127.0.0.1/$PORT_A") 2>/dev/null'
}

# rb-dispatch for handler H: its --sql records (handler, event id) in sink,
# in the transaction that completes the delivery (effectively-once)
dispatch() {  # handler
  rb-dispatch --db "$URL" -H "$1" -v --lease 5s \
    --sql "INSERT INTO $RB_SCHEMA.sink SELECT '$1', (\$1::jsonb)->>'event_id'" \
    2>"$FO_DIR/$1.err" 3>&- &
  PIDS="$PIDS $!"
}

@test "failover under load: rb-publish --reconnect rides through, every acknowledged event runs exactly once per handler" {
  pair
  # synchronous replication: an acknowledged commit is on the standby too
  on "$URL_A" "ALTER SYSTEM SET synchronous_standby_names = '*'"
  on "$URL_A" "SELECT pg_reload_conf()" >/dev/null
  wait_for 20 '[ "$(on "$URL_A" "SELECT sync_state FROM pg_stat_replication")" = sync ]'
  dispatch h1
  dispatch h2
  local n=1200
  awk -v n=$n 'BEGIN { for (i = 1; i <= n; i++) {
      printf "{\"id\":\"f%d\",\"name\":\"t\",\"key\":\"k%d\",\"payload\":%d,\"handlers\":[\"h1\",\"h2\"]}\n", i, i % 50, i
      if (i % 50 == 0) { fflush(); system("sleep 0.1") } } }' |
    rb-publish --db "$URL" --reconnect 30s -b 20 -o -v >"$FO_DIR/acks" 2>"$FO_DIR/pub.err" 3>&- &
  local pub=$!
  PIDS="$PIDS $pub"
  wait_for 30 '[ "$(wc -l <"$FO_DIR/acks")" -ge 300 ]'
  kill_primary
  sleep 1
  pgtmp promote "$FO_DIR/b"
  wait "$pub"
  # everything was acknowledged, some after the failover, by the new primary
  [ "$(jq -r .event_id "$FO_DIR/acks" | sort -u | wc -l)" = $n ]
  grep -q "reconnected to 127.0.0.1:$PORT_B; sending again from line" "$FO_DIR/pub.err"
  wait_for 60 '[ "$(on "$URL_B" "SELECT count(*) FROM $RB_SCHEMA.relaybus_deliveries")" = 0 ]'
  for h in h1 h2; do
    # each acknowledged event ran exactly once for each handler
    [ "$(on "$URL_B" "SELECT count(*) || ' ' || count(DISTINCT id) FROM $RB_SCHEMA.sink WHERE h = '$h'")" = "$n $n" ]
    grep -q "reconnected to 127.0.0.1:$PORT_B; now leasing as" "$FO_DIR/$h.err"
    grep -q "127.0.0.1:$PORT_B is on timeline 2, newer than timeline 1 before: a failover; events acknowledged before it may be lost unless replication was synchronous" "$FO_DIR/$h.err"
    # with -v, the failed attempts, every host's line of libpq's error
    grep -q "reconnect failed: .*port $PORT_A failed: .*; connection to server at \"127.0.0.1\", port $PORT_B failed: " "$FO_DIR/$h.err"
    # no doubled prefix ("claim: claim:")
    run grep -E '(^|: )([a-z]+): \2:' "$FO_DIR/$h.err"
    [ "$status" = 1 ]
  done
}

@test "an old primary restarted without demotion is refused by a running rb-dispatch (split brain), the other host taken" {
  pair
  dispatch h1
  echo '{"id":"s1","name":"t","payload":1,"handlers":["h1"]}' | rb-publish --db "$URL" -q
  wait_for 20 '[ "$(on "$URL_A" "SELECT count(*) FROM $RB_SCHEMA.sink")" = 1 ]'
  wait_for 20 '[ "$(on "$URL_B" "SELECT count(*) FROM $RB_SCHEMA.sink")" = 1 ]'
  kill_primary
  pgtmp promote "$FO_DIR/b"
  wait_for 30 'grep -q "reconnected to" "$FO_DIR/h1.err"'
  # the old primary comes back as a primary, on the old timeline, and takes a write
  # (once the killed postmaster's backends are gone: they hold its shared memory)
  wait_for 30 'pgtmp start "$FO_DIR/a" >/dev/null 2>&1'
  [ "$(on "$URL_A" "SELECT pg_is_in_recovery()")" = f ]
  echo '{"id":"old","name":"t","payload":1,"handlers":["h1"]}' | rb-publish --db "$URL_A" -q
  # the dispatcher's connection drops: libpq takes the first read-write host, the old primary
  on "$URL_B" "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'rb-dispatch%'" >/dev/null
  wait_for 30 '[ "$(grep -c "reconnected to" "$FO_DIR/h1.err")" -ge 2 ]'
  sleep 1
  # it did not run the old primary's event there...
  [ "$(sink_ids "$URL_A")" = s1 ]
  [ "$(on "$URL_A" "SELECT count(*) FROM $RB_SCHEMA.relaybus_deliveries")" = 1 ]
  # ... but refused it, saying why, and took the new primary again
  grep -q "refusing 127.0.0.1:$PORT_A: it is on timeline 1, older than timeline 2 seen before: an old primary restarted without being demoted (split brain)" "$FO_DIR/h1.err"
  [ "$(grep -c "reconnected to 127.0.0.1:$PORT_B" "$FO_DIR/h1.err")" = 2 ]
  # where it keeps dispatching
  echo '{"id":"s2","name":"t","payload":1,"handlers":["h1"]}' | rb-publish --db "$URL_B" -q
  wait_for 20 '[ "$(sink_ids "$URL_B")" = s1,s2 ]'
}

@test "rb-publish --reconnect: sends again after a restart, and exits only when no server has answered for DUR" {
  URL_A=$(pgtmp start "$FO_DIR/a")
  rb-setup --db "$URL_A" -q
  mkfifo "$FO_DIR/in"
  rb-publish --db "$URL_A" --reconnect 3s -o <"$FO_DIR/in" >"$FO_DIR/acks" 2>"$FO_DIR/pub.err" 3>&- &
  local pub=$!
  PIDS="$PIDS $pub"
  exec 4>"$FO_DIR/in"
  echo '{"id":"r1","name":"t","payload":1,"handlers":["h"]}' >&4
  wait_for 10 '[ "$(wc -l <"$FO_DIR/acks")" = 1 ]'
  # a restart: the next line goes to the restarted server
  pgtmp restart "$FO_DIR/a" >/dev/null 2>&1
  echo '{"id":"r2","name":"t","payload":1,"handlers":["h"]}' >&4
  wait_for 10 '[ "$(wc -l <"$FO_DIR/acks")" = 2 ]'
  grep -q "reconnected to 127.0.0.1:$(cat "$FO_DIR/a/port"); sending again from line 2" "$FO_DIR/pub.err"
  # no server for longer than 3s: it gives up, saying so, and the line is not acknowledged
  pgtmp stop "$FO_DIR/a"
  local t0=$SECONDS
  echo '{"id":"r3","name":"t","payload":1,"handlers":["h"]}' >&4
  local st=0
  wait "$pub" || st=$?
  exec 4>&-
  [ "$st" -eq 69 ] || [ "$st" -eq 75 ]
  [ $((SECONDS - t0)) -ge 3 ]
  grep -q "no server answered for 3s (--reconnect)" "$FO_DIR/pub.err"
  grep -q "committed through line 2" "$FO_DIR/pub.err"
  [ "$(wc -l <"$FO_DIR/acks")" = 2 ]
}

@test "pg_control_system() revoked: a warning, not a failure" {
  URL_A=$(pgtmp start "$FO_DIR/a")
  on "$URL_A" "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC; CREATE ROLE pub LOGIN"
  # a publisher role (relaybus(7) ROLES): it may publish, nothing else
  rb-setup --db "$URL_A" -q --grant publisher=pub
  run bash -c "echo '{\"id\":\"p1\",\"name\":\"t\",\"payload\":1,\"handlers\":[\"h\"]}' |
    rb-publish --db 'postgresql://pub@127.0.0.1:$(cat "$FO_DIR/a/port")/postgres' 2>&1"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"cannot read the server's system identifier (pg_control_system(): permission denied)"* ]]
  [ "$(on "$URL_A" "SELECT count(*) FROM $RB_SCHEMA.relaybus_events")" = 1 ]
}
