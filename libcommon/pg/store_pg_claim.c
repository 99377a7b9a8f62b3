/* SPDX-License-Identifier: MIT */
/*
 * store_pg_claim.c: claiming (relaybus_claim in one short transaction, at
 * once or without waiting), reading the events of what a claim took on
 * the second connection meanwhile (with RELAYBUS_PG_CONNECTIONS 2 or 3:
 * the claim is then relaybus_claim_ids), renewing leases and handing lanes
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
#include "store_pg_steps.h"

/*
 * The claim's arguments, in the order of relaybus_claim(_ids)'s parameters
 * (schema_pg.sql), named by enum claim_arg: the one place that spells
 * them, for the four statements that claim.
 */
enum claim_arg {
	CA_HANDLER, CA_OWNER, CA_BATCH, CA_LEASE_MS, CA_MAX_ATTEMPTS, CA_LIVE, CA_SEARCH, CA_CHAIN,
	CA_LIVE_LANES, CA_HOLDER, CA_CHAIN_EARLY, CA_HOLDER_LIVE,
	CA_CURSORS,		/* p_ticks_c ... p_kf: struct pg_cursors' params */
	CLAIM_NPARAMS = CA_CURSORS + PG_CURSOR_PARAMS
};
#define PG_CLAIM_ARGS \
    "($1, $2, $3::integer, $4::bigint, $5::integer, $6::bigint[], $7::boolean, $8::integer, " \
    "$9::smallint[], $10::bigint, $11::boolean, $12::boolean, " \
    "$13::timestamptz[], $14::xid8[], $15::smallint[], $16::timestamptz[], $17::timestamptz[], " \
    "$18::timestamptz, $19::smallint[], $20::smallint[], $21::tid[], $22::smallint[])"
_Static_assert(CLAIM_NPARAMS == 22, "PG_CLAIM_ARGS spells 22 parameters");

const char pg_tmpl_claim[] =
    "SELECT id, event_id, handler, lane, epoch, claims, attempts, name, key, sequence, "
    "payload::text, headers::text, created_at "
    "FROM @S@.relaybus_claim" PG_CLAIM_ARGS;
/* the claim without events, for the second connection to read them */
const char pg_tmpl_claim_ids[] = "SELECT id, event_id, handler, lane, epoch, claims, attempts, sequence, created_at, "
    "addr FROM @S@.relaybus_claim_ids" PG_CLAIM_ARGS;
/* the events of what a claim took, on the second connection, by the
 * position of their event id in $1 (the connection runs with
 * enable_seqscan off, as the claim does: young tables have no
 * statistics; and with jit off, as the claim does: see
 * relaybus_lane_candidates) */
const char pg_tmpl_fetch[] =
    "SELECT p.o, e.name, e.key, e.payload::text, coalesce(e.headers, '{}')::text "
    "FROM unnest($1::text[]) WITH ORDINALITY p(eid, o) "
    "CROSS JOIN LATERAL (SELECT * FROM @S@.relaybus_events ee WHERE ee.id = p.eid OFFSET 0) e";
/* (holder_live: whether this session holds the holder's liveness lock
 * now; a lane that says so while it does not would be cut short) */
const char pg_tmpl_extend[] =
    "UPDATE @S@.relaybus_lanes SET lease_expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond', "
    "holder_live = $5::boolean "
    "WHERE handler = $1 AND lease_owner = $2 AND holder = $4::bigint";
/* the holder's liveness lock for this session (relaybus_hold) */
const char pg_tmpl_hold[] = "SELECT @S@.relaybus_hold($1::bigint)";
const char pg_tmpl_relinquish[] =
    "UPDATE @S@.relaybus_lanes x SET lease_owner = NULL, holder = NULL, lease_expires_at = NULL, in_flight = '{}' "
    "WHERE x.handler = $1 AND x.lease_owner = $2 AND x.holder = $3::bigint AND NOT EXISTS ("
    "  SELECT 1 FROM @S@.relaybus_deliveries d WHERE d.id = ANY (x.in_flight) AND d.status = 'pending')";
const char pg_tmpl_relinquish_owner[] =
    "UPDATE @S@.relaybus_lanes x SET epoch = x.epoch + 1, lease_owner = NULL, holder = NULL, "
    "lease_expires_at = NULL, in_flight = '{}' WHERE x.handler = $1 AND x.lease_owner = $2 "
    "AND x.holder = $3::bigint";
const char pg_tmpl_relinquish_leases[] =
    "UPDATE @S@.relaybus_lanes x SET lease_owner = NULL, holder = NULL, lease_expires_at = NULL, in_flight = '{}' "
    "FROM unnest($1::text[], $2::smallint[], $3::bigint[]) AS r(handler, lane, epoch) "
    "WHERE x.handler = r.handler AND x.lane = r.lane AND x.epoch = r.epoch "
    "  AND x.lease_owner IS NOT NULL AND NOT EXISTS ("
    "  SELECT 1 FROM @S@.relaybus_deliveries d WHERE d.id = ANY (x.in_flight) AND d.status = 'pending')";

/*
 * The same for a session whose user lacks the owner's privileges (a role
 * rb-setup --grant worker=ROLE made; pg_open tells which): such a role has
 * no table privilege, so it goes through the SECURITY DEFINER doors of
 * schema_pg.sql ("Roles"), which check its handlers once per call and run
 * the statements above; the lane functions return the number of lanes they
 * changed (pg_run_affected).  The owner's sessions keep the statements
 * above and pay nothing for the roles.
 */
const char pg_tmpl_w_claim[] =
    "SELECT id, event_id, handler, lane, epoch, claims, attempts, name, key, sequence, "
    "payload::text, headers::text, created_at "
    "FROM @S@.relaybus_worker_claim" PG_CLAIM_ARGS;
const char pg_tmpl_w_claim_ids[] = "SELECT id, event_id, handler, lane, epoch, claims, attempts, sequence, created_at, "
    "addr FROM @S@.relaybus_worker_claim_ids" PG_CLAIM_ARGS;
const char pg_tmpl_w_fetch[] =
    "SELECT p.o, e.name, e.key, e.payload::text, e.headers::text "
    "FROM unnest($1::text[]) WITH ORDINALITY p(eid, o) "
    "CROSS JOIN LATERAL (SELECT * FROM @S@.relaybus_worker_events ee WHERE ee.id = p.eid OFFSET 0) e";
const char pg_tmpl_w_extend[] = "SELECT @S@.relaybus_extend($1, $2, $3::bigint, $4::bigint, $5::boolean)";
const char pg_tmpl_w_relinquish[] = "SELECT @S@.relaybus_relinquish($1, $2, $3::bigint)";
const char pg_tmpl_w_relinquish_owner[] = "SELECT @S@.relaybus_relinquish_owner($1, $2, $3::bigint)";
const char pg_tmpl_w_relinquish_leases[] =
    "SELECT @S@.relaybus_relinquish_leases($1::text[], $2::smallint[], $3::bigint[])";

/* ---- claim --------------------------------------------------------------- */

/* The claim's parameter list: be->claim (claim_params keeps it for a
 * retry), the store's holder, and the cursors, each at its place. */
static void
claim_param_list(const struct pg_be *be, const char *params[CLAIM_NPARAMS])
{
	const struct pg_claim_args *a = &be->claim;

	params[CA_HANDLER] = a->handler;
	params[CA_OWNER] = a->owner;
	params[CA_BATCH] = a->batch;
	params[CA_LEASE_MS] = a->lease_ms;
	params[CA_MAX_ATTEMPTS] = a->max_attempts;
	params[CA_LIVE] = a->live_known ? a->live.s : NULL;
	params[CA_SEARCH] = a->search ? "true" : "false";
	params[CA_CHAIN] = a->chain;
	params[CA_LIVE_LANES] = a->lanes_known ? a->live_lanes.s : NULL;
	/* (the holder is the store's for its whole life) */
	params[CA_HOLDER] = be->holder;
	params[CA_CHAIN_EARLY] = a->chain_early ? "true" : "false";
	params[CA_HOLDER_LIVE] = be->live == PG_LIVE_HELD ? "true" : "false";
	for (int i = 0; i < PG_CURSOR_PARAMS; i++)
		params[CA_CURSORS + i] = be->cursors.params[i];
}

/* ---- the liveness lock ---------------------------------------------------- */

/* A long-lived holder (rb_claim_opts.liveness) keeps its liveness lock on
 * the first connection: taken before the first claim or renewal on every
 * new connection, tried again before each while it could not be had.
 * Returns -1 when the connection failed. */
static int
live_ensure(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	const char *params[1] = { be->holder };
	PGresult *res;

	if (!be->want_live || be->live == PG_LIVE_HELD || be->live == PG_LIVE_OFF)
		return 0;
	if ((res = pg_run(s, be->q_hold, 1, params, PGRES_TUPLES_OK, "hold", true, err)) == NULL) {
		/* a role that may not take it (not a worker): the lease rule,
		 * and the claim says what the role may not do */
		if (err->exit_code != RB_EXIT_NOPERM)
			return -1;
		be->live = PG_LIVE_OFF;
		return 0;
	}
	be->live = PQgetisnull(res, 0, 0) ? PG_LIVE_OFF :
	    *PQgetvalue(res, 0, 0) == 't' ? PG_LIVE_HELD : PG_LIVE_BUSY;
	PQclear(res);
	return 0;
}

/* The claim's arguments, as text, in be->claim (the caller checked that
 * handler and owner fit), and its parameter list; p_live, the ids still
 * running, is NULL when the caller does not know them. */
static void
claim_params(struct pg_be *be, const struct rb_claim_opts *o, const char *params[CLAIM_NPARAMS])
{
	struct pg_claim_args *a = &be->claim;

	snprintf(a->handler, sizeof a->handler, "%s", o->handler);
	snprintf(a->owner, sizeof a->owner, "%s", o->owner);
	snprintf(a->batch, sizeof a->batch, "%d", o->batch);
	snprintf(a->lease_ms, sizeof a->lease_ms, "%" PRId64, o->lease_ms);
	snprintf(a->max_attempts, sizeof a->max_attempts, "%d", o->max_attempts);
	/* (the caller's, and what earlier claims took that is still being
	 * read here: the caller does not have those yet) */
	a->live.len = 0;
	a->live_known = o->live != NULL;
	if (o->live != NULL) {
		pg_arr_start(&a->live);
		for (size_t i = 0; i < o->n_live; i++)
			pg_arr_int(&a->live, o->live[i]);
		for (size_t i = 0; i < be->fetch.n; i++)
			pg_arr_int(&a->live, be->fetch.v[i]->id);
		for (size_t i = 0; i < be->waiting.n; i++)
			pg_arr_int(&a->live, be->waiting.v[i]->id);
		pg_arr_end(&a->live);
	}
	a->live_lanes.len = 0;
	a->lanes_known = o->live != NULL && o->live_lanes != NULL;
	if (a->lanes_known) {
		pg_arr_start(&a->live_lanes);
		for (size_t i = 0; i < o->n_live; i++)
			pg_arr_int(&a->live_lanes, o->live_lanes[i]);
		for (size_t i = 0; i < be->fetch.n; i++)
			pg_arr_int(&a->live_lanes, be->fetch.v[i]->lease.lane);
		for (size_t i = 0; i < be->waiting.n; i++)
			pg_arr_int(&a->live_lanes, be->waiting.v[i]->lease.lane);
		pg_arr_end(&a->live_lanes);
	}
	a->search = !o->held_only;
	a->chain_early = o->chain_early;
	snprintf(a->chain, sizeof a->chain, "%d", o->chain > 1 ? o->chain : 1);
	pg_cursors_params(&be->cursors, o->handler, o->cursors);
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

/* The deliveries of a claim's result (relaybus_claim's columns), as rb_dl. */
static struct rb_dl **
claim_dls(PGresult *res, int *np)
{
	int n = PQntuples(res), k = 0;
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (int i = 0; i < n; i++) {
		struct rb_delivery_fields c;

		if (pg_cursors_row(res, i))
			continue;
		c = claim_cols(res, i);
		v[k] = rb_dl_new(&c);
		rb_dl_fill(v[k++], &c, &b);
	}
	free(b.s);
	*np = k;
	return v;
}

/* What relaybus_claim_ids returned: the delivery rows without events. */
static struct rb_dl **
claimed_dls(PGresult *res, int *np)
{
	int n = PQntuples(res), k = 0;
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);

	for (int i = 0; i < n; i++) {
		if (pg_cursors_row(res, i))
			continue;
		struct rb_delivery_fields c = {
			.id = PQgetvalue(res, i, 0), .event_id = PQgetvalue(res, i, 1),
			.handler = PQgetvalue(res, i, 2), .lane = atoi(PQgetvalue(res, i, 3)),
			.epoch = strtoll(PQgetvalue(res, i, 4), NULL, 10),
			.claims = strtoll(PQgetvalue(res, i, 5), NULL, 10), .attempts = atoi(PQgetvalue(res, i, 6)),
			.sequence = pg_col(res, i, 7), .created_at = PQgetvalue(res, i, 8),
			.addr = pg_addr(pg_col(res, i, 9)),
		};

		v[k++] = rb_dl_new(&c);
	}
	*np = k;
	return v;
}

int
pg_claim(struct rb_store *s, const struct rb_claim_opts *o, struct rb_dl ***out, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	const char *params[CLAIM_NPARAMS];
	PGresult *res;
	int n;

	be->want_live = o->liveness;
	if (live_ensure(s, err) < 0)
		return -1;
	claim_params(be, o, params);
	res = pg_run(s, be->q_claim, CLAIM_NPARAMS, params, PGRES_TUPLES_OK, "claim", true, err);
	if (res == NULL)
		return -1;
	pg_cursors_take(&be->cursors, res);
	*out = claim_dls(res, &n);
	PQclear(res);
	return n;
}

/* ---- claim without waiting (rb_store_claim_start), and reading what it
 * took on the second connection --------------------------------------------- */

static void
push(struct rb_store *s, struct rb_store_event ev)
{
	if (ev.kind == RB_STORE_CLAIMED)
		pg_wake_claimed(pg_be(s), ev.claimed);
	rb_evq_push(&s->evq, &ev);
}

static void fetch_start(struct rb_store *, struct pg_claimed);

int
pg_claim_start(struct rb_store *s, const struct rb_claim_opts *o, bool wait, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	const char *params[CLAIM_NPARAMS];

	if (wait) {
		/* the caller waits: one statement, events and all, on the first
		 * connection (as rb-claim always did) */
		struct rb_dl **v;
		int n;

		pg_settle(s);
		if ((n = pg_claim(s, o, &v, err)) < 0)
			return -1;
		push(s, (struct rb_store_event){ .kind = RB_STORE_CLAIMED, .claimed = n, .v = v, .n = (size_t)n,
		    .retry_ms = be->cursors.free_in_ms });
		return 0;
	}
	if (!pg_claim_ready(s))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "claim: a statement is out already");
	be->want_live = o->liveness;
	if (live_ensure(s, err) < 0)
		return -1;
	claim_params(be, o, params);
	be->claim_tries = 1;
	/* (with a second connection, it reads the events of what this claim
	 * took while the next claim runs here) */
	be->claim_ids = pg_connections(s) >= 2;
	if (!pg_send(be, be->conn, be->claim_ids ? be->q_claim_ids : be->q_claim, CLAIM_NPARAMS, params))
		return pg_fail(s, NULL, "claim", err);
	be->job = PG_CLAIM;
	return 0;
}

bool
pg_claim_answer(struct rb_store *s, bool wait)
{
	struct pg_be *be = pg_be(s);
	struct rb_error err = { 0 };

	for (;;) {
		PGresult *res;
		int rc = pg_take_result(be->conn, wait, &res);

		if (rc == PG_PENDING)
			return false;
		be->job = PG_IDLE;
		if (rc < 0) {
			pg_fail(s, NULL, "claim", &err);
			rb_evq_failed(&s->evq, RB_STORE_CLAIMED, 0, &err);
			return true;
		}
		if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
			int n;
			struct pg_claimed got;

			pg_cursors_take(&be->cursors, res);
			got.v = be->claim_ids ? claimed_dls(res, &n) : claim_dls(res, &n);
			got.n = (size_t)n;
			PQclear(res);
			if (!be->claim_ids || n == 0) {
				push(s, (struct rb_store_event){ .kind = RB_STORE_CLAIMED, .claimed = n,
				    .v = n > 0 ? got.v : NULL, .n = got.n, .retry_ms = be->cursors.free_in_ms });
				if (n == 0)
					free(got.v);
				return true;
			}
			/* their events come on the second connection (DELIVERED) */
			push(s, (struct rb_store_event){ .kind = RB_STORE_CLAIMED, .claimed = n,
			    .retry_ms = be->cursors.free_in_ms });
			if (be->job2 == PG_FETCH)
				be->waiting = got;	/* (no claim goes out meanwhile: pg_claim_ready) */
			else
				fetch_start(s, got);
			return true;
		}
		/* a deadlock or serialization failure: the claim runs again, as pg_run() does */
		if (pg_retryable(res) && be->claim_tries < 5) {
			const char *params[CLAIM_NPARAMS];

			PQclear(res);
			claim_param_list(be, params);
			be->claim_tries++;
			if (!pg_send(be, be->conn, be->claim_ids ? be->q_claim_ids : be->q_claim, CLAIM_NPARAMS, params)) {
				pg_fail(s, NULL, "claim", &err);
				rb_evq_failed(&s->evq, RB_STORE_CLAIMED, 0, &err);
				return true;
			}
			be->job = PG_CLAIM;
			continue;
		}
		pg_fail(s, res, "claim", &err);
		PQclear(res);
		rb_evq_failed(&s->evq, RB_STORE_CLAIMED, 0, &err);
		return true;
	}
}

static void
claimed_free(struct pg_claimed *c)
{
	for (size_t i = 0; i < c->n; i++)
		rb_dl_free(c->v[i]);
	free(c->v);
	c->v = NULL;
	c->n = 0;
}

void
pg_fetch_forget(struct pg_be *be)
{
	claimed_free(&be->fetch);
	claimed_free(&be->waiting);
	be->job2 = PG_IDLE;
}

/* Reading a claim's events failed (res: its error, or NULL): what is
 * claimed and not read will not come; conn2 is closed if it broke. */
static void
fetch_failed(struct rb_store *s, const PGresult *res)
{
	struct pg_be *be = pg_be(s);
	struct rb_error err = { 0 };
	int dropped = (int)(be->fetch.n + be->waiting.n);

	pg_fail_on(s, be->conn2, res, "fetch", &err);
	pg_fetch_forget(be);
	if (be->conn2 != NULL && PQstatus(be->conn2) != CONNECTION_OK)
		pg_close_conn2(be);
	rb_evq_failed(&s->evq, RB_STORE_DELIVERED, dropped, &err);
}

/* Read the events of what a claim took (got stolen) on the second connection. */
static void
fetch_start(struct rb_store *s, struct pg_claimed got)
{
	struct pg_be *be = pg_be(s);
	struct rb_error err = { 0 };
	struct rb_sbuf ids;
	const char *params[1];
	int ok;

	/* (with enable_seqscan off, as the claim runs: young tables have no
	 * statistics; opening it forgets what was out there: nothing) */
	/* (no session setting behind a transaction pooler: it would stay
	 * with the server connection, for another client) */
	if (pg_open_side(s, &be->conn2, pg_close_conn2, be->pooler ? NULL : "SET enable_seqscan = off; SET jit = off",
	    "fetch", &err) < 0) {
		int dropped = (int)got.n;

		claimed_free(&got);
		rb_evq_failed(&s->evq, RB_STORE_DELIVERED, dropped, &err);
		return;
	}
	be->fetch = got;
	rb_sb_init(&ids);
	pg_arr_start(&ids);
	for (size_t i = 0; i < got.n; i++)
		pg_arr_text(&ids, got.v[i]->event_id);
	pg_arr_end(&ids);
	params[0] = ids.s;
	ok = pg_send(be, be->conn2, be->q_fetch, 1, params);
	free(ids.s);
	if (!ok) {
		fetch_failed(s, NULL);
		return;
	}
	be->job2 = PG_FETCH;
}

bool
pg_fetch_answer(struct rb_store *s, bool wait)
{
	struct pg_be *be = pg_be(s);
	struct pg_claimed got = be->fetch;
	struct rb_dl **ready;
	PGresult *res;
	struct rb_sbuf b;
	size_t k = 0;
	int rc;

	if ((rc = pg_take_result(be->conn2, wait, &res)) == PG_PENDING)
		return false;
	if (rc < 0 || res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		fetch_failed(s, rc < 0 ? NULL : res);
		PQclear(res);
		return true;
	}
	be->job2 = PG_IDLE;
	/* each claimed delivery with its event (one that is gone is dropped):
	 * the rows come in any order, each with its place */
	rb_sb_init(&b);
	for (int i = 0; i < PQntuples(res); i++) {
		long o = strtol(PQgetvalue(res, i, 0), NULL, 10);
		struct rb_dl *d = o >= 1 && (size_t)o <= got.n ? got.v[o - 1] : NULL;
		char id[32];
		struct rb_delivery_fields c;

		if (d == NULL || d->fetched)
			continue;
		id[rb_fmt_int(id, d->id)] = '\0';
		c = (struct rb_delivery_fields){
			.id = id, .event_id = d->event_id, .handler = d->handler, .lane = d->lease.lane,
			.epoch = d->lease.epoch, .claims = d->lease.claims, .attempts = d->attempt - 1,
			.sequence = d->sequence, .created_at = d->created_at,
			.name = pg_col(res, i, 1), .key = pg_col(res, i, 2),
			.payload = pg_col(res, i, 3), .headers = pg_col(res, i, 4),
		};
		rb_dl_fill(d, &c, &b);
	}
	free(b.s);
	PQclear(res);
	/* in the claim's order */
	ready = xmalloc((got.n > 0 ? got.n : 1) * sizeof *ready);
	for (size_t i = 0; i < got.n; i++) {
		if (got.v[i]->fetched)
			ready[k++] = got.v[i];
		else
			rb_dl_free(got.v[i]);
	}
	free(got.v);
	be->fetch = (struct pg_claimed){ 0 };
	if (k == 0) {
		free(ready);
		ready = NULL;
	}
	push(s, (struct rb_store_event){ .kind = RB_STORE_DELIVERED, .v = ready, .n = k,
	    .dropped = (int)(got.n - k) });
	if (be->waiting.n > 0) {
		struct pg_claimed next = be->waiting;

		be->waiting = (struct pg_claimed){ 0 };
		fetch_start(s, next);
	}
	return true;
}

bool
pg_claim_ready(const struct rb_store *s)
{
	const struct pg_be *be = pg_be(s);

	/* (and not while a claim's answer waits for the second connection:
	 * the next would have to wait behind it too) */
	return be->job == PG_IDLE && be->waiting.n == 0;
}

/* The second and third connections go with the first: closed with it,
 * and with them whatever was out on them. */
void
pg_close_conn2(struct pg_be *be)
{
	if (be->conn2 != NULL)
		PQfinish(be->conn2);
	be->conn2 = NULL;
	be->prepared2 = 0;
	pg_fetch_forget(be);
}

int
pg_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	char lease[32];
	const char *params[5] = { handler, owner, lease, pg_be(s)->holder, NULL };

	snprintf(lease, sizeof lease, "%" PRId64, lease_ms);
	pg_settle(s);
	/* the lock first: a claimer that found it free meanwhile cut the
	 * lease short, and this renewal is what restores it */
	if (live_ensure(s, err) < 0)
		return -1;
	params[4] = pg_be(s)->live == PG_LIVE_HELD ? "true" : "false";
	return pg_run_affected(s, pg_be(s)->q_extend, 5, params, "extend", err);
}

/* The lock is no longer asked for, nor said to hold the lanes (it goes
 * with the session; their holder_live is false from this renewal on, so
 * no claimer cuts them when it is gone) */
int
pg_extend_plain(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	be->want_live = false;
	be->live = PG_LIVE_OFF;
	return pg_extend(s, handler, owner, lease_ms, err);
}

/* ---- handing lanes back -------------------------------------------------- */

int
pg_relinquish(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[3] = { handler, owner, pg_be(s)->holder };

	pg_settle(s);
	return pg_run_affected(s, pg_be(s)->q_relinquish, 3, params, "relinquish", err);
}

int
pg_relinquish_owner(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[3] = { handler, owner, pg_be(s)->holder };

	pg_settle(s);
	return pg_run_affected(s, pg_be(s)->q_relinquish_owner, 3, params, "relinquish", err);
}

int
pg_relinquish_leases(struct rb_store *s, const struct rb_result *v, size_t n, struct rb_error *err)
{
	struct rb_sbuf h, lane, epoch;
	int freed;

	if (n == 0)
		return 0;
	pg_settle(s);
	rb_sb_init(&h);
	rb_sb_init(&lane);
	rb_sb_init(&epoch);
	pg_arr_start(&h);
	pg_arr_start(&lane);
	pg_arr_start(&epoch);
	for (size_t i = 0; i < n; i++) {
		pg_arr_text(&h, v[i].handler);
		pg_arr_int(&lane, v[i].lease.lane);
		pg_arr_int(&epoch, v[i].lease.epoch);
	}
	pg_arr_end(&h);
	pg_arr_end(&lane);
	pg_arr_end(&epoch);
	const char *params[3] = { h.s, lane.s, epoch.s };
	freed = pg_run_affected(s, pg_be(s)->q_relinquish_leases, 3, params, "relinquish", err);
	free(h.s);
	free(lane.s);
	free(epoch.s);
	return freed;
}
