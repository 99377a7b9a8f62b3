/* SPDX-License-Identifier: MIT */
/*
 * store_pg_publish.c: publishing, one statement per batch
 * (relaybus_publish_batch in schema_pg.sql, one row per event in input
 * order), and rb_pg_publish (rb_pg.h) on the application's own connection
 * and transaction.
 */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_pg.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"

/* publish: one row per event, in input order */
const char pg_tmpl_publish[] =
    "SELECT event_id, deliveries, duplicate, array_to_json(handlers)::text "
    "FROM @S@.relaybus_publish_batch($1::jsonb) ORDER BY ord";

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

int
pg_publish(struct rb_store *s, const char *events, size_t n, struct rb_publish_acks *acks,
    struct rb_error *err)
{
	const char *params[1] = { events };
	PGresult *res;

	res = pg_run(s, pg_be(s)->q_publish, 1, params, PGRES_TUPLES_OK, "publish", true, err);
	if (res == NULL)
		return -1;
	return acks_of_result(res, n, acks, err);
}

int
rb_pg_publish(PGconn *conn, const char *schema, const json_t *event, json_t **ack,
    struct rb_error *err)
{
	/* (the error map reads only the schema of a store) */
	struct rb_store s = { .ops = &rb_store_pg_ops };
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
