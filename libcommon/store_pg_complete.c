/* SPDX-License-Identifier: MIT */
/*
 * store_pg_complete.c: completion.  The ok results of a batch are one
 * statement (pg_tmpl_complete: relaybus_complete_batch, a DELETE fenced by
 * lane epoch, claim count and the lane's in_flight list), run at once (rb_store_complete) or in two
 * steps on the first or the third connection (rb_store_complete_send);
 * --sql runs the caller's statement and the deletion in one transaction
 * per delivery; failures, releases and burials go to relaybus_fail in one
 * statement.
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

/*
 * The completion: relaybus_complete_batch (schema_pg.sql), one statement
 * fenced by lane epoch, in_flight membership and claims; each row deleted
 * returns the position of its result.  It writes the history rows itself
 * when the schema keeps them (a worker role cannot leave them out), so
 * both statements are the same call.
 */
#define COMPLETE_CALL \
    "SELECT ord FROM @S@.relaybus_complete_batch($1::text[], $2::text[], $3::smallint[], $4::bigint[], " \
    "$5::integer[], $6::bigint[])"
const char pg_tmpl_complete[] = COMPLETE_CALL;
const char pg_tmpl_complete_hist[] = COMPLETE_CALL;
const char pg_tmpl_fail[] =
    "SELECT ord, outcome, attempts, missing FROM @S@.relaybus_fail($1::text[], $2::text[], "
    "$3::smallint[], $4::bigint[], $5::integer[], $6::text[], $7::bigint[], $8::text[], "
    "$9::integer, $10::bigint, $11::bigint, $12::double precision) ORDER BY ord";
/* (--sql: the lane row locked for the caller's transaction) */
/* (a row when the lane row is locked KEY SHARE at that epoch) */
const char pg_tmpl_lock_lane[] = "SELECT 1 WHERE @S@.relaybus_lock_lane($1, $2::smallint, $3::bigint)";

/* ---- the fence arrays ------------------------------------------------------ */

struct pg_fence {
	struct rb_sbuf ev, h, lane, epoch, claims, id;
};

/* (every array has one element per result, in the results' order) */
#define FENCE_ARRAYS(a)	{ &(a)->ev, &(a)->h, &(a)->lane, &(a)->epoch, &(a)->claims, &(a)->id }

static void
fa_init(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		rb_sb_init(v[i]);
		pg_arr_start(v[i]);
	}
}

static void
fa_add(struct pg_fence *a, const json_t *r)
{
	struct rb_lease l;

	rb_lease_parse(json_string_value(json_object_get(r, "lease")), &l);
	pg_arr_text(&a->ev, json_string_value(json_object_get(r, "event_id")));
	pg_arr_text(&a->h, json_string_value(json_object_get(r, "handler")));
	pg_arr_int(&a->lane, l.lane);
	pg_arr_int(&a->epoch, l.epoch);
	pg_arr_int(&a->claims, l.claims);
	{
		const char *id = json_string_value(json_object_get(r, "delivery_id"));
		int64_t v;

		if (id != NULL && rb_parse_int64(id, 1, INT64_MAX, &v) == 0)
			pg_arr_int(&a->id, v);
		else
			pg_arr_text(&a->id, NULL);
	}
}

static void
fa_add_dl(struct pg_fence *a, const struct rb_dl *d)
{
	pg_arr_text(&a->ev, d->event_id);
	pg_arr_text(&a->h, d->handler);
	pg_arr_int(&a->lane, d->lane);
	pg_arr_int(&a->epoch, d->epoch);
	pg_arr_int(&a->claims, d->claims);
	pg_arr_int(&a->id, d->id);
}

static void
fa_close(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
		pg_arr_end(v[i]);
}

static void
fa_free(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
		free(v[i]->s);
}

/* ---- completion at once (rb_store_complete) -------------------------------- */

static void
set_outcome(json_t *outcomes, size_t i, const json_t *r, const char *outcome)
{
	/* (built by hand: json_pack parses its format each time, and this
	 * runs once a delivery) */
	json_t *o = json_object();
	json_t *ev = json_object_get(r, "event_id"), *h = json_object_get(r, "handler");

	json_object_set_new(o, "event_id", ev != NULL ? json_incref(ev) : json_null());
	json_object_set_new(o, "handler", h != NULL ? json_incref(h) : json_null());
	json_object_set_new(o, "outcome", json_string(outcome));
	json_array_set_new(outcomes, i, o);
}

/* Does a delivery (event_id, handler) still exist? 1 yes, 0 no, -1 error */
static int
delivery_exists(struct rb_store *s, PGconn *c, const char *event_id, const char *handler,
    struct rb_error *err)
{
	char *q = pg_render("SELECT 1 WHERE @S@.relaybus_delivery_exists($1, $2)", s->schema);
	const char *params[2] = { event_id, handler };
	PGresult *res = pg_run_on(s, c, q, 2, params, PGRES_TUPLES_OK, "complete", false, err);
	int n;

	free(q);
	if (res == NULL)
		return -1;
	n = PQntuples(res) > 0;
	PQclear(res);
	return n;
}

/*
 * The outcomes of a completion statement (res: the positions of the rows
 * it deleted, 1-based in results order): completed or lost, and "missing"
 * when a lost delivery is gone.  idx: the results' places in outcomes (and
 * results), or NULL for 0..n-1.
 */
static int
complete_outcomes(struct rb_store *s, PGconn *c, const json_t *results, const size_t *idx, size_t n,
    PGresult *res, json_t *outcomes, struct rb_error *err)
{
	bool *done = xcalloc(n > 0 ? n : 1, sizeof *done);

	for (int i = 0; i < PQntuples(res); i++) {
		long ord = strtol(PQgetvalue(res, i, 0), NULL, 10);

		if (ord >= 1 && (size_t)ord <= n)
			done[ord - 1] = true;
	}
	for (size_t k = 0; k < n; k++) {
		size_t at = idx != NULL ? idx[k] : k;
		const json_t *r = json_array_get(results, at);

		set_outcome(outcomes, at, r, done[k] ? "completed" : "lost");
		if (!done[k]) {
			int ex = delivery_exists(s, c, json_string_value(json_object_get(r, "event_id")),
			    json_string_value(json_object_get(r, "handler")), err);

			if (ex < 0) {
				free(done);
				return -1;
			}
			if (!ex)
				json_object_set_new(json_array_get(outcomes, at), "missing", json_true());
		}
	}
	free(done);
	return 0;
}

/* Complete the ok results in one statement; marks completed or lost. */
static int
complete_ok(struct rb_store *s, const json_t *results, const size_t *idx, size_t n, json_t *outcomes,
    struct rb_error *err)
{
	struct pg_fence a;
	PGresult *res;
	int rc, hist = pg_history(s, pg_be(s)->conn, "complete", err);

	if (hist < 0)
		return -1;
	fa_init(&a);
	for (size_t k = 0; k < n; k++)
		fa_add(&a, json_array_get(results, idx[k]));
	fa_close(&a);
	const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };

	res = pg_run(s, hist ? pg_be(s)->q_complete_hist : pg_be(s)->q_complete, 6, params,
	    PGRES_TUPLES_OK, "complete", true, err);
	fa_free(&a);
	if (res == NULL)
		return -1;
	rc = complete_outcomes(s, pg_be(s)->conn, results, idx, n, res, outcomes, err);
	PQclear(res);
	return rc;
}

/* ---- completion in two steps (rb_store_complete_send) ---------------------- */

/* The second and third connections go with the first: closed with it,
 * and with them whatever was out on them. */
void
pg_close_conn3(struct pg_be *be)
{
	if (be->conn3 != NULL)
		PQfinish(be->conn3);
	be->conn3 = NULL;
	be->prepared3 = 0;
	if (be->complete_apart)
		pg_complete_forget(be);
	be->complete_apart = false;
}

void
pg_complete_forget(struct pg_be *be)
{
	if (be->complete_fa != NULL) {
		fa_free(be->complete_fa);
		free(be->complete_fa);
		be->complete_fa = NULL;
	}
	be->complete_v = NULL;
	be->complete_n = 0;
	be->complete_pending = false;
}

/* The connection the completion out is on. */
static PGconn *
complete_conn(const struct pg_be *be)
{
	return be->complete_apart ? be->conn3 : be->conn;
}

static int
complete_async_query(struct pg_be *be)
{
	const struct pg_fence *a = be->complete_fa;
	const char *params[6] = { a->ev.s, a->h.s, a->lane.s, a->epoch.s, a->claims.s, a->id.s };

	return pg_send(be, complete_conn(be), be->complete_hist ? be->q_complete_hist : be->q_complete, 6,
	    params);
}

/* The completion out failed (res: its error, or NULL: the connection
 * broke).  Apart, the third connection is closed when it broke, and the
 * claim on the first one is not touched. */
static int
complete_failed(struct rb_store *s, PGresult *res, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	bool apart = be->complete_apart;

	pg_complete_forget(be);
	if (!apart)
		return res != NULL ? pg_fail(s, res, "complete", err) : pg_send_failed(s, "complete", err);
	return pg_side_failed(s, be->conn3, pg_close_conn3, res, "complete", err);
}

int
pg_complete_send(struct rb_store *s, struct rb_dl *const *v, size_t n, bool apart, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	int hist;

	if (be->complete_pending || (!apart && be->claim_pending))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "complete: a statement is in progress already");
	if (apart && pg_open_side(s, &be->conn3, pg_close_conn3, NULL, "complete", err) < 0)
		return -1;
	be->complete_apart = apart;
	if ((hist = pg_history(s, complete_conn(be), "complete", err)) < 0) {
		if (apart && PQstatus(be->conn3) != CONNECTION_OK)
			pg_close_conn3(be);
		return -1;
	}
	be->complete_fa = xcalloc(1, sizeof *be->complete_fa);
	fa_init(be->complete_fa);
	for (size_t i = 0; i < n; i++)
		fa_add_dl(be->complete_fa, v[i]);
	fa_close(be->complete_fa);
	be->complete_v = v;
	be->complete_n = n;
	be->complete_hist = hist;
	be->complete_tries = 1;
	if (!complete_async_query(be))
		return complete_failed(s, NULL, err);
	be->complete_pending = true;
	return 0;
}

int
pg_complete_recv(struct rb_store *s, bool wait, unsigned char *outcome, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	if (!be->complete_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "complete: no completion in progress");
	for (;;) {
		PGresult *res;
		int got = pg_take_result(complete_conn(be), wait, &res);

		if (got == RB_CLAIM_PENDING)
			return got;
		if (got < 0)
			return complete_failed(s, NULL, err);
		be->complete_pending = false;
		if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
			/* (the positions of the rows deleted, 1-based; a delivery
			 * not deleted is lost, "missing" when it is gone) */
			size_t n = be->complete_n;

			memset(outcome, RB_DL_LOST, n);
			for (int i = 0; i < PQntuples(res); i++) {
				long ord = strtol(PQgetvalue(res, i, 0), NULL, 10);

				if (ord >= 1 && (size_t)ord <= n)
					outcome[ord - 1] = RB_DL_COMPLETED;
			}
			PQclear(res);
			for (size_t k = 0; k < n; k++) {
				int ex;

				if (outcome[k] == RB_DL_COMPLETED)
					continue;
				ex = delivery_exists(s, complete_conn(be), be->complete_v[k]->event_id,
				    be->complete_v[k]->handler, err);
				if (ex < 0) {
					pg_complete_forget(be);
					return -1;
				}
				if (!ex)
					outcome[k] = RB_DL_MISSING;
			}
			pg_complete_forget(be);
			return 0;
		}
		/* a deadlock or serialization failure: the statement runs again, as pg_run() does */
		if (pg_retryable(res) && be->complete_tries < 5) {
			PQclear(res);
			be->complete_tries++;
			if (!complete_async_query(be))
				return complete_failed(s, NULL, err);
			be->complete_pending = true;
			continue;
		}
		complete_failed(s, res, err);
		PQclear(res);
		return -1;
	}
}

int
pg_complete_socket(const struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	return be != NULL && be->complete_pending && be->complete_apart && be->conn3 != NULL ?
	    PQsocket(be->conn3) : -1;
}

/* Complete one result with the caller's SQL in the same transaction. */
static int
complete_sql(struct rb_store *s, const struct rb_complete_opts *o, const json_t *r, size_t i,
    json_t *outcomes, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	struct rb_lease l;
	char lane[16], epoch[32];
	const char *handler = json_string_value(json_object_get(r, "handler"));
	const char *lp[3] = { handler, lane, epoch };
	PGresult *res;
	char *text;
	int hist = pg_history(s, pg_be(s)->conn, "complete", err);

	if (hist < 0)
		return -1;
	rb_lease_parse(json_string_value(json_object_get(r, "lease")), &l);
	snprintf(lane, sizeof lane, "%d", l.lane);
	snprintf(epoch, sizeof epoch, "%" PRId64, l.epoch);
	if (pg_run_cmd(s, "BEGIN", "complete", err) < 0)
		return -1;
	/* KEY SHARE on the lane row: a takeover (FOR UPDATE) skips the lane
	 * until this transaction ends; the owner's claims do not wait */
	res = pg_run(s, be->q_lock_lane, 3, lp, PGRES_TUPLES_OK, "complete", false, err);
	if (res == NULL)
		goto fail;
	if (PQntuples(res) == 0) {
		PQclear(res);
		pg_rollback_quietly(s);
		set_outcome(outcomes, i, r, "lost");
		return 0;
	}
	PQclear(res);
	text = json_dumps(r, JSON_COMPACT);
	const char *sp[1] = { text };
	res = PQexecParams(be->conn, o->sql, strstr(o->sql, "$1") != NULL ? 1 : 0, NULL, sp, NULL, NULL, 0);
	free(text);
	if (res == NULL || (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)) {
		if (PQstatus(be->conn) == CONNECTION_BAD) {
			pg_fail(s, res, "complete", err);
			PQclear(res);
			return -1;
		}
		const char *m = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
		char msg[300];

		snprintf(msg, sizeof msg, "--sql failed: %s", m != NULL ? m : "unknown error");
		PQclear(res);
		pg_rollback_quietly(s);
		/* the statement failed: the handler failed, count it as an attempt */
		json_object_set_new(json_array_get(outcomes, i), "error", json_string(msg));
		return 1;
	}
	PQclear(res);
	{
		struct pg_fence a;

		fa_init(&a);
		fa_add(&a, r);
		fa_close(&a);
		const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };
		res = pg_run(s, hist ? be->q_complete_hist : be->q_complete, 6, params,
		    PGRES_TUPLES_OK, "complete", false, err);
		fa_free(&a);
	}
	if (res == NULL)
		goto fail;
	if (PQntuples(res) == 0) {
		/* fenced out: the SQL's effect must not commit either */
		PQclear(res);
		pg_rollback_quietly(s);
		set_outcome(outcomes, i, r, "lost");
		return 0;
	}
	PQclear(res);
	if (pg_run_cmd(s, "COMMIT", "complete", err) < 0)
		return -1;
	set_outcome(outcomes, i, r, "completed");
	return 0;
fail:
	pg_rollback_quietly(s);
	return -1;
}

static const char *
fail_kind(const json_t *r)
{
	if (json_is_true(json_object_get(r, "release")))
		return "release";
	if (json_is_true(json_object_get(r, "dead")))
		return "bury";
	return "retry";
}

static int
complete_fail(struct rb_store *s, const struct rb_complete_opts *o, const json_t *results,
    const size_t *idx, size_t n, json_t *outcomes, struct rb_error *err)
{
	struct pg_fence a;
	struct rb_sbuf kinds, retry, errors;
	char maxa[16], base[32], maxms[32], factor[32];
	PGresult *res;

	fa_init(&a);
	rb_sb_init(&kinds);
	rb_sb_init(&retry);
	rb_sb_init(&errors);
	pg_arr_start(&kinds);
	pg_arr_start(&retry);
	pg_arr_start(&errors);
	for (size_t k = 0; k < n; k++) {
		const json_t *r = json_array_get(results, idx[k]);
		const json_t *rm = json_object_get(r, "retry_ms");
		const json_t *e = json_object_get(r, "error");
		const json_t *oe = json_object_get(json_array_get(outcomes, idx[k]), "error");

		fa_add(&a, r);
		pg_arr_text(&kinds, fail_kind(r));
		if (json_is_integer(rm))
			pg_arr_int(&retry, json_integer_value(rm));
		else
			pg_arr_text(&retry, NULL);
		if (json_is_string(oe))
			pg_arr_text(&errors, json_string_value(oe));
		else
			pg_arr_text(&errors, json_is_string(e) ? json_string_value(e) :
			    (json_is_true(json_object_get(r, "release")) ? NULL : "handler failed"));
	}
	fa_close(&a);
	pg_arr_end(&kinds);
	pg_arr_end(&retry);
	pg_arr_end(&errors);
	snprintf(maxa, sizeof maxa, "%d", o->max_attempts);
	snprintf(base, sizeof base, "%" PRId64, o->backoff.base_ms);
	snprintf(maxms, sizeof maxms, "%" PRId64, o->backoff.max_ms);
	snprintf(factor, sizeof factor, "%g", o->backoff.factor);
	const char *params[12] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, kinds.s, retry.s,
	    errors.s, maxa, base, maxms, factor };
	res = pg_run(s, pg_be(s)->q_fail, 12, params, PGRES_TUPLES_OK, "reschedule", true, err);
	fa_free(&a);
	free(kinds.s);
	free(retry.s);
	free(errors.s);
	if (res == NULL)
		return -1;
	for (int i = 0; i < PQntuples(res) && (size_t)i < n; i++) {
		size_t k = (size_t)atoi(PQgetvalue(res, i, 0)) - 1;
		const json_t *r;
		json_t *prev_err;

		if (k >= n)
			continue;
		r = json_array_get(results, idx[k]);
		prev_err = json_incref(json_object_get(json_array_get(outcomes, idx[k]), "error"));
		set_outcome(outcomes, idx[k], r, PQgetvalue(res, i, 1));
		json_t *oc = json_array_get(outcomes, idx[k]);
		if (!PQgetisnull(res, i, 2))
			json_object_set_new(oc, "attempts", json_integer(atoi(PQgetvalue(res, i, 2))));
		if (PQgetvalue(res, i, 3)[0] == 't')
			json_object_set_new(oc, "missing", json_true());
		if (prev_err != NULL)
			json_object_set_new(oc, "error", prev_err);
	}
	PQclear(res);
	return 0;
}

int
pg_complete(struct rb_store *s, const struct rb_complete_opts *o, const json_t *results,
    json_t **outcomes_out, struct rb_error *err)
{
	size_t n = json_array_size(results), nok = 0, nfail = 0;
	size_t *ok = xcalloc(n, sizeof *ok), *fail = xcalloc(n, sizeof *fail);
	json_t *outcomes = json_array();
	int rc = -1;

	for (size_t i = 0; i < n; i++) {
		const json_t *r = json_array_get(results, i);

		json_array_append_new(outcomes, json_object());
		if (rb_result_completes(r))
			ok[nok++] = i;
		else
			fail[nfail++] = i;
	}
	if (o->sql != NULL && *o->sql != '\0') {
		/* one transaction per delivery: the caller's statement and the deletion */
		for (size_t k = 0; k < nok; k++) {
			int c = complete_sql(s, o, json_array_get(results, ok[k]), ok[k], outcomes, err);

			if (c < 0)
				goto out;
			if (c == 1) {
				/* the SQL failed: this delivery takes the failure path */
				fail[nfail++] = ok[k];
			}
		}
	} else if (nok > 0 && complete_ok(s, results, ok, nok, outcomes, err) < 0)
		goto out;
	if (nfail > 0) {
		/* keep input order for the failure function's ord */
		for (size_t a = 1; a < nfail; a++)
			for (size_t b = a; b > 0 && fail[b - 1] > fail[b]; b--) {
				size_t t = fail[b];
				fail[b] = fail[b - 1];
				fail[b - 1] = t;
			}
		if (complete_fail(s, o, results, fail, nfail, outcomes, err) < 0)
			goto out;
	}
	*outcomes_out = outcomes;
	outcomes = NULL;
	rc = 0;
out:
	json_decref(outcomes);
	free(ok);
	free(fail);
	return rc;
}
