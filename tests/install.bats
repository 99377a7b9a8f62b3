#!/usr/bin/env bats
# What `make install` puts in place works from there: a C program built
# with nothing but `pkg-config --cflags --libs relaybus` against the
# installed header and library publishes in its own transaction; every
# installed program runs; `make uninstall` takes every file back.

load test_helper

setup_file() {
  builddir=${RB_BUILDDIR:-}
  [ -n "$builddir" ] && [ -f "$builddir/Makefile" ] || return 0
  export DEST=$BATS_FILE_TMPDIR/root
  # a make of its own, not a part of the make check that runs this file
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$builddir" install DESTDIR="$DEST" >"$BATS_FILE_TMPDIR/install.log" 2>&1 ||
    { cat "$BATS_FILE_TMPDIR/install.log" >&2; return 1; }
  have_pg || return 0
  rb-setup -s 'capi:order.*'
}

teardown_file() { drop_schema; }

need_install() {
  [ -n "${DEST:-}" ] || skip "not run from a build tree (RB_BUILDDIR)"
}

# the installed relaybus.pc, moved with the files: prefix= is its only absolute path
pc_dir() {
  local pc
  pc=$(find "$DEST" -name relaybus.pc)
  [ -n "$pc" ] || { echo "relaybus.pc is not installed" >&2; return 1; }
  mkdir -p "$BATS_TEST_TMPDIR/pc"
  sed "s|^prefix=|prefix=$DEST|" "$pc" >"$BATS_TEST_TMPDIR/pc/relaybus.pc"
  echo "$BATS_TEST_TMPDIR/pc"
}

@test "relaybus.pc, <rb_pg.h> and librelaybus.a: a program built from the installed files only" {
  need_install
  local pcd
  pcd=$(pc_dir)
  run env PKG_CONFIG_PATH="$pcd" pkg-config --cflags --libs relaybus
  [ "$status" -eq 0 ]
  [[ "$output" == *"-I$DEST"*"/include/relaybus"* ]]
  [[ "$output" == *"-lrelaybus"* ]]
  [[ "$output" == *"-lpq"* ]]
  [[ "$output" == *"-ljansson"* ]]
  [[ "$output" != *"$RB_SRCDIR"* ]]
  cd "$BATS_TEST_TMPDIR"
  cat >app.c <<'EOF'
/* publish one event inside the application's own transaction */
#include <stdio.h>
#include <rb_pg.h>

int
main(int argc, char **argv)
{
	struct rb_error err = { 0 };
	json_t *ev, *ack = NULL;
	PGconn *conn;

	if (argc != 3) {
		fprintf(stderr, "usage: app CONNINFO SCHEMA\n");
		return 64;
	}
	conn = PQconnectdb(argv[1]);
	if (PQstatus(conn) != CONNECTION_OK)
		return 69;
	ev = json_pack("{s:s, s:s, s:{s:i}}", "id", "capi-1", "name", "order.paid", "payload", "n", 7);
	PQclear(PQexec(conn, "BEGIN"));
	if (rb_pg_publish(conn, argv[2], ev, &ack, &err) < 0) {
		fprintf(stderr, "app: %s (%d)\n", err.msg, err.exit_code);
		return err.exit_code;
	}
	PQclear(PQexec(conn, "COMMIT"));
	printf("%s deliveries=%d\n", json_string_value(json_object_get(ack, "event_id")),
	    (int)json_integer_value(json_object_get(ack, "deliveries")));
	json_decref(ack);
	json_decref(ev);
	PQfinish(conn);
	return 0;
}
EOF
  # the sanitizer build's library needs the sanitizers' run-time too
  local san=
  [ "${RELAYBUS_TEST_ASAN:-}" = 1 ] && san=-fsanitize=address,undefined
  # shellcheck disable=SC2046
  run cc -std=c11 -Wall -Werror $san -o app app.c $(PKG_CONFIG_PATH="$pcd" pkg-config --cflags --libs relaybus)
  [ "$status" -eq 0 ] || { echo "$output"; false; }
  run ./app
  [ "$status" -eq 64 ]
  pg_only "rb_pg_publish runs on the application's own PGconn"
  need_pg
  run ./app "$RELAYBUS_URL" "$RB_SCHEMA"
  [ "$status" -eq 0 ] || { echo "$output"; false; }
  [ "$output" = "capi-1 deliveries=1" ]
  [ "$(rb-admin show capi-1 | jq -r '.deliveries[0].handler')" = capi ]
}

@test "relaybus-mongo.pc, <rb_mongo.h> and librelaybus-mongo.a: a program publishes in its own MongoDB transaction, commit or abort" {
  need_install
  local pcd
  pcd=$(pc_dir)
  [ -n "$(find "$DEST" -name relaybus-mongo.pc)" ] || skip "built without the MongoDB backend"
  sed "s|^prefix=|prefix=$DEST|" "$(find "$DEST" -name relaybus-mongo.pc)" >"$pcd/relaybus-mongo.pc"
  run env PKG_CONFIG_PATH="$pcd" pkg-config --libs relaybus-mongo
  [[ "$output" == *"-lrelaybus-mongo"*"-lrelaybus"*"-lmongoc-1.0"* ]]
  [[ "$output" != *"$RB_SRCDIR"* ]]
  cd "$BATS_TEST_TMPDIR"
  cat >mapp.c <<'EOF'
/* an order and its event in one MongoDB transaction: mapp URL SCHEMA ID commit|abort */
#include <stdio.h>
#include <string.h>
#include <rb_mongo.h>

int
main(int argc, char **argv)
{
	struct rb_error err = { 0 };
	bson_error_t e;
	json_t *ev, *ack = NULL;
	mongoc_client_t *client;
	mongoc_database_t *db;
	mongoc_collection_t *orders;
	mongoc_client_session_t *cs;
	bson_t *order, opts = BSON_INITIALIZER;
	char coll[200];
	int rc = 0;

	if (argc != 5) {
		fprintf(stderr, "usage: mapp URL SCHEMA ID commit|abort\n");
		return 64;
	}
	mongoc_init();
	client = mongoc_client_new(argv[1]);
	db = mongoc_client_get_default_database(client);
	snprintf(coll, sizeof coll, "%s.orders", argv[2]);
	orders = mongoc_database_get_collection(db, coll);
	cs = mongoc_client_start_session(client, NULL, &e);
	if (cs == NULL || !mongoc_client_session_start_transaction(cs, NULL, &e))
		return 69;
	mongoc_client_session_append(cs, &opts, &e);
	order = BCON_NEW("_id", BCON_UTF8(argv[3]), "paid", BCON_BOOL(true));
	if (!mongoc_collection_insert_one(orders, order, &opts, NULL, &e))
		return 70;
	ev = json_pack("{s:s, s:s, s:s, s:{s:s}}", "id", argv[3], "name", "order.paid", "key", "capi-key",
	    "payload", "order", argv[3]);
	if (rb_mongo_publish(cs, db, argv[2], ev, &ack, &err) < 0) {
		fprintf(stderr, "mapp: %s (%d)\n", err.msg, err.exit_code);
		mongoc_client_session_abort_transaction(cs, NULL);
		rc = err.exit_code;
	} else if (strcmp(argv[4], "commit") == 0) {
		if (!mongoc_client_session_commit_transaction(cs, NULL, &e))
			rc = 75;
		printf("%s deliveries=%d\n", json_string_value(json_object_get(ack, "event_id")),
		    (int)json_integer_value(json_object_get(ack, "deliveries")));
	} else
		mongoc_client_session_abort_transaction(cs, NULL);
	json_decref(ack);
	json_decref(ev);
	bson_destroy(order);
	bson_destroy(&opts);
	mongoc_client_session_destroy(cs);
	mongoc_collection_destroy(orders);
	mongoc_database_destroy(db);
	mongoc_client_destroy(client);
	mongoc_cleanup();
	return rc;
}
EOF
  local san=
  [ "${RELAYBUS_TEST_ASAN:-}" = 1 ] && san=-fsanitize=address,undefined
  # shellcheck disable=SC2046
  # (libmongoc's headers need POSIX: strict C11 alone does not declare struct addrinfo)
  run cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Werror $san -o mapp mapp.c \
    $(PKG_CONFIG_PATH="$pcd" pkg-config --cflags --libs relaybus-mongo)
  [ "$status" -eq 0 ] || { echo "$output"; false; }
  run ./mapp
  [ "$status" -eq 64 ]
  on_mongo || skip "rb_mongo_publish runs on MongoDB (RELAYBUS_TEST_STORE=mongo)"
  need_pg
  rbq reset orders
  run -0 --separate-stderr ./mapp "$RELAYBUS_URL" "$RB_SCHEMA" capi-m1 commit
  [ "$output" = "capi-m1 deliveries=1" ]
  run -0 --separate-stderr ./mapp "$RELAYBUS_URL" "$RB_SCHEMA" capi-m2 abort
  [ -z "$output" ]
  [ "$(rbq find orders '{}' _id | tr '\n' ' ')" = "capi-m1 " ]
  [ "$(rbq count events '{"_id":"capi-m2"}')" = 0 ]
  [ "$(rbq find keys '{}' _id seq)" = "capi-key 1" ]
  # an id that exists with another payload: 81, and the order was not kept either
  echo '{"id":"capi-m3","name":"order.paid","key":"capi-key","payload":{}}' | rb-publish -q
  run -81 --separate-stderr ./mapp "$RELAYBUS_URL" "$RB_SCHEMA" capi-m3 commit
  [[ $stderr == *'event id "capi-m3" exists with another name, key or payload (conflict)'*'(81)'* ]]
  [ "$(rbq count orders '{"_id":"capi-m3"}')" = 0 ]
  # what it published runs, in key order with rb-publish's
  run -0 rb-claim -H capi --batch 10
  [ "$(jq -r .event_id <<<"$output" | tr '\n' ' ')" = "capi-m1 " ]
}

@test "the installed library defines only rb_ symbols (no clash with an application's xmalloc)" {
  need_install
  local lib
  lib=$(find "$DEST" -name librelaybus.a)
  [ -n "$lib" ]
  # (names starting with __ are the compiler's own: the sanitizers' in an --enable-asan build)
  run sh -c "nm -g --defined-only '$lib' | awk 'NF == 3 { print \$3 }' | grep -v -e '^rb_' -e '^__'"
  [ -z "$output" ] || { echo "not rb_-prefixed: $output"; false; }
  # and it holds what rb-publish(1) says it does
  nm -g --defined-only "$lib" | grep -q ' T rb_pg_publish$'
  # the same of the MongoDB one (when built)
  lib=$(find "$DEST" -name librelaybus-mongo.a)
  [ -n "$lib" ] || return 0
  run sh -c "nm -g --defined-only '$lib' | awk 'NF == 3 { print \$3 }' | grep -v -e '^rb_' -e '^__'"
  [ -z "$output" ] || { echo "not rb_-prefixed: $output"; false; }
  nm -g --defined-only "$lib" | grep -q ' T rb_mongo_publish$'
}

@test "only the headers of the API are installed, and they are self-contained" {
  need_install
  local inc
  inc=$(dirname "$(find "$DEST" -name rb_pg.h)")
  local hs="rb_exit.h rb_pg.h rb_store.h "
  [ -z "$(find "$DEST" -name relaybus-mongo.pc)" ] || hs="rb_exit.h rb_mongo.h rb_pg.h rb_store.h "
  [ "$(cd "$inc" && ls | sort | tr '\n' ' ')" = "$hs" ]
  for h in $hs; do
    # shellcheck disable=SC2046
    echo "#include <$h>" | cc -std=c11 -fsyntax-only -Wall -Werror -I"$inc" $(pkg-config --cflags jansson libpq) \
      $([ $h != rb_mongo.h ] || echo -D_POSIX_C_SOURCE=200809L $(pkg-config --cflags libmongoc-1.0)) -x c - ||
      { echo "$h does not compile on its own"; false; }
  done
}

@test "the installed programs run from where they were installed" {
  need_install
  local bin n=0
  bin=$(dirname "$(find "$DEST" -path "*/bin/rb-setup" -type f)")
  for p in rb-setup rb-publish rb-claim rb-complete rb-dispatch rb-admin rb-pageinspect; do
    run "$bin/$p" --version
    [ "$status" -eq 0 ] || { echo "$p --version: $status"; false; }
    [[ "$output" == "$p 0."* ]]
    n=$((n + 1))
  done
  [ "$n" -eq 7 ]
  "$bin/rb-setup" --print-sql | grep -q 'relaybus_publish'
}

@test "the MongoDB backend's module is installed in pkglibdir, where the installed programs look for it" {
  need_install
  [[ "$(rb-claim --version)" == *"backends: postgresql, mongodb;"* ]] || skip "built without the MongoDB backend"
  local pkglibdir bin mod
  pkglibdir=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$RB_BUILDDIR" -f Makefile -f - \
    print-pkglibdir <<<'print-pkglibdir: ; @echo $(pkglibdir)')
  mod=$(find "$DEST" -name relaybus-mongo.so)
  [ "$mod" = "$DEST$pkglibdir/relaybus-mongo.so" ] || { echo "pkglibdir $pkglibdir, module at $mod"; false; }
  bin=$(dirname "$(find "$DEST" -path "*/bin/rb-claim" -type f)")
  # without RELAYBUS_MODULE_DIR: the configured directory (not under DESTDIR)
  run --separate-stderr env -u RELAYBUS_MODULE_DIR "$bin/rb-claim" --db mongodb://localhost:1/db -H h
  if [ -f "$pkglibdir/relaybus-mongo.so" ]; then
    [[ "$stderr" != *"backend not available"* ]]
  else
    [ "$status" -eq 69 ]
    [[ "$stderr" == *"mongodb backend not available: $pkglibdir/relaybus-mongo.so: "* ]]
  fi
  # the installed module works with the installed program
  run env RELAYBUS_MODULE_DIR="$DEST$pkglibdir" "$bin/rb-claim" --version
  [ "$status" -eq 0 ]
  [[ "$output" == *", libmongoc "* ]]
}

@test "make uninstall leaves no file behind" {
  need_install
  local dest=$BATS_TEST_TMPDIR/root2
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$RB_BUILDDIR" install DESTDIR="$dest" >/dev/null 2>&1
  [ -n "$(find "$dest" -type f)" ]
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$RB_BUILDDIR" uninstall DESTDIR="$dest" >/dev/null 2>&1
  run find "$dest" -type f -o -type l
  [ -z "$output" ] || { echo "left: $output"; false; }
}

@test "bash completion: a file for every program where bash-completion looks, each completing its program" {
  need_install
  local dir
  dir=$(dirname "$(find "$DEST" -path '*/bash-completion/completions/rb-setup')")
  [ -d "$dir" ]
  for p in rb-setup rb-publish rb-claim rb-complete rb-dispatch rb-admin rb-pageinspect; do
    [ -e "$dir/$p" ] || { echo "no completion for $p"; false; }
    run bash -c "source '$dir/$p' && complete -p $p"
    [ "$status" -eq 0 ]
    [[ "$output" == *"-F _relaybus $p" ]]
  done
  if pkg-config --exists bash-completion; then
    # where this system's bash-completion loads from, under the build's prefix
    [[ "$dir" == "$DEST"*"/share/bash-completion/completions" ]]
  fi
}

@test "the bats library: bats_load_library relaybus finds it where it was installed, with its pg-tmp" {
  need_install
  local lib
  lib=$(dirname "$(dirname "$(find "$DEST" -path '*/bats/relaybus/load.bash')")")
  [[ "$lib" == "$DEST"*/lib/bats ]]
  [ -x "$lib/relaybus/pg-tmp" ]
  cat >"$BATS_TEST_TMPDIR/user.bats" <<'EOT'
bats_load_library relaybus
TEST "loaded" {
  declare -F relaybus_setup_file rb_publish rb_run_handler rb_dispatch assert_delivery_completed \
    assert_delivery_rescheduled assert_delivery_dead >/dev/null
}
EOT
  sed -i 's/^TEST /@test /' "$BATS_TEST_TMPDIR/user.bats"
  local path
  path=$(tr ':' '\n' <<<"$PATH" | grep -v bats-core | paste -sd:)
  run env -i PATH="$path" HOME="$HOME" BATS_LIB_PATH="$lib" bats "$BATS_TEST_TMPDIR/user.bats"
  [ "$status" -eq 0 ] || { echo "$output"; false; }
  [[ "$output" == *"ok 1 loaded"* ]]
}

@test "after a default make install, bats_load_library relaybus finds the library with BATS_LIB_PATH unset, as the README says" {
  need_install
  # configured with the default prefix, as a user who runs ./configure && make install
  grep -qx 'prefix = /usr/local' "$RB_BUILDDIR/Makefile" || skip "configured with another prefix"
  # where bats looks when BATS_LIB_PATH is unset (bats sets its default)
  cat >"$BATS_TEST_TMPDIR/where.bats" <<'EOT'
TEST "where" { echo "# $BATS_LIB_PATH" >&3; }
EOT
  sed -i 's/^TEST /@test /' "$BATS_TEST_TMPDIR/where.bats"
  local path libpath
  path=$(tr ':' '\n' <<<"$PATH" | grep -v bats-core | paste -sd:)
  libpath=$(env -i PATH="$path" HOME="$HOME" bats "$BATS_TEST_TMPDIR/where.bats" | sed -n 's/^# //p')
  [ -n "$libpath" ]
  [ -f "$DEST$libpath/relaybus/load.bash" ]
  [ -x "$DEST$libpath/relaybus/pg-tmp" ]
  # and run from there: the installed tree seen at / (its $libpath laid over
  # the system's in a mount namespace of the test's own), nothing set
  unshare -m true 2>/dev/null || skip "no mount namespace here (unshare -m)"
  cat >"$BATS_TEST_TMPDIR/user.bats" <<'EOT'
bats_load_library relaybus
TEST "loaded" {
  declare -F relaybus_setup_file rb_publish rb_dispatch assert_delivery_completed >/dev/null
}
EOT
  sed -i 's/^TEST /@test /' "$BATS_TEST_TMPDIR/user.bats"
  local parent=${libpath%/*}
  [ -d "$parent" ] || skip "$parent does not exist here"
  run env -i PATH="$path" HOME="$HOME" unshare -m sh -c '
    mount -t overlay overlay -o "lowerdir=$1:$2" "$2" || exit 9
    exec bats "$3"' _ "$DEST$parent" "$parent" "$BATS_TEST_TMPDIR/user.bats"
  [ "$status" -ne 9 ] || skip "no overlay mount here"
  [ "$status" -eq 0 ] || { echo "$output"; false; }
  [[ "$output" == *"ok 1 loaded"* ]]
}
