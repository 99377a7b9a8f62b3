#!/usr/bin/env bats
# The streaming pipeline, with real processes: rb-claim --follow | handler |
# rb-complete.  rb-claim keeps claiming as work arrives, writes as the pipe
# takes lines, caps what is in flight, renews the leases of what is
# downstream, and at SIGTERM or when its reader leaves releases what it
# had not handed on.  Counts come from rb-admin stats ("processing": claimed
# and not completed), so the file runs on every backend.

load test_helper

setup_file() {
  have_pg || return 0
  rb-setup -s 'fol:*'
}

teardown_file() { drop_schema; }

setup() {
  need_pg
  cd "$BATS_TEST_TMPDIR"
  # nothing left from the test before: no deliveries, every lane free
  q "TRUNCATE relaybus_events, relaybus_deliveries, relaybus_keys; UPDATE relaybus_lanes SET lease_owner = NULL, lease_expires_at = NULL, in_flight = '{}'"
}

teardown() {
  # the processes a test started in the background
  for p in $(cat "$BATS_TEST_TMPDIR"/pids 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  if [ -n "${OWN_PG:-}" ]; then
    "$RB_SRCDIR/scripts/pg-tmp" stop "$OWN_PG" >/dev/null 2>&1 3>&- || true
    rm -rf "$OWN_PG"
  fi
}

# N events PREFIX-1..N for handler fol, with a payload of PAD bytes
events() {  # n prefix [pad]
  awk -v n="$1" -v p="$2" -v pad="${3:-0}" 'BEGIN {
    s = ""; for (i = 0; i < pad; i++) s = s "x"
    for (i = 1; i <= n; i++) {
      if (i % 2) printf "{\"id\":\"%s-%d\",\"name\":\"fol.a\",\"key\":\"k%d\",\"payload\":{\"i\":%d,\"pad\":\"%s\"}}\n", p, i, i % 7, i, s
      else printf "{\"id\":\"%s-%d\",\"name\":\"fol.a\",\"payload\":{\"i\":%d,\"pad\":\"%s\"}}\n", p, i, i, s
    }
  }'
}

stat_of() {  # field: rb-admin stats of handler fol
  rb-admin stats --handler fol | jq -r "select(.handler == \"fol\") | .$1"
}

# every event of PREFIX 1..N handled once, as the handler log OUT says
handled_once() {  # out n prefix
  local got
  got=$(cut -d' ' -f1 "$1" | sort | uniq -c | awk '$1 != 1' | wc -l)
  [ "$got" -eq 0 ] || { echo "handled more than once:"; cut -d' ' -f1 "$1" | sort | uniq -d | head; return 1; }
  [ "$(cut -d' ' -f1 "$1" | grep -c "^$3-")" -eq "$2" ] || { echo "handled $(wc -l <"$1") of $2"; return 1; }
}

@test "rb-claim --follow --drain | handler | rb-complete: every event once, nothing left" {
  events 300 dr | rb-publish -q
  run timeout 60 bash -c 'rb-claim -H fol --follow --drain --batch 50 | rb-test-pipe out | rb-complete
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"status 0 0 0"* ]]
  handled_once out 300 dr
  # attempt 1 each: no takeover, no lease ran out
  [ "$(awk '$4 != 1' out | wc -l)" -eq 0 ]
  [ "$(stat_of pending)" = 0 ]
  [ "$(stat_of processing)" = 0 ]
}

@test "rb-claim --follow --drain --poll 1h: after a claim short of --batch it claims again at once, not at the next poll" {
  # 60 due, --batch 50: the second claim finds 10, the third none (drained).
  # Waiting for --poll after the short one (as before) took an hour here,
  # and a second a time in a drain with the default --poll.  Unkeyed: while
  # keyed ones are out it claims every 10ms anyway
  seq 60 | awk '{ printf "{\"id\":\"sh-%d\",\"name\":\"fol.a\",\"payload\":{\"i\":%d}}\n", $1, $1 }' | rb-publish -q
  run timeout 20 bash -c 'rb-claim -H fol --follow --drain --batch 50 --poll 1h | rb-test-pipe out | rb-complete
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"status 0 0 0"* ]]
  handled_once out 60 sh
  [ "$(stat_of pending)" = 0 ]
}

@test "rb-claim --follow: events published while it runs are delivered (wake-up), SIGTERM ends it with 0" {
  # --poll 1h: on PostgreSQL only a wake-up finds the work (MongoDB has
  # none: its backend cuts every wait to a short poll)
  (rb-claim -H fol --follow --poll 1h 2>claim.err; echo $? >claim.rc) | rb-test-pipe out | rb-complete -o >done &
  echo $! >>pids
  sleep 1
  events 20 wk | rb-publish -q
  wait_for 20 '[ "$(grep -c completed done 2>/dev/null)" = 20 ]'
  events 20 wk2 | rb-publish -q
  wait_for 20 '[ "$(grep -c completed done 2>/dev/null)" = 40 ]'
  pkill -TERM -f 'rb-claim -H fol --follow --poll 1h'
  wait_for 10 '[ -s claim.rc ]'
  [ "$(cat claim.rc)" = 0 ]
  handled_once out 20 wk
  [ "$(cut -d' ' -f1 out | grep -c '^wk2-')" -eq 20 ]
  [ "$(stat_of pending)" = 0 ]
}

@test "rb-claim --follow, SIGTERM: what was not written is released (no attempt charged), what was stays in flight" {
  # 300 lines of 1 kB into a pipe nobody reads: some 64 kB are written, the rest wait
  events 300 st 1000 | rb-publish -q
  (rb-claim -H fol --follow --batch 300 --max-in-flight 300 2>claim.err; echo $? >claim.rc) | sleep 120 &
  echo $! >>pids
  wait_for 20 '[ "$(stat_of processing)" -ge 150 ]'
  sleep 0.5
  claimed=$(stat_of processing)
  pkill -TERM -f 'rb-claim -H fol --follow --batch 300'
  wait_for 10 '[ -s claim.rc ]'
  [ "$(cat claim.rc)" = 0 ]
  written=$(stat_of processing)
  echo "claimed $claimed, written (still in flight) $written"
  [ "$written" -gt 0 ]
  [ "$written" -le 80 ]
  # the rest is claimable at once by another claimer, on its first attempt
  # (but for the lanes and keys of what is still in flight)
  rb-claim -H fol --batch 1000 >again
  echo "claimed again: $(wc -l <again)"
  [ "$(wc -l <again)" -ge 100 ]
  [ "$(( $(wc -l <again) + written ))" -le 300 ]
  [ "$(jq -r .attempt again | sort -u)" = 1 ]
}

@test "rb-claim --follow: its backend terminated while it waits: exits 75 at once; its lines keep their lease and complete" {
  pg_only
  local url n
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rbfolcut" ;; *) url="$RELAYBUS_URL?application_name=rbfolcut" ;; esac
  events 4 tc | rb-publish -q
  (rc=0; rb-claim --db "$url" -H fol --follow --lease 30s 2>claim.err || rc=$?; echo $rc >claim.rc) >lines &
  echo $! >>pids
  wait_for 10 '[ "$(wc -l <lines)" = 4 ]'
  # idle, all four written: the cut comes while it waits
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'rbfolcut'"' AND state = '"'idle'"'")" -ge 1 ]'
  n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'rbfolcut'")
  [ "$n" -ge 1 ]
  wait_for 10 '[ -s claim.rc ]'
  cat claim.err
  [ "$(cat claim.rc)" = 75 ]
  grep -q '^rb-claim: .*connection lost' claim.err
  [ "$(wc -l <claim.err)" -le 3 ]
  # what it wrote is still its own until the lease ends: no other claimer
  # takes it, even once a cut lease would have ended, and rb-complete completes it
  rb-claim -q -H fol >/dev/null || true
  sleep 2
  run rb-claim -H fol
  [ "$status" -eq 1 ]
  while IFS= read -r l; do printf '%s\n' "${l%\}},\"ok\":true}"; done <lines | rb-complete -o >done
  [ "$(grep -c '"completed"' done)" = 4 ]
  [ "$(stat_of pending)" = 0 ]
}

@test "rb-claim --follow: the server gone for good while lines are out: exits 75 and warns, once, that their lanes may be taken over" {
  pg_only
  # a server of this test's own, stopped under it
  OWN_PG=$(mktemp -d /tmp/rb-follow-pg.XXXXXX)
  chmod 755 "$OWN_PG"
  local url
  url=$("$RB_SRCDIR/scripts/pg-tmp" start "$OWN_PG" 3>&-)
  RELAYBUS_URL=$url rb-setup -q -s 'fol:*'
  events 4 gone | RELAYBUS_URL=$url rb-publish -q
  (rc=0; rb-claim --db "$url" -H fol --follow --lease 30s 2>claim.err || rc=$?; echo $rc >claim.rc) >lines &
  echo $! >>pids
  wait_for 10 '[ "$(wc -l <lines)" = 4 ]'
  "$RB_SRCDIR/scripts/pg-tmp" stop "$OWN_PG" >/dev/null 2>&1 3>&-
  wait_for 10 '[ -s claim.rc ]'
  cat claim.err
  [ "$(cat claim.rc)" = 75 ]
  [ "$(grep -c 'could not reconnect to keep the lanes of the 4 lines written' claim.err)" = 1 ]
  [ "$(wc -l <claim.err)" -le 4 ]
}

@test "rb-claim --follow | head -n 3: exits 74 and releases all that the reader did not take" {
  events 300 bp 1000 | rb-publish -q
  run timeout 30 bash -c 'rb-claim -H fol --follow --batch 300 --max-in-flight 300 | head -n 3 >/dev/null
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"
  [[ "$output" == *"status 74 0"* ]]
  # in flight: only what head read (one read of a few kB), not what was
  # left in the pipe or never written
  left=$(stat_of processing)
  echo "in flight after: $left"
  [ "$left" -ge 3 ]
  [ "$left" -le 20 ]
  rb-claim -H fol --batch 1000 >again
  echo "claimed again: $(wc -l <again)"
  [ "$(wc -l <again)" -ge 100 ]
  [ "$(jq -r .attempt again | sort -u)" = 1 ]
}

@test "rb-claim --follow --max-in-flight 5: a slow handler never has more than 5 outstanding" {
  events 40 cap | rb-publish -q
  cat >slow <<'EOF'
#!/bin/bash
# per line: how many are claimed and not completed, then the answer
while IFS= read -r l; do
  rb-admin stats --handler fol | jq -r 'select(.handler == "fol") | .processing' >>seen
  sleep 0.05
  printf '%s\n' "${l%\}},\"ok\":true}"
done
EOF
  chmod +x slow
  run timeout 120 bash -c 'rb-claim -H fol --follow --drain --max-in-flight 5 --batch 100 | ./slow | rb-complete -o >done
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"
  [[ "$output" == *"status 0 0 0"* ]]
  [ "$(grep -c '"completed"' done)" -eq 40 ]
  echo "outstanding seen: $(sort -n seen | uniq -c | tr '\n' ' ')"
  [ "$(sort -n seen | tail -n 1)" -le 5 ]
  [ "$(sort -n seen | tail -n 1)" -ge 2 ]
  [ "$(stat_of pending)" = 0 ]
}

@test "rb-claim --follow: a handler slower than --lease keeps its lanes (renewed), no second claimer takes them" {
  events 4 rn | rb-publish -q
  cat >slow <<'EOF'
#!/bin/bash
while IFS= read -r l; do
  sleep 1.2
  printf '%s\n' "${l%\}},\"ok\":true}"
done
EOF
  chmod +x slow
  (timeout 60 rb-claim -H fol --follow --drain --lease 1s; echo $? >claim.rc) | ./slow | rb-complete -o >done &
  echo $! >>pids
  wait_for 10 '[ "$(stat_of processing)" = 4 ]'
  # the handler takes ~5 s for the four, 5 leases: another claimer finds nothing all along
  end=$(( $(date +%s) + 4 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    run rb-claim -H fol --batch 10 --lease 1s
    [ "$status" -eq 1 ] || { echo "a second claimer took: $output"; false; }
    sleep 0.3
  done
  wait_for 20 '[ -s claim.rc ]'
  [ "$(cat claim.rc)" = 0 ]
  wait_for 10 '[ "$(grep -c "\"completed\"" done)" = 4 ]'
  [ "$(grep -c '"lost"' done)" -eq 0 ]
  [ "$(stat_of pending)" = 0 ]
}

@test "rb-complete completes lines as they arrive (in windows), before its input ends" {
  events 3 cw | rb-publish -q
  rb-claim -H fol --batch 10 >claimed
  [ "$(wc -l <claimed)" -eq 3 ]
  mkfifo in
  rb-complete -o <in >done &
  echo $! >>pids
  exec 7>in
  jq -c '. + {ok: true}' claimed >&7
  # the input stays open: completed within the window, not at its end
  wait_for 10 '[ "$(stat_of processing)" = 0 ]'
  [ "$(stat_of pending)" = 0 ]
  exec 7>&-
  wait_for 10 '[ "$(grep -c "\"completed\"" done)" = 3 ]'
}

@test "rb-claim: --max-in-flight and --drain need --follow, --wait does not go with it (64)" {
  run rb-claim -H fol --max-in-flight 5
  [ "$status" -eq 64 ]
  [[ "$output" == *"--max-in-flight: only with --follow"* ]]
  run rb-claim -H fol --drain
  [ "$status" -eq 64 ]
  run rb-claim -H fol --follow --wait 1s
  [ "$status" -eq 64 ]
  run rb-claim -H fol --follow --max-in-flight 0
  [ "$status" -eq 64 ]
}

# ./chainh OUT [fail:I|break:I]: a handler that keeps the contract of
# rb-claim --follow --chain (rb-claim(1)): each line run is logged to OUT as
# "event_id key sequence attempt" and answered "ok":true; fail:I fails the
# first attempt of the event with payload i = I, and then answers the later
# lines of its key "release":true (not run, not logged) until the key comes
# round again (a sequence not above the highest failed or released).
# break:I fails the same way but runs the rest of the key anyway (the
# contract broken).
chain_handler() {
  cat >chainh <<'EOF'
#!/bin/sh
out=$1 mode=${2:-ok}
set --
if awk -W version 2>&1 | grep -q mawk; then set -- -W interactive; fi
exec awk "$@" -v out="$out" -v mode="$mode" '
function field(re, len) {
  if (match($0, re)) return substr($0, RSTART + len, RLENGTH - len)
  return "-"
}
{
  ev = field("\"event_id\":\"[^\"]*", 12)
  key = field("\"key\":\"[^\"]*", 7)
  seq = field("\"sequence\":[0-9]+", 11) + 0
  att = field("\"attempt\":[0-9]+", 10)
  i = field("\"i\":[0-9]+", 4)
  line = $0
  if (key != "-" && (key in held)) {
    if (seq > held[key]) {
      held[key] = seq
      sub(/}$/, ",\"release\":true}", line)
      print line
      fflush()
      next
    }
    delete held[key]
  }
  print ev, key, seq, att >> out
  fflush(out)
  if (mode ~ /^(fail|break):/ && i == substr(mode, index(mode, ":") + 1) && att == 1) {
    if (mode ~ /^fail:/) held[key] = seq
    sub(/}$/, ",\"ok\":false,\"error\":\"first attempt\",\"retry_ms\":0}", line)
  } else
    sub(/}$/, ",\"ok\":true}", line)
  print line
  fflush()
}'
EOF
  chmod +x chainh
}

# N keyed events PREFIX-1..N over K keys (key k(i mod K)), for handler fol
keyed_events() {  # n k prefix
  awk -v n="$1" -v k="$2" -v p="$3" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "{\"id\":\"%s-%d\",\"name\":\"fol.a\",\"key\":\"k%d\",\"payload\":{\"i\":%d}}\n", p, i, i % k, i
  }'
}

# each key's runs in OUT ("event key sequence attempt") in sequence order
in_key_order() {  # out
  awk '$2 != "-" { if (($2 in last) && $3 + 0 < last[$2]) { print "out of order: " $0; bad = 1 } last[$2] = $3 + 0 }
    END { exit bad }' "$1"
}

@test "rb-claim --follow --chain 8: a key's next deliveries come with its head; every event once, each key in order" {
  keyed_events 60 3 ch | rb-publish -q
  chain_handler
  run timeout 60 bash -c 'rb-claim -vv -H fol --follow --drain --chain 8 --batch 100 2>claim.err | ./chainh out |
    rb-complete -o >done 2>complete.err
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"; cat complete.err
  [[ "$output" == *"status 0 0 0"* ]]
  handled_once out 60 ch
  in_key_order out
  [ "$(grep -c '"completed"' done)" -eq 60 ]
  # the first claim took up to 8 of each of the 3 keys, not only their heads
  first=$(grep -m1 -o 'claimed [0-9]* deliveries' claim.err | cut -d' ' -f2)
  echo "first claim: $first"
  [ "$first" -eq 24 ]
  [ "$(awk '$4 != 1' out | wc -l)" -eq 0 ]
  ! grep -q 'order violation' complete.err
  [ "$(stat_of pending)" = 0 ]
  [ "$(stat_of processing)" = 0 ]
}

@test "rb-claim --follow --chain: a keyed line fails, the rest of its key come back released, attempts unchanged" {
  # key k1: 1, 4, 7, ... 28; i = 4 fails on its first attempt
  keyed_events 30 3 rl | rb-publish -q
  chain_handler
  run timeout 60 bash -c 'rb-claim -H fol --follow --drain --chain 8 --batch 100 | ./chainh out fail:4 |
    rb-complete -o >done 2>complete.err
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"; cat complete.err
  [[ "$output" == *"status 0 0 0"* ]]
  # the chain behind it (7 .. 22 came in the same claim) answered "release"
  released=$(grep -c '"released"' done)
  echo "released: $released"
  [ "$released" -ge 1 ]
  [ "$(grep '"released"' done | jq -r .event_id | sed 's/^rl-//' | awk '($1 - 1) % 3 != 0 || $1 <= 4' | wc -l)" -eq 0 ]
  # rl-4 ran twice (attempt 1 failed, attempt 2), every other event once, on its first attempt
  [ "$(grep -c '^rl-4 ' out)" -eq 2 ]
  [ "$(grep '^rl-4 ' out | cut -d' ' -f4 | tr '\n' ' ')" = "1 2 " ]
  [ "$(grep -v '^rl-4 ' out | awk '$4 != 1' | wc -l)" -eq 0 ]
  [ "$(cut -d' ' -f1 out | sort -u | wc -l)" -eq 30 ]
  # and k1's runs in order: 1, 4 (failed), 4, 7, ...
  in_key_order out
  [ "$(awk '$2 == "k1" { printf "%s ", $1 }' out | cut -d' ' -f1-4)" = "rl-1 rl-4 rl-4 rl-7" ]
  [ "$(grep -c '"completed"' done)" -eq 30 ]
  ! grep -q 'order violation' complete.err
  [ "$(stat_of pending)" = 0 ]
  [ "$(stat_of dead)" = 0 ]
}

@test "rb-complete: a key's result after its failure that is not a release is an order violation (stderr)" {
  keyed_events 30 3 ov | rb-publish -q
  chain_handler
  run timeout 60 bash -c 'rb-claim -H fol --follow --drain --chain 8 --batch 100 | ./chainh out break:4 |
    rb-complete -o >done 2>complete.err
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"; cat complete.err
  [[ "$output" == *"status 0 0 0"* ]]
  grep -q 'order violation: ov-7 (key k1, sequence 3) was answered after ov-4 of its key failed' complete.err
  grep -q 'order violations: results of a key after its failure' complete.err
  # only key k1's followers of the claim, no other key
  [ "$(grep 'order violation: ' complete.err | grep -vc '(key k1,')" -eq 0 ]
}

@test "rb-claim --follow --chain, kill -9 of the pipeline mid-stream: after the lease every event runs, each key replays in order" {
  keyed_events 200 5 kl | rb-publish -q
  # a slow handler: logs a line ("event key sequence attempt"), then answers it
  cat >slow <<'EOF'
#!/bin/bash
echo $$ >slow.pid
while IFS= read -r l; do
  sleep 0.02
  printf '%s\n' "$l" | ./chainh out1 >/dev/null
  printf '%s\n' "${l%\}},\"ok\":true}"
done
EOF
  chmod +x slow
  chain_handler
  (rb-claim -H fol --follow --chain 8 --batch 20 --max-in-flight 40 --lease 2s & echo $! >claim.pid; wait) |
    ./slow | rb-complete -o >done1 &
  pl=$!
  echo $pl >>pids
  wait_for 20 '[ -s out1 ] && [ "$(wc -l <out1)" -ge 30 ]'
  # the claimer and the handler die at once: what was in the pipe, or run
  # and not answered, stays in flight under the dead one's lease
  kill -9 "$(cat claim.pid)" "$(cat slow.pid)"
  wait "$pl" || true
  completed1=$(grep -c '"completed"' done1 || true)
  echo "before the kill: $(wc -l <out1) run, $completed1 completed"
  [ "$completed1" -lt 200 ]
  # after its lease (--drain would find nothing due before: the lanes are
  # the dead one's until then), a second pipeline takes the lanes over
  sleep 2.5
  run timeout 60 bash -c 'rb-claim -H fol --follow --drain --chain 8 --batch 100 --lease 2s | ./chainh out2 |
    rb-complete -o >done2 2>complete.err
    echo "status ${PIPESTATUS[*]}"'
  echo "$output"
  [[ "$output" == *"status 0 0 0"* ]]
  cat out1 out2 >out
  # every event ran, and was completed once
  [ "$(cut -d' ' -f1 out | sort -u | grep -c '^kl-')" -eq 200 ]
  [ "$(( completed1 + $(grep -c '"completed"' done2) ))" -eq 200 ]
  # the takeover charged what was in flight: runs on a second attempt
  echo "second attempts: $(awk '$4 >= 2' out2 | wc -l)"
  [ "$(awk '$4 >= 2' out2 | wc -l)" -ge 1 ]
  # per key: each pipeline's runs in sequence order, the first runs too,
  # and the second starts at the key's first delivery not completed before
  for f in out1 out2; do in_key_order "$f"; done
  awk '!seen[$1]++' out >firsts
  in_key_order firsts
  jq -r 'select(.outcome == "completed") | .event_id' done1 >completed1
  awk 'FILENAME == "completed1" { c[$1] = 1; next }
    FILENAME == "out1" { if ($1 in c && $3 + 0 > max[$2]) max[$2] = $3 + 0; next }
    !($2 in first) { first[$2] = $3 + 0; if (first[$2] <= max[$2]) { print "key " $2 " started again at " $3 " after " max[$2] " completed"; bad = 1 } }
    END { exit bad }' completed1 out1 out2
  [ "$(stat_of pending)" = 0 ]
  [ "$(stat_of processing)" = 0 ]
  [ "$(stat_of dead)" = 0 ]
}

@test "rb-claim: --chain needs --follow and is 1 to 1000 (64)" {
  run rb-claim -H fol --chain 8
  [ "$status" -eq 64 ]
  [[ "$output" == *"--chain: only with --follow"* ]]
  run rb-claim -H fol --follow --chain 0
  [ "$status" -eq 64 ]
  run rb-claim -H fol --follow --chain 1001
  [ "$status" -eq 64 ]
}
