#!/usr/bin/env bats
# The bats library (bats/relaybus, installed for `bats_load_library
# relaybus`), used the way a user testing a handler would: a database of the
# file's own, rb_publish, rb_run_handler / rb_dispatch, assert_delivery_*.
# Not through test_helper (it clears RELAYBUS_URL in every test): the
# programs under test on PATH, the database as the library finds it.

bats_require_minimum_version 1.5.0
export LC_ALL=C
RB_BINDIR=${RB_BINDIR:-$BATS_TEST_DIRNAME/../cmd}
RB_SRCDIR=${RB_SRCDIR:-$BATS_TEST_DIRNAME/..}
PATH=$RB_BINDIR:$PATH
export BATS_LIB_PATH=$RB_SRCDIR/bats${BATS_LIB_PATH:+:$BATS_LIB_PATH}
bats_load_library relaybus

# a database named by RELAYBUS_TEST_PG_URL or PG* (without, the library starts one of
# its own: a test below); none: skip, or fail under RELAYBUS_REQUIRE_PG=1 (scripts/test)
have_db() { [ -n "${RELAYBUS_TEST_PG_URL:-}${PGHOST:-}${PGHOSTADDR:-}${PGPORT:-}${PGSERVICE:-}" ]; }

setup_file() {
  if ! have_db; then
    [ "${RELAYBUS_REQUIRE_PG:-}" != 1 ] || { echo "RELAYBUS_REQUIRE_PG=1 but no database" >&2; return 1; }
    return 0
  fi
  relaybus_setup_file --subscribe 'mailer:order.*' --subscribe 'ledger:order.paid'
  # the user's handler: JSON lines in, a verdict per line out
  cat >"$BATS_FILE_TMPDIR/send-mail" <<'EOF'
#!/bin/sh
exec jq -c --unbuffered 'if .payload.fail then . + {ok: false, error: .payload.fail}
  elif .payload.dead then . + {dead: true, error: "undeliverable"} else . + {ok: true} end'
EOF
  chmod +x "$BATS_FILE_TMPDIR/send-mail"
}

teardown_file() { relaybus_teardown_file; }

need_db() { [ -n "${RELAYBUS_TEST_DB:-}" ] || skip "no test database (set RELAYBUS_TEST_PG_URL, or PG*: pg_virtualenv)"; }

@test "relaybus_setup_file: a database of this file's own, set up, in RELAYBUS_URL" {
  need_db
  [[ "$RELAYBUS_TEST_DB" == rbt_bats_lib_* ]]
  [ "$(rb_psql -c 'SELECT current_database()')" = "$RELAYBUS_TEST_DB" ]
  [ "$(rb-admin --json subscriptions | jq -r .handler | sort -u | tr '\n' ' ')" = "ledger mailer " ]
}

@test "a handler that succeeds: completed; the other handler's delivery not run yet" {
  need_db
  rb_publish '{"id":"ok-1","name":"order.paid","payload":{"total":99}}'
  run rb_run_handler mailer "$BATS_FILE_TMPDIR/send-mail"
  [ "$status" -eq 0 ]
  [[ "$output" == *'"event_id":"ok-1","handler":"mailer","outcome":"completed"'* ]]
  assert_delivery_completed ok-1 mailer
  assert_delivery_pending ok-1 ledger
}

@test "a failure is rescheduled with its attempt and error; a dead verdict buries" {
  need_db
  rb_publish '{"id":"f-1","name":"order.created","payload":{"fail":"smtp 451"}}' \
    '{"id":"d-1","name":"order.created","payload":{"dead":true}}'
  rb_run_handler mailer "$BATS_FILE_TMPDIR/send-mail" >/dev/null
  assert_delivery_rescheduled f-1 mailer --attempt 1 --error "smtp 451"
  assert_delivery_dead d-1 mailer --attempt 1 --error undeliverable
}

@test "the assertions fail, and say why, when the delivery is elsewhere" {
  need_db
  rb_publish '{"id":"w-1","name":"order.created","payload":{}}'
  run assert_delivery_completed w-1 mailer
  [ "$status" -eq 1 ]
  [ "${lines[0]}" = "-- delivery is not completed --" ]
  [[ "$output" == *"actual   : pending"* ]]
  run assert_delivery_dead w-1 ledger
  [ "$status" -eq 1 ]
  [ "${lines[0]}" = "-- event w-1 has no delivery for ledger --" ]
  run assert_delivery_pending no-such-event mailer
  [ "$status" -eq 1 ]
  [ "${lines[0]}" = "-- no event no-such-event --" ]
  rb_run_handler mailer "$BATS_FILE_TMPDIR/send-mail" >/dev/null
  run assert_delivery_rescheduled w-1 mailer
  [ "$status" -eq 1 ]
  run assert_delivery_completed w-1 mailer --attempt 2
  [ "$status" -eq 1 ]
  [ "${lines[0]}" = "-- delivery is completed, but not after attempt 2 --" ]
  run rb_publish '{"name":"order.created"}'
  [ "$status" -eq 65 ]
  [[ "$output" == *"missing field 'payload'"* ]]
}

@test "rb_run_handler --settle: a handler that always fails ends dead after --max-attempts, without waiting for backoffs" {
  need_db
  rb_publish '{"id":"s-1","name":"order.created","payload":{"fail":"always"}}'
  local t0=$SECONDS
  rb_run_handler --settle --max-attempts 4 mailer "$BATS_FILE_TMPDIR/send-mail" >/dev/null
  assert_delivery_dead s-1 mailer --attempt 4 --error always
  # the backoffs (1 s, 2 s, 4 s by default) were not waited for
  [ $((SECONDS - t0)) -lt 7 ]
}

@test "rb_dispatch --settle: rb-dispatch --settle, the retries end dead after N attempts without waiting for backoffs" {
  need_db
  rb_publish '{"id":"x-1","name":"order.created","payload":{}}'
  local t0=$SECONDS
  rb_dispatch --settle mailer --exec 'echo "no route" >&2; exit 1' --max-attempts 4
  assert_delivery_dead x-1 mailer --attempt 4 --error 'exit 1'
  # the backoffs (1 s, 2 s, 4 s by default) were not waited for
  [ $((SECONDS - t0)) -lt 7 ]
  rb_publish '{"id":"x-2","name":"order.created","payload":{}}'
  rb_dispatch mailer --exec 'cat >/dev/null'
  assert_delivery_completed x-2 mailer
}

@test "rb_dispatch: RELAYBUS_URL reaches the --exec handler too, as the library says; its own transaction completes the delivery" {
  need_db
  rb_psql -c 'CREATE TABLE seen (event_id text PRIMARY KEY)'
  rb_publish '{"id":"u-1","name":"order.paid","payload":{}}'
  # a handler that writes with RELAYBUS_URL alone and completes in its own transaction
  cat >"$BATS_TEST_TMPDIR/see" <<'EOF'
#!/bin/sh
line=$(cat)
psql "$RELAYBUS_URL" -XAtq -v ON_ERROR_STOP=1 -v line="$line" <<'SQL' | grep -qx completed && exit 80
BEGIN;
INSERT INTO seen VALUES (:'line'::jsonb->>'event_id');
SELECT relaybus_complete(:'line');
COMMIT;
SQL
exit 1
EOF
  chmod +x "$BATS_TEST_TMPDIR/see"
  rb_dispatch ledger --exec "$BATS_TEST_TMPDIR/see"
  assert_delivery_completed u-1 ledger
  [ "$(rb_psql -c "SELECT count(*) FROM seen WHERE event_id = 'u-1'")" = 1 ]
}

@test "scripts/pg-tmp started from a folder the postgres user cannot enter prints its URL and nothing else" {
  [ "$(id -u)" = 0 ] || skip "as root only (the server runs as postgres)"
  command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || skip "no PostgreSQL server"
  local priv=$BATS_TEST_TMPDIR/private dir
  mkdir -m 700 "$priv"
  dir=$(mktemp -d) && chmod 755 "$dir"
  run bash -c 'cd "$1" && "$2" start "$3" 3>&- 2>&1' sh "$priv" "$RB_SRCDIR/scripts/pg-tmp" "$dir"
  "$RB_SRCDIR/scripts/pg-tmp" stop "$dir" >/dev/null 2>&1 3>&- || true
  rm -rf "$dir"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" =~ ^postgresql://postgres@127\.0\.0\.1:[0-9]+/postgres$ ]]
}

@test "with no database given at all, the library starts a throwaway PostgreSQL for the file" {
  need_db  # a machine with a database to test against can start one
  command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || skip "no PostgreSQL server"
  local dir=$BATS_TEST_TMPDIR/user
  mkdir -p "$dir"
  cat >"$dir/handler.bats" <<'EOF'
bats_load_library relaybus
setup_file() { relaybus_setup_file -s 'h:e.*'; }
teardown_file() { relaybus_teardown_file; }
TEST "own cluster" {
  [ -n "$RELAYBUS_TEST_OWN_PG" ]
  rb_publish '{"id":"u-1","name":"e.x","payload":{}}'
  rb_run_handler h jq -c '. + {ok: true}'
  assert_delivery_completed u-1 h
}
EOF
  sed -i 's/^TEST /@test /' "$dir/handler.bats"  # not a test of this file: bats reads every @test line
  # a clean environment, as in the user's shell: no database named anywhere
  local path
  path=$(tr ':' '\n' <<<"$PATH" | grep -v bats-core | paste -sd:)  # without bats' own libexec
  run env -i PATH="$path" HOME="$HOME" BATS_LIB_PATH="$BATS_LIB_PATH" bats "$dir/handler.bats"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"ok 1 own cluster"* ]]
  # and stopped it: no server left in a relaybus-bats folder
  ! pgrep -f 'relaybus-bats\.[A-Za-z0-9]+/data' >/dev/null || false
}
