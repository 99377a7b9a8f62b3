#!/usr/bin/env bats
# rb-dispatch under systemd: sd_notify(3) READY=1, STOPPING=1 and
# WATCHDOG=1 reach the socket NOTIFY_SOCKET names; log lines carry
# journald priorities when JOURNAL_STREAM is stderr; the installed
# rb-dispatch@.service passes systemd-analyze verify.

load test_helper

setup() { fresh_schema; }

teardown() { kill_pids_drop_schema; }

need_libsystemd() {
  ldd "$RB_BINDIR/rb-dispatch" 2>/dev/null | grep -q libsystemd ||
    skip "rb-dispatch built without libsystemd (configure --without-systemd)"
}

# listen on a NOTIFY_SOCKET of our own; sets SOCK and MSGS
listen_notify() {
  SOCK=$BATS_TEST_TMPDIR/notify.sock
  MSGS=$BATS_TEST_TMPDIR/notify.msgs
  rb-test-notify-listen "$SOCK" "$MSGS" 3>&- &
  PIDS="${PIDS:-} $!"
  wait_for 10 '[ -e "$MSGS" ]'
}

@test "NOTIFY_SOCKET: READY=1 once listening, STOPPING=1 when SIGTERM starts the graceful stop" {
  need_pg
  need_libsystemd
  listen_notify
  rb-setup -s 'sd:*'
  NOTIFY_SOCKET=$SOCK rb-dispatch -H sd --exec 'sleep 1' --grace 10s 2>"$BATS_TEST_TMPDIR/err" 3>&- &
  local pid=$!
  PIDS="$PIDS $pid"
  wait_for 10 'grep -qx READY=1 "$MSGS"'
  ! grep -q STOPPING=1 "$MSGS" || false
  # a delivery running when the stop begins: STOPPING=1 comes while it finishes
  echo '{"id":"sd-1","name":"sd","payload":{}}' | rb-publish -q
  wait_for 10 '[ "$(q "SELECT count(*) FROM relaybus_lanes WHERE handler = '"'sd'"' AND cardinality(in_flight) > 0")" = 1 ]'
  kill -TERM "$pid"
  wait_for 10 'grep -qx STOPPING=1 "$MSGS"'
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ]
  [ "$(grep -c READY=1 "$MSGS")" -eq 1 ]
  # the graceful stop let the handler finish: the delivery is completed
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'sd'")" = 0 ]
}

@test "WATCHDOG_USEC: WATCHDOG=1 about twice per period from the main loop, none without it" {
  need_pg
  need_libsystemd
  listen_notify
  # sd_watchdog_enabled(3) honours WATCHDOG_USEC only with WATCHDOG_PID = our pid: exec keeps it
  NOTIFY_SOCKET=$SOCK bash -c 'WATCHDOG_PID=$$ WATCHDOG_USEC=400000 exec rb-dispatch -H wd --exec true' 2>/dev/null 3>&- &
  local pid=$!
  PIDS="$PIDS $pid"
  wait_for 10 'grep -qx READY=1 "$MSGS"'
  sleep 1.2
  kill -TERM "$pid"
  wait "$pid" || true
  # 1.2 s at one every 0.2 s: 6 or so; at least 4 (a loaded machine), one per loop turn at most
  local n
  n=$(grep -c '^WATCHDOG=1$' "$MSGS")
  [ "$n" -ge 4 ] || { echo "only $n WATCHDOG=1 in 1.2 s" >&2; false; }
  [ "$n" -le 20 ]
  # without WATCHDOG_USEC: none
  : >"$MSGS"
  NOTIFY_SOCKET=$SOCK rb-dispatch -H wd --exec true 2>/dev/null 3>&- &
  pid=$!
  PIDS="$PIDS $pid"
  wait_for 10 'grep -qx READY=1 "$MSGS"'
  sleep 0.5
  kill -TERM "$pid"
  wait "$pid" || true
  ! grep -q WATCHDOG "$MSGS" || false
}

# stderr's device:inode, as systemd puts it in JOURNAL_STREAM
stderr_id() { stat -L -c '%d:%i' /dev/stderr; }

@test "JOURNAL_STREAM naming stderr: <3> errors, <4> warnings, <5> notices, <6> info, <7> debug" {
  local f=$BATS_TEST_TMPDIR/err
  # an unreachable database: one error line, priority 3
  run bash -c 'exec 2>"$1"; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) \
    rb-admin --db postgresql://127.0.0.1:1/x stats' _ "$f"
  [ "$status" -eq 69 ]
  grep -q '^<3>rb-admin: cannot connect' "$f"
  ! grep -v '^<[0-7]>' "$f" || false
  need_pg
  # an event no handler subscribes to: a warning (4), then the summary, a notice (5)
  bash -c 'exec 2>"$1"; echo "{\"id\":\"js-1\",\"name\":\"nomatch\",\"payload\":{}}" |
    JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) rb-publish' _ "$f"
  grep -q '^<4>rb-publish: stdin:1: event js-1 (nomatch) matches no handler' "$f"
  grep -q '^<5>rb-publish: 1 events' "$f"
  # rb-dispatch -vv: info and debug lines, each with its priority
  bash -c 'exec 2>"$1"; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) \
    exec rb-dispatch -vv -H js --exec true --drain' _ "$f"
  grep -q '^<6>rb-dispatch: js: drained' "$f"
  grep -q '^<7>rb-dispatch: js: claimed' "$f"
  ! grep -v '^<[0-7]>' "$f" || false
  # --log-format json: the prefix, then the JSON object
  bash -c 'exec 2>"$1"; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) \
    exec rb-dispatch -v --log-format json -H js --exec true --drain' _ "$f"
  grep '^<6>{' "$f" | head -n 1 | cut -c4- | jq -e '.level == "info"' >/dev/null
}

@test "JOURNAL_STREAM naming another stream (inherited from a parent): no prefixes" {
  local f=$BATS_TEST_TMPDIR/err
  # the numbers of stdout, not of stderr: the journal is not where stderr goes
  run bash -c 'exec 2>"$1"; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stdout) \
    rb-admin --db postgresql://127.0.0.1:1/x stats' _ "$f"
  [ "$status" -eq 69 ]
  grep -q '^rb-admin: cannot connect' "$f"
  # and garbage in the variable: none either
  run bash -c 'exec 2>"$1"; JOURNAL_STREAM=junk rb-admin --db postgresql://127.0.0.1:1/x stats' _ "$f"
  [ "$status" -eq 69 ]
  grep -q '^rb-admin: cannot connect' "$f"
}

@test "make install puts rb-dispatch@.service in the unit directory; systemd-analyze verify passes on it" {
  [ -n "${RB_BUILDDIR:-}" ] && [ -f "$RB_BUILDDIR/Makefile" ] || skip "not run from a build tree (RB_BUILDDIR)"
  command -v systemd-analyze >/dev/null || skip "no systemd-analyze (Debian: systemd)"
  grep -q '^systemdsystemunitdir = ..*' "$RB_BUILDDIR/Makefile" || skip "configured without a systemd unit directory"
  local dest=$BATS_TEST_TMPDIR/root unit bindir
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$RB_BUILDDIR" install DESTDIR="$dest" >"$BATS_TEST_TMPDIR/install.log" 2>&1 ||
    { cat "$BATS_TEST_TMPDIR/install.log" >&2; false; }
  unit=$(find "$dest" -name 'rb-dispatch@.service')
  [ -n "$unit" ]
  [ "$(stat -c %a "$unit")" = 644 ]
  grep -qx 'Type=notify' "$unit"
  grep -qx 'Restart=always' "$unit"
  # one owner per host and handler: %H-%i
  grep -q '^ExecStart=/.*/rb-dispatch --handler %i --owner %H-%i ' "$unit"
  grep -q '^EnvironmentFile=/.*/relaybus/%i.env$' "$unit"
  grep -qx 'Environment=MONGOC_DISABLE_SHM=1' "$unit"
  # no password on a command line: the URL comes from the environment file
  ! grep -q -- '--db' "$unit" || false
  # verify looks for ExecStart's program: point it to where DESTDIR put it
  bindir=$(sed -n 's/^bindir = //p' "$RB_BUILDDIR/Makefile" | sed "s|\${exec_prefix}|$(sed -n 's/^exec_prefix = //p' "$RB_BUILDDIR/Makefile")|; s|\${prefix}|$(sed -n 's/^prefix = //p' "$RB_BUILDDIR/Makefile")|")
  [ -x "$dest$bindir/rb-dispatch" ]
  mkdir -p "$BATS_TEST_TMPDIR/units"
  sed "s|^ExecStart=$bindir/|ExecStart=$dest$bindir/|" "$unit" >"$BATS_TEST_TMPDIR/units/rb-dispatch@.service"
  ! cmp -s "$unit" "$BATS_TEST_TMPDIR/units/rb-dispatch@.service" || false
  # verify warns (rc 0) on unknown keys and values: the output must be empty too
  run systemd-analyze verify --man=no "$BATS_TEST_TMPDIR/units/rb-dispatch@mailer.service"
  echo "$output"
  [ "$status" -eq 0 ]
  [ -z "$output" ]
}

@test "a /dev/shm/mongoc-PID left by a killed process: a program that loads the MongoDB module and is given that PID says nothing under MONGOC_DISABLE_SHM=1" {
  [ -d /dev/shm ] && [ -w /dev/shm ] || skip "no writable /dev/shm"
  # (--version loads the module, relaybus-mongo.so, to name its libmongoc)
  [[ "$(rb-setup --version)" == *", libmongoc "* ]] || skip "no MongoDB backend module in this build"
  local pidf=$BATS_TEST_TMPDIR/pid
  # bash leaves the file for its own PID, then execs the program into that PID
  run --separate-stderr env -u MONGOC_DISABLE_SHM bash -c 'echo $$ >"$0"; : >/dev/shm/mongoc-$$; exec rb-setup --version' "$pidf"
  rm -f "/dev/shm/mongoc-$(cat "$pidf")"
  [ "$status" -eq 0 ]
  # libmongoc's own warning, printed when it loads (what the unit's setting is for)
  [[ "$stderr" == *"Falling back to malloc for counters"* ]]
  run --separate-stderr env MONGOC_DISABLE_SHM=1 bash -c 'echo $$ >"$0"; : >/dev/shm/mongoc-$$; exec rb-setup --version' "$pidf"
  rm -f "/dev/shm/mongoc-$(cat "$pidf")"
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [[ "$output" == rb-setup* ]]
}

@test "a /dev/shm/mongoc-PID left by a killed process: a PostgreSQL program given that PID says nothing, even without MONGOC_DISABLE_SHM" {
  [ -d /dev/shm ] && [ -w /dev/shm ] || skip "no writable /dev/shm"
  local pidf=$BATS_TEST_TMPDIR/pid
  # bash leaves libmongoc's file for its own PID, as a process killed with -9
  # would, then execs the program into that PID
  run --separate-stderr env -u MONGOC_DISABLE_SHM bash -c 'echo $$ >"$0"; : >/dev/shm/mongoc-$$;
    exec rb-setup --print-sql --db postgresql://localhost/app -s "mh:mod.*"' "$pidf"
  rm -f "/dev/shm/mongoc-$(cat "$pidf")"
  [ "$status" -eq 0 ]
  [ -z "$stderr" ]
  [[ "$output" == *relaybus_publish* ]]
}

@test "under systemd, a failed attempt is a journal entry of its own: journalctl RELAYBUS_EVENT_ID=... finds it" {
  need_pg
  need_libsystemd
  unshare -m true 2>/dev/null || skip "no mount namespace here (unshare -m): journald's socket is a fixed path"
  local out=$BATS_TEST_TMPDIR/journal.jsonl err=$BATS_TEST_TMPDIR/err
  echo '{"id":"o-42","name":"t","payload":{},"handlers":["jh"]}' | rb-publish -q
  # journald's socket, in a mount namespace of the test's own (a tmpfs on /run)
  run unshare -m bash -c '
    mount -t tmpfs none /run && mkdir -p /run/systemd/journal || exit 9
    rb-test-journal-listen /run/systemd/journal/socket "$1" 3>&- & lpid=$!
    for i in $(seq 100); do [ -e "$1" ] && break; sleep 0.05; done
    (exec 2>"$2"; JOURNAL_STREAM=$(stat -L -c "%d:%i" /dev/stderr) \
      exec rb-dispatch -H jh --exec "echo boom >&2; exit 3" --drain)
    rc=$?
    sleep 0.2
    kill $lpid
    exit $rc' _ "$out" "$err"
  [ "$status" -eq 0 ]
  # what journalctl RELAYBUS_EVENT_ID=o-42 would select
  entry=$(jq -c 'select(.RELAYBUS_EVENT_ID == "o-42")' "$out")
  [ "$(jq -r '[.PRIORITY, .RELAYBUS_HANDLER, .RELAYBUS_ATTEMPT, .RELAYBUS_MAX_ATTEMPTS, .RELAYBUS_ERROR, .SYSLOG_IDENTIFIER] | @tsv' <<<"$entry")" = \
    "$(printf '4\tjh\t1\t10\texit 3\trb-dispatch')" ]
  [ "$(jq -r .MESSAGE <<<"$entry")" = "o-42: attempt 1/10 failed: exit 3" ]
  [[ "$(jq -r .RELAYBUS_LANE <<<"$entry")" =~ ^[0-9]+$ ]]
  # the drain's summary too; the handler's own stderr stays on the stream
  jq -e 'select(.MESSAGE | startswith("drained: 0 completed, 1 failed and rescheduled"))' "$out" >/dev/null
  grep -qx boom "$err"
  ! grep -q 'attempt 1/10 failed' "$err" || false
}
