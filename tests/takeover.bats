#!/usr/bin/env bats
# Takeovers at the speed of the fault (PostgreSQL): rb-dispatch keeps a
# session-level liveness lock; a claimer that finds the lock of a lane's
# holder free cuts its lease to 1.5 s.  Real processes, kill -9 and
# pg_terminate_backend.  The handlers in tests/bin record
# "event_id key seq attempt" per delivery they ran.

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }


lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
pending() { q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$1'"; }
# the same on either store (through rb-admin: slower)
left() { rb-admin stats --handler "$1" | jq -r 'select(.handler != null) | .pending + .processing + .dead' | grep . || echo 0; }
now_ms() { date +%s%3N; }

@test "kill -9 of one of two dispatchers (--lease 30s): the other takes its lanes over in seconds, attempts charged" {
  pg_only
  need_pg
  local a=$BATS_TEST_TMPDIR/a.out b=$BATS_TEST_TMPDIR/b.out t0 t1
  publish_for 80 k fast
  rb-dispatch -H fast --lease 30s -c 4 --exec "rb-test-exec $a sleep:0.05" 2>"$BATS_TEST_TMPDIR/a.err" 3>&- & PIDS=$!
  rb-dispatch -H fast --lease 30s -c 4 --exec "rb-test-exec $b sleep:0.05" 2>"$BATS_TEST_TMPDIR/b.err" 3>&- &
  PIDS="$PIDS $!"
  wait_for 20 '[ "$(lines "$a")" -ge 8 ] && [ "$(lines "$b")" -ge 1 ]'
  kill -9 "${PIDS%% *}"
  t0=$(now_ms)
  # the dead one still holds lanes with work: its lease would keep them 30 s
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'fast' AND lease_owner IS NOT NULL
            AND lease_expires_at > now() + interval '20 seconds'")" -gt 0 ]
  [ "$(pending fast)" -gt 0 ]
  wait_for 40 '[ "$(pending fast)" = 0 ]'
  t1=$(now_ms)
  echo "nothing pending $((t1 - t0)) ms after the kill" >&3
  # (a bound a busy machine meets, well under the 30-s lease that a
  # takeover without the liveness lock would wait for)
  [ $((t1 - t0)) -lt 20000 ]
  # every event ran; what ran twice ran second on attempt 2 (charged once).
  # (A handler the kill left without its delivery line records no id: it
  # ran nothing)
  grep -hv '^ ' "$a" "$b" >"$BATS_TEST_TMPDIR/ran"
  [ "$(cut -d' ' -f1 "$BATS_TEST_TMPDIR/ran" | sort -u | wc -l)" = 80 ]
  [ "$(awk '$4 != 1 && $4 != 2' "$BATS_TEST_TMPDIR/ran" | wc -l)" = 0 ]
  [ "$(awk '$4 == 2' "$b" | cut -d' ' -f1 | sort | uniq -d | wc -l)" = 0 ]
}

@test "a dispatcher whose own work ran out looks again when a killed holder's cut lease ends, not a --poll later" {
  pg_only
  need_pg
  local a=$BATS_TEST_TMPDIR/a.out b=$BATS_TEST_TMPDIR/b.out p t0 t1
  publish_for 8 c cutwait
  # A runs 4 for a minute and is killed; B runs the other 4 for 1.5 s,
  # and after them polls only every 30 s: its next look must come when
  # the lease it cut on A's lanes ends (1.5 s), not 30 s later
  rb-dispatch -H cutwait --owner A --lease 30s -c 4 --exec "rb-test-exec $a sleep:60" >/dev/null 2>&1 3>&- & p=$!
  PIDS=$p
  wait_for 20 '[ "$(lines "$a.start")" = 4 ]'
  rb-dispatch -H cutwait --owner B --lease 30s -c 4 --poll 30s --exec "rb-test-exec $b sleep:1.5" \
    2>"$BATS_TEST_TMPDIR/b.err" 3>&- &
  PIDS="$PIDS $!"
  wait_for 20 '[ "$(lines "$b.start")" = 4 ]'
  kill -9 "$p"
  t0=$(now_ms)
  wait_for 40 '[ "$(pending cutwait)" = 0 ]'
  t1=$(now_ms)
  echo "nothing pending $((t1 - t0)) ms after the kill" >&3
  # (a --poll later would be 30 s: half that, which a busy machine meets)
  [ $((t1 - t0)) -lt 15000 ]
  # A's four ran again at B, on attempt 2 (the takeover charged them)
  [ "$(awk '$4 == 2' "$b" | wc -l)" = 4 ]
  [ "$(cut -d' ' -f1 "$b" | sort -u | wc -l)" = 8 ]
}

@test "the backends of one of two dispatchers terminated up to twice a second while they drain: exact, and no takeover while each reconnection comes within the grace" {
  pg_only
  need_pg
  local out=$BATS_TEST_TMPDIR/t.out err=$BATS_TEST_TMPDIR/t1.err url cut=0 n p1 p2 before t0 t1 gap gaps="" slow=0
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rbtermcut" ;; *) url="$RELAYBUS_URL?application_name=rbtermcut" ;; esac
  publish_for 300 t termcut
  # (JSON diagnostics: each line's time, for the reconnections below)
  RELAYBUS_LOG_FORMAT=json rb-dispatch --db "$url" -H termcut --owner cutA --lease 30s -c 4 --drain \
    --exec "rb-test-exec $out sleep:0.05" 2>"$err" 3>&- & p1=$!
  # the other one, never cut, looks for lanes every 50 ms: it finds the
  # first one's liveness lock free between a cut and its reconnect
  rb-dispatch -H termcut --lease 30s -c 4 --drain --poll 50ms --exec "rb-test-exec $out sleep:0.05" \
    2>"$BATS_TEST_TMPDIR/t2.err" 3>&- & p2=$!
  PIDS="$p1 $p2"
  # The cuts begin once the first one holds lanes: a cut while it is still
  # starting is a failed start, tried again without a "reconnected" line
  # (the ASan stage of CI cut it there once, and then waited for that line)
  wait_for 30 '[ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = '"'termcut'"' AND lease_owner LIKE '"'cutA%'"'")" -gt 0 ]'
  # A cut holder keeps its lanes when it takes its liveness lock again
  # within the grace (1.5 s) of the other's cut of its leases: each cut
  # waits for its reconnection before the next (cuts in a row without one
  # made a takeover in CI's loaded stage), and each reconnection's time,
  # from the cut to its "reconnected" line, is kept
  while kill -0 "$p1" 2>/dev/null && [ "$(grep -c reconnected "$err")" -lt 5 ]; do
    before=$(grep -c reconnected "$err" || true)
    t0=$(date +%s.%N)
    n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
           WHERE application_name = 'rbtermcut' AND pid <> pg_backend_pid()")
    cut=$((cut + n))
    if [ "$n" -gt 0 ] &&
       wait_for 60 '! kill -0 "$p1" 2>/dev/null || [ "$(grep -c reconnected "$err")" -gt "$before" ]' &&
       [ "$(grep -c reconnected "$err")" -gt "$before" ]; then
      t1=$(date -d "$(grep reconnected "$err" | sed -n "$((before + 1))p" | jq -r .ts)" +%s.%N)
      gap=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
      gaps="$gaps $gap"
      awk -v g="$gap" 'BEGIN { exit !(g > 0.75) }' && slow=$((slow + 1))
    fi
    sleep 0.5
  done
  wait "$p1"
  wait "$p2"
  echo "$cut backends terminated; reconnected after (s):$gaps" >&3
  # (shown if the test fails: each delivery that ran more than once, with
  # its attempt, and what the two dispatchers said)
  echo "reconnections after (s):$gaps; slower than 0.75 s: $slow"
  echo "deliveries run more than once (event key seq attempt):"
  awk '{ n[$1]++; l[$1] = l[$1] "\n  " $0 } END { for (e in n) if (n[e] > 1) print substr(l[e], 2) }' "$out"
  echo "the cut dispatcher said:"; tail -n 40 "$err"
  echo "the other one said:"; tail -n 20 "$BATS_TEST_TMPDIR/t2.err"
  [ "$cut" -ge 3 ]
  [ "$(grep -c reconnected "$err")" -ge 3 ]
  [ "$(pending termcut)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 300 ]
  # a delivery that ran again ran with its attempt charged: each one ran
  # at most as often as its last attempt says
  [ "$(awk '{ n[$1]++; if ($4 > m[$1]) m[$1] = $4 } END { for (e in n) if (n[e] > m[e]) b++; print b + 0 }' "$out")" = 0 ]
  # and when every reconnection came well within the grace (in half of
  # it: the renewal that follows has the other half), each ran once, on its
  # first attempt: no lane was taken over.  (A loaded machine can take
  # longer to reconnect; then the other dispatcher may rightly take the
  # lanes over, with the charge the line above checks.)
  if [ "$slow" = 0 ]; then
    [ "$(wc -l <"$out")" = 300 ]
    [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
  fi
}

@test "a handler that runs longer than --lease keeps its lane through renewals: a second dispatcher does not take it over" {
  need_pg
  local a=$BATS_TEST_TMPDIR/a.out b=$BATS_TEST_TMPDIR/b.out
  publish_for 4 s slow
  rb-dispatch -H slow --lease 2s -c 4 --exec "rb-test-exec $a sleep:7" 2>"$BATS_TEST_TMPDIR/a.err" 3>&- & PIDS=$!
  wait_for 20 '[ "$(lines "$a.start")" = 4 ]'
  # a second dispatcher looks for work every 50 ms while the first one's
  # handlers run three times its lease and more
  rb-dispatch -H slow --lease 2s -c 4 --poll 50ms --exec "rb-test-exec $b ok" 2>"$BATS_TEST_TMPDIR/b.err" 3>&- &
  PIDS="$PIDS $!"
  wait_for 20 '[ "$(lines "$a")" = 4 ]'
  wait_for 10 '[ "$(left slow)" = 0 ]'
  [ "$(lines "$b")" = 0 ]
  [ "$(awk '$4 != 1' "$a" | wc -l)" = 0 ]
}

# A dispatcher (ARGS... before the handler form) takes 4 deliveries with a
# handler that runs 60 s, and is killed; rb-claim claims at once, then
# again 2 s later.  Prints what the second claim took.
claim_after_kill() {  # handler [rb-dispatch args]
  local h=$1 out=$BATS_TEST_TMPDIR/$1.out; shift
  publish_for 4 "$h" "$h"
  # (its handlers outlive it: none may hold the caller's $(...) open)
  rb-dispatch "$@" -H "$h" --lease 30s -c 4 --exec "rb-test-exec $out sleep:60" >/dev/null 2>&1 3>&- & PIDS=$!
  wait_for 20 '[ "$(lines "$out.start")" = 4 ]'
  kill -9 "$PIDS"
  rb-claim -q -H "$h" >/dev/null || true
  sleep 2
  rb-claim -q -H "$h" | wc -l
}

@test "rb-claim takes a killed dispatcher's lanes over after 1.5 s; with relaybus.liveness off (transaction pooling) only after the lease" {
  pg_only
  need_pg
  [ "$(claim_after_kill live)" = 4 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'live' AND attempts = 1")" = 4 ]
  local url
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&options=-c%20relaybus.liveness%3Doff" ;; *) url="$RELAYBUS_URL?options=-c%20relaybus.liveness%3Doff" ;; esac
  [ "$(claim_after_kill pooled --db "$url")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'pooled' AND lease_owner IS NOT NULL
            AND lease_expires_at > now() + interval '20 seconds'")" -gt 0 ]
}

@test "kill -9 of rb-claim --follow (--lease 30s): another claimer takes its lanes over in seconds, attempts charged" {
  pg_only
  need_pg
  local f=$BATS_TEST_TMPDIR/f t0 t1
  publish_for 4 fk folkill
  # its lines go to a file: written, and never completed
  rb-claim -H folkill --follow --lease 30s >"$f.1" 2>"$f.err" & PIDS=$!
  wait_for 10 '[ "$(lines "$f.1")" = 4 ]'
  # it holds them as rb-dispatch does, under its liveness lock
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'folkill' AND lease_owner IS NOT NULL AND holder_live
            AND lease_expires_at > now() + interval '20 seconds'")" -gt 0 ]
  kill -9 "$PIDS"
  t0=$(now_ms)
  wait_for 25 'rb-claim -H folkill --batch 10 >>"$f.2" || true; [ "$(lines "$f.2")" = 4 ]'
  t1=$(now_ms)
  echo "claimed again $((t1 - t0)) ms after the kill" >&3
  # (well under the 30-s lease, and what a busy machine meets)
  [ $((t1 - t0)) -lt 20000 ]
  # the takeover charged the attempt that may have run
  [ "$(jq -r .attempt "$f.2" | sort -u)" = 2 ]
  [ "$(jq -r .event_id "$f.2" | sort | tr '\n' ' ')" = "$(jq -r .event_id "$f.1" | sort | tr '\n' ' ')" ]
}

@test "rb-claim --follow whose own lines ran out looks again when a killed holder's cut lease ends, not a --poll later" {
  pg_only
  need_pg
  local a=$BATS_TEST_TMPDIR/a.out f=$BATS_TEST_TMPDIR/f p t0 t1
  publish_for 8 r cutfol
  rb-dispatch -H cutfol --owner A --lease 30s -c 4 --exec "rb-test-exec $a sleep:60" >/dev/null 2>&1 3>&- & p=$!
  PIDS=$p
  wait_for 20 '[ "$(lines "$a.start")" = 4 ]'
  # B takes the other four; its handler answers them once told to (then
  # at once), and after them B polls only every 30 s
  printf '%s\n' '#!/bin/bash' 'while [ ! -e "$1.go" ]; do sleep 0.02; done' \
    'while IFS= read -r l; do printf "%s\n" "$l" >>"$1.log"; printf "%s\n" "${l%\}},\"ok\":true}"; done' >"$f.h"
  chmod +x "$f.h"
  (rb-claim -H cutfol --owner B --follow --poll 30s --lease 30s 2>"$f.err" & echo $! >"$f.pid"; wait) |
    "$f.h" "$f" | rb-complete -o >"$f.done" 3>&- &
  wait_for 10 '[ -s "$f.pid" ]'
  PIDS="$PIDS $(cat "$f.pid")"
  wait_for 20 '[ "$(q "SELECT coalesce(sum(cardinality(in_flight)), 0) FROM relaybus_lanes WHERE handler = '"'cutfol'"' AND lease_owner = '"'B'"'")" = 4 ]'
  kill -9 "$p"
  t0=$(now_ms)
  # B's own four end 1.2 s after the kill: after B cut A's leases (within
  # a second), before the cut leases end (1.5 s after the cut)
  sleep 1.2
  touch "$f.go"
  wait_for 40 '[ "$(pending cutfol)" = 0 ]'
  t1=$(now_ms)
  echo "nothing pending $((t1 - t0)) ms after the kill" >&3
  # (a --poll later would be 30 s: half that, which a busy machine meets)
  [ $((t1 - t0)) -lt 15000 ]
  # A's four completed at B, on attempt 2 (the takeover charged them)
  [ "$(grep -c '"completed"' "$f.done")" = 8 ]
  [ "$(jq -r 'select(.attempt == 2) | .event_id' "$f.log" | sort -u | wc -l)" = 4 ]
}

@test "rb-claim --follow stopped (SIGTERM): the lanes of the lines it wrote keep a plain lease after it exited, and they complete" {
  pg_only
  need_pg
  local f=$BATS_TEST_TMPDIR/f p
  publish_for 4 fs folstop
  rb-claim -H folstop --follow --lease 30s >"$f.1" 2>"$f.err" & p=$!
  PIDS=$p
  wait_for 10 '[ "$(lines "$f.1")" = 4 ]'
  kill -TERM "$p"
  wait "$p"
  # no longer the liveness lock's (it went with the process), leased for --lease from the stop
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'folstop' AND lease_owner IS NOT NULL AND holder_live")" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'folstop' AND lease_owner IS NOT NULL
            AND lease_expires_at > now() + interval '25 seconds'")" -gt 0 ]
  # a claimer looks, and again once a cut lease would have ended: nothing for it
  rb-claim -q -H folstop >/dev/null || true
  sleep 2
  run rb-claim -H folstop --batch 10
  [ "$status" -eq 1 ]
  # the pipeline's other end completes all four
  while IFS= read -r l; do printf '%s\n' "${l%\}},\"ok\":true}"; done <"$f.1" | rb-complete -o >"$f.done"
  [ "$(grep -c '"completed"' "$f.done")" = 4 ]
  [ "$(pending folstop)" = 0 ]
}

# c1, c2, c3 of key C and an unkeyed u for HANDLER.  A dispatcher (ARGS...)
# with --chain 3 claims all four, runs c1 and u for 60 s (c2 and c3 wait
# behind c1) and is killed; once its lease ended, another one drains the
# handler: prints "event:attempt" of each delivery that one ran.
chain_takeover() {  # handler [rb-dispatch args]
  local h=$1 a=$BATS_TEST_TMPDIR/$1.a b=$BATS_TEST_TMPDIR/$1.b p; shift
  # (its handlers outlive it: none may hold the caller's $(...) open)
  rb-dispatch "$@" -H "$h" --chain 3 --lease 2s -c 4 --exec "rb-test-exec $a sleep:60" >/dev/null 2>&1 3>&- & p=$!
  PIDS="${PIDS:-} $p"
  wait_for 20 '[ "$(lines "$a.start")" = 2 ]'
  kill -9 "$p"
  sleep 2.5
  rb-dispatch -H "$h" --drain --exec "rb-test-exec $b ok" >/dev/null 2>&1 3>&-
  awk '{sub(/^[^.]*\./, "", $1); print $1 ":" $4}' "$b" | sort | tr '\n' ' '
}

# (ids of the handler's own: an id published again is a duplicate, which
# reaches no handler its name is not subscribed to)
chain_publish() {  # handler
  for i in 1 2 3; do printf '{"id":"%s.c%d","name":"t","key":"C","payload":{"i":%d},"handlers":["%s"]}\n' "$1" "$i" "$i" "$1"; done |
    rb-publish -q
  printf '{"id":"%s.u","name":"t","payload":{"i":0},"handlers":["%s"]}\n' "$1" "$1" | rb-publish -q
}

@test "a takeover charges the chained followers of a killed dispatcher only when they may have run" {
  need_pg
  # --strict-order: a follower starts once the completion of the one before
  # it committed; c1 was still running, so c2 and c3 never ran
  chain_publish strict
  [ "$(chain_takeover strict --strict-order)" = "c1:2 c2:1 c3:1 u:2 " ]
  # the default (a follower starts once the one before it succeeded on its
  # first attempt), behind a c1 on its first attempt: c2 and c3 may have run
  chain_publish early
  [ "$(chain_takeover early)" = "c1:2 c2:2 c3:2 u:2 " ]
  # the same, behind a c1 past its first attempt (its first one failed):
  # c2 and c3 never ran
  chain_publish retried
  rb-claim -q -H retried --batch 10 | jq -c '. + {ok: false, error: "first", retry_ms: 0}' | rb-complete -q
  [ "$(chain_takeover retried)" = "c1:3 c2:1 c3:1 u:3 " ]
}

# A dispatcher of HANDLER running 4 deliveries of 40 (handlers that take a
# minute) killed with -9 with its handlers (its own process group, as a
# crash or an OOM kill of the service's group): its lanes keep a 30-s lease.
killed_mid_batch() {  # handler
  local a=$BATS_TEST_TMPDIR/a.out p
  publish_for 40 "$1" "$1"
  setsid rb-dispatch -H "$1" --lease 30s -c 4 --exec "rb-test-exec $a sleep:60" >/dev/null 2>&1 3>&- & p=$!
  PIDS="${PIDS:-} $p"
  wait_for 20 '[ "$(lines "$a.start")" = 4 ]'
  kill -9 -- "-$p"
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = '$1' AND lease_owner IS NOT NULL
            AND lease_expires_at > now() + interval '20 seconds'")" -gt 0 ]
}

@test "rb-dispatch --drain right after a kill -9 of a dispatcher mid-batch: waits for the cut lease, nothing left pending, every delivery run" {
  pg_only "liveness locks are PostgreSQL's"
  need_pg
  local b=$BATS_TEST_TMPDIR/b.out t0 t1
  killed_mid_batch dk
  t0=$(now_ms)
  run -0 timeout 60 rb-dispatch -H dk --drain --exec "rb-test-exec $b" 3>&-
  t1=$(now_ms)
  echo "drained in $((t1 - t0)) ms" >&3
  [ "$(pending dk)" = 0 ]
  [ "$(cut -d' ' -f1 "$b" | sort -u | wc -l)" = 40 ]
  # (the 4 the dead one ran were charged: attempt 2)
  [ "$(awk '$4 == 2' "$b" | wc -l)" = 4 ]
}

@test "rb-claim --follow --drain right after a kill -9 of a dispatcher mid-batch: waits for the cut lease, nothing left pending, every delivery run" {
  pg_only "liveness locks are PostgreSQL's"
  need_pg
  local b=$BATS_TEST_TMPDIR/b.out
  killed_mid_batch ck
  run -0 timeout 60 bash -c 'set -o pipefail
    rb-claim -H ck --follow --drain | tee "$1" | sed -u "s/}\$/,\"ok\":true}/" | rb-complete -q' _ "$b"
  [ "$(pending ck)" = 0 ]
  [ "$(jq -r .event_id "$b" | sort -u | wc -l)" = 40 ]
}
