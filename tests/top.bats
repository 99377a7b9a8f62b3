#!/usr/bin/env bats
# rb-admin top, for real under tmux (a private server, -L): with a
# dispatcher running, the live view shows each handler's pending, due, in
# flight and dead deliveries and the holder with its lanes; it refreshes
# every second; h picks a handler, q quits; q and ^C leave the terminal
# as they found it (the alternate screen left, the stty settings back);
# every line fits 80 columns.  --once prints one plain frame.

load test_helper

setup() {
  command -v tmux >/dev/null || skip "no tmux (Debian: tmux)"
  fresh_schema
  TMUX_SOCK=rbtop-$$-$BATS_TEST_NUMBER
}

teardown() {
  tmux -L "$TMUX_SOCK" kill-server 2>/dev/null || true
  kill_pids_drop_schema
}

pane() { tmux -L "$TMUX_SOCK" capture-pane -p -t top; }
keys() { tmux -L "$TMUX_SOCK" send-keys -t top "$@"; }

# rb-admin top in an 80x24 tmux pane, in a shell that records the
# terminal's settings before and after it, and its exit status
start_top() {
  local sh=$BATS_TEST_TMPDIR/top.sh
  cat >"$sh" <<SH
export PATH='$PATH' RELAYBUS_URL='$RELAYBUS_URL' RELAYBUS_SCHEMA='$RELAYBUS_SCHEMA' MONGOC_DISABLE_SHM=1
export RELAYBUS_MODULE_DIR='${RELAYBUS_MODULE_DIR:-}' LC_ALL=C
stty -g >'$BATS_TEST_TMPDIR/stty.before'
rb-admin top $*
echo "top exited \$?"
stty -g >'$BATS_TEST_TMPDIR/stty.after'
exec sleep 600
SH
  tmux -L "$TMUX_SOCK" -f /dev/null new-session -d -s top -x 80 -y 24 "bash --noprofile --norc $sh"
  wait_for 20 'pane | grep -q "^relaybus top"'
}

busy_dispatcher() {
  rb-setup -s 'mailer:mail.*' -s 'audit:*'
  awk 'BEGIN { for (i = 1; i <= 6; i++) printf "{\"id\":\"m%d\",\"name\":\"mail.x\",\"key\":\"k%d\",\"payload\":{}}\n", i, i }' | rb-publish -q
  # (a 3s lease: renewed every second, for the view to see)
  rb-dispatch -q -H mailer --owner host-a --concurrency 4 --lease 3s --exec 'sleep 30' 3>&- &
  PIDS="$!"
  wait_for 20 '[ "$(rb-admin stats --handler mailer | jq -s ".[0].processing")" = 4 ]'
}

@test "top under tmux with a dispatcher running: handlers, holder, live refresh; h picks a handler; q quits and restores the terminal" {
  need_pg
  busy_dispatcher
  start_top
  # the alternate screen while it runs
  [ "$(tmux -L "$TMUX_SOCK" display -p -t top '#{alternate_on}')" = 1 ]
  wait_for 10 'pane | grep -Eq "^mailer +2 +2 +4 +0 +[-0-9.]+ +(-|[0-9.]+(ms|s)) *$"' || { pane >&2; false; }
  pane | grep -Eq '^audit +6 +6 +0 +0 '
  pane | grep -Eq '^TOTAL +8 +8 +4 +0 '
  pane | grep -Eq '^host-a +mailer +4 +4 +[0-9.]+s '
  # every line within 80 columns
  [ "$(pane | awk '{ if (length($0) > m) m = length($0) } END { print m }')" -le 80 ]
  # it refreshes: new events show within a few seconds, and the holder's renewal is seen
  echo '{"id":"a-new","name":"other","payload":{}}' | rb-publish -q
  wait_for 10 'pane | grep -Eq "^audit +7 +7 "'
  wait_for 10 'pane | grep -Eq "^host-a +mailer +4 +4 +[0-9.]+s +[0-9.]+(ms|s) *$"'
  # h: the first handler alone, then the next, then all again
  keys h
  wait_for 5 'pane | grep -q "handler audit$"'
  ! pane | grep -q '^mailer' || false
  pane | grep -q '(no lane is held)'
  keys h
  wait_for 5 'pane | grep -q "handler mailer$"'
  pane | grep -Eq '^host-a +mailer +4 +4 '
  keys h
  wait_for 5 'pane | grep -q "all handlers$"'
  keys 'q'  # (quoted, for tests/mongo/sqluse.awk)
  wait_for 10 'pane | grep -q "^top exited 0$"'
  [ "$(tmux -L "$TMUX_SOCK" display -p -t top '#{alternate_on}')" = 0 ]
  wait_for 5 '[ -s "$BATS_TEST_TMPDIR/stty.after" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/stty.before")" = "$(cat "$BATS_TEST_TMPDIR/stty.after")" ]
  # the cursor is shown again
  [ "$(tmux -L "$TMUX_SOCK" display -p -t top '#{cursor_flag}')" = 1 ]
}

@test "top: ^C (SIGINT) also restores the terminal; --interval, and --handler from the start" {
  need_pg
  busy_dispatcher
  start_top --handler mailer --interval 500ms
  wait_for 10 'pane | grep -q "handler mailer$"'
  pane | grep -q 'every 0.5s'
  keys C-c
  wait_for 10 'pane | grep -q "^top exited 0$"'
  [ "$(tmux -L "$TMUX_SOCK" display -p -t top '#{alternate_on}')" = 0 ]
  wait_for 5 '[ -s "$BATS_TEST_TMPDIR/stty.after" ]'
  [ "$(cat "$BATS_TEST_TMPDIR/stty.before")" = "$(cat "$BATS_TEST_TMPDIR/stty.after")" ]
}

@test "top --once: one plain frame on stdout (no escape sequences), 80 columns; without a terminal and without --once: exit 64" {
  need_pg
  busy_dispatcher
  run --separate-stderr rb-admin top --once
  [ "$status" -eq 0 ]
  [ "${lines[0]:0:19}" = "relaybus top  schem" ]
  [[ "$output" != *$'\033'* ]]
  grep -Eq '^mailer +2 +2 +4 +0 ' <<<"$output"
  grep -Eq '^host-a +mailer +4 +4 ' <<<"$output"
  [ "$(awk '{ if (length($0) > m) m = length($0) } END { print m }' <<<"$output")" -le 80 ]
  run --separate-stderr rb-admin top --once --handler audit
  ! grep -q '^mailer' <<<"$output" || false
  grep -q '^audit' <<<"$output"
  run --separate-stderr rb-admin top </dev/null
  [ "$status" -eq 64 ]
  [ "$stderr" = "rb-admin: top: standard output is not a terminal (use --once)" ]
  run --separate-stderr rb-admin top --interval 10ms --once
  [ "$status" -eq 64 ]
  [ "${stderr_lines[0]}" = "rb-admin: --interval: at least 100ms" ]
}
