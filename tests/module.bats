#!/usr/bin/env bats
# The MongoDB backend is a module (relaybus-mongo.so, loaded with dlopen for
# mongodb:// URLs only): a program on PostgreSQL never loads libmongoc, and
# a module that cannot be loaded is one line and exit 69.

load test_helper

setup_file() { drop_schema; have_pg || return 0; rb-setup -s 'mh:mod.*'; }
# (the /dev/shm/mongoc-PID tests are in systemd.bats)
teardown_file() { drop_schema; }

# the build has the MongoDB backend (--version lists it)
need_mongo_build() {
  [[ "$(rb-claim --version)" == *"backends: postgresql, mongodb;"* ]] || skip "built without the MongoDB backend (--without-mongo)"
}

# the libraries PID has mapped, one per line
mapped_libs() {
  awk '$6 ~ /\.so/ { n = split($6, p, "/"); print p[n] }' "/proc/$1/maps" | sort -u
}

@test "no program links libmongoc or libbson (the module does)" {
  command -v readelf >/dev/null || skip "no readelf (Debian: binutils)"
  local p n=0
  for p in "$RB_BINDIR"/rb-*; do
    [ -x "$p" ] && [ -f "$p" ] || continue
    run readelf -d "$p"
    [ "$status" -eq 0 ]
    [[ "$output" == *"libjansson"* ]]
    [[ "$output" != *"libmongoc"* ]] || { echo "$p links libmongoc"; false; }
    [[ "$output" != *"libbson"* ]] || { echo "$p links libbson"; false; }
    n=$((n + 1))
  done
  [ "$n" -eq 7 ]
}

@test "a waiting rb-claim maps libmongoc only on a mongodb:// URL" {
  need_pg
  rb-claim -q -H mh --wait 30s --poll 30s >/dev/null 2>&1 &
  local pid=$!
  # connected (a socket: the store was opened, any module loaded before), then waiting
  wait_for 30 "ls -l /proc/$pid/fd 2>/dev/null | grep -q 'socket:'"
  sleep 0.5
  mapped_libs "$pid" >"$BATS_TEST_TMPDIR/libs"
  kill "$pid"
  wait "$pid" || true
  cat "$BATS_TEST_TMPDIR/libs"
  grep -q '^libpq\.so' "$BATS_TEST_TMPDIR/libs"
  if on_mongo; then
    grep -q '^relaybus-mongo\.so$' "$BATS_TEST_TMPDIR/libs"
    grep -q '^libmongoc-1\.0\.so' "$BATS_TEST_TMPDIR/libs"
  else
    ! grep -E '^(libmongoc|libbson|relaybus-mongo)' "$BATS_TEST_TMPDIR/libs" || false
  fi
}

@test "a mongodb:// URL without its module: one line naming why, exit 69, no password" {
  need_mongo_build
  mkdir -p "$BATS_TEST_TMPDIR/empty"
  run --separate-stderr env RELAYBUS_MODULE_DIR="$BATS_TEST_TMPDIR/empty" \
    rb-claim --db 'mongodb://app:s3cret@localhost:1/db?replicaSet=rs0' -H mh
  [ "$status" -eq 69 ]
  [ -z "$output" ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == "rb-claim: mongodb://app:"*"@localhost:1/db?replicaSet=rs0: mongodb backend not available: $BATS_TEST_TMPDIR/empty/relaybus-mongo.so: cannot open shared object file"* ]]
  [[ "$stderr" != *s3cret* ]]
  # --version says so too, and still exits 0
  run --separate-stderr env RELAYBUS_MODULE_DIR="$BATS_TEST_TMPDIR/empty" rb-setup --version
  [ "$status" -eq 0 ]
  [[ "$output" == *"mongodb not available ($BATS_TEST_TMPDIR/empty/relaybus-mongo.so: cannot open shared object file"* ]]
}

@test "a module file that is not one (empty, or another library): exit 69 with the loader's reason" {
  need_mongo_build
  mkdir -p "$BATS_TEST_TMPDIR/bad"
  : >"$BATS_TEST_TMPDIR/bad/relaybus-mongo.so"
  run --separate-stderr env RELAYBUS_MODULE_DIR="$BATS_TEST_TMPDIR/bad" rb-admin --db mongodb://localhost:1/db stats
  [ "$status" -eq 69 ]
  [ "${#stderr_lines[@]}" -eq 1 ]
  [[ "$stderr" == *"mongodb backend not available: $BATS_TEST_TMPDIR/bad/relaybus-mongo.so: file too short"* ]]
  # a real shared library that is no relaybus module
  local other
  other=$(ldd "$RB_BINDIR/rb-admin" | awk '/libjansson/ { print $3 }')
  [ -f "$other" ]
  cp "$other" "$BATS_TEST_TMPDIR/bad/relaybus-mongo.so"
  run --separate-stderr env RELAYBUS_MODULE_DIR="$BATS_TEST_TMPDIR/bad" rb-admin --db mongodb://localhost:1/db stats
  [ "$status" -eq 69 ]
  [[ "$stderr" == *"mongodb backend not available: $BATS_TEST_TMPDIR/bad/relaybus-mongo.so: not a relaybus backend module" ]]
}

@test "the build tree's module serves mongodb:// URLs (--version names libmongoc)" {
  need_mongo_build
  [ -n "${RELAYBUS_MODULE_DIR:-}" ] || skip "not run from a build tree"
  [ -f "$RELAYBUS_MODULE_DIR/relaybus-mongo.so" ]
  run rb-claim --version
  [ "$status" -eq 0 ]
  [[ "$output" == *", libmongoc 1."* ]]
}
