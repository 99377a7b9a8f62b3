#!/usr/bin/env bats
# Parking on MongoDB (relaybus(7) "MongoDB", parking): a deep backlog of one
# key behind a head that runs long leaves the claim index, so that claims
# of other work do not read it, measured with the server's own counter
# (serverStatus metrics.document.returned, as on a real MongoDB); and the
# key still runs every delivery once, in order, when its head completes,
# also after a kill -9 of its dispatcher and a takeover.  Runs with
# RELAYBUS_TEST_STORE=mongo (scripts/test's second pass); skips otherwise.

load test_helper

setup_file() { on_mongo || return 0; drop_schema; have_pg || return 0; rb-setup -s 'h:k.*' -s 'h:u.*'; }
teardown_file() { on_mongo || return 0; drop_schema; }
setup() {
  on_mongo || skip "parking is the MongoDB store's (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  mongo_fresh_store
}
teardown() { kill_pids; }
# (the database stays for the next test: setup_file made it)
kill_pids() { local p; for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done; }

keyed() {  # n: events k1..kn of key K, payload i = 1..n
  awk -v n="$1" 'BEGIN { for (i = 1; i <= n; i++)
    printf "{\"id\":\"k%d\",\"name\":\"k.x\",\"key\":\"K\",\"payload\":{\"i\":%d}}\n", i, i }' | rb-publish -q
}
unkeyed() {  # n
  awk -v n="$1" 'BEGIN { for (i = 1; i <= n; i++)
    printf "{\"id\":\"u%d\",\"name\":\"u.x\",\"payload\":{\"i\":%d}}\n", i, i }' | rb-publish -q
}
returned() {
  /usr/bin/python3 -c 'import sys, pymongo
print(pymongo.MongoClient(sys.argv[1]).admin.command("serverStatus")["metrics"]["document"]["returned"])' \
    "$(mongo_file_url)"
}
claims() { grep -c 'claimed [0-9]' "$1" || true; }
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
parked() { rbq count deliveries '{"lane":"parked"}'; }
# the key's runs in OUT files: each seq 1..n first run in order, each at least once
in_order() {  # n file...
  local n=$1; shift
  cat "$@" | awk -v n="$n" '$2 == "K" && !seen[$3]++ { if ($3 != ++want) { print "out of order: " $3 " after " want - 1; bad = 1; exit } }
    END { if (!bad && want != n) { print want " of " n " ran"; bad = 1 } exit bad }'
}

@test "a backlog of 2000 behind a head in flight is parked: claims of other work return no parked document" {
  local out=$BATS_TEST_TMPDIR/out flag=$BATS_TEST_TMPDIR/go err=$BATS_TEST_TMPDIR/err r0 r1 c0 c1 per
  keyed 2000
  rb-dispatch -H h -vv --chain 32 -c 64 --pipe "rb-test-hold $out $flag k1" 2>"$err" 3>&- & PIDS=$!
  # the head in flight, held by the handler
  wait_for 60 '[ "$(lines "$out")" -ge 1 ]'
  [ "$(head -1 "$out")" = "k1 K 1 1" ]
  wait_for 60 '[ "$(claims "$err")" -ge 3 ]'
  # the followers stay pending (parked is an index state, not a status)
  [ "$(rb-admin stats --handler h | jq -r 'select(.handler == "h") | .pending + .processing')" = 2000 ]
  run -0 rb-admin show k1500
  [ "$(jq -r '.deliveries[0].status' <<<"$output")" = pending ]
  # measured: the documents the server returned per claim while 200 unkeyed run
  c0=$(claims "$err"); r0=$(returned)
  unkeyed 200
  wait_for 120 '[ "$(grep -c "^u" "$out")" -ge 200 ]'
  c1=$(claims "$err"); r1=$(returned)
  per=$(( (r1 - r0) / (c1 - c0) ))
  echo "# $((c1 - c0)) claims, $((r1 - r0)) documents returned, $per per claim; $(parked) parked" >&3
  # a claim reads the handler's 256 lane documents and its candidates; before
  # parking each one also returned the key's 1999 followers
  [ "$per" -lt 1000 ]
  [ "$(parked)" -ge 1900 ]
  [ "$(lines "$out")" = 201 ]
  # the head completes: the key runs to its end, in order, each once
  touch "$flag"
  wait_for 300 '[ "$(rbq count deliveries)" = 0 ]'
  in_order 2000 "$out"
  [ "$(awk '$2 == "K"' "$out" | wc -l)" = 2000 ]
  [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
}

@test "kill -9 of the dispatcher in the middle of a parked key: the takeover runs the rest in order, nothing lost" {
  local a=$BATS_TEST_TMPDIR/a b=$BATS_TEST_TMPDIR/b
  keyed 600
  rb-dispatch -H h --chain 8 -c 8 --lease 2s --pipe "rb-test-pipe $a" 2>"$BATS_TEST_TMPDIR/a.err" 3>&- & PIDS=$!
  wait_for 120 '[ "$(lines "$a")" -ge 150 ]'
  kill -9 "$PIDS"
  # it had parked the rest of the key
  [ "$(parked)" -gt 0 ]
  rb-dispatch -H h --chain 8 -c 8 --lease 2s --pipe "rb-test-pipe $b" 2>"$BATS_TEST_TMPDIR/b.err" 3>&- &
  PIDS="$PIDS $!"
  wait_for 300 '[ "$(rbq count deliveries)" = 0 ]'
  in_order 600 "$a" "$b"
  # run again: only what was in flight at the kill (a chain at most), on attempt 2
  [ "$(cat "$a" "$b" | awk '{print $3}' | sort | uniq -d | wc -l)" -le 8 ]
  [ "$(awk '$4 > 2' "$a" "$b" | wc -l)" = 0 ]
  [ "$(rbq count deliveries '{"lane":"parked"}')" = 0 ]
}

@test "a parked backlog unparks when its head is buried, cancelled or completed by rb-admin and rb-complete" {
  local out
  keyed 60
  # a claim with a chain of 1 parks all but the first four: k5 .. k60
  run -0 rb-claim -H h -b 1 --owner c1
  out=$output
  [ "$(jq -r .event_id <<<"$out")" = k1 ]
  [ "$(rbq find deliveries '{"lane":"ready"}' eventId parkNext | tr '\n' ' ')" = "k1 null k2 null k3 null k4 4 " ]
  [ "$(parked)" = 56 ]
  # list and stats still see them all pending
  [ "$(rb-admin list --handler h --status pending | wc -l)" -ge 59 ]
  # the head completes; the key's next (k2) is ready, and claimed next
  jq -c '. + {ok: true}' <<<"$out" | rb-complete -q
  run -0 rb-claim -H h -b 1 --owner c1
  [ "$(jq -r .event_id <<<"$output")" = k2 ]
  jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  # rb-admin cancels k3 and buries the marker k4: k5 .. k8 ready, k8 the next marker
  rb-admin cancel k3 >/dev/null
  rb-admin bury k4 >/dev/null
  [ "$(rbq find deliveries '{"lane":"ready","status":"pending"}' eventId parkNext | tr '\n' ' ')" = "k5 null k6 null k7 null k8 4 " ]
  # a requeued one is ready (its key's order: before k5)
  rb-admin requeue k4 >/dev/null
  run -0 rb-claim -H h -b 1 --owner c1
  [ "$(jq -r .event_id <<<"$output")" = k4 ]
  jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  # the rest, in order, one claim each
  # (not $i: bats's run sets it)
  for ((n = 5; n <= 60; n++)); do
    run -0 rb-claim -H h -b 1 --owner c1
    [ "$(jq -r .event_id <<<"$output")" = "k$n" ]
    jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  done
  [ "$(rbq count deliveries '{"status":"pending"}')" = 0 ]
}

@test "a marker buried by a takeover's charge or by its handler (dead): the next ones are ready at once" {
  keyed 40
  for ((n = 1; n <= 3; n++)); do
    run -0 rb-claim -H h -b 1 --owner c1
    [ "$(jq -r .event_id <<<"$output")" = "k$n" ]
    jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  done
  [ "$(parked)" = 36 ]
  # k4, the marker, claimed and never completed: its lease ends
  run -0 rb-claim -H h -b 1 --owner c1 --lease 1s
  [ "$(jq -r .event_id <<<"$output")" = k4 ]
  sleep 1.5
  # the takeover charges it its last attempt (buried); k5 .. k8 are ready
  run -0 rb-claim -H h -b 1 --owner c2 --max-attempts 1
  [ "$(jq -r .event_id <<<"$output")" = k5 ]
  [ "$(rbq find deliveries '{"eventId":"k4"}' status)" = dead ]
  jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  for ((n = 6; n <= 8; n++)); do
    run -0 rb-claim -H h -b 1 --owner c2
    [ "$(jq -r .event_id <<<"$output")" = "k$n" ]
    [ $n = 8 ] || jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  done
  # k8, the next marker, buried by its handler: k9 next
  jq -c '. + {ok: false, dead: true, error: "no"}' <<<"$output" | rb-complete -q
  [ "$(rbq find deliveries '{"eventId":"k8"}' status)" = dead ]
  run -0 rb-claim -H h -b 1 --owner c2
  [ "$(jq -r .event_id <<<"$output")" = k9 ]
  [ "$(parked)" = 28 ]
}

@test "deliveries published after a parking run after the parked ones: a chain stops at the marker" {
  local out=$BATS_TEST_TMPDIR/out
  keyed 60
  run -0 rb-claim -H h -b 1 --owner c1
  [ "$(parked)" = 56 ]
  jq -c '. + {ok: true}' <<<"$output" | rb-complete -q
  # four more of K, published ready behind the parked run
  awk 'BEGIN { for (i = 61; i <= 64; i++)
    printf "{\"id\":\"k%d\",\"name\":\"k.x\",\"key\":\"K\",\"payload\":{\"i\":%d}}\n", i, i }' | rb-publish -q
  [ "$(rbq count deliveries '{"lane":"ready"}')" = 7 ]
  run -0 timeout 300 rb-dispatch -H h --chain 32 -c 64 --drain --pipe "rb-test-pipe $out" 3>&-
  [ "$(rbq count deliveries)" = 0 ]
  # k1 ran before (by rb-claim)
  sed -i '1i k1 K 1 1' "$out"
  in_order 64 "$out"
  [ "$(wc -l <"$out")" = 64 ]
}
