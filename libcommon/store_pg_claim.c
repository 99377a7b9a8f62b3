/* SPDX-License-Identifier: MIT */
/*
 * store_pg_claim.c: claiming (relaybus_claim in one short transaction, at
 * once or in two steps), reading the events of what a claim took on the
 * second connection (rb_store_fetch_*), renewing leases and handing lanes
 * back.  A claimed row becomes a delivery line, object or rb_dl through
 * delivery.c, the same for every backend.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"

const char pg_tmpl_claim[] =
    "SELECT id, event_id, handler, lane, epoch, claims, attempts, name, key, sequence, "
    "payload::text, headers::text, created_at "
    "FROM @S@.relaybus_claim($1, $2, $3::integer, $4::bigint, $5::integer, $6::bigint[], $7::boolean, $8::integer, "
    "$9::smallint[], $10::bigint, $11::boolean)";
/* the claim without events, for the second connection to read them (rb_claim_opts.apart) */
const char pg_tmpl_claim_ids[] = "SELECT id, event_id, handler, lane, epoch, claims, attempts, sequence, created_at "
    "FROM @S@.relaybus_claim_ids($1, $2, $3::integer, $4::bigint, $5::integer, $6::bigint[], $7::boolean, $8::integer, "
    "$9::smallint[], $10::bigint, $11::boolean)";
/* the events of what a claim took, on the second connection, by the
 * position of their event id in $1 (the connection runs with
 * enable_seqscan off, as the claim does: young tables have no
 * statistics) */
const char pg_tmpl_fetch[] =
    "SELECT p.o, e.name, e.key, e.payload::text, e.headers::text "
    "FROM unnest($1::text[]) WITH ORDINALITY p(eid, o) "
    "CROSS JOIN LATERAL (SELECT * FROM @S@.relaybus_worker_events ee WHERE ee.id = p.eid OFFSET 0) e";
/* (a worker role has no table privilege: what the delivery path writes
 * goes through the functions of schema_pg.sql, "Roles"; each returns the
 * number of lanes it changed) */
const char pg_tmpl_extend[] = "SELECT @S@.relaybus_extend($1, $2, $3::bigint, $4::bigint)";
const char pg_tmpl_relinquish[] = "SELECT @S@.relaybus_relinquish($1, $2, $3::bigint)";
const char pg_tmpl_relinquish_owner[] = "SELECT @S@.relaybus_relinquish_owner($1, $2, $3::bigint)";
const char pg_tmpl_relinquish_leases[] =
    "SELECT @S@.relaybus_relinquish_leases($1::text[], $2::smallint[], $3::bigint[])";


/* ---- claim --------------------------------------------------------------- */

/* relaybus_claim's parameters: handler, owner, batch, lease, max attempts,
 * live ids, search, chain, live lanes, holder, chain early */
enum { CLAIM_NPARAMS = 11 };

/* The claim's eleven parameters, from what claim_params keeps for a retry
 * (the tenth, the holder, is the store's for its whole life). */
static void
claim_param_list(const struct pg_be *be, const char *params[CLAIM_NPARAMS])
{
	for (int i = 0; i < 5; i++)
		params[i] = be->claim_params[i];
	params[5] = be->claim_live_known ? be->claim_live.s : NULL;
	params[6] = be->claim_quiet ? "false" : "true";
	params[7] = be->claim_chain;
	params[8] = be->claim_lanes_known ? be->claim_live_lanes.s : NULL;
	params[9] = be->holder;
	params[10] = be->claim_early ? "true" : "false";
}

/* The claim's parameters, as text, in be->claim_params (the caller checked
 * that handler and owner fit); the sixth, the ids still running, is NULL
 * when the caller does not know them. */
static void
claim_params(struct pg_be *be, const struct rb_claim_opts *o, const char *params[CLAIM_NPARAMS])
{
	snprintf(be->claim_params[0], sizeof be->claim_params[0], "%s", o->handler);
	snprintf(be->claim_params[1], sizeof be->claim_params[1], "%s", o->owner);
	snprintf(be->claim_params[2], sizeof be->claim_params[2], "%d", o->batch);
	snprintf(be->claim_params[3], sizeof be->claim_params[3], "%" PRId64, o->lease_ms);
	snprintf(be->claim_params[4], sizeof be->claim_params[4], "%d", o->max_attempts);
	be->claim_live.len = 0;
	be->claim_live_known = o->live != NULL;
	if (o->live != NULL) {
		pg_arr_start(&be->claim_live);
		for (size_t i = 0; i < o->n_live; i++)
			pg_arr_int(&be->claim_live, o->live[i]);
		pg_arr_end(&be->claim_live);
	}
	be->claim_live_lanes.len = 0;
	be->claim_lanes_known = o->live != NULL && o->live_lanes != NULL;
	if (be->claim_lanes_known) {
		pg_arr_start(&be->claim_live_lanes);
		for (size_t i = 0; i < o->n_live; i++)
			pg_arr_int(&be->claim_live_lanes, o->live_lanes[i]);
		pg_arr_end(&be->claim_live_lanes);
	}
	be->claim_quiet = o->no_search;
	be->claim_text = o->line_text;
	be->claim_early = o->chain_early;
	snprintf(be->claim_chain, sizeof be->claim_chain, "%d", o->chain > 1 ? o->chain : 1);
	claim_param_list(be, params);
}

/* Row i of a claim's result (relaybus_claim's columns). */
static struct rb_delivery_fields
claim_cols(const PGresult *res, int i)
{
	return (struct rb_delivery_fields){
		.id = pg_col(res, i, 0), .event_id = pg_col(res, i, 1), .handler = pg_col(res, i, 2),
		.lane = atoi(PQgetvalue(res, i, 3)), .epoch = strtoll(PQgetvalue(res, i, 4), NULL, 10),
		.claims = strtoll(PQgetvalue(res, i, 5), NULL, 10), .attempts = atoi(PQgetvalue(res, i, 6)),
		.name = pg_col(res, i, 7), .key = pg_col(res, i, 8), .sequence = pg_col(res, i, 9),
		.payload = pg_col(res, i, 10), .headers = pg_col(res, i, 11), .created_at = pg_col(res, i, 12),
	};
}

/* The deliveries of a claim's result (relaybus_claim's columns). */
static json_t *
claim_rows(PGresult *res, bool text)
{
	json_t *arr = json_array();
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (int i = 0; i < PQntuples(res); i++) {
		struct rb_delivery_fields c = claim_cols(res, i);

		json_array_append_new(arr, rb_delivery_object(&c, text, &b));
	}
	free(b.s);
	return arr;
}

/* The deliveries of a claim's result (relaybus_claim's columns), as rb_dl. */
static struct rb_dl **
claim_dls(PGresult *res, bool text)
{
	int n = PQntuples(res);
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (int i = 0; i < n; i++) {
		struct rb_delivery_fields c = claim_cols(res, i);

		v[i] = rb_dl_new(&c);
		rb_dl_fill(v[i], &c, text, &b);
	}
	free(b.s);
	return v;
}

/* What relaybus_claim_ids returned: the delivery rows without events. */
static struct rb_dl **
claimed_dls(PGresult *res)
{
	int n = PQntuples(res);
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);

	for (int i = 0; i < n; i++) {
		struct rb_delivery_fields c = {
			.id = PQgetvalue(res, i, 0), .event_id = PQgetvalue(res, i, 1),
			.handler = PQgetvalue(res, i, 2), .lane = atoi(PQgetvalue(res, i, 3)),
			.epoch = strtoll(PQgetvalue(res, i, 4), NULL, 10),
			.claims = strtoll(PQgetvalue(res, i, 5), NULL, 10), .attempts = atoi(PQgetvalue(res, i, 6)),
			.sequence = pg_col(res, i, 7), .created_at = PQgetvalue(res, i, 8),
		};

		v[i] = rb_dl_new(&c);
	}
	return v;
}

int
pg_claim(struct rb_store *s, const struct rb_claim_opts *o, json_t **out, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	const char *params[CLAIM_NPARAMS];
	PGresult *res;

	claim_params(be, o, params);
	res = pg_run(s, be->q_claim, CLAIM_NPARAMS, params, PGRES_TUPLES_OK, "claim", true, err);
	if (res == NULL)
		return -1;
	*out = claim_rows(res, o->line_text);
	PQclear(res);
	return (int)json_array_size(*out);
}

int
pg_claim_send(struct rb_store *s, const struct rb_claim_opts *o, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	const char *params[CLAIM_NPARAMS];

	if (be->claim_pending || (be->complete_pending && !be->complete_apart))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "claim: a statement is in progress already");
	claim_params(be, o, params);
	be->claim_tries = 1;
	be->claim_apart = o->apart;
	if (!pg_send(be, be->conn, o->apart ? be->q_claim_ids : be->q_claim, CLAIM_NPARAMS, params))
		return pg_send_failed(s, "claim", err);
	be->claim_pending = true;
	return 0;
}

int
pg_claim_recv(struct rb_store *s, bool wait, struct rb_dl ***out, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	if (!be->claim_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "claim: no claim in progress");
	for (;;) {
		PGresult *res;
		int rc = pg_take_result(be->conn, wait, &res);

		if (rc == RB_CLAIM_PENDING)
			return rc;
		if (rc < 0)
			return pg_send_failed(s, "claim", err);
		be->claim_pending = false;
		if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
			int n = PQntuples(res);

			*out = be->claim_apart ? claimed_dls(res) : claim_dls(res, be->claim_text);
			PQclear(res);
			return n;
		}
		/* a deadlock or serialization failure: the claim runs again, as pg_run() does */
		if (pg_retryable(res) && be->claim_tries < 5) {
			const char *params[CLAIM_NPARAMS];

			PQclear(res);
			claim_param_list(be, params);
			be->claim_tries++;
			if (!pg_send(be, be->conn, be->claim_apart ? be->q_claim_ids : be->q_claim, CLAIM_NPARAMS, params))
				return pg_send_failed(s, "claim", err);
			be->claim_pending = true;
			continue;
		}
		pg_fail(s, res, "claim", err);
		PQclear(res);
		return -1;
	}
}

/* ---- reading what a claim took, on the second connection ------------------ */

void
pg_close_conn2(struct pg_be *be)
{
	if (be->conn2 != NULL)
		PQfinish(be->conn2);
	be->conn2 = NULL;
	be->prepared2 = 0;
	be->fetch_pending = false;
	be->fetch_v = NULL;
	be->fetch_n = 0;
}

static int
fetch_failed(struct rb_store *s, PGresult *res, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	be->fetch_pending = false;
	be->fetch_v = NULL;
	be->fetch_n = 0;
	return pg_side_failed(s, be->conn2, pg_close_conn2, res, "fetch", err);
}

int
pg_fetch_send(struct rb_store *s, struct rb_dl *const *claimed, size_t n, bool text, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	struct rb_sbuf ids;
	const char *params[1];
	int ok;

	if (be->fetch_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "fetch: a fetch is in progress already");
	/* (with enable_seqscan off, as the claim runs: young tables have no
	 * statistics) */
	if (pg_open_side(s, &be->conn2, pg_close_conn2, "SET enable_seqscan = off", "fetch", err) < 0)
		return -1;
	rb_sb_init(&ids);
	pg_arr_start(&ids);
	for (size_t i = 0; i < n; i++)
		pg_arr_text(&ids, claimed[i]->event_id);
	pg_arr_end(&ids);
	params[0] = ids.s;
	ok = pg_send(be, be->conn2, be->q_fetch, 1, params);
	free(ids.s);
	if (!ok)
		return fetch_failed(s, NULL, err);
	be->fetch_pending = true;
	be->fetch_text = text;
	be->fetch_v = claimed;
	be->fetch_n = n;
	return 0;
}

int
pg_fetch_recv(struct rb_store *s, bool wait, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res;
	struct rb_sbuf b;
	int rc, got = 0;

	if (!be->fetch_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "fetch: no fetch in progress");
	if ((rc = pg_take_result(be->conn2, wait, &res)) == RB_CLAIM_PENDING)
		return rc;
	if (rc < 0)
		return fetch_failed(s, NULL, err);
	be->fetch_pending = false;
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		fetch_failed(s, res, err);
		PQclear(res);
		return -1;
	}
	/* each claimed delivery with its event (one that is gone is left as
	 * it is): the rows come in any order, each with its place */
	rb_sb_init(&b);
	for (int i = 0; i < PQntuples(res); i++) {
		long o = strtol(PQgetvalue(res, i, 0), NULL, 10);
		struct rb_dl *d = o >= 1 && (size_t)o <= be->fetch_n ? be->fetch_v[o - 1] : NULL;
		char id[32];
		struct rb_delivery_fields c;

		if (d == NULL || d->fetched)
			continue;
		id[rb_fmt_int(id, d->id)] = '\0';
		c = (struct rb_delivery_fields){
			.id = id, .event_id = d->event_id, .handler = d->handler, .lane = d->lane,
			.epoch = d->epoch, .claims = d->claims, .attempts = d->attempt - 1,
			.sequence = d->sequence, .created_at = d->created_at,
			.name = pg_col(res, i, 1), .key = pg_col(res, i, 2),
			.payload = pg_col(res, i, 3), .headers = pg_col(res, i, 4),
		};
		rb_dl_fill(d, &c, be->fetch_text, &b);
		got++;
	}
	free(b.s);
	be->fetch_v = NULL;
	be->fetch_n = 0;
	PQclear(res);
	return got;
}

int
pg_fetch_socket(const struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	return be != NULL && be->conn2 != NULL && be->fetch_pending ? PQsocket(be->conn2) : -1;
}

int
pg_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	char lease[32];
	const char *params[4] = { handler, owner, lease, pg_be(s)->holder };

	snprintf(lease, sizeof lease, "%" PRId64, lease_ms);
	return pg_run_affected(s, pg_be(s)->q_extend, 4, params, "extend", err);
}

/* ---- handing lanes back -------------------------------------------------- */

int
pg_relinquish(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[3] = { handler, owner, pg_be(s)->holder };

	return pg_run_affected(s, pg_be(s)->q_relinquish, 3, params, "relinquish", err);
}

int
pg_relinquish_owner(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[3] = { handler, owner, pg_be(s)->holder };

	return pg_run_affected(s, pg_be(s)->q_relinquish_owner, 3, params, "relinquish", err);
}

int
pg_relinquish_leases(struct rb_store *s, const json_t *leases, struct rb_error *err)
{
	struct rb_sbuf h, lane, epoch;
	size_t i;
	json_t *v;
	int n;

	if (json_array_size(leases) == 0)
		return 0;
	rb_sb_init(&h);
	rb_sb_init(&lane);
	rb_sb_init(&epoch);
	pg_arr_start(&h);
	pg_arr_start(&lane);
	pg_arr_start(&epoch);
	json_array_foreach(leases, i, v) {
		struct rb_lease l;

		if (rb_lease_parse(json_string_value(json_object_get(v, "lease")), &l) < 0 ||
		    !json_is_string(json_object_get(v, "handler")))
			continue;
		pg_arr_text(&h, json_string_value(json_object_get(v, "handler")));
		pg_arr_int(&lane, l.lane);
		pg_arr_int(&epoch, l.epoch);
	}
	pg_arr_end(&h);
	pg_arr_end(&lane);
	pg_arr_end(&epoch);
	const char *params[3] = { h.s, lane.s, epoch.s };
	n = pg_run_affected(s, pg_be(s)->q_relinquish_leases, 3, params, "relinquish", err);
	free(h.s);
	free(lane.s);
	free(epoch.s);
	return n;
}
