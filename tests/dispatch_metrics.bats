#!/usr/bin/env bats
# rb-dispatch --metrics-file: each dispatcher's own node_exporter textfile,
# written atomically every --stats-every and at exit, labelled with its
# handler and owner: the counters agree with what the database says
# happened, the in-flight and lanes-held gauges with rb-admin lanes
# while handlers run, the handler-duration and commit-to-handler latency
# histograms with handlers that sleep and events that waited; promtool
# check metrics passes; sd_notify STATUS= carries the one-line summary.

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

prom_check() {  # file
  python3 "$RB_SRCDIR/tests/prom_lint.py" <"$1" >/dev/null
  if command -v promtool >/dev/null; then
    promtool check metrics <"$1"
  else
    echo "# no promtool (Debian: prometheus): tests/prom_lint.py only" >&3
  fi
}

# the value of a series in file: name and the labels after handler and owner
val() {  # file name [extra labels, e.g. ,le="1"]
  awk -v s="$2{handler=\"$H\",owner=\"$O\"${3:-}}" '$1 == s { print $2 }' "$1"
}

publish() {  # n prefix name [keyed]
  awk -v n="$1" -v p="$2" -v name="$3" -v k="${4:-}" 'BEGIN { for (i = 1; i <= n; i++)
    if (k != "") printf "{\"id\":\"%s%d\",\"name\":\"%s\",\"key\":\"k%d\",\"payload\":{}}\n", p, i, name, i
    else printf "{\"id\":\"%s%d\",\"name\":\"%s\",\"payload\":{}}\n", p, i, name }' | rb-publish -q
}

@test "--metrics-file after a drain: claimed, completed, failed, dead counters as the database says; duration and latency histograms; promtool clean" {
  need_pg
  H=mh O=host-a
  rb-setup -s 'mh:m.*'
  publish 6 ok- m.ok
  publish 2 bad- m.bad
  # the events wait 1.5 s before any handler starts: commit-to-handler latency >= 1.5 s
  sleep 1.5
  local m=$BATS_TEST_TMPDIR/rb.prom
  run --separate-stderr rb-dispatch -H mh --owner "$O" --metrics-file "$m" --max-attempts 1 --concurrency 8 \
    --exec 'grep -q "\"m.bad\"" && exit 1; sleep 0.3' --drain
  [ "$status" -eq 0 ]
  prom_check "$m"
  [ "$(stat -c %a "$m")" = 644 ]
  [ "$(val "$m" relaybus_dispatch_claimed_total)" = 8 ]
  [ "$(val "$m" relaybus_dispatch_completed_total)" = 6 ]
  [ "$(val "$m" relaybus_dispatch_failed_total)" = 2 ]
  [ "$(val "$m" relaybus_dispatch_dead_total)" = 2 ]
  [ "$(val "$m" relaybus_dispatch_lost_total)" = 0 ]
  [ "$(rb-admin stats | jq -s '.[-1].dead')" = 2 ]
  [ "$(val "$m" relaybus_dispatch_in_flight)" = 0 ]
  [ "$(val "$m" relaybus_dispatch_up)" = 1 ]
  # 8 attempts timed; the 6 that slept 0.3 s are above 0.25 s
  [ "$(val "$m" relaybus_dispatch_handler_duration_seconds_count)" = 8 ]
  [ "$(val "$m" relaybus_dispatch_handler_duration_seconds_bucket ',le="0.25"')" -le 2 ]
  [ "$(val "$m" relaybus_dispatch_handler_duration_seconds_bucket ',le="+Inf"')" = 8 ]
  awk -v s="$(val "$m" relaybus_dispatch_handler_duration_seconds_sum)" 'BEGIN { exit !(s >= 1.8) }'
  # every start came at least 1.5 s after its event's commit: none in the 1 s bucket
  [ "$(val "$m" relaybus_dispatch_latency_seconds_count)" = 8 ]
  [ "$(val "$m" relaybus_dispatch_latency_seconds_bucket ',le="1"')" = 0 ]
  [ "$(val "$m" relaybus_dispatch_latency_seconds_bucket ',le="3600"')" = 8 ]
  awk -v s="$(val "$m" relaybus_dispatch_latency_seconds_sum)" 'BEGIN { exit !(s >= 12) }'
  # the last claim: within the run
  local last now
  last=$(val "$m" relaybus_dispatch_last_claim_timestamp_seconds)
  now=$(date +%s)
  awk -v l="$last" -v n="$now" 'BEGIN { exit !(l > n - 60 && l <= n + 1) }'
  # no temporary file left beside it
  [ "$(ls -A "$BATS_TEST_TMPDIR" | grep -c prom)" = 1 ]
}

@test "--metrics-file every --stats-every while running: in flight and lanes held as rb-admin lanes says, the file replaced (new inode), then back to 0" {
  need_pg
  H=mr O=host-b
  rb-setup -s 'mr:r.*'
  local m=$BATS_TEST_TMPDIR/rb.prom go=$BATS_TEST_TMPDIR/go
  # (a handler that waits for $go, a minute at most: none outlives a failed test)
  rb-dispatch -q -H mr --owner "$O" --metrics-file "$m" --stats-every 200ms --poll 100ms \
    --exec "n=0; while [ ! -e '$go' ] && [ \$n -lt 1200 ]; do sleep 0.05; n=\$((n + 1)); done" 3>&- &
  PIDS="$!"
  wait_for 20 '[ -e "$m" ]'
  # (the first file held open: a freed inode's number may come back for the
  # next file; an open one's cannot)
  local i1
  exec 8<"$m"
  i1=$(stat -c %i "$m")
  publish 5 r- r.x keyed
  wait_for 20 '[ "$(val "$m" relaybus_dispatch_in_flight)" = 5 ]'
  # the lanes those 5 keys hash to, as the store has them in flight (rb-admin lanes)
  local lanes
  lanes=$(rb-admin lanes --handler mr | jq -s '[.[] | select(.in_flight > 0)] | length')
  wait_for 10 '[ "$(val "$m" relaybus_dispatch_lanes_held)" = "$lanes" ]'
  [ "$lanes" -ge 1 ]
  [ "$(stat -c %i "$m")" != "$i1" ]
  exec 8<&-
  prom_check "$m"
  touch "$go"
  wait_for 20 '[ "$(val "$m" relaybus_dispatch_completed_total)" = 5 ]'
  wait_for 10 '[ "$(val "$m" relaybus_dispatch_in_flight)" = 0 ] && [ "$(val "$m" relaybus_dispatch_lanes_held)" = 0 ]'
  # idle, it still claims every --poll: the last claim keeps moving
  local a b
  a=$(val "$m" relaybus_dispatch_last_claim_timestamp_seconds)
  sleep 1.2
  b=$(val "$m" relaybus_dispatch_last_claim_timestamp_seconds)
  awk -v a="$a" -v b="$b" 'BEGIN { exit !(b > a) }'
  kill -TERM $PIDS
  wait $PIDS
}

@test "NOTIFY_SOCKET: STATUS= with the one-line summary at start and every period (15s default; --stats-every)" {
  need_pg
  ldd "$(command -v rb-dispatch)" 2>/dev/null | grep -q libsystemd || skip "rb-dispatch built without libsystemd"
  rb-setup -s 'ms:s.*'
  local sock=$BATS_TEST_TMPDIR/n.sock msgs=$BATS_TEST_TMPDIR/n.msgs
  rb-test-notify-listen "$sock" "$msgs" 3>&- &
  PIDS="$!"
  wait_for 10 '[ -e "$msgs" ]'
  publish 3 s- s.x
  NOTIFY_SOCKET=$sock rb-dispatch -H ms --exec true --stats-every 200ms 2>/dev/null 3>&- &
  local pid=$!
  PIDS="$PIDS $pid"
  wait_for 10 'grep -q "^STATUS=ms: claimed 0, completed 0" "$msgs"'
  wait_for 20 'grep -q "^STATUS=ms: claimed 3, completed 3, failed 0 (dead 0), lost 0, in flight 0, lanes 0, [0-9.]*/s, last claim [0-9.]*s ago$" "$msgs"'
  kill -TERM "$pid"
  wait "$pid"
  # without --stats-every under systemd: the first summary at start, no status line on stderr
  : >"$msgs"
  run --separate-stderr env NOTIFY_SOCKET="$sock" rb-dispatch -H ms --exec true --drain
  [ "$status" -eq 0 ]
  grep -q '^STATUS=ms: claimed 0' "$msgs"
  [[ "$stderr" != *"claimed "* ]]
}

@test "--metrics-file that cannot be written: one warning, the dispatcher goes on and drains; an empty name is a usage error" {
  need_pg
  rb-setup -s 'mw:w.*'
  publish 2 w- w.x
  run --separate-stderr rb-dispatch -H mw --exec true --drain --stats-every 100ms \
    --metrics-file "$BATS_TEST_TMPDIR/no/such/dir/rb.prom"
  [ "$status" -eq 0 ]
  [ "$(grep -c -- '--metrics-file .*: cannot write: No such file or directory' <<<"$stderr")" = 1 ]
  [ "$(rb-admin stats | jq -s '.[-1].pending + .[-1].processing')" = 0 ]
  run --separate-stderr rb-dispatch -H mw --exec true --metrics-file ''
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-dispatch: --metrics-file: give a file name" ]
}
