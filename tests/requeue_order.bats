#!/usr/bin/env bats
# A requeued dead head of a key never runs beside a later delivery of its
# key, and goes to the back of its key when a later one is in flight (the
# seed audit's row 51 and section (c) 1, a reproducer with real processes:
# the handler of r2 requeues the dead r1 while it runs).  The same on both
# stores (RELAYBUS_TEST_STORE=mongo runs it on MongoDB).

load test_helper

setup() {
  need_pg
  drop_schema
  rb-setup -q -s 'h:*'
}
teardown() { drop_schema; }

@test "a dead head requeued while a later delivery of its key runs waits for it, and runs after what was in flight (row 51)" {
  cat >"$BATS_TEST_TMPDIR/rq.sh" <<EOF
#!/bin/sh
id=\$(jq -r .event_id); echo "start \$id" >> $BATS_TEST_TMPDIR/log
[ "\$id" = r2 ] && { rb-admin requeue r1 >$BATS_TEST_TMPDIR/requeue 2>&1; sleep 2; }
echo "end \$id" >> $BATS_TEST_TMPDIR/log
EOF
  chmod +x "$BATS_TEST_TMPDIR/rq.sh"
  printf '%s\n' '{"id":"r1","name":"t","key":"K","payload":{}}' \
    '{"id":"r2","name":"t","key":"K","payload":{}}' '{"id":"r3","name":"t","key":"K","payload":{}}' | rb-publish -q
  run -0 rb-admin bury r1
  RELAYBUS_PASS_ENV=RELAYBUS_URL,RELAYBUS_SCHEMA,RELAYBUS_MODULE_DIR,PATH,MONGOC_DISABLE_SHM \
    timeout 60 rb-dispatch -H h --exec "$BATS_TEST_TMPDIR/rq.sh" --chain 1 --drain -q
  cat "$BATS_TEST_TMPDIR/requeue"
  grep -q '"requeued"' "$BATS_TEST_TMPDIR/requeue"
  # never two at once, and r1 after what ran beside its requeue (as on PostgreSQL)
  cat "$BATS_TEST_TMPDIR/log"
  [ "$(tr '\n' , <"$BATS_TEST_TMPDIR/log")" = "start r2,end r2,start r3,end r3,start r1,end r1," ]
  [ "$(rb-admin --json stats | jq -r 'select(.handler == "h") | "\(.pending) \(.dead)"')" = "0 0" ]
}

@test "a dead head requeued while nothing of its key runs keeps its place: it runs first" {
  printf '%s\n' '{"id":"q1","name":"t","key":"Q","payload":{}}' '{"id":"q2","name":"t","key":"Q","payload":{}}' | rb-publish -q
  run -0 rb-admin bury q1
  run -0 rb-admin requeue q1
  run -0 rb-dispatch -H h --exec "jq -r .event_id >>$BATS_TEST_TMPDIR/ran" --chain 1 --drain -q
  [ "$(tr '\n' , <"$BATS_TEST_TMPDIR/ran")" = "q1,q2," ]
}
