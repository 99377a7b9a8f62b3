/* SPDX-License-Identifier: MIT */
/*
 * rb_pg_publish on the caller's own connection, inside the caller's
 * transaction: rolled back publishes nothing, committed publishes the event
 * and its deliveries together with the caller's own write.
 * Needs RELAYBUS_TEST_PG_URL, or libpq's PG* variables (pg_virtualenv make check);
 * skips without them unless RELAYBUS_REQUIRE_PG=1.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_pg.h"
#include "rb_store.h"
#include "tap.h"

static const char *schema = "t_unit_pg_publish";

static long
count(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	long n = -1;

	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		n = atol(PQgetvalue(r, 0, 0));
	PQclear(r);
	return n;
}

static void
exec_ok(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);

	ok(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s", sql);
	PQclear(r);
}

static int
nonempty(const char *var)
{
	const char *v = getenv(var);

	return v != NULL && *v != '\0';
}

int
main(void)
{
	const char *url = getenv("RELAYBUS_TEST_PG_URL");
	const char *sub[] = { "mailer:order.*" };
	struct rb_setup_opts so = { .subscribe = sub, .n_subscribe = 1 };
	struct rb_error err = { 0 };
	struct rb_store *s;
	PGconn *c;
	json_t *ev, *ack = NULL;

	/* without it, libpq's PG* variables: a conninfo that names nothing else (never RELAYBUS_URL) */
	if ((url == NULL || *url == '\0') && (nonempty("PGHOST") || nonempty("PGHOSTADDR") ||
	    nonempty("PGPORT") || nonempty("PGSERVICE")))
		url = "connect_timeout=10";
	if (url == NULL || *url == '\0') {
		const char *req = getenv("RELAYBUS_REQUIRE_PG");

		if (req != NULL && strcmp(req, "1") == 0) {
			printf("not ok 1 - RELAYBUS_REQUIRE_PG=1 but RELAYBUS_TEST_PG_URL is not set\n1..1\n");
			return 1;
		}
		printf("1..0 # SKIP no test database (set RELAYBUS_TEST_PG_URL)\n");
		return 0;
	}
	c = PQconnectdb(url);
	ok(PQstatus(c) == CONNECTION_OK, "connect");
	exec_ok(c, "SET client_min_messages = warning");
	exec_ok(c, "DROP SCHEMA IF EXISTS t_unit_pg_publish CASCADE");
	s = rb_store_open(url, schema, "test_pg_publish", &err);
	ok(s != NULL && rb_store_setup(s, &so, &err) == 0, "set up schema %s: %s", schema, err.msg);
	rb_store_close(s);
	exec_ok(c, "CREATE TABLE t_unit_pg_publish.orders (id int PRIMARY KEY)");

	ev = json_pack("{s:s, s:s, s:s, s:{s:i}}", "id", "o1", "name", "order.paid", "key", "o-1", "payload", "order", 1);
	exec_ok(c, "BEGIN");
	exec_ok(c, "INSERT INTO t_unit_pg_publish.orders VALUES (1)");
	ok(rb_pg_publish(c, schema, ev, &ack, &err) == 0, "publish in a transaction: %s", err.msg);
	is_int(json_integer_value(json_object_get(ack, "deliveries")), 1, "one delivery (mailer)");
	json_decref(ack);
	exec_ok(c, "ROLLBACK");
	is_int(count(c, "SELECT count(*) FROM t_unit_pg_publish.relaybus_events"), 0, "rolled back: no event");
	is_int(count(c, "SELECT count(*) FROM t_unit_pg_publish.relaybus_deliveries"), 0, "rolled back: no delivery");

	exec_ok(c, "BEGIN");
	exec_ok(c, "INSERT INTO t_unit_pg_publish.orders VALUES (1)");
	ok(rb_pg_publish(c, schema, ev, &ack, &err) == 0, "publish again");
	is_str(json_string_value(json_object_get(ack, "event_id")), "o1", "the ack names the event_id");
	json_decref(ack);
	exec_ok(c, "COMMIT");
	/* event_id is the id's other name: the same event, a duplicate */
	json_t *alias = json_pack("{s:s, s:s, s:s, s:{s:i}}", "event_id", "o1", "name", "order.paid", "key", "o-1",
	    "payload", "order", 1);
	ok(rb_pg_publish(c, schema, alias, &ack, &err) == 0 && json_is_true(json_object_get(ack, "duplicate")),
	    "event_id o1 is o1 again: a duplicate (%s)", err.msg);
	ok(json_object_get(alias, "id") == NULL, "the caller's event is left as it was");
	json_decref(ack);
	json_decref(alias);
	/* the same id with another payload is a conflict, not a duplicate */
	json_t *other = json_pack("{s:s, s:s, s:s, s:i}", "id", "o1", "name", "order.paid", "key", "o-1", "payload", 2);
	memset(&err, 0, sizeof err);
	ok(rb_pg_publish(c, schema, other, &ack, &err) < 0 && err.exit_code == RB_EXIT_CONFLICT,
	    "o1 with another payload: a conflict (%d: %s)", err.exit_code, err.msg);
	json_decref(other);
	is_int(count(c, "SELECT count(*) FROM t_unit_pg_publish.relaybus_events WHERE id = 'o1'"), 1, "committed: the event");
	is_int(count(c, "SELECT count(*) FROM t_unit_pg_publish.relaybus_deliveries WHERE event_id = 'o1' AND handler = 'mailer'"),
	    1, "committed: its delivery");
	is_int(count(c, "SELECT count(*) FROM t_unit_pg_publish.orders"), 1, "committed: the caller's own write");

	/* a bad event is refused before anything is sent */
	json_t *bad = json_pack("{s:s}", "name", "x");
	ok(rb_pg_publish(c, schema, bad, &ack, &err) < 0 && strcmp(err.msg, "missing field 'payload'") == 0,
	    "a bad event is refused: %s", err.msg);
	json_decref(bad);
	/* an error inside the caller's transaction aborts it, as any statement would */
	exec_ok(c, "BEGIN");
	ok(rb_pg_publish(c, "no_such_schema", ev, &ack, &err) < 0 && err.exit_code == 78,
	    "schema not set up: exit code 78 (%s)", err.msg);
	exec_ok(c, "ROLLBACK");
	exec_ok(c, "DROP SCHEMA t_unit_pg_publish CASCADE");
	json_decref(ev);
	PQfinish(c);
	return done_testing();
}
