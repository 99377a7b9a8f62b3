/* SPDX-License-Identifier: MIT */
/*
 * store_pg_complete_start.c: completion without waiting
 * (rb_store_complete_start).  Successes go in one statement on the first
 * connection, or with RELAYBUS_PG_CONNECTIONS 3 on the third, beside the
 * claims; failures (releases, burials) after them in one relaybus_fail,
 * on the first connection only; each answer is taken by the store's
 * service.  What cannot wait (--sql, the handlers' own completions,
 * failures with three connections) is applied at once by pg_complete
 * (store_pg_complete.c), whose parameters and outcomes this file uses.
 */
#include "config.h"

#include <stdlib.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

void
pg_close_conn3(struct pg_be *be)
{
	if (be->conn3 != NULL)
		PQfinish(be->conn3);
	be->conn3 = NULL;
	be->prepared3 = 0;
	if (be->job3 == PG_COMPLETE)
		pg_complete_forget(be);
}

void
pg_complete_forget(struct pg_be *be)
{
	if (be->complete_fa != NULL) {
		pg_fence_free(be->complete_fa);
		free(be->complete_fa);
		be->complete_fa = NULL;
	}
	if (be->complete_ff != NULL) {
		pg_fail_args_free(be->complete_ff);
		free(be->complete_ff);
		be->complete_ff = NULL;
	}
	free(be->complete_ok_at);
	free(be->complete_fail_at);
	be->complete_ok_at = be->complete_fail_at = NULL;
	be->complete_nok = be->complete_nfail = 0;
	be->complete_failing = false;
	be->complete_v = NULL;
	be->complete_n = 0;
	if (be->job == PG_COMPLETE)
		be->job = PG_IDLE;
	be->job3 = PG_IDLE;
}

/* The connection the completion out is on. */
static PGconn *
complete_conn(const struct pg_be *be)
{
	return be->job3 == PG_COMPLETE ? be->conn3 : be->conn;
}

/* Send the part of the completion out that is next: the successes'
 * deletion, or the failures' relaybus_fail. */
static int
complete_send(struct pg_be *be, PGconn *c)
{
	if (be->complete_failing) {
		const struct pg_fail_args *f = be->complete_ff;
		const char *params[FAIL_NPARAMS] = FAIL_PARAMS(*f);

		return pg_send(be, c, be->q_fail, FAIL_NPARAMS, params);
	}
	const struct pg_fence *a = be->complete_fa;
	const char *params[COMPLETE_NPARAMS] = COMPLETE_PARAMS(*a);

	return pg_send(be, c, be->complete_hist ? be->q_complete_hist : be->q_complete, COMPLETE_NPARAMS, params);
}

/* The failures' part is next (its parameters made at the start). */
static void
complete_failures_next(struct pg_be *be)
{
	if (be->complete_fa != NULL) {
		pg_fence_free(be->complete_fa);
		free(be->complete_fa);
		be->complete_fa = NULL;
	}
	be->complete_failing = true;
	be->complete_tries = 1;
}

bool
pg_complete_ready(const struct rb_store *s)
{
	const struct pg_be *be = pg_be(s);

	/* (with three connections the successes go on the third, beside the
	 * claims; anything else then waits for the first, as without) */
	return pg_connections(s) == 3 ? be->job3 == PG_IDLE : be->job == PG_IDLE;
}

/*
 * Without waiting: successes, then failures (releases, burials), each
 * part one statement, its answer taken by service.  Failures go only on
 * the first connection, never beside a claim: a claim out meanwhile was
 * told the failed delivery still runs (its live ids), and would write it
 * back into its lane's in_flight after relaybus_fail took it out, where a
 * takeover would charge it an attempt it never had.  So with three
 * connections, a completion with failures is applied at once (after the
 * claim out), as are --sql's (a transaction a delivery), the handlers'
 * own completions (RB_VERDICT_DONE, each asked about) and one waited for.
 */
int
pg_complete_start(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    bool wait, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	bool later = !wait && n > 0 && (o->sql == NULL || *o->sql == '\0');
	bool apart = pg_connections(s) == 3;
	size_t nok = 0, nfail = 0;
	PGconn *c;
	int hist = 0;

	for (size_t i = 0; i < n && later; i++)
		if (v[i].verdict == RB_VERDICT_DONE)
			later = false;
		else if (v[i].verdict == RB_VERDICT_OK)
			nok++;
		else
			nfail++;
	if (!later || (apart && nfail > 0)) {
		/* at once on the first connection, reported at the next service */
		pg_settle(s);
		if (pg_complete(s, o, v, n, err) < 0)
			return -1;
		rb_evq_push(&s->evq, &(struct rb_store_event){ .kind = RB_STORE_COMPLETED, .results = v,
		    .nresults = n });
		return 0;
	}
	if (!pg_complete_ready(s))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "complete: a statement is out already");
	if (apart && pg_open_side(s, &be->conn3, pg_close_conn3, NULL, "complete", err) < 0)
		return -1;
	c = apart ? be->conn3 : be->conn;
	if (nok > 0 && (hist = pg_history(s, c, "complete", err)) < 0) {
		if (apart && PQstatus(be->conn3) != CONNECTION_OK)
			pg_close_conn3(be);
		return -1;
	}
	be->complete_ok_at = xcalloc(nok > 0 ? nok : 1, sizeof *be->complete_ok_at);
	be->complete_fail_at = xcalloc(nfail > 0 ? nfail : 1, sizeof *be->complete_fail_at);
	for (size_t i = 0; i < n; i++) {
		pg_result_reset(&v[i]);
		if (v[i].verdict == RB_VERDICT_OK)
			be->complete_ok_at[be->complete_nok++] = i;
		else
			be->complete_fail_at[be->complete_nfail++] = i;
	}
	be->complete_v = v;
	be->complete_n = n;
	be->complete_hist = hist;
	be->complete_tries = 1;
	if (nfail > 0) {
		be->complete_ff = xcalloc(1, sizeof *be->complete_ff);
		pg_fail_args_init(be->complete_ff, o, v, be->complete_fail_at, nfail);
	}
	if (nok > 0) {
		be->complete_fa = xcalloc(1, sizeof *be->complete_fa);
		pg_fence_init(be->complete_fa);
		for (size_t k = 0; k < nok; k++)
			pg_fence_add(be->complete_fa, &v[be->complete_ok_at[k]]);
		pg_fence_close(be->complete_fa);
	} else
		complete_failures_next(be);
	if (!complete_send(be, c)) {
		pg_complete_forget(be);
		if (!apart)
			return pg_fail(s, NULL, "complete", err);
		return pg_side_failed(s, be->conn3, pg_close_conn3, NULL, "complete", err);
	}
	if (apart)
		be->job3 = PG_COMPLETE;
	else
		be->job = PG_COMPLETE;
	return 0;
}

/* The completion out failed (res: its error, or NULL: the connection
 * broke): reported, and the third connection closed if it broke. */
static void
complete_failed(struct rb_store *s, const PGresult *res)
{
	struct pg_be *be = pg_be(s);
	struct rb_error err = { 0 };
	PGconn *c = complete_conn(be);
	bool apart = be->job3 == PG_COMPLETE;

	pg_fail_on(s, c, res, "complete", &err);
	pg_complete_forget(be);
	if (apart && be->conn3 != NULL && PQstatus(be->conn3) != CONNECTION_OK)
		pg_close_conn3(be);
	rb_evq_failed(&s->evq, RB_STORE_COMPLETED, 0, &err);
}

bool
pg_complete_answer(struct rb_store *s, bool wait)
{
	struct pg_be *be = pg_be(s);

	for (;;) {
		PGconn *c = complete_conn(be);
		PGresult *res;
		struct rb_error err = { 0 };
		int got = pg_take_result(c, wait, &res);

		if (got == PG_PENDING)
			return false;
		if (got < 0) {
			complete_failed(s, NULL);
			return true;
		}
		if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
			struct rb_result *v = be->complete_v;
			size_t n = be->complete_n;
			int rc;

			/* (the positions of the rows deleted; one not deleted is
			 * lost, missing when it is gone: asked on the same
			 * connection; and then the failures, if any) */
			if (be->complete_failing)
				rc = pg_fail_outcomes(s, c, v, be->complete_fail_at, be->complete_nfail, res, &err);
			else
				rc = pg_complete_outcomes(s, c, v, be->complete_ok_at, be->complete_nok, res, &err);
			PQclear(res);
			if (rc == 0 && !be->complete_failing && be->complete_nfail > 0) {
				complete_failures_next(be);
				if (!complete_send(be, c)) {
					complete_failed(s, NULL);
					return true;
				}
				if (!wait)
					return false;
				continue;
			}
			pg_complete_forget(be);
			if (rc < 0)
				rb_evq_failed(&s->evq, RB_STORE_COMPLETED, 0, &err);
			else
				rb_evq_push(&s->evq, &(struct rb_store_event){ .kind = RB_STORE_COMPLETED,
				    .results = v, .nresults = n });
			return true;
		}
		/* a deadlock or serialization failure: the statement runs again, as pg_run() does */
		if (pg_retryable(res) && be->complete_tries < 5) {
			PQclear(res);
			be->complete_tries++;
			if (!complete_send(be, c)) {
				complete_failed(s, NULL);
				return true;
			}
			continue;
		}
		complete_failed(s, res);
		PQclear(res);
		return true;
	}
}

