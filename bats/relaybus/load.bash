# relaybus helpers for bats-core: test your own handlers against a real
# PostgreSQL.  Load with `bats_load_library relaybus` (BATS_LIB_PATH, by
# default /usr/lib/bats).  SPDX-License-Identifier: MIT
#
#   setup_file()    { relaybus_setup_file --subscribe 'mailer:order.*'; }
#   teardown_file() { relaybus_teardown_file; }
#
#   @test "a paid order sends one mail" {
#     rb_publish '{"id":"o-1","name":"order.paid","payload":{"total":99}}'
#     rb_run_handler mailer ./send-mail          # rb-claim | ./send-mail | rb-complete
#     assert_delivery_completed o-1 mailer
#   }
#
# The database: $RELAYBUS_TEST_PG_URL, else libpq's PG* variables (what
# `pg_virtualenv bats tests/` sets), else a throwaway cluster of the
# library's own (pg-tmp, about two seconds a file).  Each test file gets a
# database of its own, created by relaybus_setup_file and dropped by
# relaybus_teardown_file; RELAYBUS_URL points at it for the relaybus
# programs and your handlers, and rb_psql runs psql there.  RELAYBUS_URL
# from your own environment is never used: it may be a real database.
#
# Needs the relaybus programs on PATH, psql and jq.

_rb_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# A failure in the style of bats-assert: "-- TITLE --", "key : value" lines, "--", on stderr.
_rb_fail() {  # title [key value]...
  local title=$1 k
  shift
  {
    echo "-- $title --"
    while [ $# -ge 2 ]; do
      printf '%-9s: %s\n' "$1" "$2"
      shift 2
    done
    echo "--"
  } >&2
  return 1
}

# A connection string for database DB on the server of BASE (a URL, a
# conninfo string, or empty for libpq's environment).
_rb_url_for_db() {  # base db
  case $1 in
    postgres://* | postgresql://*)
      sed -E "s#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\1/$2#" <<<"$1" ;;
    '') echo "dbname=$2" ;;
    *) echo "$1 dbname=$2" ;;
  esac
}

# relaybus_setup_file [RB-SETUP OPTION...]: for setup_file.  A database for
# this test file, RELAYBUS_URL pointing at it, the relaybus schema set up
# there (rb-setup with the options given, e.g. --subscribe HANDLER:PATTERN).
relaybus_setup_file() {
  local base db out
  unset RELAYBUS_SCHEMA
  if [ -n "${RELAYBUS_TEST_PG_URL:-}" ]; then
    base=$RELAYBUS_TEST_PG_URL
  elif [ -n "${PGHOST:-}${PGHOSTADDR:-}${PGPORT:-}${PGSERVICE:-}" ]; then
    base=
  else
    local pgtmp=$_rb_lib_dir/pg-tmp
    [ -x "$pgtmp" ] || pgtmp=$_rb_lib_dir/../../scripts/pg-tmp  # the source tree
    [ -x "$pgtmp" ] || { _rb_fail "no database" hint "set RELAYBUS_TEST_PG_URL, or run under pg_virtualenv"; return 1; }
    RELAYBUS_TEST_OWN_PG=$(mktemp -d "${TMPDIR:-/tmp}/relaybus-bats.XXXXXX") && chmod 755 "$RELAYBUS_TEST_OWN_PG" || return 1
    export RELAYBUS_TEST_OWN_PG
    if ! base=$("$pgtmp" start "$RELAYBUS_TEST_OWN_PG" 3>&- 2>&1); then
      _rb_fail "cannot start a throwaway PostgreSQL" output "$base"
      return 1
    fi
  fi
  db=$(basename "$BATS_TEST_FILENAME" .bats | tr -c 'a-z0-9_\n' '_')
  db="rbt_${db:0:40}_$$_$RANDOM"
  if ! out=$(psql "$base" -X -q -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$db\"" 2>&1); then
    _rb_fail "cannot create the test database" database "$db" output "$out"
    return 1
  fi
  export RELAYBUS_TEST_BASE_URL=$base RELAYBUS_TEST_DB=$db
  RELAYBUS_URL=$(_rb_url_for_db "$base" "$db")
  export RELAYBUS_URL
  if [ -z "$base" ]; then  # psql and your handlers, through libpq's environment
    export RELAYBUS_TEST_BASE_PGDATABASE=${PGDATABASE:-} PGDATABASE=$db
  fi
  if ! out=$(rb-setup -q "$@" 2>&1); then
    _rb_fail "rb-setup failed" options "$*" output "$out"
    return 1
  fi
}

# relaybus_teardown_file: for teardown_file.  Drops the file's database (and
# stops the throwaway cluster if the library started one).
relaybus_teardown_file() {
  if [ -n "${RELAYBUS_TEST_DB:-}" ]; then
    # from the database the server was reached through (libpq's: the one before ours)
    PGDATABASE=${RELAYBUS_TEST_BASE_PGDATABASE:-postgres} psql "${RELAYBUS_TEST_BASE_URL:-}" -X -q \
      -c "DROP DATABASE IF EXISTS \"$RELAYBUS_TEST_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  if [ -n "${RELAYBUS_TEST_OWN_PG:-}" ]; then
    local pgtmp=$_rb_lib_dir/pg-tmp
    [ -x "$pgtmp" ] || pgtmp=$_rb_lib_dir/../../scripts/pg-tmp
    "$pgtmp" stop "$RELAYBUS_TEST_OWN_PG" >/dev/null 2>&1 3>&- || true
    rm -rf "$RELAYBUS_TEST_OWN_PG"
  fi
}

# rb_psql [PSQL OPTION...]: psql on the test database, unaligned, tuples only, stop on error.
rb_psql() {
  psql "$RELAYBUS_URL" -X -A -t -q -v ON_ERROR_STOP=1 "$@"
}

# rb_publish [EVENT...]: publish the events (one JSON object each, as rb-publish
# reads them; stdin when none are given).  Fails the test on a bad event.
rb_publish() {
  local out rc=0
  if [ $# -gt 0 ]; then
    out=$(printf '%s\n' "$@" | rb-publish -q 2>&1) || rc=$?
  else
    out=$(rb-publish -q 2>&1) || rc=$?
  fi
  [ $rc -eq 0 ] || _rb_fail "rb-publish failed (exit $rc)" output "$out" || return $rc
}

# rb_retry_now HANDLER: the retries of HANDLER that wait for their backoff
# are due now (no waiting in tests; attempts and errors are kept).
rb_retry_now() {
  [[ $1 =~ ^[A-Za-z0-9_.:-]+$ ]] || { _rb_fail "bad handler name" handler "$1"; return 64; }
  rb_psql -v h="$1" <<'EOF'
UPDATE relaybus_deliveries SET available_at = now()
 WHERE handler = :'h' AND status = 'pending' AND available_at > now();
EOF
}

# How many deliveries of HANDLER are still to run (pending or in flight).
_rb_unsettled() {
  local out
  out=$(rb-admin --json list --handler "$1" --status pending,processing) || return
  [ -z "$out" ] && echo 0 || wc -l <<<"$out"
}

# rb_run_handler [--settle] [--max-attempts N] HANDLER COMMAND [ARG...]:
# run COMMAND as `rb-claim -H HANDLER | COMMAND | rb-complete` until nothing
# of HANDLER is due.  COMMAND reads delivery lines and writes each back with
# "ok":true, or "ok":false,"error":"..." (a retry after a backoff), or
# "dead":true.  The outcome lines of rb-complete go to stdout.  --settle:
# until every delivery of HANDLER is completed or dead, a failure due again
# at once (rb-complete --backoff 0ms); it fails, naming them, when some still
# wait after $RELAYBUS_TEST_TIMEOUT s (a "retry_ms", or a run without --settle).
# Fails when rb-claim, COMMAND or rb-complete fails.
rb_run_handler() {
  local settle=no max=() backoff=() handler rounds=0 rc st
  while :; do
    case ${1:-} in
      --settle) settle=yes; backoff=(--backoff 0ms); shift ;;
      --max-attempts) max=(--max-attempts "$2"); shift 2 ;;
      *) break ;;
    esac
  done
  handler=${1:?rb_run_handler: HANDLER COMMAND}
  shift
  [ $# -gt 0 ] || { _rb_fail "rb_run_handler: no COMMAND" handler "$handler"; return 64; }
  local batch=${BATS_TEST_TMPDIR:-${TMPDIR:-/tmp}}/rb_run_handler.$$
  local deadline=$((SECONDS + ${RELAYBUS_TEST_TIMEOUT:-60}))
  while :; do
    rc=0
    rb-claim -q -H "$handler" "${max[@]}" >"$batch" || rc=$?
    if [ $rc -eq 1 ]; then  # nothing due
      local left=0
      if [ $settle = yes ]; then left=$(_rb_unsettled "$handler") || return; fi
      if [ "$left" -eq 0 ]; then rm -f "$batch"; return 0; fi
      # due at once, but a lane may still be held for a moment (a lease
      # being handed back): look again, up to $RELAYBUS_TEST_TIMEOUT s
      if [ $SECONDS -ge $deadline ]; then
        rm -f "$batch"
        _rb_fail "rb_run_handler --settle: $left deliveries still wait (a retry_ms, or a backoff from a run without --settle)" handler "$handler"
        return 1
      fi
      sleep 0.1
    elif [ $rc -ne 0 ]; then
      rm -f "$batch"
      _rb_fail "rb-claim failed (exit $rc)" handler "$handler"
      return $rc
    else
      { "$@" <"$batch" | rb-complete -q -o "${max[@]}" "${backoff[@]}"; st=("${PIPESTATUS[@]}"); } || true
      if [ "${st[0]}" -ne 0 ] || [ "${st[1]}" -ne 0 ]; then
        rm -f "$batch"
        _rb_fail "the handler run failed" handler "$handler" command "$*" \
          "exit" "$1: ${st[0]}, rb-complete: ${st[1]}"
        return 1
      fi
    fi
    rounds=$((rounds + 1))
    if [ $rounds -ge 10000 ]; then
      rm -f "$batch"
      _rb_fail "rb_run_handler: still not done after 10000 rounds" handler "$handler"
      return 1
    fi
  done
}

# rb_dispatch [--settle] HANDLER RB-DISPATCH OPTION...: run `rb-dispatch
# --handler HANDLER --drain` with the options given (--exec CMD, --pipe CMD,
# --sql SQL, --max-attempts N, ...), at most $RELAYBUS_TEST_TIMEOUT seconds
# (default 60).  --drain ends while a retry waits for its backoff; --settle
# runs `rb-dispatch --settle` instead: retries due at once, until every
# delivery it runs is completed or dead.  The handlers get RELAYBUS_URL,
# the test database (RELAYBUS_PASS_ENV, rb-dispatch(1)).
rb_dispatch() {
  local drain=--drain handler rc=0
  [ "${1:-}" = --settle ] && { drain=--settle; shift; }
  handler=${1:?rb_dispatch: HANDLER OPTION...}
  shift
  # the test database's URL reaches the handlers too (rb-dispatch withholds
  # RELAYBUS_URL from them unless RELAYBUS_PASS_ENV names it)
  RELAYBUS_PASS_ENV=RELAYBUS_URL${RELAYBUS_PASS_ENV:+,$RELAYBUS_PASS_ENV} \
    timeout "${RELAYBUS_TEST_TIMEOUT:-60}" rb-dispatch -q --handler "$handler" $drain "$@" || rc=$?
  if [ $rc -eq 124 ]; then
    _rb_fail "rb-dispatch did not drain within ${RELAYBUS_TEST_TIMEOUT:-60} s" handler "$handler" || return $rc
  elif [ $rc -ne 0 ]; then
    _rb_fail "rb-dispatch failed (exit $rc)" handler "$handler" options "$*" || return $rc
  fi
}

# rb_delivery EVENT_ID HANDLER: the delivery as `rb-admin show` prints it (one
# JSON line), or nothing when there is none (completed, or never made).
rb_delivery() {
  rb-admin --json show "$1" 2>/dev/null | jq -c --arg h "$2" '.deliveries[] | select(.handler == $h)'
}

# assert_delivery EVENT_ID HANDLER STATE [--attempt N] [--error TEXT]
# STATE: completed, pending (not run yet), rescheduled (failed, to run
# again), dead, or processing (leased now).  --attempt N: the delivery has
# been charged N attempts (rescheduled after its Nth, dead after its Nth);
# --error TEXT: its last error is TEXT.
assert_delivery() {
  local id=${1:?assert_delivery: EVENT_ID HANDLER STATE} handler=${2:?} want=${3:?} attempt= error= have_error=no
  shift 3
  while [ $# -gt 0 ]; do
    case $1 in
      --attempt) attempt=$2; shift 2 ;;
      --error) error=$2; have_error=yes; shift 2 ;;
      *) _rb_fail "assert_delivery: unknown option" option "$1"; return 64 ;;
    esac
  done
  local ev d status attempts last
  if ! ev=$(rb-admin --json show "$id" 2>&1); then
    _rb_fail "no event $id" handler "$handler" expected "$want" output "$ev"
    return 1
  fi
  d=$(jq -c --arg h "$handler" '.deliveries[] | select(.handler == $h)' <<<"$ev")
  if [ -z "$d" ]; then
    if jq -e --arg h "$handler" '.handlers | index($h)' <<<"$ev" >/dev/null; then
      status=completed
    else
      _rb_fail "event $id has no delivery for $handler" handlers "$(jq -c .handlers <<<"$ev")" expected "$want"
      return 1
    fi
  else
    status=$(jq -r .status <<<"$d")
    attempts=$(jq -r '.attempts // .attempt' <<<"$d")
    last=$(jq -r '.last_error // ""' <<<"$d")
    [ "$status" = pending ] && [ "$attempts" -gt 0 ] && status=rescheduled
  fi
  local -a facts=(event "$id" handler "$handler" expected "$want" actual "$status")
  [ -n "$d" ] && facts+=(attempts "$attempts" error "$last")
  if [ "$status" != "$want" ]; then
    _rb_fail "delivery is not $want" "${facts[@]}"
    return 1
  fi
  if [ -n "$attempt" ] && [ "${attempts:-}" != "$attempt" ]; then
    _rb_fail "delivery is $want, but not after attempt $attempt" "${facts[@]}"
    return 1
  fi
  if [ $have_error = yes ] && [ "${last:-}" != "$error" ]; then
    _rb_fail "delivery is $want, with another error" "${facts[@]}" "expected error" "$error"
    return 1
  fi
}

# assert_delivery_completed EVENT_ID HANDLER
assert_delivery_completed() { assert_delivery "${1:?}" "${2:?}" completed "${@:3}"; }
# assert_delivery_pending EVENT_ID HANDLER: not run yet
assert_delivery_pending() { assert_delivery "${1:?}" "${2:?}" pending "${@:3}"; }
# assert_delivery_rescheduled EVENT_ID HANDLER [--attempt N] [--error TEXT]
assert_delivery_rescheduled() { assert_delivery "${1:?}" "${2:?}" rescheduled "${@:3}"; }
# assert_delivery_dead EVENT_ID HANDLER [--attempt N] [--error TEXT]
assert_delivery_dead() { assert_delivery "${1:?}" "${2:?}" dead "${@:3}"; }
