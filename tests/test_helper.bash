# test_helper.bash: loaded by every bats file.
#
# Clears RELAYBUS_* and PG* from the environment, puts the programs under
# test first on PATH (wrapped in valgrind with --enable-valgrind), and gives
# each file its own schema in the test database (RELAYBUS_TEST_PG_URL, or
# without it libpq's PG* variables made into that URL, so that
# `pg_virtualenv make check` runs every test), dropped at the end.  need_pg
# skips when no database is given, unless RELAYBUS_REQUIRE_PG=1
# (scripts/test), where a missing database fails.

bats_require_minimum_version 1.5.0

export LC_ALL=C

# libpq's PG* variables as one URL: the user in it, the rest as parameters
_pct() {  # percent-encode $1 for a URL
  local s=$1 out= c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in [a-zA-Z0-9._~-]) out+=$c ;; *) printf -v c '%%%02X' "'$c"; out+=$c ;; esac
  done
  printf '%s' "$out"
}
_pg_env_url() {
  local url=postgresql:// q= k v
  [ -n "${PGUSER:-}" ] && url+="$(_pct "$PGUSER")@"
  url+="/$(_pct "${PGDATABASE:-}")"
  for k in host:PGHOST hostaddr:PGHOSTADDR port:PGPORT password:PGPASSWORD passfile:PGPASSFILE \
      service:PGSERVICE servicefile:PGSERVICEFILE sslmode:PGSSLMODE; do
    v=${k#*:}; v=${!v:-}
    [ -n "$v" ] && q+="${q:+&}${k%%:*}=$(_pct "$v")"
  done
  printf '%s%s\n' "$url" "${q:+?$q}"
}
if [ -z "${RELAYBUS_TEST_PG_URL:-}" ] && [ -n "${PGHOST:-}${PGHOSTADDR:-}${PGPORT:-}${PGSERVICE:-}" ]; then
  RELAYBUS_TEST_PG_URL=$(_pg_env_url)
  export RELAYBUS_TEST_PG_URL
fi
_test_pg_url=${RELAYBUS_TEST_PG_URL:-}
_test_pg_dir=${RELAYBUS_TEST_PG_DIR:-}
_require_pg=${RELAYBUS_REQUIRE_PG:-}
for v in $(env | sed -n 's/^\(RELAYBUS_[A-Z_]*\|PG[A-Z]*\)=.*/\1/p'); do
  case $v in RELAYBUS_TEST_*|RELAYBUS_REQUIRE_PG) ;; *) unset "$v" ;; esac
done

RB_BINDIR=${RB_BINDIR:-$BATS_TEST_DIRNAME/../cmd}
RB_SRCDIR=${RB_SRCDIR:-$BATS_TEST_DIRNAME/..}
if [ -n "${RB_VALGRIND:-}" ]; then
  _wrap=$BATS_RUN_TMPDIR/valgrind-bin
  if [ ! -d "$_wrap" ]; then
    mkdir -p "$_wrap"
    for p in "$RB_BINDIR"/rb-*; do
      [ -x "$p" ] || continue
      printf '#!/bin/sh\nexec %s %s "$@"\n' "$RB_VALGRIND" "$p" >"$_wrap/$(basename "$p")"
      chmod +x "$_wrap/$(basename "$p")"
    done
  fi
  PATH=$_wrap:$PATH
fi
PATH=$RB_BINDIR:$RB_SRCDIR/tests/bin:$PATH

need_pg() {
  if [ -z "$_test_pg_url" ]; then
    if [ "$_require_pg" = 1 ]; then
      echo "RELAYBUS_REQUIRE_PG=1 but RELAYBUS_TEST_PG_URL is not set" >&2
      return 1
    fi
    skip "no test database (set RELAYBUS_TEST_PG_URL, or PG*: pg_virtualenv)"
  fi
  export RELAYBUS_URL=$_test_pg_url
  export RELAYBUS_SCHEMA=$RB_SCHEMA
}

# For setup_file: true when there is a database to prepare; without one
# the tests skip (need_pg), or the file fails when RELAYBUS_REQUIRE_PG=1.
have_pg() {
  if [ -z "$_test_pg_url" ]; then
    if [ "$_require_pg" = 1 ]; then
      echo "RELAYBUS_REQUIRE_PG=1 but RELAYBUS_TEST_PG_URL is not set" >&2
      exit 1
    fi
    return 1
  fi
  export RELAYBUS_URL=$_test_pg_url
  export RELAYBUS_SCHEMA=$RB_SCHEMA
}

# The schema of this file: unique per file and run.
_base=$(basename "$BATS_TEST_FILENAME" .bats | tr -c 'a-z0-9_\n' '_')
_run=$(printf '%s' "$BATS_RUN_TMPDIR" | cksum | cut -d' ' -f1)
RB_SCHEMA="t_${_base}_${_run}"
RB_SCHEMA=${RB_SCHEMA:0:50}

# psql against the test database with the file's schema on the search path.
sql() {
  PGOPTIONS="-c search_path=$RB_SCHEMA,public -c client_min_messages=warning" \
    psql "$_test_pg_url" -X -A -t -q -v ON_ERROR_STOP=1 "$@"
}
q() { sql -c "$1"; }

# the server's own folder (scripts/pg-tmp), for restart tests
pg_dir() { echo "$_test_pg_dir"; }

# Create this file's schema with rb-setup (and any extra arguments).
setup_schema() {
  need_pg
  rb-setup "$@"
}

drop_schema() {
  [ -n "$_test_pg_url" ] || return 0
  psql "$_test_pg_url" -X -q -c "DROP SCHEMA IF EXISTS \"$RB_SCHEMA\" CASCADE" >/dev/null 2>&1 || true
}

# Publish N simple events named NAME (keyed with KEYS distinct keys when given).
gen_events() {  # n name [keys]
  local n=$1 name=$2 keys=${3:-0}
  awk -v n="$n" -v name="$name" -v keys="$keys" 'BEGIN {
    for (i = 1; i <= n; i++) {
      if (keys > 0) printf "{\"id\":\"e%d\",\"name\":\"%s\",\"key\":\"k%d\",\"payload\":{\"i\":%d}}\n", i, name, i % keys, i
      else printf "{\"id\":\"e%d\",\"name\":\"%s\",\"payload\":{\"i\":%d}}\n", i, name, i
    }
  }'
}
