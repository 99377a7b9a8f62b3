#!/usr/bin/env bats
# Secrets and hostile input: passwords never in messages, argv or the
# handlers' environment; durations bounded; --print-sql safe under any
# standard_conforming_strings; bare ids, log lines and --rejects files
# that cannot be turned against the operator.

load test_helper

setup_file() {
  if have_pg; then
    drop_schema
    rb-setup
  fi
}

teardown_file() {
  drop_schema
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    psql "$RELAYBUS_TEST_PG_URL" -X -q -c "DROP SCHEMA IF EXISTS ${RB_SCHEMA:0:44}_on CASCADE" \
      -c "DROP SCHEMA IF EXISTS ${RB_SCHEMA:0:44}_off CASCADE" \
      -c "DROP TABLE IF EXISTS public.${RB_SCHEMA:0:44}_victim" >/dev/null 2>&1 || true
  fi
}

teardown() {
  local p
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  tmux -L "rbw$$" kill-server 2>/dev/null || true
}

# the test database's port, and a URL to it that carries a password
# (the server trusts local connections and ignores it)
pg_port() { printf '%s\n' "$_test_pg_url" | sed -n 's|.*:\([0-9][0-9]*\)/.*|\1|p'; }

app_conns() { q "SELECT count(*) FROM pg_stat_activity WHERE application_name = '$1'"; }

# ---- passwords in messages (F3, F4) ------------------------------------------

@test "redaction: libpq's parse error, which quotes the password, is not shown" {
  for url in 'postgresql://postgres:se%zzret@127.0.0.1:1/x' \
             'postgresql://postgres:sec%00ret@127.0.0.1:1/x' \
             'postgresql://postgres@127.0.0.1:1/x?password=Se%zzcret'; do
    run -78 --separate-stderr rb-admin --db "$url" stats
    [[ "$stderr" != *zz* && "$stderr" != *sec* && "$stderr" != *Se* && "$stderr" != *00ret* ]] || { echo "$url: $stderr"; false; }
    [[ "$stderr" == "rb-admin: cannot connect to (unparsable connection string): "* ]]
  done
  run -78 --separate-stderr rb-admin --db 'postgresql://postgres:se%zzret@127.0.0.1:1/x' stats
  [ "$stderr" = "rb-admin: cannot connect to (unparsable connection string): invalid percent-encoded token (the rest is not shown: it may hold a password)" ]
}

@test "redaction: passwords holding ? or #, percent-encoded keys and sslpassword are masked" {
  local url
  for url in 'postgresql://postgres:pa?ss@127.0.0.1:1/x' 'postgresql://postgres:pa#ss@127.0.0.1:1/x'; do
    run -69 --separate-stderr rb-admin --db "$url" stats
    [[ "$stderr" == "rb-admin: cannot connect to postgresql://postgres:xxxxx@127.0.0.1:1/x: "* ]] || { echo "$stderr"; false; }
  done
  run -69 --separate-stderr rb-admin --db 'postgresql://postgres@127.0.0.1:1/x?pass%77ord=Secret1&sslpassword=Secret2' stats
  [[ "$stderr" == "rb-admin: cannot connect to postgresql://postgres@127.0.0.1:1/x?pass%77ord=xxxxx&sslpassword=xxxxx: "* ]] || { echo "$stderr"; false; }
  run -69 --separate-stderr rb-admin --db $'host=127.0.0.1 port=1 user=postgres\vpassword=VtSecret' stats
  [[ "$stderr" != *VtSecret* && "$stderr" == *password=xxxxx* ]] || { echo "$stderr"; false; }
}

@test "redaction: -vv 'connected to' hides a password after a newline and in the query" {
  pg_only "a libpq conninfo string, on the PostgreSQL test database"
  need_pg
  run -0 --separate-stderr rb-admin -vv --db $'host=127.0.0.1 port='"$(pg_port)"$' user=postgres dbname=postgres\npassword=NewlineSecret' lanes
  [[ "$stderr" == *"connected to host=127.0.0.1 port=$(pg_port) user=postgres dbname=postgres"* ]] || { echo "$stderr"; false; }
  [[ "$stderr" != *NewlineSecret* ]]
  run -0 --separate-stderr rb-admin -vv --db "postgresql://postgres:UserinfoSecret@127.0.0.1:$(pg_port)/postgres?sslpassword=SslSecret" lanes
  [[ "$stderr" == *"connected to postgresql://postgres:xxxxx@127.0.0.1:$(pg_port)/postgres?sslpassword=xxxxx"* ]] || { echo "$stderr"; false; }
  [[ "$stderr" != *Secret* ]]
}

# ---- argv and the handlers' environment (F5) -----------------------------------

@test "argv: a password given with --db is gone from /proc/PID/cmdline" {
  need_pg
  local base="postgresql://postgres:TopSecretPW@127.0.0.1:$(pg_port)/postgres?application_name=sec_argv"
  rb-dispatch --db "${base}1_$$" -H argvh --exec true 2>/dev/null 3>&- & PIDS=$!
  wait_for 20 '[ "$(app_conns sec_argv1_$$)" -gt 0 ]'
  run -0 sh -c "tr '\\0' ' ' </proc/$PIDS/cmdline"
  [[ "$output" == *"--db postgresql://postgres:xxxxx@127.0.0.1:"* ]] || { echo "$output"; false; }
  [[ "$output" != *TopSecretPW* ]]
  kill "$PIDS"; wait "$PIDS" || true
  # --db=URL and -uURL: the password sits in the middle of the argument
  rb-claim "--db=${base}2_$$" -H argvh --wait 20s 2>/dev/null 3>&- & PIDS=$!
  wait_for 20 '[ "$(app_conns sec_argv2_$$)" -gt 0 ]'
  run -0 sh -c "tr '\\0' ' ' </proc/$PIDS/cmdline"
  [[ "$output" == *"--db=postgresql://postgres:xxxxx@"* && "$output" != *TopSecretPW* ]] || { echo "$output"; false; }
  kill "$PIDS"; wait "$PIDS" || true
  rb-claim "-u${base}3_$$" -H argvh --wait 20s 2>/dev/null 3>&- & PIDS=$!
  wait_for 20 '[ "$(app_conns sec_argv3_$$)" -gt 0 ]'
  run -0 sh -c "tr '\\0' ' ' </proc/$PIDS/cmdline"
  [[ "$output" == *"-upostgresql://postgres:xxxxx@"* && "$output" != *TopSecretPW* ]] || { echo "$output"; false; }
  kill "$PIDS"; wait "$PIDS" || true
}

@test "environment: --exec and --pipe handlers get no RELAYBUS_URL, PGPASSWORD, PGPASSFILE, PGSERVICEFILE, PGSSLKEY" {
  need_pg
  local out=$BATS_TEST_TMPDIR/env
  printf '{"id":"env-%s","name":"t","payload":{},"handlers":["envh"]}\n' 1 2 3 | rb-publish -q
  export RELAYBUS_URL="postgresql://postgres:EnvUrlSecret@127.0.0.1:$(pg_port)/postgres"
  export PGPASSWORD=PgPwSecret PGPASSFILE=/nonexistent/pgpass PGSERVICEFILE=/nonexistent/svc PGSSLKEY=/nonexistent/key
  export PGCONNECT_TIMEOUT=7
  run -0 rb-dispatch -H envh --exec "env >>$out.exec" --drain -q
  [ -s "$out.exec" ]
  run ! grep -E '^(RELAYBUS_URL|PGPASSWORD|PGPASSFILE|PGSERVICEFILE|PGSSLKEY)=' "$out.exec"
  run ! grep Secret "$out.exec"
  grep -q "^RELAYBUS_SCHEMA=$RB_SCHEMA\$" "$out.exec"   # the rest is passed on
  grep -q '^PGCONNECT_TIMEOUT=7$' "$out.exec"
  grep -q '^PATH=' "$out.exec"
  # the same for co-processes; RELAYBUS_PASS_ENV hands on what the user names
  printf '{"id":"env-%s","name":"t","payload":{},"handlers":["envp"]}\n' 1 2 | rb-publish -q
  RELAYBUS_PASS_ENV=PGPASSWORD,PGSSLKEY run -0 rb-dispatch -H envp \
    --pipe "env >$out.pipe; exec sed -u 's/}\$/,\"ok\":true}/'" --drain -q
  grep -q '^PGPASSWORD=PgPwSecret$' "$out.pipe"
  grep -q '^PGSSLKEY=/nonexistent/key$' "$out.pipe"
  run ! grep -E '^(RELAYBUS_URL|PGPASSFILE|PGSERVICEFILE)=' "$out.pipe"
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler IN ('envh', 'envp')")" = 0 ]
}

# ---- durations (F6) ---------------------------------------------------------------

@test "durations: a bare number is a usage error that names the option and the units" {
  run -64 --separate-stderr rb-dispatch -H h --exec true --grace 30
  [[ "$stderr" == "rb-dispatch: --grace: '30' has no unit: write 30s, 30ms, 30m, 30h or 30d (see relaybus(7))"* ]] || { echo "$stderr"; false; }
  run -64 --separate-stderr rb-claim -H h --lease 2000
  [[ "$stderr" == "rb-claim: --lease: '2000' has no unit"* ]]
  run -64 --separate-stderr rb-complete --window 5
  [[ "$stderr" == "rb-complete: --window: '5' has no unit"* ]]
  run -64 --separate-stderr rb-dispatch -H h --exec true --backoff 1s,300
  [[ "$stderr" == "rb-dispatch: --backoff: '300' has no unit"* ]]
  run -64 --separate-stderr rb-dispatch -H h --exec true --timeout 1.5x
  [[ "$stderr" == "rb-dispatch: --timeout: '1.5x' is not a duration"* ]]
  run -64 --separate-stderr rb-dispatch -H h --exec true --timeout 0.1ms
  [[ "$stderr" == "rb-dispatch: --timeout: '0.1ms' is not a whole number of milliseconds"* ]]
}

@test "durations: compound and decimal forms are accepted; 0 needs no unit" {
  # accepted: the program gets past its options and fails to connect (69)
  local db='postgresql://x@127.0.0.1:1/x'
  run -69 rb-dispatch --db "$db" -H h --exec true --timeout 1m30s --grace 1.5s --lease 2h --poll 0.25s --window 0
  run -69 rb-claim --db "$db" -H h --lease 1d --wait 1h30m15s500ms --poll 1min
  run -69 rb-admin --db "$db" purge --dead-older-than 3650d
}

@test "durations: values beyond an option's maximum are usage errors (exit 64), not overflows" {
  run -64 --separate-stderr rb-dispatch -H h --exec true --timeout 9223372036854775807ms
  [[ "$stderr" == "rb-dispatch: --timeout: '9223372036854775807ms' is more than 24d"* ]] || { echo "$stderr"; false; }
  run -64 --separate-stderr rb-dispatch -H h --exec true --grace 25d
  [[ "$stderr" == "rb-dispatch: --grace: '25d' is more than 24d"* ]]
  run -64 --separate-stderr rb-dispatch -H h --exec true --poll 106751991167d
  run -64 --separate-stderr rb-claim -H h --lease 25h
  [[ "$stderr" == "rb-claim: --lease: '25h' is more than 1d"* ]]
  run -64 --separate-stderr rb-claim -H h --wait 30d --poll 30d
  [[ "$stderr" == "rb-claim: --wait: '30d' is more than 24d"* ]]
  run -64 rb-dispatch -H h --exec true --backoff 1s,366d
  run -64 rb-admin purge --dead-older-than 3651d
  run -64 rb-publish --flush 25d
  run -64 rb-pageinspect watch --interval 25d
}

@test "durations: the largest values run (no overflow of the clocks, no busy loop)" {
  need_pg
  # nothing due: a drain at the largest timeout, grace, poll and lease ends at once
  run -0 --separate-stderr rb-dispatch -H maxh --exec true --timeout 24d --grace 24d --poll 24d \
    --lease 1d --window 24d --stats-every 24d --drain
  # rb-claim waits the --wait it was given even with the longest --poll
  local t0=$SECONDS
  run -1 rb-claim -H maxh --wait 1s --poll 24d --lease 1d
  [ $(( SECONDS - t0 )) -le 5 ]
  printf '{"id":"max-1","name":"t","payload":{},"handlers":["maxh"]}\n' | rb-publish -q --flush 24d
  run -0 rb-claim -H maxh --wait 24d --poll 24d --lease 1d
  [[ "$output" == *'"event_id":"max-1"'* ]]
}

# ---- --print-sql under standard_conforming_strings = off (F7) -------------------------

@test "--print-sql: the script makes the same schema with standard_conforming_strings off" {
  need_pg
  local on=${RB_SCHEMA:0:44}_on off=${RB_SCHEMA:0:44}_off victim=${RB_SCHEMA:0:44}_victim
  local pat="x\\', \$\$l\$\$) ON CONFLICT DO NOTHING; DROP TABLE public.$victim; --"
  psql "$_test_pg_url" -X -q -c "CREATE TABLE public.$victim (x int)"
  rb-setup --print-sql --schema "$on" --subscribe "h:$pat" --subscribe 'h2:a\b*' >"$BATS_TEST_TMPDIR/on.sql"
  rb-setup --print-sql --schema "$off" --subscribe "h:$pat" --subscribe 'h2:a\b*' >"$BATS_TEST_TMPDIR/off.sql"
  psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -f "$BATS_TEST_TMPDIR/on.sql" >/dev/null 2>&1
  PGOPTIONS='-c standard_conforming_strings=off' \
    psql "$_test_pg_url" -X -q -v ON_ERROR_STOP=1 -f "$BATS_TEST_TMPDIR/off.sql" >/dev/null 2>&1 || true
  # the victim survived, and both schemas hold the patterns verbatim
  [ "$(psql "$_test_pg_url" -X -A -t -c "SELECT count(*) FROM public.$victim")" = 0 ]
  local a b
  a=$(psql "$_test_pg_url" -X -A -t -c "SELECT handler, pattern, like_pattern FROM $on.relaybus_subscriptions ORDER BY 1")
  b=$(psql "$_test_pg_url" -X -A -t -c "SELECT handler, pattern, like_pattern FROM $off.relaybus_subscriptions ORDER BY 1")
  [ "$a" = "$b" ]
  [[ "$a" == *"h|$pat|"* && "$a" == *'h2|a\b*|a\\b%'* ]] || { echo "$a"; false; }
  a=$(psql "$_test_pg_url" -X -A -t -c "SELECT count(*) FROM pg_proc WHERE pronamespace = '$on'::regnamespace")
  b=$(psql "$_test_pg_url" -X -A -t -c "SELECT count(*) FROM pg_proc WHERE pronamespace = '$off'::regnamespace")
  [ "$a" = "$b" ] && [ "$a" -gt 5 ]
}

# ---- bare ids, log lines, --rejects (F9, F10, F12) -----------------------------------

@test "rb-admin: a bare id with a NUL or invalid UTF-8 is an error (65), never a cut id" {
  need_pg
  printf '{"id":"o-1","name":"t","payload":{},"handlers":["adm"]}\n' | rb-publish -q
  run -65 --separate-stderr sh -c "printf 'o-1\\0garbage\\n' | rb-admin cancel"
  [ "$stderr" = "rb-admin: stdin:1: the event id holds a NUL byte" ] || { echo "$stderr"; false; }
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'o-1'")" = 1 ]
  run -65 --separate-stderr sh -c "printf 'o-\\377\\n' | rb-admin cancel"
  [ "$stderr" = "rb-admin: stdin:1: the event id is not valid UTF-8" ] || { echo "$stderr"; false; }
  run -65 --separate-stderr rb-admin cancel $'o-\xff'
  [ "$stderr" = "rb-admin: cancel: the event id 'o-\\xff' is not valid UTF-8" ] || { echo "$stderr"; false; }
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = 'o-1'")" = 1 ]
}

@test "logs: event ids and handler errors cannot forge log lines or send escape codes" {
  need_pg
  run -65 --separate-stderr rb-admin cancel $'inj\nrb-admin: everything is fine\e[2J'
  [ "$(printf '%s\n' "$stderr" | wc -l)" = 1 ] || { echo "$stderr"; false; }
  [[ "$stderr" == *"no delivery of event 'inj\\nrb-admin: everything is fine\\x1b[2J'"* ]] || { echo "$stderr"; false; }
  # a co-process's error text: its first line in the failed attempt's
  # warning, all of it, escaped, in the burial's
  printf '{"id":"log-1","name":"t","payload":{},"handlers":["logh"]}\n' | rb-publish -q
  run -0 --separate-stderr rb-dispatch -H logh -v --max-attempts 1 --drain \
    --pipe "sed -u 's/}\$/,\"ok\":false,\"error\":\"boom\\\\nrb-dispatch: forged\\\\u001b[31m\\\\u0085\"}/'"
  [[ "$stderr" == *'attempt 1/1 failed: boom'$'\n'* ]] || { echo "$stderr"; false; }
  [[ "$stderr" == *'buried after 1 attempts: boom\nrb-dispatch: forged\x1b[31m\u0085'* ]] || { echo "$stderr"; false; }
  [[ $'\n'"$stderr" != *$'\n'"rb-dispatch: forged"* && "$stderr" != *$'\e'* ]] || { echo "$stderr"; false; }
}

@test "logs: the json format keeps a message that is not valid UTF-8" {
  need_pg
  run -65 --separate-stderr rb-admin --log-format json cancel $'bad-\xff-id'
  [[ "$stderr" == *'"level":"error"'* && "$stderr" == *'bad-\\xff-id'* ]] || { echo "$stderr"; false; }
}

@test "--rejects: a symbolic link is refused and a new file is created 0600" {
  need_pg
  cd "$BATS_TEST_TMPDIR"
  echo keep >target
  ln -s target link
  run -73 --separate-stderr rb-publish -k --rejects link <<<'not json'
  [[ "$stderr" == "rb-publish: --rejects: cannot open link: it is a symbolic link"* ]] || { echo "$stderr"; false; }
  [ "$(cat target)" = keep ]
  umask 022
  run -65 rb-publish -k --rejects new.jsonl <<<'not json'
  [ "$(cat new.jsonl)" = 'not json' ]
  [ "$(stat -c %a new.jsonl)" = 600 ]
}

# A payload PostgreSQL holds and jansson cannot (an integer beyond 64 bits,
# 1e400), published with SQL as other languages do, plus 0.1 (which a
# parse-and-print turns into 0.10000000000000001).  Prints its event id.
fid_publish() {
  rb-setup --subscribe fid:fid.big >/dev/null
  q "SELECT event_id FROM relaybus_publish('fid.big',
     '{\"n\":123456789012345678901234567890,\"x\":1e400,\"p\":0.1}'::jsonb)"
}
# the payload as PostgreSQL prints it, compacted: what the line must carry
fid_stored() { q "SELECT replace(payload::text, ' ', '') FROM relaybus_events WHERE id = '$1'"; }
# the payload member of a delivery line
fid_payload() { sed -n 's/.*"payload":\({[^}]*}\),"headers".*/\1/p' "$@"; }
fid_left() { q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'fid'"; }

@test "payloads: --exec gets numbers jansson cannot hold byte for byte, and completes them" {
  need_pg
  local id want
  id=$(fid_publish)
  want=$(fid_stored "$id")
  [[ "$want" == *'"n":123456789012345678901234567890'* && "$want" == *'"p":0.1'* ]] || { echo "$want"; false; }
  run -0 rb-dispatch -H fid --exec "cat > '$BATS_TEST_TMPDIR/line'" --drain
  [ "$(fid_payload "$BATS_TEST_TMPDIR/line")" = "$want" ]
  [ "$(fid_left)" = 0 ]
}

@test "payloads: a --pipe co-process that echoes such a line completes it (no timeout)" {
  need_pg
  local id want
  id=$(fid_publish)
  want=$(fid_stored "$id")
  run -0 --separate-stderr timeout 60 rb-dispatch -H fid --pipe "tee '$BATS_TEST_TMPDIR/line'" \
    --timeout 20s --drain
  [[ "$stderr" != *ignored* ]] || { echo "$stderr"; false; }
  [ "$(fid_payload "$BATS_TEST_TMPDIR/line")" = "$want" ]
  [ "$(fid_left)" = 0 ]
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE event_id = '$id'")" = 0 ]
}

@test "payloads: --sql's \$1 carries such a payload as stored, never null or re-printed" {
  need_pg
  local id want
  id=$(fid_publish)
  want=$(fid_stored "$id")
  q "CREATE TABLE IF NOT EXISTS fid_got (t text); TRUNCATE fid_got"
  run -0 rb-dispatch -H fid --sql "INSERT INTO $RB_SCHEMA.fid_got VALUES (\$1)" --drain
  [ "$(q "SELECT count(*) FROM fid_got")" = 1 ]
  [ "$(q "SELECT t FROM fid_got" | fid_payload)" = "$want" ]
  [ "$(q "SELECT (t::jsonb)->'payload' = (SELECT payload FROM relaybus_events WHERE id = '$id')
           AND (t::jsonb)->>'ok' = 'true' FROM fid_got")" = t ]
  [ "$(fid_left)" = 0 ]
}

@test "payloads: rb-claim | cat | rb-complete completes such a delivery, and --sql gets the line as it came" {
  need_pg
  local id want
  id=$(fid_publish)
  want=$(fid_stored "$id")
  run -0 --separate-stderr bash -c "rb-claim -H fid | tee '$BATS_TEST_TMPDIR/line' | cat | rb-complete -o"
  [ "$(fid_payload "$BATS_TEST_TMPDIR/line")" = "$want" ]
  [[ "$output" == *'"outcome":"completed"'* ]] || { echo "$output $stderr"; false; }
  [ "$(fid_left)" = 0 ]
  # rb-complete --sql: $1 is the result line byte for byte
  id=$(fid_publish)
  q "CREATE TABLE IF NOT EXISTS fid_got (t text); TRUNCATE fid_got"
  run -0 --separate-stderr bash -c "rb-claim -H fid | tee '$BATS_TEST_TMPDIR/line' |
    rb-complete --sql \"INSERT INTO $RB_SCHEMA.fid_got VALUES (\\\$1)\""
  [ "$(q "SELECT t FROM fid_got")" = "$(tr -d '\n' < "$BATS_TEST_TMPDIR/line")" ]
  [ "$(fid_left)" = 0 ]
  # a member rb-complete reads must still be valid: retry_ms 1e400 is refused, naming it
  id=$(fid_publish)
  run -65 --separate-stderr bash -c "rb-claim -H fid | sed 's/}\$/,\"ok\":false,\"retry_ms\":1e400}/' | rb-complete"
  [[ "$stderr" == *"stdin:1: invalid JSON: real number overflow"*"(field 'retry_ms'): not applied"* ]] ||
    { echo "$stderr"; false; }
}

# ---- -W: the password asked for on the terminal --------------------------------

@test "-W asks for the password on the terminal with echo off, and no handler gets it" {
  need_pg
  pg_only "rb-dispatch --exec on PostgreSQL"
  local tm="tmux -L rbw$$" pane
  rb-setup -q -s 'pw:pw.*'
  echo '{"id":"pw-1","name":"pw.x","payload":{}}' | rb-publish -q
  $tm new-session -d -x 150 -y 30 "rb-admin -W --json stats --handler pw; echo rc=\$?;
    rb-dispatch -W -H pw --drain --exec 'env > $BATS_TEST_TMPDIR/env'; echo rc=\$?; sleep 60" 3>&-
  wait_for 20 '$tm capture-pane -p | grep -q "^Password:"'
  $tm send-keys 'TopSecretPW1' Enter
  wait_for 20 '$tm capture-pane -p | grep -q "^rc=0"'
  wait_for 20 '[ "$($tm capture-pane -p | grep -c "^Password:")" = 2 ]'
  $tm send-keys 'TopSecretPW2' Enter
  wait_for 30 '[ "$($tm capture-pane -p | grep -c "^rc=")" = 2 ]'
  pane=$($tm capture-pane -p)
  $tm kill-server
  echo "$pane"
  [[ $pane == *'"handler":"pw","pending":1'* ]]
  [ "$(grep -c '^rc=0' <<<"$pane")" = 2 ]
  [[ $pane != *TopSecretPW* ]]
  [ -s "$BATS_TEST_TMPDIR/env" ]
  ! grep -q 'TopSecretPW' "$BATS_TEST_TMPDIR/env"
  [ "$(q "SELECT count(*) FROM relaybus_deliveries WHERE handler = 'pw'")" = 0 ]
  # without a terminal: a usage error naming the way out
  run --separate-stderr setsid -w rb-admin -W stats </dev/null
  [ "$status" -eq 64 ]
  [[ ${stderr_lines[0]} == "rb-admin: --password: no terminal to ask on (give a passfile: PGPASSFILE)" ]]
}
