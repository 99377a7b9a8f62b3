/* SPDX-License-Identifier: MIT */
/*
 * store_pg_complete.c: completion.  The ok results of a batch are one
 * statement (pg_tmpl_complete: a DELETE fenced by lane epoch, claim count
 * and the lane's in_flight list), run at once (rb_store_complete) or
 * without waiting (store_pg_complete_start.c, which uses the parameters
 * and outcomes made here); --sql runs the caller's statement and the
 * deletion in one transaction per delivery; failures, releases and
 * burials go to relaybus_fail in one statement.
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
 * The completion: a result with its row's address (rb_result.addr, from
 * the claim: relaybus_claim_ids' addr) is deleted there when the row at
 * that address is its delivery and passes the fence (by_addr: a TID scan
 * a result; d.id + 0, so that the primary key is not probed instead); 3.1
 * buffers a delivery where the probe below read 6.1 (bench/drain-cost).
 * Each other result with its delivery_id (a row rewritten since the
 * claim, a line rb-complete read) finds its row through the
 * primary key (event_id and handler only checked, compared under "C");
 * there in_flight is tested with @> so that it cannot become an index
 * condition (d.id = ANY (l.in_flight) made the planner read every
 * in-flight row of the lane for each result: 5.4 ms -> 1.6 ms per 200).
 * One without its delivery_id (rare: a result line written by hand)
 * through its lane's in-flight ids, the primary key again (up to 32 probes;
 * there is no index on event_id, schema_pg.sql).  Each row deleted returns
 * the position of its result.
 */
#define COMPLETE_FENCE \
    "    AND d.lane = r.lane AND d.claims = r.claims AND d.status = 'pending' " \
    "    AND l.handler = r.handler AND l.lane = r.lane AND l.epoch = r.epoch "
/* (l: each lane of the results read once, through its key, not once a
 * result: a group of 200 has some 20 lanes; 7% less time a result.
 * by_id finds its rows before it deletes them: f, each result's row
 * through the primary key (a probe a result, LATERAL and fenced with
 * OFFSET 0, so that no statistics can turn it into a scan) that passes
 * the fence; then the DELETE takes f's row addresses (a TID scan, no
 * index) and says by id which rows it deleted, f by id which result each
 * was (pg_complete_outcomes pairs them: no join of two CTEs, whose estimates
 * a generic plan may make a nested loop of, 800 x 800).  A join of the
 * deliveries with r (d.id = r.id) left the plan to the statistics: a range
 * of the primary key between the ids' min and max hashed, which in a
 * drain spread over lanes is 30 rows read for each one deleted (24,215
 * for 800, 10 of a completion's 12 ms); without the range, on a table
 * whose statistics say it is tiny, the whole primary key for each result,
 * which under a held snapshot walks every entry deleted since; and the ids
 * as a second key of the join's probe (0b91ab2) went quadratic before
 * PostgreSQL 17 (issue 43).  A row that changed in between (a takeover's
 * charge) has a new address and is not deleted, as its fence would have
 * failed.  The rows: (NULL, id) deleted by id, (ord, id) a result's row
 * found by id, (ord, NULL) deleted at its address (by_addr, below) or
 * through the lane) */
#define COMPLETE_CTE \
    "WITH r AS (SELECT * FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bigint[], $5::integer[], " \
    "  $6::bigint[], $7::tid[]) WITH ORDINALITY AS r(event_id, handler, lane, epoch, claims, id, addr, ord)), " \
    "l AS MATERIALIZED (SELECT x.handler, x.lane, x.epoch, x.in_flight FROM (SELECT DISTINCT handler, lane FROM r) u " \
    "  CROSS JOIN LATERAL (SELECT * FROM @S@.relaybus_lanes y " \
    "    WHERE y.handler = u.handler AND y.lane = u.lane OFFSET 0) x), " \
    "by_addr AS (DELETE FROM @S@.relaybus_deliveries d USING r, l " \
    "  WHERE r.addr IS NOT NULL AND d.ctid = r.addr AND d.id + 0 = r.id " \
    "    AND d.event_id = r.event_id COLLATE \"C\" AND d.handler = r.handler COLLATE \"C\" " COMPLETE_FENCE \
    "    AND l.in_flight @> ARRAY[d.id] " \
    "  RETURNING r.ord, NULL::bigint AS id, d.event_id, d.handler, d.attempts), " \
    "f AS MATERIALIZED (SELECT r.ord, d.t, d.id FROM r " \
    "  CROSS JOIN LATERAL (SELECT dd.ctid AS t, dd.id FROM @S@.relaybus_deliveries dd " \
    "    WHERE dd.id = r.id AND dd.event_id = r.event_id COLLATE \"C\" AND dd.handler = r.handler COLLATE \"C\" " \
    "      AND dd.lane = r.lane AND dd.claims = r.claims AND dd.status = 'pending' OFFSET 0) d " \
    "  JOIN l ON l.handler = r.handler AND l.lane = r.lane AND l.epoch = r.epoch AND l.in_flight @> ARRAY[d.id] " \
    "  WHERE r.ord NOT IN (SELECT b.ord FROM by_addr b)), " \
    "by_id AS (DELETE FROM @S@.relaybus_deliveries d " \
    "  WHERE d.ctid = ANY (ARRAY(SELECT f.t FROM f)) AND d.status = 'pending' " \
    "  RETURNING NULL::bigint AS ord, d.id, d.event_id, d.handler, d.attempts), " \
    "by_key AS (DELETE FROM @S@.relaybus_deliveries d USING r, l " \
    "  WHERE r.id IS NULL AND d.id = ANY (l.in_flight) AND d.event_id = r.event_id " \
    "    AND d.handler = r.handler " COMPLETE_FENCE \
    "  RETURNING r.ord, NULL::bigint AS id, d.event_id, d.handler, d.attempts), " \
    "del AS (SELECT * FROM by_addr UNION ALL SELECT * FROM by_id UNION ALL SELECT * FROM by_key) "
const char pg_tmpl_complete[] = COMPLETE_CTE "SELECT ord, id FROM del UNION ALL SELECT ord, id FROM f";
const char pg_tmpl_complete_hist[] = COMPLETE_CTE
    ", hist AS (INSERT INTO @S@.relaybus_completions (event_id, handler, attempts) "
    "  SELECT event_id, handler, attempts + 1 FROM del) "
    "SELECT ord, id FROM del UNION ALL SELECT ord, id FROM f";
const char pg_tmpl_fail[] =
    "SELECT ord, outcome, attempts, missing FROM @S@.relaybus_fail($1::text[], $2::text[], "
    "$3::smallint[], $4::bigint[], $5::integer[], $6::text[], $7::bigint[], $8::text[], "
    "$9::integer, $10::bigint, $11::bigint, $12::double precision, $13::bigint[]) ORDER BY ord";
/* (--sql: the lane row locked for the caller's transaction) */
const char pg_tmpl_lock_lane[] =
    "SELECT 1 FROM @S@.relaybus_lanes WHERE handler = $1 AND lane = $2::smallint AND epoch = $3::bigint "
    "FOR KEY SHARE";

/* (the same for a worker role, store_pg_claim.c: relaybus_complete_batch
 * writes the history rows itself when the schema keeps them) */
const char pg_tmpl_w_complete[] =
    "SELECT ord, id FROM @S@.relaybus_complete_batch($1::text[], $2::text[], $3::smallint[], $4::bigint[], "
    "$5::integer[], $6::bigint[], $7::tid[])";
const char pg_tmpl_w_fail[] =
    "SELECT ord, outcome, attempts, missing FROM @S@.relaybus_worker_fail($1::text[], $2::text[], "
    "$3::smallint[], $4::bigint[], $5::integer[], $6::text[], $7::bigint[], $8::text[], "
    "$9::integer, $10::bigint, $11::bigint, $12::double precision, $13::bigint[]) ORDER BY ord";
const char pg_tmpl_w_lock_lane[] = "SELECT 1 WHERE @S@.relaybus_lock_lane($1, $2::smallint, $3::bigint)";

/* ---- the fence arrays ------------------------------------------------------ */



/* (every array has one element per result, in the results' order) */
#define FENCE_ARRAYS(a)	{ &(a)->ev, &(a)->h, &(a)->lane, &(a)->epoch, &(a)->claims, &(a)->id, &(a)->addr }

void
pg_fence_init(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		rb_sb_init(v[i]);
		pg_arr_start(v[i]);
	}
}

void
pg_fence_add(struct pg_fence *a, const struct rb_result *r)
{
	pg_arr_text(&a->ev, r->event_id);
	pg_arr_text(&a->h, r->handler);
	pg_arr_int(&a->lane, r->lease.lane);
	pg_arr_int(&a->epoch, r->lease.epoch);
	pg_arr_int(&a->claims, r->lease.claims);
	if (r->delivery_id > 0)
		pg_arr_int(&a->id, r->delivery_id);
	else
		pg_arr_text(&a->id, NULL);
	pg_arr_addr(&a->addr, r->delivery_id > 0 ? r->addr : 0);
}

void
pg_fence_close(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
		pg_arr_end(v[i]);
}

void
pg_fence_free(struct pg_fence *a)
{
	struct rb_sbuf *v[] = FENCE_ARRAYS(a);

	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
		free(v[i]->s);
}

/* ---- relaybus_fail's parameters ---------------------------------------------- */



static const char *
fail_kind(const struct rb_result *r)
{
	return r->verdict == RB_VERDICT_RELEASE ? "release" : r->verdict == RB_VERDICT_DEAD ? "bury" :
	    r->keep && r->verdict == RB_VERDICT_FAIL ? "again" : "retry";
}

/* f: the parameters of relaybus_fail for the n results of v at idx */
void
pg_fail_args_init(struct pg_fail_args *f, const struct rb_complete_opts *o, const struct rb_result *v,
    const size_t *idx, size_t n)
{
	pg_fence_init(&f->a);
	rb_sb_init(&f->kinds);
	rb_sb_init(&f->retry);
	rb_sb_init(&f->errors);
	pg_arr_start(&f->kinds);
	pg_arr_start(&f->retry);
	pg_arr_start(&f->errors);
	for (size_t k = 0; k < n; k++) {
		const struct rb_result *r = &v[idx[k]];

		pg_fence_add(&f->a, r);
		pg_arr_text(&f->kinds, fail_kind(r));
		if (r->retry_ms >= 0)
			pg_arr_int(&f->retry, r->retry_ms);
		else
			pg_arr_text(&f->retry, NULL);
		pg_arr_text(&f->errors, r->sql_error != NULL ? r->sql_error : r->error != NULL ? r->error :
		    r->verdict == RB_VERDICT_RELEASE ? NULL : "handler failed");
	}
	pg_fence_close(&f->a);
	pg_arr_end(&f->kinds);
	pg_arr_end(&f->retry);
	pg_arr_end(&f->errors);
	snprintf(f->maxa, sizeof f->maxa, "%d", o->max_attempts);
	snprintf(f->base, sizeof f->base, "%" PRId64, o->backoff.base_ms);
	snprintf(f->maxms, sizeof f->maxms, "%" PRId64, o->backoff.max_ms);
	snprintf(f->factor, sizeof f->factor, "%g", o->backoff.factor);
}

void
pg_fail_args_free(struct pg_fail_args *f)
{
	pg_fence_free(&f->a);
	free(f->kinds.s);
	free(f->retry.s);
	free(f->errors.s);
}

/* ---- completion at once (rb_store_complete) -------------------------------- */

/*
 * Is the delivery of r (event_id, handler) still there (*exists), and is
 * its lane still at the lease's epoch (*held)?  0, or -1 on error.  A
 * delivery gone while its lease still holds was deleted under that lease,
 * and only the handler (relaybus_complete in its own transaction, which
 * committed: its answer may never have arrived) or an earlier result for
 * the same delivery does that; a takeover moves the epoch on first.
 */
static int
delivery_state(struct rb_store *s, PGconn *c, const struct rb_result *r, bool *exists, bool *held,
    struct rb_error *err)
{
	/* (a worker role reads neither table: its SECURITY DEFINER door) */
	char *q = pg_render(pg_be(s)->worker ?
	    "SELECT * FROM @S@.relaybus_delivery_state($1, $2, $3::smallint, $4::bigint, $5::bigint)" :
	    "SELECT @S@.relaybus_delivery_there($1, $2, $5::bigint), "
	    "EXISTS (SELECT 1 FROM @S@.relaybus_lanes WHERE handler = $2 AND lane = $3::smallint AND epoch = $4::bigint)",
	    s->schema);
	char lane[16], epoch[32], id[32];
	const char *params[5] = { r->event_id, r->handler, lane, epoch, r->delivery_id > 0 ? id : NULL };
	PGresult *res;

	lane[rb_fmt_int(lane, r->lease.lane)] = '\0';
	epoch[rb_fmt_int(epoch, r->lease.epoch)] = '\0';
	id[rb_fmt_int(id, r->delivery_id)] = '\0';
	res = pg_run_on(s, c, q, 5, params, PGRES_TUPLES_OK, "complete", false, err);
	free(q);
	if (res == NULL)
		return -1;
	*exists = PQgetvalue(res, 0, 0)[0] == 't';
	*held = PQgetvalue(res, 0, 1)[0] == 't';
	PQclear(res);
	return 0;
}

/*
 * r came back lost: missing when its delivery is gone, or, for a failure or
 * release (the handler crashed, or failed past its commit), completed by
 * the handler when it is gone while the lease still holds.  (Not for a
 * success: relaybus itself may have completed it already, a result given
 * twice or a completion sent again after a reconnect; such a handler says
 * "completed": true.)
 */
static int
lost_gone(struct rb_store *s, PGconn *c, struct rb_result *r, struct rb_error *err)
{
	bool ex, held;

	if (delivery_state(s, c, r, &ex, &held, err) < 0)
		return -1;
	if (!ex && held && r->verdict != RB_VERDICT_OK) {
		r->outcome = RB_OUTCOME_COMPLETED;
		r->by_handler = true;
		r->missing = false;
	} else
		r->missing = !ex;
	return 0;
}

/* a row pg_tmpl_complete deleted by id, and the first result (by its
 * position: 1-based, 0 none) that found it */
struct deleted_id {
	long long	 id;
	long		 ord;
};

static int
deleted_cmp(const void *a, const void *b)
{
	long long x = ((const struct deleted_id *)a)->id, y = ((const struct deleted_id *)b)->id;

	return (x > y) - (x < y);
}

/*
 * The outcomes of a completion statement (res: the positions of the rows
 * it deleted, 1-based in the order of idx; or pg_tmpl_complete's pairs,
 * above): completed or lost, and
 * missing when a lost delivery is gone.  idx: the results' places in v,
 * or NULL for 0..n-1.
 */
int
pg_complete_outcomes(struct rb_store *s, PGconn *c, struct rb_result *v, const size_t *idx, size_t n,
    PGresult *res, struct rb_error *err)
{
	int rows = PQntuples(res);
	size_t nd = 0;
	struct deleted_id *deleted = NULL;

	for (size_t k = 0; k < n; k++)
		v[idx != NULL ? idx[k] : k].outcome = RB_OUTCOME_LOST;
	/* (two columns, pg_tmpl_complete's: the ids it deleted, then each
	 * result's by its id, one result a row deleted) */
	if (PQnfields(res) >= 2) {
		deleted = xcalloc((size_t)rows + 1, sizeof *deleted);
		for (int i = 0; i < rows; i++)
			if (PQgetisnull(res, i, 0) && !PQgetisnull(res, i, 1))
				deleted[nd++].id = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		qsort(deleted, nd, sizeof *deleted, deleted_cmp);
	}
	/* (a row deleted by id goes to the first of the results that found
	 * it, whatever the order of the statement's rows: the same delivery's
	 * result twice in a batch completes the first, the second is lost) */
	for (int i = 0; i < rows; i++) {
		if (PQgetisnull(res, i, 0))
			continue;
		long ord = strtol(PQgetvalue(res, i, 0), NULL, 10);

		if (ord < 1 || (size_t)ord > n)
			continue;
		if (deleted != NULL && !PQgetisnull(res, i, 1)) {
			struct deleted_id key = { .id = strtoll(PQgetvalue(res, i, 1), NULL, 10) };
			struct deleted_id *hit = bsearch(&key, deleted, nd, sizeof *deleted, deleted_cmp);

			if (hit != NULL && (hit->ord == 0 || ord < hit->ord))
				hit->ord = ord;
			continue;
		}
		v[idx != NULL ? idx[ord - 1] : (size_t)ord - 1].outcome = RB_OUTCOME_COMPLETED;
	}
	for (size_t k = 0; k < nd; k++)
		if (deleted[k].ord > 0)
			v[idx != NULL ? idx[deleted[k].ord - 1] : (size_t)deleted[k].ord - 1].outcome = RB_OUTCOME_COMPLETED;
	free(deleted);
	for (size_t k = 0; k < n; k++) {
		struct rb_result *r = &v[idx != NULL ? idx[k] : k];

		if (r->outcome != RB_OUTCOME_COMPLETED && lost_gone(s, c, r, err) < 0)
			return -1;
	}
	return 0;
}

/*
 * The outcomes of relaybus_fail (res) for the n results of v at idx:
 * rescheduled (kept: in flight, to run again), buried, released or lost,
 * with their attempts; one whose delivery is gone under its still-held
 * lease was completed by the handler (it completed it and then crashed,
 * or answered late).
 */
int
pg_fail_outcomes(struct rb_store *s, PGconn *c, struct rb_result *v, const size_t *idx, size_t n,
    PGresult *res, struct rb_error *err)
{
	for (int i = 0; i < PQntuples(res) && (size_t)i < n; i++) {
		size_t k = (size_t)atoi(PQgetvalue(res, i, 0)) - 1;
		struct rb_result *r;

		if (k >= n)
			continue;
		r = &v[idx[k]];
		/* (again: rescheduled, kept in flight; relaybus_fail) */
		r->kept = strcmp(PQgetvalue(res, i, 1), "again") == 0;
		r->outcome = r->kept ? RB_OUTCOME_RESCHEDULED : rb_outcome_of(PQgetvalue(res, i, 1));
		if (!PQgetisnull(res, i, 2))
			r->attempts = atoi(PQgetvalue(res, i, 2));
		r->missing = PQgetvalue(res, i, 3)[0] == 't';
	}
	for (size_t k = 0; k < n; k++)
		if (v[idx[k]].missing && lost_gone(s, c, &v[idx[k]], err) < 0)
			return -1;
	return 0;
}

/* Complete the ok results in one statement; marks completed or lost. */
static int
complete_ok(struct rb_store *s, struct rb_result *v, const size_t *idx, size_t n, struct rb_error *err)
{
	struct pg_fence a;
	PGresult *res;
	int rc, hist = pg_history(s, pg_be(s)->conn, "complete", err);

	if (hist < 0)
		return -1;
	pg_fence_init(&a);
	for (size_t k = 0; k < n; k++)
		pg_fence_add(&a, &v[idx[k]]);
	pg_fence_close(&a);
	const char *params[COMPLETE_NPARAMS] = COMPLETE_PARAMS(a);

	res = pg_run(s, hist ? pg_be(s)->q_complete_hist : pg_be(s)->q_complete, COMPLETE_NPARAMS, params,
	    PGRES_TUPLES_OK, "complete", true, err);
	pg_fence_free(&a);
	if (res == NULL)
		return -1;
	rc = pg_complete_outcomes(s, pg_be(s)->conn, v, idx, n, res, err);
	PQclear(res);
	return rc;
}

/* The answer of a statement that fences r (res, cleared here): 1 it
 * matched a row; 0 none (rolled back, r lost); -1 it failed (rolled back). */
static int
fenced(struct rb_store *s, PGresult *res, struct rb_result *r)
{
	int n;

	if (res == NULL) {
		pg_rollback_quietly(s);
		return -1;
	}
	n = PQntuples(res);
	/* (pg_tmpl_complete's pairs: the rows it deleted, by id or by lane) */
	if (PQnfields(res) >= 2) {
		int rows = n;

		n = 0;
		for (int i = 0; i < rows; i++)
			n += PQgetisnull(res, i, 0) || PQgetisnull(res, i, 1);
	}
	PQclear(res);
	if (n == 0) {
		pg_rollback_quietly(s);
		r->outcome = RB_OUTCOME_LOST;
	}
	return n > 0;
}

#define PINNED_PATH	"pg_catalog, pg_temp"

/* Set search_path to path for the rest of this transaction (NULL: leave
 * it): 0, or -1 + err (the transaction rolled back).  The statement names
 * pg_catalog's function, so it means the same under any path. */
static int
sql_path(struct rb_store *s, const char *path, struct rb_error *err)
{
	const char *p[1] = { path };
	PGresult *res;

	if (path == NULL)
		return 0;
	res = pg_run(s, "SELECT pg_catalog.set_config('search_path', $1::pg_catalog.text, true)", 1, p,
	    PGRES_TUPLES_OK, "complete", false, err);
	if (res == NULL) {
		pg_rollback_quietly(s);
		return -1;
	}
	PQclear(res);
	return 0;
}

/* Complete one result with the caller's SQL in the same transaction: 0
 * (its outcome set), 1 (the SQL failed: r->sql_error set, it takes the
 * failure path) or -1. */
static int
complete_sql(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *r,
    struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	char lane[16], epoch[32];
	const char *lp[3] = { r->handler, lane, epoch };
	PGresult *res;
	int rc, hist = pg_history(s, pg_be(s)->conn, "complete", err);

	if (hist < 0)
		return -1;
	lane[rb_fmt_int(lane, r->lease.lane)] = '\0';
	epoch[rb_fmt_int(epoch, r->lease.epoch)] = '\0';
	if (pg_run_cmd(s, "BEGIN", "complete", err) < 0)
		return -1;
	/* KEY SHARE on the lane row: a takeover (FOR UPDATE) skips the lane
	 * until this transaction ends; the owner's claims do not wait */
	res = pg_run(s, be->q_lock_lane, 3, lp, PGRES_TUPLES_OK, "complete", false, err);
	if ((rc = fenced(s, res, r)) <= 0)
		return rc;
	/* the caller's statement resolves its names as the session would
	 * have (pg_connect_to pinned relaybus's own to pg_catalog) */
	if (sql_path(s, be->user_path, err) < 0)
		return -1;
	const char *sp[1] = { r->json };
	res = PQexecParams(be->conn, o->sql, strstr(o->sql, "$1") != NULL ? 1 : 0, NULL, sp, NULL, NULL, 0);
	if (res == NULL || (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)) {
		if (PQstatus(be->conn) == CONNECTION_BAD) {
			pg_fail(s, res, "complete", err);
			PQclear(res);
			return -1;
		}
		const char *m = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;

		r->sql_error = xasprintf("--sql failed: %.285s", m != NULL ? m : "unknown error");
		PQclear(res);
		pg_rollback_quietly(s);
		/* the statement failed: the handler failed, count it as an attempt */
		return 1;
	}
	PQclear(res);
	if (sql_path(s, be->user_path != NULL ? PINNED_PATH : NULL, err) < 0)
		return -1;
	{
		struct pg_fence a;

		pg_fence_init(&a);
		pg_fence_add(&a, r);
		pg_fence_close(&a);
		const char *params[COMPLETE_NPARAMS] = COMPLETE_PARAMS(a);
		res = pg_run(s, hist ? be->q_complete_hist : be->q_complete, COMPLETE_NPARAMS, params,
		    PGRES_TUPLES_OK, "complete", false, err);
		pg_fence_free(&a);
	}
	/* fenced out: the SQL's effect must not commit either */
	if ((rc = fenced(s, res, r)) <= 0)
		return rc;
	if (pg_run_cmd(s, "COMMIT", "complete", err) < 0)
		return -1;
	r->outcome = RB_OUTCOME_COMPLETED;
	return 0;
}

static int
complete_fail(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v,
    const size_t *idx, size_t n, struct rb_error *err)
{
	struct pg_fail_args f;
	PGresult *res;
	int rc;

	pg_fail_args_init(&f, o, v, idx, n);
	const char *params[FAIL_NPARAMS] = FAIL_PARAMS(f);

	res = pg_run(s, pg_be(s)->q_fail, FAIL_NPARAMS, params, PGRES_TUPLES_OK, "reschedule", true, err);
	pg_fail_args_free(&f);
	if (res == NULL)
		return -1;
	rc = pg_fail_outcomes(s, pg_be(s)->conn, v, idx, n, res, err);
	PQclear(res);
	return rc;
}

/* ---- completed by the handler (RB_VERDICT_DONE) ------------------------------ */

/* For each result: does its delivery exist, and is it still pending under
 * the result's lease (the completion's fence)? */
static const char tmpl_done[] =
    "SELECT r.ord, @S@.relaybus_delivery_there(r.event_id, r.handler, r.id), x.live IS NOT NULL "
    "FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bigint[], $5::integer[], $6::bigint[]) "
    "  WITH ORDINALITY AS r(event_id, handler, lane, epoch, claims, id, ord) "
    "LEFT JOIN LATERAL (SELECT true AS live FROM @S@.relaybus_lanes l JOIN @S@.relaybus_deliveries d "
    "    ON d.id = ANY (l.in_flight) AND d.handler = l.handler AND d.lane = l.lane "
    "    WHERE l.handler = r.handler AND l.lane = r.lane AND l.epoch = r.epoch "
    "    AND (r.id IS NULL OR d.id = r.id) AND d.event_id = r.event_id "
    "    AND d.claims = r.claims AND d.status = 'pending' LIMIT 1) x ON true "
    "ORDER BY r.ord";
static const char tmpl_w_done[] =
    "SELECT * FROM @S@.relaybus_worker_done($1::text[], $2::text[], $3::smallint[], $4::bigint[], $5::integer[], "
    "$6::bigint[])";

static const char pg_done_not_committed[] =
    "\"completed\": true, but the delivery is still pending under this lease (the handler's "
    "transaction did not commit, or did not call relaybus_complete)";

/*
 * The results the handler says it completed, checked in one statement:
 * gone: completed (by the handler), nothing written; still pending under
 * the lease: the handler's transaction did not commit, so the result takes
 * the failure path (*fail, *nfail) and runs again; there under another
 * lease: lost.
 */
static int
complete_done(struct rb_store *s, struct rb_result *v, const size_t *idx, size_t n, size_t *fail,
    size_t *nfail, struct rb_error *err)
{
	struct pg_fence a;
	PGresult *res;
	char *q = pg_render(pg_be(s)->worker ? tmpl_w_done : tmpl_done, s->schema);

	pg_fence_init(&a);
	for (size_t k = 0; k < n; k++)
		pg_fence_add(&a, &v[idx[k]]);
	pg_fence_close(&a);
	const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };

	res = pg_run(s, q, 6, params, PGRES_TUPLES_OK, "complete", true, err);
	pg_fence_free(&a);
	free(q);
	if (res == NULL)
		return -1;
	for (int i = 0; i < PQntuples(res); i++) {
		size_t k = (size_t)atol(PQgetvalue(res, i, 0)) - 1;
		struct rb_result *r;

		if (k >= n)
			continue;
		r = &v[idx[k]];
		if (PQgetvalue(res, i, 1)[0] != 't') {
			r->outcome = RB_OUTCOME_COMPLETED;
			r->by_handler = true;
		} else if (PQgetvalue(res, i, 2)[0] == 't') {
			r->error = pg_done_not_committed;
			fail[(*nfail)++] = idx[k];
		} else
			r->outcome = RB_OUTCOME_LOST;
	}
	PQclear(res);
	return 0;
}

/* ---- still in flight (rb_store_in_flight): the same fence, read only --------- */

/* By the deliveries' ids (their primary key), when every result has one: a
 * probe each, fenced (LATERAL ... OFFSET 0) so that it stays a probe.  The
 * EXISTS of tmpl_done became two hashed subplans, a scan of the whole
 * deliveries table each: 19 ms to look at 500 lines of a backlog of
 * 20,000, 1.2 ms this way (rb-claim --follow looks at every line it wrote,
 * once, bench/README.md). */
static const char tmpl_in_flight[] =
    "SELECT r.ord, true, x.live IS NOT NULL "
    "FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bigint[], $5::integer[], $6::bigint[]) "
    "  WITH ORDINALITY AS r(event_id, handler, lane, epoch, claims, id, ord) "
    "LEFT JOIN LATERAL (SELECT true AS live FROM @S@.relaybus_deliveries d JOIN @S@.relaybus_lanes l "
    "    ON l.handler = d.handler AND l.lane = d.lane "
    "    WHERE d.id = r.id AND d.handler = r.handler AND d.lane = r.lane AND d.claims = r.claims "
    "    AND d.status = 'pending' AND l.epoch = r.epoch AND l.in_flight @> ARRAY[d.id] OFFSET 0) x ON true "
    "ORDER BY r.ord";

int
pg_in_flight(struct rb_store *s, const struct rb_result *v, size_t n, bool *live, struct rb_error *err)
{
	struct pg_fence a;
	PGresult *res;
	bool by_id = !pg_be(s)->worker;
	char *q;

	for (size_t i = 0; i < n && by_id; i++)
		by_id = v[i].delivery_id > 0;
	q = pg_render(pg_be(s)->worker ? tmpl_w_done : by_id ? tmpl_in_flight : tmpl_done, s->schema);
	pg_fence_init(&a);
	for (size_t i = 0; i < n; i++)
		pg_fence_add(&a, &v[i]);
	pg_fence_close(&a);
	const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };

	res = pg_run(s, q, 6, params, PGRES_TUPLES_OK, "in flight", true, err);
	pg_fence_free(&a);
	free(q);
	if (res == NULL)
		return -1;
	for (int i = 0; i < PQntuples(res); i++) {
		size_t k = (size_t)atol(PQgetvalue(res, i, 0)) - 1;

		if (k < n)
			live[k] = PQgetvalue(res, i, 2)[0] == 't';
	}
	PQclear(res);
	return 0;
}

void
pg_result_reset(struct rb_result *r)
{
	r->outcome = RB_OUTCOME_LOST;
	r->missing = false;
	r->by_handler = false;
	r->attempts = -1;
	r->sql_error = NULL;
}

int
pg_complete(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    struct rb_error *err)
{
	size_t nok = 0, nfail = 0, ndone = 0;
	size_t *ok = xcalloc(n > 0 ? n : 1, sizeof *ok), *fail = xcalloc(n > 0 ? n : 1, sizeof *fail);
	size_t *done = xcalloc(n > 0 ? n : 1, sizeof *done);
	int rc = -1;

	for (size_t i = 0; i < n; i++) {
		pg_result_reset(&v[i]);
		if (v[i].verdict == RB_VERDICT_OK)
			ok[nok++] = i;
		else if (v[i].verdict == RB_VERDICT_DONE)
			done[ndone++] = i;
		else
			fail[nfail++] = i;
	}
	if (o->sql != NULL && *o->sql != '\0') {
		/* one transaction per delivery: the caller's statement and the deletion */
		for (size_t k = 0; k < nok; k++) {
			int c = complete_sql(s, o, &v[ok[k]], err);

			if (c < 0)
				goto out;
			if (c == 1) {
				/* the SQL failed: this delivery takes the failure path */
				fail[nfail++] = ok[k];
			}
		}
	} else if (nok > 0 && complete_ok(s, v, ok, nok, err) < 0)
		goto out;
	/* (never with --sql: the handler did its own work) */
	if (ndone > 0 && complete_done(s, v, done, ndone, fail, &nfail, err) < 0)
		goto out;
	if (nfail > 0) {
		/* keep input order for the failure function's ord */
		for (size_t a = 1; a < nfail; a++)
			for (size_t b = a; b > 0 && fail[b - 1] > fail[b]; b--) {
				size_t t = fail[b];
				fail[b] = fail[b - 1];
				fail[b - 1] = t;
			}
		if (complete_fail(s, o, v, fail, nfail, err) < 0)
			goto out;
	}
	rc = 0;
out:
	if (rc < 0)
		for (size_t i = 0; i < n; i++) {
			free(v[i].sql_error);
			v[i].sql_error = NULL;
		}
	free(ok);
	free(fail);
	free(done);
	return rc;
}
