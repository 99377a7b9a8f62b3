/* SPDX-License-Identifier: MIT */
/*
 * store_pg_publish.c: publishing, one statement per batch
 * (relaybus_publish_batch in schema_pg.sql, one row per event in input
 * order), and rb_pg_publish (rb_pg.h) on the application's own connection
 * and transaction.
 *
 * The wake-up: PostgreSQL serializes the commits of notifying transactions
 * (a lock taken before the commit record and held until it is flushed),
 * which cost concurrent publishers half their rate (bench/run, scenario 1:
 * 8 single-event publishers).  So the store's publisher sets its session's
 * relaybus.notify off (when it was on), and sends the notifications itself
 * once the publish committed, in a transaction of their own whose commit
 * does not wait for the flush (synchronous_commit off: a notification
 * lost in a crash only leaves a listener to its poll).  Listeners hear of
 * committed work as before, once per handler and publish.  Behind a
 * transaction pooler (no session SET) the publish function sends them.
 */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_pg.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

/* publish: one row per event, in input order */
const char pg_tmpl_publish[] =
    "SELECT event_id, deliveries, duplicate, array_to_json(handlers)::text, due "
    "FROM @S@.relaybus_publish_batch($1::jsonb) ORDER BY ord";

/* One event ($1 a JSON array of one): relaybus_publish, whose plain
 * statements cost a single event a quarter less server time than the
 * batch function's set-based one (bench/README.md). */
const char pg_tmpl_publish1[] =
    "SELECT p.event_id, p.deliveries, p.duplicate, array_to_json(p.handlers)::text, "
    "  coalesce((x.e->>'available_at')::timestamptz, "
    "           now() + coalesce((x.e->>'delay_ms')::bigint, 0) * interval '1 millisecond') <= now() "
    "FROM (SELECT $1::jsonb->0 AS e) x, LATERAL @S@.relaybus_publish(x.e->>'name', x.e->'payload', "
    "  x.e->>'key', x.e->>'id', CASE WHEN jsonb_typeof(x.e->'headers') = 'object' THEN x.e->'headers' END, "
    "  (x.e->>'available_at')::timestamptz, (x.e->>'delay_ms')::bigint, "
    "  CASE WHEN jsonb_typeof(x.e->'handlers') = 'array' THEN "
    "    ARRAY(SELECT jsonb_array_elements_text(x.e->'handlers')) END) p";

/* The session's relaybus.notify as it was, and off from now on. */
static const char defer_sql[] =
    "SELECT coalesce(lower(current_setting('relaybus.notify', true)), '') NOT IN ('off', 'false', '0', 'no'), "
    "set_config('relaybus.notify', 'off', false)";

/* The handlers ($1, a JSON array of the events' handler arrays) woken,
 * once each, in a transaction that does not wait for its flush. */
const char pg_tmpl_wake[] =
    "SELECT set_config('synchronous_commit', 'off', true), count(pg_notify('@CHAN@', w.h)) "
    "FROM (SELECT DISTINCT jsonb_array_elements_text(x) AS h FROM jsonb_array_elements($1::jsonb) x) w";

static void
pg_clear_result(void *res)
{
	PQclear(res);
}

/* The acks of a publish statement's result (which they then own). */
static int
acks_of_result(PGresult *res, size_t n, struct rb_publish_acks *acks, struct rb_error *err)
{
	if ((size_t)PQntuples(res) != n) {
		int got = PQntuples(res);

		PQclear(res);
		return rb_seterr(err, RB_EXIT_SOFTWARE, "publish: %d outcomes for %zu events", got, n);
	}
	acks->v = xcalloc(n > 0 ? n : 1, sizeof *acks->v);
	acks->n = n;
	acks->priv = res;
	acks->free_priv = pg_clear_result;
	for (size_t i = 0; i < n; i++) {
		acks->v[i].id = PQgetvalue(res, (int)i, 0);
		acks->v[i].deliveries = atoi(PQgetvalue(res, (int)i, 1));
		acks->v[i].duplicate = PQgetvalue(res, (int)i, 2)[0] == 't';
		acks->v[i].handlers = PQgetvalue(res, (int)i, 3);
	}
	return 0;
}

/* On a connection's first publish: who sends the wake-up (pg_be.wake). */
static int
defer_wake(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res;

	if (be->wake != 0)
		return 0;
	if (be->pooler) {
		be->wake = -1;
		return 0;
	}
	res = pg_run(s, defer_sql, 0, NULL, PGRES_TUPLES_OK, "publish", false, err);
	if (res == NULL)
		return -1;
	be->wake = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't' ? 1 : -1;
	PQclear(res);
	return 0;
}

/* After the commit: wake the handlers of the events due now.  A failure
 * costs only the wake-up (the publish is committed): it is not reported.
 * Its result is not awaited: the caller has its acks one round trip
 * sooner, and the next statement on the connection (every one is sent with
 * PQexec*, which discards a result nobody read) finds it done.  Each set
 * of handlers is sent once (the events of a batch mostly share one: the
 * server read a JSON array of them all, 1.2 us an event at batch 100),
 * compared with the last WAKE_SETS sent (a set sent twice is harmless). */
#define WAKE_SETS 8
static void
wake(struct rb_store *s, PGresult *res, const struct rb_publish_acks *acks)
{
	struct pg_be *be = pg_be(s);
	struct rb_sbuf w = { 0 };
	const char *params[1], *sent[WAKE_SETS];
	size_t nsent = 0;

	for (size_t i = 0; i < acks->n; i++) {
		const char *h = acks->v[i].handlers;
		size_t k;

		if (acks->v[i].deliveries == 0 || PQgetvalue(res, (int)i, 4)[0] != 't')
			continue;
		for (k = 0; k < nsent && k < WAKE_SETS; k++)
			if (strcmp(sent[k], h) == 0)
				break;
		if (k < nsent && k < WAKE_SETS)
			continue;
		sent[nsent++ % WAKE_SETS] = h;
		rb_sb_putn(&w, w.len == 0 ? "[" : ",", 1);
		rb_sb_puts(&w, h);
	}
	if (w.len == 0)
		return;
	rb_sb_putn(&w, "]", 1);
	params[0] = w.s;
	if (!pg_send(be, be->conn, be->q_wake, 1, params))
		rb_debug("the wake-up was not sent: %s", PQerrorMessage(be->conn));
	free(w.s);
}

int
pg_publish(struct rb_store *s, const char *events, size_t n, struct rb_publish_acks *acks,
    struct rb_error *err)
{
	const char *params[1] = { events };
	PGresult *res;

	if (defer_wake(s, err) < 0)
		return -1;
	res = pg_run(s, n == 1 ? pg_be(s)->q_publish1 : pg_be(s)->q_publish, 1, params, PGRES_TUPLES_OK,
	    "publish", true, err);
	if (res == NULL)
		return -1;
	if (acks_of_result(res, n, acks, err) < 0)
		return -1;
	if (pg_be(s)->wake > 0)
		wake(s, res, acks);
	return 0;
}

int
rb_pg_publish(PGconn *conn, const char *schema, const json_t *event, json_t **ack,
    struct rb_error *err)
{
	/* (the error map reads only the schema of a store) */
	struct rb_store s = { 0 };
	struct rb_publish_acks acks = { 0 };
	json_t *arr;
	char *text, *sql;
	int rc = -1;

	*ack = NULL;
	if (schema == NULL)
		schema = RB_DEFAULT_SCHEMA;
	if (!rb_ident_valid(schema))
		return rb_seterr(err, RB_EXIT_USAGE, "invalid schema name");
	if (rb_event_validate(event, err) < 0)
		return -1;
	s.schema = (char *)schema;
	sql = pg_render(pg_tmpl_publish, schema);
	arr = json_pack("[o]", json_deep_copy(event));
	rb_event_id_alias(json_array_get(arr, 0));
	text = json_dumps(arr, JSON_COMPACT);
	/* no retry: the statement runs in the caller's transaction */
	const char *params[1] = { text };
	PGresult *res = PQexecParams(conn, sql, 1, NULL, params, NULL, NULL, 0);
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		pg_fail_on(&s, conn, res, "publish", err);
		PQclear(res);
	} else if (acks_of_result(res, 1, &acks, err) == 0) {
		json_t *a = rb_publish_acks_json(&acks);

		*ack = json_incref(json_array_get(a, 0));
		json_decref(a);
		rb_publish_acks_clear(&acks);
		rc = 0;
	}
	free(text);
	json_decref(arr);
	free(sql);
	return rc;
}
