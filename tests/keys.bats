#!/usr/bin/env bats
# Key retention: rb-admin purge --keys deletes the counters (relaybus_keys)
# that no pending, in-flight or dead delivery needs, and never lets a later
# publish of a key run before an earlier one: a publish in progress held
# open in a real second session, the restart of a sequence, dead deliveries
# requeued after the purge, batches.

load test_helper

setup() {
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    drop_schema
    setup_schema -s mailer:order
  fi
}

teardown() { kill_pids_drop_schema; }

fields() { jq -r "[$1] | map(tostring) | join(\" \")"; }
# an event line: id key i [handler [extra fields]]
ev() { printf '{"id":"%s","name":"order","key":"%s","payload":{"i":%d},"handlers":["%s"]%s}\n' "$1" "$2" "$3" "${4:-mailer}" "${5:-}"; }
counters() { q "SELECT coalesce(string_agg(key || '=' || sequence, ' ' ORDER BY key), '-') FROM relaybus_keys"; }
seq_of() { q "SELECT sequence FROM relaybus_deliveries WHERE event_id = '$1'"; }
drain() { rb-dispatch -q -H "${1:-mailer}" --pipe "rb-test-pipe $BATS_TEST_TMPDIR/ran" --drain; }
# keyed records whose payload i is not above the previous one of their key
order_violations() {
  awk '$2 != "-" { if (($2 in last) && $3 + 0 <= last[$2]) bad++; last[$2] = $3 + 0 } END { print bad + 0 }' "$1"
}

# a second session (psql) that stays open: send it statements with hold_sql
hold_open() {
  local fifo=$BATS_TEST_TMPDIR/fifo
  mkfifo "$fifo"
  (sql <"$fifo" >"$BATS_TEST_TMPDIR/held.out" 2>&1 3>&-) &
  PIDS="${PIDS:-} $!"
  exec 7>"$fifo"
  HOLD_FD=7
}
hold_sql() { echo "$1" >&7; }

@test "purge --keys removes the counters no delivery needs and keeps pending, in-flight and dead ones" {
  need_pg
  # A: all done; B: pending, not due yet; C: in flight (claimed, its handler
  # still running); D: dead
  ev a1 A 1 | rb-publish -q
  drain
  ev c1 C 1 | rb-publish -q
  run -0 rb-claim -H mailer --lease 5m
  [ "$(jq -r .event_id <<<"$output")" = c1 ]
  ev b1 B 1 mailer ',"delay_ms":3600000' | rb-publish -q
  ev d1 D 1 audit | rb-publish -q
  rb-claim -H audit | jq -c '. + {dead: true, error: "no"}' | rb-complete -q >/dev/null
  [ "$(q "SELECT status FROM relaybus_deliveries WHERE event_id = 'd1'")" = dead ]
  [ "$(counters)" = "A=1 B=1 C=1 D=1" ]
  run -0 --separate-stderr rb-admin purge --keys
  [ "$(fields '.keys,.dead,.events,.batches,.interrupted' <<<"$output")" = "1 0 0 1 false" ]
  [ "$(counters)" = "B=1 C=1 D=1" ]
  # a second run finds nothing more
  run -0 rb-admin purge --keys --table
  [[ "$output" =~ ^purged\ 0\ dead\ deliveries,\ 0\ events,\ 0\ history\ rows,\ 0\ key\ counters\ in\ 0\ batches ]]
  # A's sequence starts again, and its deliveries run in order
  printf '%s\n' "$(ev a2 A 2)" "$(ev a3 A 3)" | rb-publish -q
  [ "$(seq_of a2) $(seq_of a3)" = "1 2" ]
  : >"$BATS_TEST_TMPDIR/ran"
  drain
  [ "$(grep ' A ' "$BATS_TEST_TMPDIR/ran" | cut -d' ' -f1 | tr '\n' ' ')" = "a2 a3 " ]
}

@test "a publish in progress keeps its key: the purge skips its counter without waiting, and the sequence goes on" {
  need_pg
  ev k1 K 1 | rb-publish -q
  drain
  [ "$(counters)" = "K=1" ]
  # a second session publishes k2 of K and has not committed: it holds K's counter
  hold_open
  hold_sql "BEGIN; SELECT event_id FROM relaybus_publish('order', '{\"i\":2}', 'K', 'k2', p_handlers => ARRAY['mailer']);"
  for i in $(seq 50); do grep -q k2 "$BATS_TEST_TMPDIR/held.out" 2>/dev/null && break; sleep 0.1; done
  grep -q k2 "$BATS_TEST_TMPDIR/held.out"
  # the purge sees no delivery of K (k2 is not committed), but may not take the counter
  # (not holding the session's fifo open, nor bats's fd 3)
  timeout 30 rb-admin purge --keys >"$BATS_TEST_TMPDIR/purge.out" 2>"$BATS_TEST_TMPDIR/purge.err" 7>&- 3>&- & purge=$!
  PIDS="$PIDS $purge"
  for i in $(seq 50); do kill -0 "$purge" 2>/dev/null || break; sleep 0.1; done
  # it is done before the publish commits: it did not wait for it
  if kill -0 "$purge" 2>/dev/null; then echo "the purge waits for the publish"; false; fi
  hold_sql "COMMIT;"
  wait "$purge"
  [ "$(fields '.keys' <"$BATS_TEST_TMPDIR/purge.out")" = 0 ]
  [ -z "$(cat "$BATS_TEST_TMPDIR/purge.err")" ]
  for i in $(seq 50); do [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'k2'")" = 1 ] && break; sleep 0.1; done
  [ "$(counters)" = "K=2" ]
  # the next publish of K comes after k2, and runs after it
  ev k3 K 3 | rb-publish -q
  [ "$(seq_of k2) $(seq_of k3)" = "2 3" ]
  : >"$BATS_TEST_TMPDIR/ran"
  drain
  [ "$(cut -d' ' -f1 "$BATS_TEST_TMPDIR/ran" | tr '\n' ' ')" = "k2 k3 " ]
  # and once nothing of K is left, its counter goes
  run -0 rb-admin purge --keys
  [ "$(counters)" = "-" ]
}

@test "(what the purge relies on) a publish that finds the counter locked waits, and after its deletion starts the key at 1" {
  need_pg
  ev w1 W 1 | rb-publish -q
  drain
  # the purge's two statements, by hand, in a session held open between them
  hold_open
  hold_sql "BEGIN ISOLATION LEVEL READ COMMITTED; SELECT key FROM relaybus_keys WHERE key = 'W' FOR UPDATE SKIP LOCKED;"
  sleep 0.5
  ev w2 W 2 | rb-publish -q 7>&- 3>&- & pub=$!
  PIDS="$PIDS $pub"
  # the publish waits for the counter
  for i in $(seq 50); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rb-publish' AND wait_event_type = 'Lock'")" = 1 ] && break
    sleep 0.1
  done
  [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rb-publish' AND wait_event_type = 'Lock'")" = 1 ]
  hold_sql "DELETE FROM relaybus_keys WHERE key = 'W' AND NOT EXISTS (SELECT 1 FROM relaybus_deliveries WHERE key = 'W' AND status IN ('pending', 'dead')); COMMIT;"
  wait "$pub"
  [ "$(seq_of w2)" = 1 ]
  [ "$(counters)" = "W=1" ]
}

@test "a dead delivery keeps its key: requeued after a purge, it still runs before what its key published later" {
  need_pg
  ev x1 X 1 | rb-publish -q
  rb-claim -H mailer | jq -c '. + {dead: true, error: "bad"}' | rb-complete -q >/dev/null
  [ "$(q "SELECT status FROM relaybus_deliveries WHERE event_id = 'x1'")" = dead ]
  run -0 rb-admin purge --keys --dead-older-than 1d
  [ "$(fields '.keys,.dead' <<<"$output")" = "0 0" ]
  [ "$(counters)" = "X=1" ]
  ev x2 X 2 | rb-publish -q
  [ "$(seq_of x2)" = 2 ]
  run -0 rb-admin requeue x1
  : >"$BATS_TEST_TMPDIR/ran"
  drain
  [ "$(cut -d' ' -f1 "$BATS_TEST_TMPDIR/ran" | tr '\n' ' ')" = "x1 x2 " ]
  [ "$(order_violations "$BATS_TEST_TMPDIR/ran")" = 0 ]
  # purged dead deliveries free their keys in the same run
  ev x3 X 3 | rb-publish -q
  rb-claim -H mailer | jq -c '. + {dead: true}' | rb-complete -q >/dev/null
  q "UPDATE relaybus_deliveries SET updated_at = now() - interval '2 days' WHERE event_id = 'x3'"
  run -0 rb-admin purge --keys --dead-older-than 1d
  [ "$(fields '.keys,.dead' <<<"$output")" = "1 1" ]
  [ "$(counters)" = "-" ]
}

@test "every counter is looked at once, in batches; keys of other handlers' pending deliveries stay" {
  need_pg
  rb-setup -s audit:order
  awk 'BEGIN { for (i = 1; i <= 2500; i++) printf "{\"id\":\"m%d\",\"name\":\"order\",\"key\":\"key %d, \\\"q\\\"\",\"payload\":{\"i\":%d},\"handlers\":[\"mailer\"]}\n", i, i, i }' | rb-publish -q
  drain
  ev p1 'key 7, \"q\"' 7 audit | rb-publish -q
  ev p2 'only audit' 1 audit | rb-publish -q
  [ "$(q "SELECT count(*) FROM relaybus_keys")" = 2501 ]
  run -0 --separate-stderr rb-admin purge --keys --batch 1000
  [ "$(fields '.keys,.batches' <<<"$output")" = "2499 3" ]
  [ "$(counters)" = 'key 7, "q"=2 only audit=1' ]
}
