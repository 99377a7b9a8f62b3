#!/usr/bin/env bats
# A real broker inbox: Debian's amqp-consume runs rb-publish once per
# RabbitMQ message, against a private rabbitmq-server (scripts/rabbit-tmp,
# started once for the file).  RabbitMQ redelivers a message whose consumer
# failed or died before the ack; the event id makes that harmless.
#
# Skips without amqp-tools and rabbitmq-server, unless RELAYBUS_REQUIRE_PG=1
# (scripts/test), where they must be there.

load test_helper

RABBIT=$RB_SRCDIR/scripts/rabbit-tmp

have_rabbit() {
  command -v amqp-consume >/dev/null && command -v amqp-publish >/dev/null &&
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]
}

setup_file() {
  drop_schema
  have_pg || return 0
  if ! have_rabbit; then
    if [ "$_require_pg" = 1 ]; then
      echo "RELAYBUS_REQUIRE_PG=1 but amqp-tools or rabbitmq-server is missing (scripts/deps test)" >&2
      return 1
    fi
    return 0
  fi
  rb-setup -q -s 'mail:order.*' -s audit:order.created
  AMQP_URL=$("$RABBIT" start "$BATS_FILE_TMPDIR/rabbit")
  export AMQP_URL
}

teardown_file() {
  [ -z "${AMQP_URL:-}" ] || "$RABBIT" stop "$BATS_FILE_TMPDIR/rabbit"
  drop_schema
}

setup() {
  need_pg
  [ -n "${AMQP_URL:-}" ] || skip "no RabbitMQ (apt-get install amqp-tools rabbitmq-server)"
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys"
  QUEUE=inbox$BATS_TEST_NUMBER
  amqp-declare-queue -u "$AMQP_URL" -d -q "$QUEUE" >/dev/null
  export T=$BATS_TEST_TMPDIR
}

# each line of stdin becomes one persistent message on the test's queue
send() { amqp-publish -u "$AMQP_URL" -r "$QUEUE" -p -l; }
# consume from the test's queue, running the command once per message
# (options, then -- and the command: amqp-consume also parses options after the command)
consume() { timeout 60 amqp-consume -u "$AMQP_URL" -q "$QUEUE" "$@"; }
# basic.get finds nothing: every message was acked
queue_empty() { ! amqp-get -u "$AMQP_URL" -q "$QUEUE" >/dev/null 2>&1; }
# (event, handler) pairs with more than one delivery row
dup_pairs() { q "SELECT count(*) FROM (SELECT event_id, handler FROM relaybus_deliveries GROUP BY 1, 2 HAVING count(*) > 1) d"; }
handlers_of() { q "SELECT string_agg(handler, ',' ORDER BY handler) FROM relaybus_deliveries WHERE event_id = '$1'"; }

# A consumer command: publish the message body with rb-publish -o (its outcome
# lines go to $T/out), note the attempt in $T/attempts, then fail (exit 1, so
# no ack) on the first attempt of the events listed in $T/fail-once.
handler() {
  cat >"$T/handler" <<'EOF'
#!/bin/sh
body=$(cat)
id=$(printf '%s\n' "$body" | jq -r .id)
printf '%s\n' "$body" | rb-publish -q -o >>"$T/out" || exit
echo "$id" >>"$T/attempts"
if grep -qx "$id" "$T/fail-once" 2>/dev/null && [ ! -e "$T/failed-$id" ]; then
  : >"$T/failed-$id"
  exit "${FAIL_HOW:-1}"
fi
exit 0
EOF
  chmod +x "$T/handler"
  echo "$T/handler"
}

@test "a queue drains into the outbox: every message stored once, one delivery per handler, all acked" {
  gen_events 25 order.created | send
  run consume -c 25 -- rb-publish -q
  [ "$status" -eq 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 25 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 50 ]
  [ "$(dup_pairs)" = 0 ]
  [ "$(handlers_of e7)" = audit,mail ]
  [ "$(q "SELECT payload FROM relaybus_events WHERE id = 'e7'")" = '{"i": 7}' ]
  queue_empty
}

@test "a consumer command failing after the commit: RabbitMQ redelivers, rb-publish finds duplicates, no delivery twice" {
  gen_events 12 order.created | send
  printf '%s\n' e3 e6 e9 e12 >"$T/fail-once"
  h=$(handler)
  # the failed messages stay unacked until this consumer leaves, then go back to the queue
  run consume -c 12 -- "$h"
  [ "$status" -eq 0 ]
  [ "$(wc -l <"$T/attempts")" = 12 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 24 ]
  # the next consumer gets exactly those four again
  run consume -c 4 -- "$h"
  [ "$status" -eq 0 ]
  [ "$(sort "$T/attempts" | uniq -d | sort -V | paste -sd,)" = e3,e6,e9,e12 ]
  [ "$(jq -r 'select(.duplicate) | "\(.event_id):\(.deliveries)"' "$T/out" | sort -V | paste -sd,)" = e3:0,e6:0,e9:0,e12:0 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 12 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 24 ]
  [ "$(dup_pairs)" = 0 ]
  queue_empty
}

@test "the consumer dying between the commit and the ack: the message and its prefetched followers come back once" {
  gen_events 10 order.created | send
  echo e5 >"$T/fail-once"
  h=$(handler)
  # after committing e5 the handler exits 2 and the command kills amqp-consume: e5 is never acked
  FAIL_HOW=2 run consume -p 3 -c 10 -- sh -c "$h"' || { [ $? = 2 ] && kill -KILL $PPID; exit 1; }'
  [ "$status" -eq 137 ]
  [ "$(paste -sd, "$T/attempts")" = e1,e2,e3,e4,e5 ]
  run consume -p 3 -c 6 -- "$h"
  [ "$status" -eq 0 ]
  [ "$(paste -sd, "$T/attempts")" = e1,e2,e3,e4,e5,e5,e6,e7,e8,e9,e10 ]
  [ "$(jq -r 'select(.duplicate) | .event_id' "$T/out")" = e5 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 10 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries")" = 20 ]
  [ "$(dup_pairs)" = 0 ]
  queue_empty
}

@test "the documented consumer: database trouble stops it and the broker keeps the message; a bad message is set aside and acked" {
  printf '%s\n' '{"id":"g1","name":"order.created","payload":{}}' 'not json' \
    '{"id":"g2","name":"order.created","payload":{}}' | send
  # the command from the docs (README, rb-publish(1)), with test paths
  inbox="rb-publish -q -k --rejects $T/rejects"'
         case $? in 0|65) exit 0 ;; *) kill $PPID; exit 1 ;; esac'
  RELAYBUS_URL=postgresql://postgres@127.0.0.1:1/postgres run consume -p 10 -- sh -c "$inbox"
  [ "$status" -eq 143 ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 0 ]
  run consume -p 10 -c 3 -- sh -c "$inbox"
  [ "$status" -eq 0 ]
  [ "$(q "SELECT string_agg(id, ',' ORDER BY id) FROM relaybus_events")" = g1,g2 ]
  [ "$(cat "$T/rejects")" = "not json" ]
  queue_empty
}

@test "a redelivery after a handler completed does not bring it back; a handler subscribed since gets a delivery" {
  echo '{"id":"o1","name":"order.created","payload":{"order":1}}' | send
  echo o1 >"$T/fail-once"
  h=$(handler)
  run consume -c 1 -- "$h"
  [ "$status" -eq 0 ]
  [ "$(handlers_of o1)" = audit,mail ]
  # while the message waits for its redelivery: mail does its work, crm subscribes
  rb-claim -H mail | jq -c '. + {ok: true}' | rb-complete -q
  [ "$(handlers_of o1)" = audit ]
  rb-setup -q -s 'crm:order.*'
  run consume -c 1 -- "$h"
  [ "$status" -eq 0 ]
  rb-setup -q --unsubscribe 'crm:order.*'
  [ "$(paste -sd, "$T/attempts")" = o1,o1 ]
  [ "$(tail -n 1 "$T/out" | jq -c '[.duplicate, .deliveries, .handlers]')" = '[true,1,["crm"]]' ]
  [ "$(handlers_of o1)" = audit,crm ]
  [ "$(q "SELECT array_to_string(handlers, ',') FROM relaybus_events WHERE id = 'o1'")" = audit,mail,crm ]
  [ "$(q "SELECT count(*) FROM relaybus_events")" = 1 ]
  queue_empty
}
