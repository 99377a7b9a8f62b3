#!/usr/bin/env bats
# rb-dispatch: real processes against a real PostgreSQL.  Each test has
# its own schema and handler name; the handlers in tests/bin
# record "event_id key seq attempt" per delivery they ran.

load test_helper

# each test has its own schema (RB_SCHEMA names the test's process)
setup() { fresh_schema; }

teardown() {
  kill_pids_drop_schema
  if [ -n "${RESTART_DIR:-}" ]; then
    "$RB_SRCDIR/scripts/pg-tmp" stop "$RESTART_DIR" >/dev/null 2>&1 3>&- || true
    rm -rf "$RESTART_DIR"
  fi
}

# N events for HANDLER with ids PREFIX1..N: odd ones keyed (KEYS keys), even ones unkeyed.
events() {  # n prefix handler [keys]
  awk -v n="$1" -v p="$2" -v h="$3" -v keys="${4:-0}" 'BEGIN {
    for (i = 1; i <= n; i++) {
      if (keys > 0 && i % 2 == 1)
        printf "{\"id\":\"%s%d\",\"name\":\"t\",\"key\":\"%sk%d\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, p, i % keys, i, h
      else
        printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i, h
    }
  }'
}

publish() { events "$@" | rb-publish -q; }

lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
pending() { q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$1'"; }
# keyed records whose payload seq is not above the previous one of their key
order_violations() {  # file [strict]
  awk -v strict="${2:-1}" '$2 != "-" {
      if (($2 in last) && (strict ? $3 + 0 <= last[$2] : $3 + 0 < last[$2])) bad++
      last[$2] = $3 + 0
    } END { print bad + 0 }' "$1"
}

@test "usage: a handler and exactly one handler form are required" {
  run -64 --separate-stderr rb-dispatch --exec true
  [ "${stderr_lines[0]}" = "rb-dispatch: --handler is required" ]
  [ "${stderr_lines[2]}" = "Try 'rb-dispatch --help' for more information." ]
  run -64 --separate-stderr rb-dispatch -H h
  [ "${stderr_lines[0]}" = "rb-dispatch: a handler is required: --exec, --pipe or --sql" ]
  run -64 --separate-stderr rb-dispatch -H h --exec true --pipe cat
  [ "${stderr_lines[0]}" = "rb-dispatch: give one of --exec, --pipe and --sql" ]
  run -64 --separate-stderr rb-dispatch -H h --exec true --backoff 1s,2s,x
  [ "${stderr_lines[0]}" = "rb-dispatch: --backoff: factor 'x' is not a number from 1 to 100" ]
  run -64 --separate-stderr rb-dispatch -H h --exec true --concurrency 0
  run -0 rb-dispatch --help
  [[ "$output" == *"--stats-every DUR"* ]]
}

@test "defaults: 3200 in flight, claims of 800, chains of 32 with --pipe; 10, 100, 1 with --exec; the chain fits the concurrency" {
  need_pg
  run -0 --separate-stderr rb-dispatch -v -H dc --pipe cat --drain
  [[ "$stderr" == *"(concurrency 3200, batch 800, chain 32)"* ]]
  run -0 --separate-stderr rb-dispatch -v -H dc --exec true --drain
  [[ "$stderr" == *"(concurrency 10, batch 100, chain 1)"* ]]
  # an eighth of --concurrency, at most 32 with --pipe and 8 otherwise
  run -0 --separate-stderr rb-dispatch -v -H dc --pipe cat --concurrency 32 --drain
  [[ "$stderr" == *"(concurrency 32, batch 800, chain 4)"* ]]
  run -0 --separate-stderr rb-dispatch -v -H dc --pipe cat --concurrency 7 --drain
  [[ "$stderr" == *"(concurrency 7, batch 800, chain 1)"* ]]
  run -0 --separate-stderr rb-dispatch -v -H dc --exec true --concurrency 200 --drain
  [[ "$stderr" == *"(concurrency 200, batch 100, chain 8)"* ]]
  run -0 --separate-stderr rb-dispatch -v -H dc --pipe cat --concurrency 7 --batch 3 --chain 2 --drain
  [[ "$stderr" == *"(concurrency 7, batch 3, chain 2)"* ]]
  # and 3200 really go out at once, in claims of 800: one co-process holds them
  # all before answering
  publish 4000 dc dc
  run -0 --separate-stderr timeout 60 rb-dispatch -vv -H dc --drain \
    --pipe "sh -c 'head -n 3200 >$BATS_TEST_TMPDIR/first; cat $BATS_TEST_TMPDIR/first; cat'"
  [ "$(wc -l <"$BATS_TEST_TMPDIR/first")" = 3200 ]
  [[ "$stderr" == *"claimed 800 (asked 800)"* ]]
  [[ "$stderr" != *"(asked 801)"* && "$stderr" != *"claimed 801"* ]]
  [ "$(pending dc)" = 0 ]
}

@test "three dispatchers drain 20,000 keyed and unkeyed events: all ran once, key order kept" {
  need_pg
  local out=$BATS_TEST_TMPDIR/big.out
  publish 20000 b big 40
  [ "$(pending big)" = 20000 ]
  local p1 p2 p3
  rb-dispatch -H big --pipe "rb-test-pipe $out" --drain -c 100 -b 100 2>"$BATS_TEST_TMPDIR/d1.err" 3>&- & p1=$!
  rb-dispatch -H big --pipe "rb-test-pipe $out" --drain -c 100 -b 100 2>"$BATS_TEST_TMPDIR/d2.err" 3>&- & p2=$!
  rb-dispatch -H big --pipe "rb-test-pipe $out" --drain -c 100 -b 100 2>"$BATS_TEST_TMPDIR/d3.err" 3>&- & p3=$!
  PIDS="$p1 $p2 $p3"
  wait "$p1"; wait "$p2"; wait "$p3"
  [ "$(pending big)" = 0 ]
  [ "$(lines "$out")" = 20000 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 20000 ]
  [ "$(order_violations "$out")" = 0 ]
  # each dispatcher did a share of the work, and every lane was handed back
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'big' AND lease_owner IS NOT NULL")" = 0 ]
}

@test "--chain: a key's next deliveries come with its head and run in order; a failure sends the rest back" {
  need_pg
  local out=$BATS_TEST_TMPDIR/c.out one=$BATS_TEST_TMPDIR/c1.out
  seq 1 10 | awk '{ printf "{\"id\":\"c%d\",\"name\":\"t\",\"key\":\"ck\",\"payload\":{\"i\":%d},\"handlers\":[\"chain\"]}\n", $1, $1 }' \
    | rb-publish -q
  run -0 --separate-stderr rb-dispatch -vv -H chain --pipe "rb-test-pipe $out fail-once:5" --chain 8 --backoff 0 --drain
  [ "$(pending chain)" = 0 ]
  # the first claim brought 8 of the key: they ran one after the other; 5
  # failed, so 6-8 went back unrun (no attempt charged) and came again behind its retry
  [[ "$stderr" == *"claimed 8 (asked"* ]]
  [ "$(awk '{ printf "%s:%s ", $3, $4 }' "$out")" = "1:1 2:1 3:1 4:1 5:1 5:2 6:1 7:1 8:1 9:1 10:1 " ]
  [[ "$stderr" == *"c5: attempt 1/10 failed: fail-once"* ]]
  # --chain 1: a claim takes only the head of a key
  seq 1 3 | awk '{ printf "{\"id\":\"o%d\",\"name\":\"t\",\"key\":\"ok\",\"payload\":{\"i\":%d},\"handlers\":[\"chain1\"]}\n", $1, $1 }' \
    | rb-publish -q
  run -0 --separate-stderr rb-dispatch -vv -H chain1 --pipe "rb-test-pipe $one" --chain 1 --drain
  [[ "$stderr" == *"claimed 1 (asked"* ]]
  [[ "$stderr" != *"claimed 2 (asked"* && "$stderr" != *"claimed 3 (asked"* ]]
  [ "$(awk '{ printf "%s ", $3 }' "$one")" = "1 2 3 " ]
}

@test "handlers get the payload and headers as stored: compact, numbers as spelled, big ones too" {
  need_pg
  local out=$BATS_TEST_TMPDIR/line.out
  # published from SQL: rb-publish itself refuses integers beyond 64 bits
  q "SELECT count(*) FROM relaybus_publish('t', '{\"price\": 1.50, \"big\": 12345678901234567890123, \"s\": \"a\\\"b\\n\\u00e9\"}',
       NULL, 'p1', '{\"h\": [1, 2]}', NULL, NULL, ARRAY['lit'])" >/dev/null
  run -0 rb-dispatch -q -H lit --exec "cat >>$out" --drain
  [ "$(wc -l <"$out")" = 1 ]
  [[ "$(cat "$out")" == '{"event_id":"p1","handler":"lit","name":"t","key":null,"payload":{"s":"a\"b\né","big":12345678901234567890123,"price":1.50},"headers":{"h":[1,2]},"attempt":1,"lease":"'* ]]
  jq -e '.delivery_id and .lane >= 0 and .sequence == null and (.created_at | test("Z$"))' "$out"
}

@test "kill -9 mid-batch: after the lease another dispatcher runs that work, attempts charged" {
  need_pg
  local a=$BATS_TEST_TMPDIR/a.out b=$BATS_TEST_TMPDIR/b.out
  publish 200 k kill9
  rb-dispatch -H kill9 --pipe "rb-test-pipe $a noreply" -c 20 --lease 2s 2>/dev/null 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$a")" -ge 20 ]'
  kill -9 "$PIDS"
  [ "$(pending kill9)" = 200 ]
  sleep 2.2
  run -0 rb-dispatch -H kill9 --pipe "rb-test-pipe $b" --drain -c 20
  [ "$(pending kill9)" = 0 ]
  [ "$(cut -d' ' -f1 "$b" | sort -u | wc -l)" = 200 ]
  # what the dead one had in flight ran on a second attempt, the rest on a first
  [ "$(awk 'NR == FNR { a[$1] = 1; next } ($1 in a) != ($4 == 2) || ($4 != 1 && $4 != 2)' "$a" "$b" | wc -l)" = 0 ]
  [ "$(awk '$4 == 2' "$b" | wc -l)" = "$(lines "$a")" ]
}

@test "kill -9 of a dispatcher: its --exec and --pipe handlers die with it, children too, not to run on beside the takeover" {
  need_pg
  local h=$BATS_TEST_TMPDIR/h pids=$BATS_TEST_TMPDIR/pids d pid
  # a handler that runs a child of its own for long and says the child's pid
  printf '#!/bin/sh\nsleep 600 &\necho $! >>%s\nwait\n' "$pids" >"$h"
  chmod +x "$h"
  publish 1 e orphan
  # killed alone, and with its process group (setsid: an operator's or a
  # supervisor's kill -9 -- -PGID, which reaches the guard too unless it
  # has a group of its own; the handlers' groups are their own)
  for kind in --exec --pipe; do
    for how in process group; do
      : >"$pids"
      if [ "$how" = group ]; then
        setsid rb-dispatch -H orphan "$kind" "$h" 2>/dev/null 3>&- & d=$!
      else
        rb-dispatch -H orphan "$kind" "$h" 2>/dev/null 3>&- & d=$!
      fi
      PIDS="${PIDS:-} $d"
      wait_for 20 '[ -s "$pids" ]'
      pid=$(head -1 "$pids")
      PIDS="$PIDS $pid"
      running "$pid"
      if [ "$how" = group ]; then kill -9 -- "-$d"; else kill -9 "$d"; fi
      # gone within seconds, not when its 600 s are over
      wait_for 10 '! running "$pid"' || { echo "$kind, kill -9 of its $how: the handler's child ($pid) runs on"; false; }
    done
  done
  # the delivery is still there, for the takeover
  [ "$(pending orphan)" = 1 ]
}

@test "the handlers' guard keeps nothing of rb-dispatch's open: /dev/null on 0-2 and its pipe" {
  need_pg
  local d g fds
  publish 1 e guardfd
  rb-dispatch -q -H guardfd --pipe "cat >/dev/null" 2>/dev/null 3>&- & d=$!
  PIDS="${PIDS:-} $d"
  # the guard: rb-dispatch's child that runs no program of its own
  wait_for 10 '[ -n "$(pgrep -P "$d" -x rb-dispatch)" ]'
  g=$(pgrep -P "$d" -x rb-dispatch)
  fds=$(cd "/proc/$g/fd" && for f in *; do printf '%s:%s\n' "$f" "$(readlink "$f")"; done)
  echo "$fds"
  # the PostgreSQL connections, the LISTEN socket, the handler's pipes
  # and whatever rb-dispatch inherited are closed there: a reader of
  # rb-dispatch's output sees the end when rb-dispatch ends
  [ "$(echo "$fds" | grep -c ':/dev/null$')" = 3 ]
  [ "$(echo "$fds" | grep -c ':pipe:')" = 1 ]
  [ "$(echo "$fds" | wc -l)" = 4 ]
}

# Run rb-dispatch (ARGS...) again and again while event EV of HANDLER is
# pending, at most 60 times: a dispatcher whose handler kills it, restarted.
restart_while_pending() {  # handler ev args...
  local h=$1 ev=$2 i=0; shift 2
  while [ "$(q "SELECT status FROM relaybus_deliveries WHERE handler = '$h' AND event_id = '$ev'")" = pending ] && [ $i -lt 60 ]; do
    (rb-dispatch -q -H "$h" --lease 400ms --max-attempts 3 --poll 50ms --drain "$@" 3>&- || true) 2>/dev/null
    i=$((i + 1))
    sleep 0.1
  done
}

@test "restarted under the same --owner, a dispatcher whose handler kills it: the delivery still ends dead" {
  need_pg
  local out=$BATS_TEST_TMPDIR/loop.out
  publish 1 p crashloop
  # each restart is a new holder: it waits for the dead one's lease, then takes the lane over
  restart_while_pending crashloop p1 --owner w1 --exec "rb-test-exec $out crash-on:p1 || kill -9 \$PPID"
  [ "$(q "SELECT status || ' ' || attempts || ' ' || last_error FROM relaybus_deliveries WHERE handler = 'crashloop'")" = "dead 3 lease of w1 expired: attempt lost" ]
  # it ran on attempts 1, 2 and 3, and no more
  [ "$(awk '{ printf "%s ", $4 }' "$out")" = "1 2 3 " ]
}

@test "--chain: a head whose handler kills the dispatcher ends dead; its followers are charged only while they may have run" {
  need_pg
  local out=$BATS_TEST_TMPDIR/hc.out
  seq 1 4 | awk '{ printf "{\"id\":\"h%d\",\"name\":\"t\",\"key\":\"hk\",\"payload\":{\"i\":%d},\"handlers\":[\"headcrash\"]}\n", $1, $1 }' \
    | rb-publish -q
  # a new owner name each time (the default): each restart takes the lane over when the lease ends
  restart_while_pending headcrash h1 --chain 8 --max-attempts 5 --exec "rb-test-exec $out crash-on:h1 || kill -9 \$PPID"
  run -0 rb-dispatch -q -H headcrash --exec "rb-test-exec $out ok" --drain
  [ "$(q "SELECT status || ' ' || attempts FROM relaybus_deliveries WHERE handler = 'headcrash'")" = "dead 5" ]
  # every claim took h1 with h2-h4 behind it.  The first crash was h1's first
  # attempt, after which h2 starts at once: h2-h4 may have run, and were
  # charged.  From then on h1 was past its first attempt, so h2 would start
  # only once h1's completion committed: not charged again.  They ran on
  # their second attempt once h1 was buried.
  [ "$(awk '{ printf "%s:%s ", $1, $4 }' "$out")" = "h1:1 h1:2 h1:3 h1:4 h1:5 h2:2 h3:2 h4:2 " ]
}

@test "--chain: a follower of a retried delivery starts only once that one's completion committed" {
  need_pg
  local out=$BATS_TEST_TMPDIR/fc.out h=$BATS_TEST_TMPDIR/fc.sh
  seq 1 3 | awk '{ printf "{\"id\":\"f%d\",\"name\":\"t\",\"key\":\"fk\",\"payload\":{\"i\":%d},\"handlers\":[\"follow\"]}\n", $1, $1 }' \
    | rb-publish -q
  # the handler records its attempt and how many deliveries of its key before it are still
  # there; f1 fails on its first attempt
  cat >"$h" <<'EOF'
#!/bin/sh
line=$(cat)
ev=$(printf '%s\n' "$line" | jq -r .event_id)
seq=$(printf '%s\n' "$line" | jq -r .sequence)
att=$(printf '%s\n' "$line" | jq -r .attempt)
n=$(psql "$RELAYBUS_URL" -X -A -t -q -c "SELECT count(*) FROM \"$RELAYBUS_SCHEMA\".relaybus_deliveries WHERE handler = 'follow' AND key = 'fk' AND sequence < $seq")
echo "$ev $att $n" >>"$1"
[ "$ev $att" != "f1 1" ]
EOF
  chmod +x "$h"
  # (completions wait for a --window of 1 s: a follower started before sees its predecessor;
  # the handler connects with the test's URL, which handlers do not inherit unless named)
  RELAYBUS_PASS_ENV=RELAYBUS_URL run -0 rb-dispatch -q -H follow --exec "$h $out" --chain 8 --window 1s \
    --backoff 0 --drain
  # f2 came behind f1's second attempt: it started once f1 was deleted.  (f3 came
  # behind f2's first attempt: it may start as soon as f2 succeeded.)
  [ "$(awk '{ printf "%s:%s:%s ", $1, $2, $3 }' "$out" | cut -d' ' -f1-3)" = "f1:1:0 f1:2:0 f2:1:0" ]
  [ "$(awk '$1 == "f3" { print $2 }' "$out")" = 1 ]
}

@test "requeue of a dead head while the next of its key runs: it goes behind its key, never beside" {
  need_pg
  local log=$BATS_TEST_TMPDIR/rq.log h=$BATS_TEST_TMPDIR/rq.sh
  seq 1 3 | awk '{ printf "{\"id\":\"r%d\",\"name\":\"t\",\"key\":\"rk\",\"payload\":{\"i\":%d},\"handlers\":[\"rq\"]}\n", $1, $1 }' \
    | rb-publish -q
  # with nothing of its key in flight, a requeued delivery keeps its place
  rb-admin bury r1 >/dev/null
  rb-admin requeue r1 >/dev/null
  [ "$(q "SELECT string_agg(event_id || ':' || sequence, ' ' ORDER BY sequence) FROM relaybus_deliveries WHERE status = 'pending'")" = "r1:1 r2:2 r3:3" ]
  rb-admin bury r1 >/dev/null
  # (r2 runs until told: until r1 was requeued)
  printf '#!/bin/sh\nev=$(jq -r .event_id)\necho "start $ev" >>%s\n[ $ev != r2 ] || until [ -e %s.go ]; do sleep 0.05; done\nsleep 0.2\necho "end $ev" >>%s\n' \
    "$log" "$log" "$log" >"$h"
  chmod +x "$h"
  rb-dispatch -q -H rq --exec "$h" --poll 50ms --drain 2>"$BATS_TEST_TMPDIR/rq.err" 3>&- & PIDS=$!
  wait_for 10 'grep -q "start r2" "$log" 2>/dev/null'
  # r2 runs (r3 waits behind it): r1 comes back behind both
  run -0 rb-admin requeue r1
  [ "$(q "SELECT string_agg(event_id || ':' || sequence, ' ' ORDER BY sequence) FROM relaybus_deliveries WHERE status = 'pending'")" = "r2:2 r3:3 r1:4" ]
  # (time for the dispatcher's next claims, every --poll, to not take it)
  sleep 0.5
  : >"$log.go"
  wait "$PIDS"
  [ "$(tr '\n' ',' <"$log")" = "start r2,end r2,start r3,end r3,start r1,end r1," ]
  [ "$(pending rq)" = 0 ]
}

@test "a dispatcher under the name of a dead rb-claim does not renew its lanes: they expire and are taken over" {
  need_pg
  local out=$BATS_TEST_TMPDIR/ex.out x
  # two deliveries in two lanes
  q "SELECT 'x' || g FROM generate_series(1, 50) g WHERE relaybus_lane('x' || g) <> relaybus_lane('x1') LIMIT 1" |
    { read -r other; printf '{"id":"%s","name":"t","payload":{},"handlers":["ext"]}\n' x1 "$other"; } | rb-publish -q
  x=$(rb-claim -H ext --owner W --batch 1 --lease 1s | jq -r .event_id)
  # the rb-claim process is gone; a dispatcher of the same name takes the other one and
  # renews its own lanes while that runs (3 s), not the lane of the first
  rb-dispatch -q -H ext --owner W --exec "rb-test-exec $out sleep:3" --lease 1s --poll 100ms 2>/dev/null 3>&- & PIDS=$!
  wait_for 10 "grep -q '^$x ' '$out.start' 2>/dev/null"
  [ "$(grep "^$x " "$out.start")" = "$x - - 2" ]
  # taken over while the other one still ran
  [ "$(lines "$out")" = 0 ]
  kill -TERM "$PIDS"
  wait "$PIDS"
}

# A server of this test's own (RESTART_DIR, stopped by teardown), so that
# its restart does not break the test files running beside it: RELAYBUS_URL
# points there, the schema set up.
own_server() {
  drop_schema
  RESTART_DIR=$(mktemp -d /tmp/rb-restart.XXXXXX)
  chmod 755 "$RESTART_DIR"
  _test_pg_url=$("$RB_SRCDIR/scripts/pg-tmp" start "$RESTART_DIR" 3>&-)
  export RELAYBUS_URL=$_test_pg_url
  rb-setup
}

@test "a restart of PostgreSQL during a drain: the dispatchers reconnect and finish, nothing lost" {
  need_pg
  own_server
  local out=$BATS_TEST_TMPDIR/r.out p1 p2
  publish 1000 r restart 20
  rb-dispatch -H restart --exec "rb-test-exec $out ok" --drain -c 20 --lease 10s 2>"$BATS_TEST_TMPDIR/r1.err" 3>&- & p1=$!
  rb-dispatch -H restart --exec "rb-test-exec $out ok" --drain -c 20 --lease 10s 2>"$BATS_TEST_TMPDIR/r2.err" 3>&- & p2=$!
  PIDS="$p1 $p2"
  wait_for 30 '[ "$(lines "$out")" -ge 150 ]'
  # the new server must not hold the test's output open (bats waits for it)
  "$RB_SRCDIR/scripts/pg-tmp" restart "$RESTART_DIR" >/dev/null 2>&1 3>&-
  wait "$p1"
  wait "$p2"
  grep -q reconnected "$BATS_TEST_TMPDIR/r1.err"
  [ "$(pending restart)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 1000 ]
  [ "$(order_violations "$out" 0)" = 0 ]
}

@test "PostgreSQL stopped for 3 s under load with a backlog (--lease 30s): drained well before the lease would have let it, every event run" {
  need_pg
  own_server
  local out=$BATS_TEST_TMPDIR/o.out p1 p2 t_a n_a t_b n_b t_up t_end down rest expect
  publish 1200 o outage 20
  rb-dispatch -H outage --exec "rb-test-exec $out sleep:0.02" --drain -c 8 --lease 30s 2>"$BATS_TEST_TMPDIR/o1.err" 3>&- & p1=$!
  rb-dispatch -H outage --exec "rb-test-exec $out sleep:0.02" --drain -c 8 --lease 30s 2>"$BATS_TEST_TMPDIR/o2.err" 3>&- & p2=$!
  PIDS="$p1 $p2"
  # the drain's rate before the stop, on this machine as loaded as it is
  # now (issue 38: the time of a drain of --exec handlers is mostly process
  # creation, 2.5-11 times longer on a busy 2-core machine than on an idle one)
  wait_for 30 '[ "$(lines "$out")" -ge 50 ]'
  t_a=$(date +%s%3N) n_a=$(lines "$out")
  wait_for 60 '[ "$(lines "$out")" -ge 300 ]'
  t_b=$(date +%s%3N) n_b=$(lines "$out")
  # (the new server must not hold the test's output open: bats waits for it)
  "$RB_SRCDIR/scripts/pg-tmp" stop "$RESTART_DIR" >/dev/null 2>&1 3>&-
  down=$(lines "$out")
  sleep 3
  "$RB_SRCDIR/scripts/pg-tmp" start "$RESTART_DIR" >/dev/null 2>&1 3>&-
  t_up=$(date +%s%3N)
  wait "$p1"
  wait "$p2"
  t_end=$(date +%s%3N)
  rest=$((1200 - down))
  expect=$((rest * (t_b - t_a) / (n_b - n_a)))
  echo "# $down run before the stop, at $(((n_b - n_a) * 1000 / (t_b - t_a)))/s; the other $rest drained $((t_end - t_up)) ms after the server was up ($expect ms at the rate before the stop)" >&3
  # the leases the stop left (30 s) kept nothing waiting: a wait for them
  # would add 27-30 s to the time of the rest at the rate before the stop;
  # allowed: twice that time, and 10 s to reconnect
  [ $((t_end - t_up)) -lt $((2 * expect + 10000)) ]
  grep -q reconnected "$BATS_TEST_TMPDIR/o1.err"
  grep -q reconnected "$BATS_TEST_TMPDIR/o2.err"
  [ "$(pending outage)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 1200 ]
  [ "$(order_violations "$out" 0)" = 0 ]
}

@test "a server down for 8 s: rb-dispatch is back within about a second of it accepting connections (reconnect backoff at most 0.5 s)" {
  need_pg
  own_server
  local out=$BATS_TEST_TMPDIR/down.out t_up t_rec
  publish 2 down down
  rb-dispatch -H down --exec "rb-test-exec $out ok" 2>"$BATS_TEST_TMPDIR/down.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out")" -ge 2 ]'
  "$RB_SRCDIR/scripts/pg-tmp" stop "$RESTART_DIR" >/dev/null 2>&1 3>&-
  wait_for 10 'grep -q reconnecting "$BATS_TEST_TMPDIR/down.err"'
  sleep 8
  "$RB_SRCDIR/scripts/pg-tmp" start "$RESTART_DIR" >/dev/null 2>&1 3>&-
  t_up=$(date +%s%3N)
  wait_for 10 'grep -q reconnected "$BATS_TEST_TMPDIR/down.err"'
  t_rec=$(date +%s%3N)
  # what a connection costs on this machine now: a whole program run
  local c0 c1
  c0=$(date +%s%3N)
  rb-admin stats >/dev/null
  c1=$(date +%s%3N)
  echo "# reconnected $((t_rec - t_up)) ms after the server was up (a program's connection and query: $((c1 - c0)) ms)" >&3
  # (with the old 5 s cap the attempt after 8 s came 2-4 s late): within
  # the 0.5 s backoff, a second, and what three connections cost here
  [ $((t_rec - t_up)) -lt $((1500 + 3 * (c1 - c0))) ]
  # and it works there: one more event runs
  publish 1 down2 down
  wait_for 10 '[ "$(lines "$out")" -ge 3 ]'
}

# Drain N with -c 20 -b 10 (and args) while the backend that runs the
# statement starting with prefix is cut, three times: the dispatcher
# reconnects each time, and every delivery ran once, in key order.  Until
# the third reconnection the backlog is topped up with N more whenever it
# falls under N/2, so that the drain outlasts the cuts however fast it runs
# (a cut of an idle connection is only seen at its next statement, and a
# drain that ends first never reconnects: a fixed N that lasted long
# enough ended before the third cut once the completion got cheaper).
# Each cut waits for the reconnection of the one before: the
# dispatcher reconnects all its connections at once, so two cuts before it
# noticed the first (an idle connection whose last statement matches, then
# another) made one reconnection, not two (it failed so under ASan).
drain_cutting() {  # handler statement-prefix n [rb-dispatch args]
  local h=$1 like=$2 n0=$3 out=$BATS_TEST_TMPDIR/$1.out cut=0 n url before total topup
  local err=$BATS_TEST_TMPDIR/$1.err more=$BATS_TEST_TMPDIR/$1.more stop=$BATS_TEST_TMPDIR/$1.stop
  shift 3
  # only this dispatcher's connections: the other test files run beside
  # this one, against the same server (rb-complete sends the same statement)
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rb$h" ;; *) url="$RELAYBUS_URL?application_name=rb$h" ;; esac
  publish "$n0" "$h" "$h" 20
  rb-dispatch --db "$url" -H "$h" --pipe "rb-test-pipe $out" --drain -c 20 -b 10 "$@" \
    2>"$err" 3>&- & PIDS=$!
  : >"$more"
  (
    r=0
    while [ ! -e "$stop" ]; do
      if [ "$(pending "$h")" -lt $((n0 / 2)) ]; then
        r=$((r + 1))
        publish "$n0" "$h$r-" "$h" 20
        echo "$n0" >>"$more"
      fi
      sleep 0.05
    done
  ) 3>&- & topup=$!
  PIDS="$PIDS $topup"
  while kill -0 "${PIDS%% *}" 2>/dev/null && [ "$(grep -c reconnected "$err")" -lt 3 ]; do
    before=$(grep -c reconnected "$err" || true)
    n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
           WHERE application_name = 'rb$h' AND query LIKE '$like%' AND pid <> pg_backend_pid()")
    cut=$((cut + n))
    if [ "$n" -gt 0 ]; then
      wait_for 60 '! kill -0 "${PIDS%% *}" 2>/dev/null || [ "$(grep -c reconnected "$err")" -gt "$before" ]' || true
    fi
    sleep 0.2
  done
  touch "$stop"
  wait "$topup"
  wait "${PIDS%% *}"
  total=$((n0 + $(awk '{ s += $1 } END { print s + 0 }' "$more")))
  echo "cuts $cut, $total events ($(wc -l <"$more") top-ups)" >&3
  [ "$cut" -ge 3 ]
  [ "$(grep -c reconnected "$err")" -ge 3 ]
  [ "$(pending "$h")" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = "$total" ]
  [ "$(wc -l <"$out")" = "$total" ]
  [ "$(order_violations "$out")" = 0 ]
}

@test "the connection that reads what was claimed is cut, again and again: it reconnects, nothing lost or run twice" {
  need_pg
  # the second connection is the one whose statement reads the claimed rows
  drain_cutting fetchcut 'SELECT p.o, e.name' 6000
}

@test "RELAYBUS_PG_CONNECTIONS=3: the connection that completes is cut, again and again: it reconnects, nothing lost or run twice" {
  need_pg
  # the third connection is the one whose statement deletes what completed
  RELAYBUS_PG_CONNECTIONS=3 drain_cutting compcut 'WITH r AS (SELECT * FROM unnest(' 9000
}

@test "RELAYBUS_PG_CONNECTIONS=3 --drain: a completion that commits beside a claim finding nothing does not end the drain early" {
  need_pg
  local out=$BATS_TEST_TMPDIR/o.out i left
  # one key's 320 deliveries run one after another, each one's completion
  # beside the next claim: a claim that passed over the key while the
  # completion that unblocked it committed made --drain exit with most of
  # them left, about one run in ten
  for i in $(seq 1 30); do
    awk -v r="$i" 'BEGIN { for (k = 1; k <= 320; k++)
      printf "{\"id\":\"o%d-%d\",\"name\":\"t\",\"key\":\"one%d\",\"payload\":{\"i\":%d},\"handlers\":[\"onekey\"]}\n", r, k, r, k }' |
      rb-publish -q
    RELAYBUS_PG_CONNECTIONS=3 run -0 rb-dispatch -H onekey --pipe "rb-test-pipe $out" --drain
    left=$(pending onekey)
    [ "$left" = 0 ] || { echo "run $i: --drain exited with $left left" >&2; false; }
  done
  [ "$(wc -l <"$out")" = 9600 ]
  [ "$(order_violations "$out")" = 0 ]
}

@test "the server's words outside an answer (the FATAL of a cut connection) go through the log: shown with -v, never raw" {
  need_pg
  local url n
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rbidle" ;; *) url="$RELAYBUS_URL?application_name=rbidle" ;; esac
  for v in "" -v; do
    rb-dispatch $v --db "$url" -H idlecut --pipe cat 2>"$BATS_TEST_TMPDIR/i$v.err" 3>&- & PIDS=$!
    wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'rbidle'"' AND state = '"'idle'"'")" -ge 1 ]'
    # idle and listening: the cut arrives with no statement out
    n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'rbidle'")
    [ "$n" -ge 1 ]
    wait_for 10 'grep -q reconnected "$BATS_TEST_TMPDIR/i$v.err"'
    kill -TERM "$PIDS"
    wait "$PIDS"
    ! grep -q '^FATAL' "$BATS_TEST_TMPDIR/i$v.err"
  done
  grep -q '^rb-dispatch: .*server: FATAL: .*terminating connection' "$BATS_TEST_TMPDIR/i-v.err"
  ! grep -q 'server: FATAL' "$BATS_TEST_TMPDIR/i.err" || false
}

@test "RELAYBUS_PG_RESCAN: a duration or 0 drains as the default does; anything else exits 78 in one line naming it, in every program" {
  need_pg
  pg_only "claim cursors are the PostgreSQL backend's"
  local out v
  for v in 0 500ms 1h; do
    out=$BATS_TEST_TMPDIR/r$v.out
    publish 200 "r$v" rescan 10
    RELAYBUS_PG_RESCAN=$v run -0 rb-dispatch -H rescan --pipe "rb-test-pipe $out" --drain
    [ "$(pending rescan)" = 0 ]
    [ "$(wc -l <"$out")" = 200 ]
    [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 200 ]
    [ "$(order_violations "$out")" = 0 ]
  done
  for v in 5 -1s soon 0s; do
    RELAYBUS_PG_RESCAN=$v run -78 --separate-stderr rb-dispatch -H rescan --pipe cat
    [ "$stderr" = "rb-dispatch: rescan: invalid RELAYBUS_PG_RESCAN '$v': use a duration such as 5s or 500ms, or 0" ]
  done
  RELAYBUS_PG_RESCAN=soon run -78 --separate-stderr rb-claim -H rescan
  [[ "$stderr" == *"invalid RELAYBUS_PG_RESCAN 'soon'"* ]]
  [ "${#stderr_lines[@]}" -eq 1 ]
}

@test "RELAYBUS_PG_CONNECTIONS=1: one database connection, whose claim reads the events too; 2 and 3 hold as many, and so does the deprecated --connections" {
  need_pg
  local out=$BATS_TEST_TMPDIR/c1.out url n how
  publish 300 c conns1 10
  RELAYBUS_PG_CONNECTIONS=1 run -0 rb-dispatch -H conns1 --pipe "rb-test-pipe $out" --drain
  [ "$(pending conns1)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 300 ]
  [ "$(wc -l <"$out")" = 300 ]
  [ "$(order_violations "$out")" = 0 ]
  # how many connections a running one holds, by an application name of its own
  case $RELAYBUS_URL in *\?*) url="$RELAYBUS_URL&application_name=rbconns" ;; *) url="$RELAYBUS_URL?application_name=rbconns" ;; esac
  for how in env:1 env:2 env:3 opt:1 opt:3 default:2; do
    n=${how#*:}
    case $how in
      env:*) RELAYBUS_PG_CONNECTIONS=$n rb-dispatch -vv --db "$url" -H conns1 --pipe cat 2>"$BATS_TEST_TMPDIR/c$n.err" 3>&- & PIDS=$! ;;
      # (the option wins over the environment)
      opt:*) RELAYBUS_PG_CONNECTIONS=2 rb-dispatch -vv --db "$url" -H conns1 --pipe cat --connections "$n" 2>"$BATS_TEST_TMPDIR/c$n.err" 3>&- & PIDS=$! ;;
      default:*) env -u RELAYBUS_PG_CONNECTIONS rb-dispatch -vv --db "$url" -H conns1 --pipe cat 2>"$BATS_TEST_TMPDIR/c$n.err" 3>&- & PIDS=$! ;;
    esac
    publish 1 "n$how" conns1
    wait_for 10 '[ "$(pending conns1)" = 0 ]' || { cat "$BATS_TEST_TMPDIR/c$n.err" >&2;
      q "SELECT 'lane', lane, lease_owner, lease_expires_at, in_flight FROM relaybus_lanes WHERE handler = 'conns1' AND lease_owner IS NOT NULL" >&2
      q "SELECT 'delivery', id, lane, status, available_at, now(), key FROM relaybus_deliveries WHERE handler = 'conns1'" >&2; false; }
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rbconns'")" = "$n" ] ||
      { echo "$how: $(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'rbconns'") connections" >&2; false; }
    kill -TERM "$PIDS"
    wait "$PIDS"
  done
  run -64 --separate-stderr rb-dispatch -H conns1 --pipe cat --connections 4
  [[ "$stderr" == *"--connections"* ]]
  RELAYBUS_PG_CONNECTIONS=4 run -78 --separate-stderr rb-dispatch -H conns1 --pipe cat
  [ "$stderr" = "rb-dispatch: conns1: invalid RELAYBUS_PG_CONNECTIONS '4': use 1, 2 or 3" ]
  # every program opens the store the same way
  RELAYBUS_PG_CONNECTIONS=two run -78 --separate-stderr rb-claim -H conns1
  [[ "$stderr" == *"RELAYBUS_PG_CONNECTIONS 'two'"* ]]
}

@test "SIGTERM: running handlers finish, lanes are handed back, a second dispatcher goes on at once" {
  need_pg
  local out=$BATS_TEST_TMPDIR/t.out
  publish 30 t term
  rb-dispatch -H term --exec "rb-test-exec $out sleep:1" -c 5 2>"$BATS_TEST_TMPDIR/t.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out.start")" -ge 5 ]'
  kill -TERM "$PIDS"
  wait "$PIDS"
  # the five that were running completed; nothing else was started
  [ "$(lines "$out")" = 5 ]
  [ "$(pending term)" = 25 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'term' AND lease_owner IS NOT NULL")" = 0 ]
  local t0=$SECONDS
  run -0 rb-dispatch -H term --exec "rb-test-exec $out ok" --drain -c 30
  [ $((SECONDS - t0)) -lt 10 ]
  [ "$(pending term)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 30 ]
  [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
}

@test "SIGTERM past --grace: aborted handlers are released without an attempt charged" {
  need_pg
  local out=$BATS_TEST_TMPDIR/g.out
  publish 4 g grace
  rb-dispatch -H grace --exec "rb-test-exec $out sleep:30" -c 4 --grace 300ms 2>"$BATS_TEST_TMPDIR/g.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out.start")" -ge 4 ]'
  local t0=$SECONDS
  kill -TERM "$PIDS"
  wait "$PIDS"
  [ $((SECONDS - t0)) -lt 5 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'grace' AND attempts = 0 AND status = 'pending'")" = 4 ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = 'grace' AND lease_owner IS NOT NULL")" = 0 ]
  run -0 rb-dispatch -H grace --exec "rb-test-exec $out ok" --drain
  [ "$(pending grace)" = 0 ]
  [ "$(awk '$4 != 1' "$out" | wc -l)" = 0 ]
}

# Key order under a crash: HANDLER's key gets events ID1..ID3; a
# dispatcher with OPTS runs them until ID2's first run kills it (kill -9);
# once its lease ended a second one drains.  Prints the run log's events.
crash_replay() {  # handler id opts...
  local h=$1 id=$2 out=$BATS_TEST_TMPDIR/$1.out; shift 2
  for i in 1 2 3; do
    printf '{"id":"%s%d","name":"t","key":"%sk","payload":{"i":%d},"handlers":["%s"]}\n' "$id" "$i" "$id" "$i" "$h"
  done | rb-publish -q
  rb-dispatch -H "$h" --exec "rb-test-exec $out crash-once:${id}2 || kill -9 \$PPID" --lease 1s "$@" \
    2>"$BATS_TEST_TMPDIR/$h.err" 3>&- & PIDS=$!
  local rc=0; wait "$PIDS" || rc=$?
  [ "$rc" = 137 ] || { echo "$h: the first dispatcher exited $rc, not killed" >&2; return 1; }
  sleep 1.2   # its lease ends
  rb-dispatch -H "$h" --exec "rb-test-exec $out ok" --lease 1s "$@" --drain 2>>"$BATS_TEST_TMPDIR/$h.err" 3>&- ||
    { echo "$h: the drain failed" >&2; return 1; }
  # (run turns errexit off: every check here says so itself)
  on_mongo || [ "$(pending "$h")" = 0 ] || { echo "$h: deliveries left" >&2; return 1; }
  cut -d' ' -f1 "$out" | tr '\n' ' '
}

@test "key order under kill -9: chains replay in order (i, i+1, i, i+1); --strict-order and --chain 1 never go back" {
  need_pg
  # a chain (the default from --concurrency 64 on): o2 starts once o1
  # succeeded, before o1's completion commits (--window 2s holds it back);
  # the crash then replays both
  run -0 crash_replay korder o --window 2s --chain 8
  [ "$output" = "o1 o2 o1 o2 o3 " ]
  # --strict-order: o2 starts only once o1's completion committed; the
  # crash replays o2 only
  run -0 crash_replay kstrict s --window 200ms --strict-order
  [ "$output" = "s1 s2 s2 s3 " ]
  # --chain 1: one claim a delivery of a key, the same order
  run -0 crash_replay kchain1 c --window 200ms --chain 1
  [ "$output" = "c1 c2 c2 c3 " ]
  # each replay ran as the attempt the takeover charged: o1 and o2 as
  # their second; under --strict-order s3 never ran before, and is not
  # charged (PostgreSQL: the MongoDB backend's takeover charges every
  # delivery in flight, issue 18 item 2 is PostgreSQL's so far)
  on_mongo && return 0
  [ "$(awk '{ printf "%s:%s ", $1, $4 }' "$BATS_TEST_TMPDIR/korder.out")" = "o1:1 o2:1 o1:2 o2:2 o3:2 " ]
  [ "$(awk '{ printf "%s:%s ", $1, $4 }' "$BATS_TEST_TMPDIR/kstrict.out")" = "s1:1 s2:1 s2:2 s3:1 " ]
  [ "$(awk '{ printf "%s:%s ", $1, $4 }' "$BATS_TEST_TMPDIR/kchain1.out")" = "c1:1 c2:1 c2:2 c3:1 " ]
}

# rb-dispatch -H HANDLER ... runs until SIG: it exits 0 within SECS, no
# handler process of OUT is left, and the deliveries are back, pending,
# with no attempt charged, their lanes not held.
stopped_cleanly() {  # sig secs handler out n
  local t0=$SECONDS rc=0
  kill -"$1" "$PIDS"
  wait "$PIDS" || rc=$?
  [ "$rc" = 0 ] || { echo "rb-dispatch exited $rc on SIG$1" >&2; return 1; }
  [ $((SECONDS - t0)) -lt "$2" ] || { echo "SIG$1: took $((SECONDS - t0))s" >&2; return 1; }
  sleep 0.2
  ! pgrep -f "$4" >&2 || { echo "SIG$1: handler processes left" >&2; return 1; }
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = '$3' AND attempts = 0 AND status = 'pending'")" = "$5" ]
  [ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = '$3' AND lease_owner IS NOT NULL")" = 0 ]
}

@test "SIGHUP, SIGQUIT, SIGUSR1: no handler left behind, the deliveries released, the lanes handed back" {
  need_pg
  local out=$BATS_TEST_TMPDIR/hup.out
  # SIGHUP: the graceful stop, --grace then the handlers killed
  publish 3 hup sighup
  rb-dispatch -H sighup --exec "rb-test-exec $out sleep:30" -c 3 --grace 300ms -v 2>"$BATS_TEST_TMPDIR/hup.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out.start")" -ge 3 ]'
  stopped_cleanly HUP 5 sighup "$out" 3
  grep -q "stopping on signal 1 (Hangup): waiting" "$BATS_TEST_TMPDIR/hup.err"
  # SIGQUIT: the fast stop, no grace (30s by default)
  out=$BATS_TEST_TMPDIR/quit.out
  publish 3 quit sigquit
  rb-dispatch -H sigquit --exec "rb-test-exec $out sleep:30" -c 3 -v 2>"$BATS_TEST_TMPDIR/quit.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out.start")" -ge 3 ]'
  stopped_cleanly QUIT 5 sigquit "$out" 3
  grep -q "stopping on signal .*: at once" "$BATS_TEST_TMPDIR/quit.err"
  # SIGUSR1 with --pipe co-processes that never answer
  out=$BATS_TEST_TMPDIR/usr1.out
  publish 3 usr1 sigusr1
  rb-dispatch -H sigusr1 --pipe "rb-test-pipe $out noreply" --procs 2 --grace 300ms 2>"$BATS_TEST_TMPDIR/usr1.err" 3>&- & PIDS=$!
  wait_for 10 '[ "$(lines "$out")" -ge 3 ]'
  stopped_cleanly USR1 5 sigusr1 "$out" 3
  # and the work goes on at once elsewhere, each run once
  run -0 rb-dispatch -H sighup --exec "rb-test-exec $out.2 ok" --drain
  run -0 rb-dispatch -H sigquit --exec "rb-test-exec $out.2 ok" --drain
  run -0 rb-dispatch -H sigusr1 --exec "rb-test-exec $out.2 ok" --drain
  [ "$(lines "$out.2")" = 9 ]
  [ "$(awk '$4 != 1' "$out.2" | wc -l)" = 0 ]
}

@test "a handler that hangs is killed at --timeout and retried; one that always fails ends dead" {
  need_pg
  local out=$BATS_TEST_TMPDIR/h.out f=$BATS_TEST_TMPDIR/f.out
  publish 3 h hang
  run -0 --separate-stderr rb-dispatch -H hang --exec "rb-test-exec $out hang-once" --timeout 500ms --backoff 0 --drain -v
  [ "$(pending hang)" = 0 ]
  [ "$(sort "$out" | awk '{ print $1, $4 }' | tr '\n' ' ')" = "h1 2 h2 2 h3 2 " ]
  [[ "$stderr" == *"timed out after 500ms"* ]]
  # exit 1 fails, 75 asks for a retry: both are attempts, dead at --max-attempts
  publish 2 f failing
  run -0 rb-dispatch -H failing --exec "rb-test-exec $f fail" --max-attempts 3 --backoff 0 --drain -q
  [ "$(q "SELECT event_id, status, attempts, last_error FROM relaybus_deliveries WHERE handler = 'failing' ORDER BY 1")" = "f1|dead|3|exit 1
f2|dead|3|exit 1" ]
  [ "$(lines "$f")" = 6 ]
  publish 1 y retrying
  run -0 rb-dispatch -H retrying --exec "rb-test-exec $f retry" --max-attempts 2 --backoff 0 --drain -q
  [ "$(q "SELECT status, attempts, last_error FROM relaybus_deliveries WHERE handler = 'retrying'")" = "dead|2|exit 75: retry later" ]
}

@test "application_name names the handler (rb-dispatch/HANDLER); PGAPPNAME still wins" {
  need_pg
  rb-dispatch -H appname.h1 --exec true 2>/dev/null 3>&- & PIDS=$!
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'rb-dispatch/appname.h1'"'")" -ge 1 ]'
  kill -TERM "$PIDS"; wait "$PIDS"
  PGAPPNAME=billing-worker rb-dispatch -H appname.h2 --exec true 2>/dev/null 3>&- & PIDS=$!
  wait_for 10 '[ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"'billing-worker'"'")" -ge 1 ]'
  kill -TERM "$PIDS"; wait "$PIDS"
}

@test "--settle: retries due at once, whatever --backoff or a retry_ms say: dead after --max-attempts, no waiting" {
  need_pg
  local f=$BATS_TEST_TMPDIR/f.out
  publish 2 s settling
  local t0=$SECONDS
  # the default backoff would wait 1+2+4+8 s, --backoff 1h an hour, retry_ms 10 minutes
  run -0 rb-dispatch -H settling --exec "rb-test-exec $f fail" --max-attempts 5 --settle -q
  [ "$(q "SELECT event_id, status, attempts FROM relaybus_deliveries WHERE handler = 'settling' ORDER BY 1")" = "s1|dead|5
s2|dead|5" ]
  publish 1 t settling2
  run -0 rb-dispatch -H settling2 --pipe "jq -c --unbuffered '. + {ok: false, error: \"later\", retry_ms: 600000}'" \
    --backoff 1h --max-attempts 3 --settle -q
  [ "$(q "SELECT status, attempts, last_error FROM relaybus_deliveries WHERE handler = 'settling2'")" = "dead|3|later" ]
  [ $((SECONDS - t0)) -lt 10 ]
  # --drain alone leaves the retry for later
  publish 1 u settling3
  run -0 rb-dispatch -H settling3 --exec "rb-test-exec $f fail" --max-attempts 5 --drain -q
  [ "$(q "SELECT status, attempts FROM relaybus_deliveries WHERE handler = 'settling3'")" = "pending|1" ]
}

@test "--settle, keyed deliveries that always fail: all end dead, none left behind a buried head" {
  need_pg
  # a claim that found a key held by its head, beside the head's burial
  # and its followers' release, once said "drained" with them all due
  publish 120 sk settle_keyed 3
  run -0 rb-dispatch -H settle_keyed --exec 'exit 3' --max-attempts 2 --settle -q
  run -0 rb-admin stats --handler settle_keyed
  [ "$(jq -c '[.pending, .dead]' <<<"${lines[0]}")" = "[0,120]" ]
}

@test "a failure due again at once runs again under the lane held: nothing claimed twice, its key's followers stay behind it" {
  need_pg
  local out=$BATS_TEST_TMPDIR/fo.out
  # 40 deliveries of one key, 40 unkeyed, every first attempt failing with
  # "retry_ms":0.  Each failure was handed back and claimed again, the
  # chain of 16 behind a keyed one handed back with it: 183 claimed and 23
  # released (456 and 616 before the chain halved)
  publish 80 fo firstfail 1
  run -0 --separate-stderr rb-dispatch -H firstfail --pipe "rb-test-pipe $out first-fails" --chain 16 -c 64 --settle -v
  [ "$(pending firstfail)" = 0 ]
  [ "$(awk '$4 == 1' "$out" | wc -l)" = 80 ]
  awk '$4 == 2' "$out" >"$out.ok"
  [ "$(wc -l <"$out.ok")" = 80 ]
  [ "$(order_violations "$out.ok")" = 0 ]
  [[ "$stderr" == *": 80 claimed, 80 completed, 80 failed and rescheduled, 0 dead, 0 released, 0 lost,"* ]]
  # the attempts and the lanes' counters as for any failure
  [ "$(q "SELECT sum(failed) FROM relaybus_lanes WHERE handler = 'firstfail'")" = 80 ]
}

@test "a failure due again at once is a HOT update of its delivery row: its attempt and error written, its due time and index entries kept" {
  need_pg
  local out=$BATS_TEST_TMPDIR/hf.out h=$BATS_TEST_TMPDIR/hf.sh s0 s1
  stats() { q "SELECT n_tup_upd || ' ' || n_tup_hot_upd || ' ' || n_tup_del FROM pg_stat_user_tables WHERE schemaname = '$RB_SCHEMA' AND relname = 'relaybus_deliveries'"; }
  publish 1 hf hotfail
  q "SELECT available_at FROM relaybus_deliveries WHERE handler = 'hotfail'" >"$out.due"
  # the handler fails its first attempt; the second one records its row as it finds it
  cat >"$h" <<'EOF'
#!/bin/sh
att=$(jq -r .attempt)
[ "$att" = 1 ] && exit 1
psql "$RELAYBUS_URL" -X -A -t -q -F ' ' -c "SELECT attempts, last_error, available_at = '$(cat "$1.due")', updated_at IS NULL
  FROM \"$RELAYBUS_SCHEMA\".relaybus_deliveries WHERE handler = 'hotfail'" >"$1"
EOF
  chmod +x "$h"
  s0=$(stats)
  RELAYBUS_PASS_ENV=RELAYBUS_URL run -0 rb-dispatch -q -H hotfail --exec "$h $out" --settle --drain
  [ "$(pending hotfail)" = 0 ]
  # at its second attempt: one attempt and its error, due as published, never updated_at
  [ "$(cat "$out")" = "1 exit 1 t t" ]
  # one update (the failure) and one deletion (the completion); the update was HOT
  for _ in $(seq 1 50); do s1=$(stats); [ "${s1##* }" != "${s0##* }" ] && break; sleep 0.1; done
  read -r u1 h1 d1 <<<"$s1"; read -r u0 h0 d0 <<<"$s0"
  echo "deliveries +upd $((u1 - u0)) +hot $((h1 - h0)) +del $((d1 - d0))" >&3
  [ $((u1 - u0)) -eq 1 ]
  [ $((h1 - h0)) -eq 1 ]
  [ $((d1 - d0)) -eq 1 ]
}

@test "a failure that waits for its lane's lock holds up nothing else: a chain on another lane goes on meanwhile" {
  need_pg
  local d=$BATS_TEST_TMPDIR h=$BATS_TEST_TMPDIR/blk.sh
  # w1 fails once; k1 and k2 are one key's chain, on another lane.  While w1's failure
  # waits for its lane's row, which another session holds, k1 succeeds and k2 starts at
  # once behind it, as long as rb-dispatch still serves its handlers: the failure's
  # statement is out on its connection, not waited for (until 3a67121 it was, and
  # nothing ran until the lock was let go)
  printf '%s\n' '{"id":"w1","name":"t","payload":{},"handlers":["blk"]}' \
    '{"id":"k1","name":"t","key":"bk","payload":{},"handlers":["blk"]}' \
    '{"id":"k2","name":"t","key":"bk","payload":{},"handlers":["blk"]}' | rb-publish -q
  [ "$(q "SELECT count(DISTINCT lane) FROM relaybus_deliveries WHERE handler = 'blk'")" = 2 ]
  cat >"$h" <<'EOF'
#!/bin/sh
line=$(cat)
ev=$(printf '%s\n' "$line" | jq -r .event_id)
att=$(printf '%s\n' "$line" | jq -r .attempt)
echo "$ev $att" >>"$1/ran"
case "$ev $att" in
"w1 1")
  # fail once the test's session holds this lane's row
  for i in $(seq 600); do [ -f "$1/locked" ] && exit 1; sleep 0.05; done
  exit 1 ;;
"k1 1")
  # succeed once a statement of rb-dispatch waits for a lock (w1's failure)
  for i in $(seq 600); do
    [ "$(psql "$RELAYBUS_URL" -X -A -t -q -c "SELECT count(*) FROM pg_stat_activity
           WHERE wait_event_type = 'Lock' AND application_name = 'rb-dispatch/blk'")" = 0 ] || exit 0
    sleep 0.05
  done
  exit 0 ;;
esac
exit 0
EOF
  chmod +x "$h"
  # the session that holds w1's lane row, from w1's start until k2 ran (or 30 s)
  cat >"$d/hold.sh" <<EOF
for i in \$(seq 600); do grep -q '^k2 ' '$d/ran' && { echo k2 >'$d/seen'; break; }; sleep 0.05; done
EOF
  (
    for i in $(seq 600); do grep -q '^w1 1$' "$d/ran" 2>/dev/null && break; sleep 0.05; done
    sql -c "BEGIN" \
      -c "SELECT 1 FROM relaybus_lanes WHERE handler = 'blk' AND lane = (SELECT lane FROM relaybus_deliveries WHERE event_id = 'w1' AND handler = 'blk') FOR UPDATE" \
      -c "\\! touch '$d/locked'; sh '$d/hold.sh'" -c "COMMIT" >/dev/null
    touch "$d/unlocked"
  ) 3>&- &
  RELAYBUS_PASS_ENV=RELAYBUS_URL run -0 rb-dispatch -q -H blk --exec "$h $d" --chain 8 -c 10 --backoff 0 --drain
  wait
  [ -f "$d/unlocked" ]
  # k2 ran while w1's lane was still locked
  [ "$(cat "$d/seen" 2>/dev/null)" = k2 ]
  [ "$(sort "$d/ran" | tr '\n' ' ')" = "k1 1 k2 1 w1 1 w1 2 " ]
  [ "$(pending blk)" = 0 ]
}

@test "a key whose every delivery fails with a delay: its followers are not claimed again behind each retry (the chain halves)" {
  need_pg
  local out=$BATS_TEST_TMPDIR/fd.out
  # as above, "retry_ms":20: the retry is claimed again once due, and a
  # chain of 16 handed back whole behind each failure was claimed again
  # behind each retry: 456 released and 616 claimed (23 and 183 halved)
  publish 80 fd faildelay 1
  rb-dispatch -H faildelay --pipe "rb-test-pipe $out first-fails:20" --chain 16 -c 64 --poll 50ms -v \
    2>"$BATS_TEST_TMPDIR/fd.err" 3>&- &
  local pid=$! i
  for i in $(seq 1 300); do
    [ "$(pending faildelay)" != 0 ] || break
    sleep 0.1
  done
  kill -TERM "$pid"
  wait "$pid" || true
  [ "$(pending faildelay)" = 0 ]
  [ "$(awk '$4 == 1' "$out" | wc -l)" = 80 ]
  awk '$4 == 2' "$out" >"$out.ok"
  [ "$(wc -l <"$out.ok")" = 80 ]
  [ "$(order_violations "$out.ok")" = 0 ]
  local released
  released=$(sed -n 's/.* \([0-9]*\) released, .*/\1/p' "$BATS_TEST_TMPDIR/fd.err")
  [ -n "$released" ]
  [ "$released" -lt 40 ]
}

@test "a dead --pipe co-process is restarted; its in-flight deliveries fail and run again" {
  need_pg
  local out=$BATS_TEST_TMPDIR/p.out
  publish 40 p phoenix
  # each co-process answers 7 lines, then ends
  run -0 --separate-stderr rb-dispatch -H phoenix --pipe "rb-test-pipe $out die:7" -c 10 --backoff 0 --drain
  [ "$(pending phoenix)" = 0 ]
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 40 ]
  [[ "$stderr" == *"co-process 0: handler process exited with status 0; restarting in"* ]]
}

@test "--pipe verdicts: a failure with its error, a bad field, a line that is not JSON, ok with an error" {
  need_pg
  local out=$BATS_TEST_TMPDIR/v.out
  publish 40 v verdict
  run -0 --separate-stderr rb-dispatch -H verdict --pipe "rb-test-pipe $out verdicts" --max-attempts 1 --drain
  # each ran once; those told apart by payload i mod 4 (rb-test-pipe verdicts)
  [ "$(lines "$out")" = 40 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'verdict' AND status = 'pending'")" = 0 ]
  local want_odd want_bad
  want_odd=$(awk '$3 % 4 == 1' "$out" | wc -l)
  want_bad=$(awk '$3 % 4 == 2' "$out" | wc -l)
  [ "$want_odd" -gt 0 ]
  [ "$want_bad" -gt 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'verdict' AND status = 'dead' AND last_error = 'odd one'")" = "$want_odd" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'verdict' AND status = 'dead' AND last_error LIKE '%retry_ms%'")" = "$want_bad" ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'verdict'")" = $((want_odd + want_bad)) ]
  [[ "$stderr" == *"co-process 0: line "*": ignored"* ]]
  [[ "$stderr" == *"field 'retry_ms' must be a whole number >= 0: counted as a failure"* ]]
}

@test "an idle dispatcher handles a new event well under --poll (LISTEN/NOTIFY)" {
  need_pg
  local out=$BATS_TEST_TMPDIR/w.out
  rb-dispatch -H wake --pipe "rb-test-pipe $out" --poll 10s 2>/dev/null 3>&- & PIDS=$!
  sleep 1.5   # its first claims found nothing: it waits for the next poll in 10s
  local t0 t1
  t0=$(date +%s%N)
  publish 1 w wake
  wait_for 8 '[ "$(lines "$out")" -ge 1 ]'
  t1=$(date +%s%N)
  echo "# wake-up latency: $(( (t1 - t0) / 1000000 ))ms" >&3
  # (half the --poll: a busy machine starts rb-publish and a handler in that)
  [ $(( (t1 - t0) / 1000000 )) -lt 5000 ]
  kill -TERM "$PIDS"
  wait "$PIDS"
  [ "$(pending wake)" = 0 ]
}

@test "a notification whose deliveries an earlier claim took holds the next one back only when it comes again: a publish right after is handled at once" {
  need_pg
  local out=$BATS_TEST_TMPDIR/n.out log=$BATS_TEST_TMPDIR/n.log i t0 t1 a=() b=() held
  rb-dispatch -vv -H nudge --pipe "rb-test-pipe $out" --poll 10s 2>"$log" 3>&- & PIDS=$!
  sleep 1.5
  # each round: a publish, timed until its handler ran; in every other
  # round first a notification that finds nothing (its deliveries taken
  # by a claim before it, as a publisher's often are).  Such a one held
  # the next wake-up back 100 ms (the flood guard of relaybus(7),
  # Wake-ups): 60-80 ms more in those rounds on an idle machine, and a
  # p99 of 100 ms at 1,000 events/s (bench/run --only s5).  -vv says
  # when the guard holds wake-ups back: a time a loaded machine cannot
  # tell from its noise (CI: 248 against 283 ms, the fix in place)
  for i in $(seq 1 16); do
    sleep 0.1   # (the dispatcher's claims after the last completion)
    if ((i % 2 == 0)); then
      q "NOTIFY \"relaybus_$RB_SCHEMA\", 'nudge'"
      sleep 0.02
    fi
    t0=$(date +%s%N)
    printf '{"id":"n%d","name":"t","payload":{"i":%d},"handlers":["nudge"]}\n' "$i" "$i" | rb-publish -q
    until [ "$(lines "$out")" -ge "$i" ]; do sleep 0.005; done
    t1=$(date +%s%N)
    if ((i % 2 == 0)); then b+=($(( (t1 - t0) / 1000000 ))); else a+=($(( (t1 - t0) / 1000000 ))); fi
  done
  kill -TERM "$PIDS"
  wait "$PIDS"
  held=$(grep -c 'the next is held back 100ms' "$log" || true)
  echo "# publish to handler, ms: ${a[*]}; after a fruitless notification: ${b[*]}; wake-ups held back: $held" >&3
  # 8 before the fix (each fruitless notification); a claim that took a
  # publish before its own notification woke one (a slow machine) may
  # make a notification the second fruitless one in a row: by design
  [ "$held" -le 2 ] || { grep -E 'woken|claimed|held back' "$log" | tail -40; false; }
  [ "$(lines "$out")" = 16 ]
}

@test "--sql: the handler's writes and the deletion commit together, even across kill -9" {
  need_pg
  q "CREATE TABLE sqlt (event_id text PRIMARY KEY, seq int NOT NULL)"
  local stmt="INSERT INTO \"$RB_SCHEMA\".sqlt VALUES (\$1::jsonb->>'event_id', (\$1::jsonb->'payload'->>'i')::int)"
  publish 5000 s sqlh 30
  rb-dispatch -H sqlh --sql "$stmt" -c 100 --lease 2s 2>/dev/null 3>&- & PIDS=$!
  wait_for 20 '[ "$(q "SELECT count(*) FROM sqlt")" -ge 300 ]'
  kill -9 "$PIDS"
  local done_at_kill
  done_at_kill=$(q "SELECT count(*) FROM sqlt")
  sleep 2.2
  run -0 rb-dispatch -H sqlh --sql "$stmt" --drain -c 100
  [ "$(pending sqlh)" = 0 ]
  [ "$(q "SELECT count(*) FROM sqlt")" = 5000 ]
  [ "$done_at_kill" -lt 5000 ]
}

@test "memory: RSS stays under 20 MB at concurrency 200 (--pipe and --exec)" {
  need_pg
  local out=$BATS_TEST_TMPDIR/m.out rss limit=20480
  # AddressSanitizer's shadow memory is not ours: allow it twice as much
  if ldd "$(command -v rb-dispatch)" 2>/dev/null | grep -q libasan; then limit=40960; fi
  publish 400 m mem
  rb-dispatch -H mem --pipe "rb-test-pipe $out noreply" -c 200 --grace 0 2>/dev/null 3>&- & PIDS=$!
  wait_for 20 '[ "$(lines "$out")" -ge 200 ]'
  rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$PIDS/status")
  echo "# --pipe, 200 in flight: VmRSS ${rss} kB" >&3
  [ "$rss" -lt "$limit" ]
  kill -TERM "$PIDS"
  wait "$PIDS"
  rb-dispatch -H mem --exec "rb-test-exec $out sleep:5" -c 200 --grace 0 2>/dev/null 3>&- & PIDS=$!
  wait_for 30 '[ "$(lines "$out.start")" -ge 200 ]'
  rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$PIDS/status")
  echo "# --exec, 200 children: VmRSS ${rss} kB" >&3
  [ "$rss" -lt "$limit" ]
  kill -TERM "$PIDS"
  wait "$PIDS"
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'mem' AND attempts > 0")" = 0 ]
}
