# test_helper.bash: loaded by every bats file.
#
# Clears RELAYBUS_* and PG* from the environment, puts the programs under
# test first on PATH (wrapped in valgrind with --enable-valgrind), and gives
# each file its own schema in the test database (RELAYBUS_TEST_PG_URL, or
# without it libpq's PG* variables made into that URL, so that
# `pg_virtualenv make check` runs every test), dropped at the end.  need_pg
# skips when no database is given, unless RELAYBUS_REQUIRE_PG=1
# (scripts/test), where a missing database fails.
#
# RELAYBUS_TEST_STORE=mongo runs the same suites against MongoDB
# (RELAYBUS_TEST_MONGO_URL; RELAYBUS_REQUIRE_MONGO=1 fails instead of
# skipping): each file gets its own database, named as its schema, dropped at
# the end.  A test of a PostgreSQL-only feature says so (pg_only REASON); a
# test that reads or changes the store with SQL (q, sql, psql, pg_dir, or a
# helper of its file that does) skips on MongoDB saying which line does.

bats_require_minimum_version 1.5.0

export LC_ALL=C
# libmongoc (in the MongoDB backend's module, loaded for mongodb:// URLs)
# initializes itself in a program that loads it, and keeps counters in
# /dev/shm/mongoc-PID; a process killed with -9 leaves its file, and a later
# process given the same PID prints "Falling back to malloc for counters" on
# stderr.  Tests kill many processes: no shared-memory counters (relaybus(7),
# ENVIRONMENT).  A program on PostgreSQL never loads libmongoc (module.bats).
export MONGOC_DISABLE_SHM=1

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
_test_store=${RELAYBUS_TEST_STORE:-pg}
_test_mongo_url=${RELAYBUS_TEST_MONGO_URL:-}
_require_mongo=${RELAYBUS_REQUIRE_MONGO:-}
for v in $(env | sed -n 's/^\(RELAYBUS_[A-Z_]*\|PG[A-Z]*\)=.*/\1/p'); do
  case $v in RELAYBUS_TEST_*|RELAYBUS_REQUIRE_PG|RELAYBUS_REQUIRE_MONGO) ;; *) unset "$v" ;; esac
done
# the backend modules of the build tree (libtool's .libs), not the installed ones
_rb_builddir=${RB_BUILDDIR:-${RB_BINDIR:+$RB_BINDIR/..}}
if [ -n "$_rb_builddir" ] && [ -d "$_rb_builddir/libcommon/.libs" ]; then
  export RELAYBUS_MODULE_DIR=$_rb_builddir/libcommon/.libs
fi

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

# true when the suites run against MongoDB
on_mongo() { [ "$_test_store" = mongo ]; }

# The MongoDB URL with this file's database.
mongo_file_url() {
  local u=$_test_mongo_url query= rest
  case $u in *\?*) query="?${u#*\?}"; u=${u%%\?*} ;; esac
  rest=${u#*://}
  echo "${u%%://*}://${rest%%/*}/$RB_SCHEMA$query"
}

# rbq (tests/mongo/rbq.py) on this file's database
rbq() { /usr/bin/python3 "$RB_SRCDIR/tests/mongo/rbq.py" "$(mongo_file_url)" "$RB_SCHEMA" "$@"; }

_mongo_env() {
  if [ -z "$_test_mongo_url" ]; then
    if [ "$_require_mongo" = 1 ]; then
      echo "RELAYBUS_REQUIRE_MONGO=1 but RELAYBUS_TEST_MONGO_URL is not set" >&2
      return 1
    fi
    return 2
  fi
  RELAYBUS_URL=$(mongo_file_url)
  export RELAYBUS_URL
  export RELAYBUS_SCHEMA=$RB_SCHEMA
}

# Skip a test (on MongoDB) whose body uses SQL, naming where.
_mongo_skip_sql() {
  local why
  [ -n "${BATS_TEST_DESCRIPTION:-}" ] || return 0
  why=$(awk -v d="$BATS_TEST_DESCRIPTION" -f "$RB_SRCDIR/tests/mongo/sqluse.awk" \
    "$BATS_TEST_FILENAME" "$BATS_TEST_FILENAME")
  [ -z "$why" ] || skip "reads or changes the store with SQL ($why): PostgreSQL only"
}

# A test of a PostgreSQL-only feature: skips on MongoDB with the reason.
pg_only() {
  if on_mongo; then skip "PostgreSQL only: $*"; fi
}

need_pg() {
  if on_mongo; then
    local rc=0
    _mongo_env || rc=$?
    [ $rc = 2 ] && skip "no MongoDB test server (set RELAYBUS_TEST_MONGO_URL)"
    [ $rc = 0 ] || return 1
    _mongo_skip_sql
    return 0
  fi
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
  if on_mongo; then
    local rc=0
    _mongo_env || rc=$?
    [ $rc = 1 ] && exit 1
    return $rc
  fi
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
  if on_mongo; then _mongo_sql "$@"; return; fi
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

# On MongoDB, what the suites' set-up functions do with SQL: emptying
# tables (TRUNCATE) and freeing the lanes; anything else skips the test.
_mongo_sql() {
  local s="$*" t
  case $s in
  -c\ TRUNCATE*|-c\ \"TRUNCATE*) ;;
  *) skip "SQL on the store ($s): PostgreSQL only" ;;
  esac
  t=${s#*TRUNCATE }
  t=${t%%;*}
  for c in ${t//,/ }; do rbq reset "${c#relaybus_}"; done
  case $s in *"UPDATE relaybus_lanes SET lease_owner = NULL"*) mongo_free_lanes ;; esac
}

# On MongoDB: every lane free (no owner, holder, lease or deliveries in flight).
mongo_free_lanes() {
  rbq update lanes '{}' '{"$set":{"owner":null,"holder":null,"leaseExpiresAt":null,"inFlight":[],"lost":[]}}' >/dev/null
}

# On MongoDB, the usual set-up of a test: no event, delivery or key, every lane free.
mongo_fresh_store() {
  rbq reset events deliveries keys
  mongo_free_lanes
}

drop_schema() {
  if on_mongo; then
    [ -n "$_test_mongo_url" ] || return 0
    rbq drop >/dev/null 2>&1 || true
    return 0
  fi
  [ -n "$_test_pg_url" ] || return 0
  psql "$_test_pg_url" -X -q -c "DROP SCHEMA IF EXISTS \"$RB_SCHEMA\" CASCADE" >/dev/null 2>&1 || true
}

# Publish N simple events named NAME (keyed with KEYS distinct keys when given).
# The usual set-up of a test: a schema of its own, new (when a server of the
# store under test is given: on MongoDB without RELAYBUS_TEST_PG_URL too).
fresh_schema() {
  if have_pg; then
    drop_schema
    setup_schema
  fi
}

# The usual tear-down: never leave a process of $PIDS behind (kill -9), close
# the descriptor $HOLD_FD of a held transaction (a coprocess psql), drop the schema.
kill_pids_drop_schema() {
  local p
  for p in ${PIDS:-}; do kill -9 "$p" 2>/dev/null || true; done
  [ -z "${HOLD_FD:-}" ] || eval "exec $HOLD_FD>&-"
  drop_schema
}

gen_events() {  # n name [keys]
  local n=$1 name=$2 keys=${3:-0}
  awk -v n="$n" -v name="$name" -v keys="$keys" 'BEGIN {
    for (i = 1; i <= n; i++) {
      if (keys > 0) printf "{\"id\":\"e%d\",\"name\":\"%s\",\"key\":\"k%d\",\"payload\":{\"i\":%d}}\n", i, name, i % keys, i
      else printf "{\"id\":\"e%d\",\"name\":\"%s\",\"payload\":{\"i\":%d}}\n", i, name, i
    }
  }'
}

# whether process PID is there and not a zombie (whose parent has not reaped it yet)
running() { [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]; }

# wait up to SECS for a shell condition (checked every 50 ms)
wait_for() {  # secs cond...
  local end=$(( $(date +%s) + $1 )); shift
  until eval "$*"; do
    [ "$(date +%s)" -lt "$end" ] || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.05
  done
}

# ---- real login roles (PostgreSQL) ------------------------------------------

# Drop each role named, with what it owns, if it is there.
drop_roles() {  # role...
  local r
  for r in "$@"; do
    psql "$_test_pg_url" -X -q -c "DO \$\$ BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$r') THEN
      EXECUTE 'DROP OWNED BY \"$r\"'; EXECUTE 'DROP ROLE \"$r\"'; END IF; END \$\$" >/dev/null 2>&1 || true
  done
}
# The test database's URL for another role.
role_url() { case $_test_pg_url in *\?*) echo "$_test_pg_url&user=$1" ;; *) echo "$_test_pg_url?user=$1" ;; esac; }
# Run a program as a role.
as() { local r=$1; shift; RELAYBUS_URL=$(role_url "$r") "$@"; }
# psql as a role, with the file's schema on the search path.
asql() {  # role [psql args]
  local r=$1
  shift
  PGOPTIONS="-c search_path=$RB_SCHEMA -c client_min_messages=warning" \
    psql "$(role_url "$r")" -X -A -t -q -v ON_ERROR_STOP=1 -v VERBOSITY=verbose "$@"
}

# A psql session fed through a fifo, kept open on fd 7 (HOLD_FD, which
# kill_pids_drop_schema closes): echo "BEGIN; ..." >&7 runs in it.
session() {  # application name
  local fifo=$BATS_TEST_TMPDIR/fifo
  mkfifo "$fifo"
  (PGAPPNAME=$1 sql <"$fifo" >"$BATS_TEST_TMPDIR/session.out" 2>&1 3>&-) &
  PIDS="${PIDS:-} $!"
  exec 7>"$fifo"
  HOLD_FD=7
}

# Publish N unkeyed events named t for HANDLER, ids PREFIX1..PREFIXN,
# payload {"i": n}.
publish_for() {  # n prefix handler
  awk -v n="$1" -v p="$2" -v h="$3" 'BEGIN {
    for (i = 1; i <= n; i++)
      printf "{\"id\":\"%s%d\",\"name\":\"t\",\"payload\":{\"i\":%d},\"handlers\":[\"%s\"]}\n", p, i, i, h
  }' | rb-publish -q
}
