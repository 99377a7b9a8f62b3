/* SPDX-License-Identifier: MIT */
/*
 * store_pg_setup_wait.c: how the set-up waits, and for how long.  Two
 * kinds of lock: the set-up lock (a transaction-level advisory lock on a
 * key fixed for every schema of a database, which any role that can
 * connect may take too), and, when the set-up really changes the schema,
 * the tables it alters.  Each is tried for at most --lock-timeout
 * (SETUP_LOCK_WAIT_MS), then rb-setup exits 75 naming the session that
 * holds it (relaybus(7), OPERATIONS).  The tables are tried in short
 * attempts that hold nothing between them, so that claims, completions
 * and publishes never queue behind a set-up for longer than an attempt.
 */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

#define SETUP_LOCK_WAIT_MS	10000
/* one attempt at the tables: what a claim may wait behind a set-up */
#define TABLE_LOCK_TRY_MS	"200ms"

/* The session holding a lock that where (a condition on pg_locks l, with
 * $1 when n is 1) says, for a message: "pid N (user U, application_name
 * 'A', in a transaction since T, STATE)", into buf; false when no session
 * holds it now. */
static bool
lock_holder(struct rb_store *s, const char *where, int n, const char *const *p, char *buf, size_t size)
{
	struct rb_error err = { 0 };
	char *q = xasprintf(
	    "SELECT a.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), "
	    "coalesce(pg_catalog.to_char(a.xact_start, 'YYYY-MM-DD HH24:MI:SS TZ'), ''), "
	    "coalesce(pg_catalog.to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ'), ''), "
	    "coalesce(a.state, '') "
	    "FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
	    "WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid() AND %s "
	    "ORDER BY a.xact_start LIMIT 1", where);
	PGresult *r = pg_run(s, q, n, p, PGRES_TUPLES_OK, "set-up lock", false, &err);
	bool found = r != NULL && PQntuples(r) == 1;

	free(q);
	if (found) {
		const char *xact = PQgetvalue(r, 0, 3), *conn = PQgetvalue(r, 0, 4), *state = PQgetvalue(r, 0, 5);

		snprintf(buf, size, "pid %s (user %s, application_name '%s'%s%s%s%s)", PQgetvalue(r, 0, 0),
		    PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
		    *xact != '\0' ? ", in a transaction since " : *conn != '\0' ? ", connected since " : "",
		    *xact != '\0' ? xact : conn, *state != '\0' ? ", " : "", state);
	}
	PQclear(r);
	return found;
}

static const char setup_lock_where[] =
    "l.locktype = 'advisory' AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()) "
    "AND l.classid::bigint = (" SETUP_LOCK_KEY "::bigint >> 32) "
    "AND l.objid::bigint = (" SETUP_LOCK_KEY "::bigint & 4294967295)";

static int64_t
wait_ms(const struct rb_setup_opts *o)
{
	return o->lock_timeout_ms == 0 ? SETUP_LOCK_WAIT_MS : o->lock_timeout_ms;
}

static void
fmt_wait(int64_t wait, char *buf, size_t size)
{
	snprintf(buf, size, wait % 1000 == 0 ? "%llds" : "%lldms",
	    (long long)(wait % 1000 == 0 ? wait / 1000 : wait));
}

/*
 * Take the set-up lock within o->lock_timeout_ms (0: SETUP_LOCK_WAIT_MS),
 * trying every 100 ms, or fail with 75 naming its holder (said with -v at
 * once).  For ever: the script's own pg_advisory_xact_lock waits.
 */
int
pg_setup_lock(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	int64_t wait = wait_ms(o);
	int64_t start = rb_mono_ms();
	char who[600], dur[32];

	for (int tries = 0;; tries++) {
		PGresult *r = pg_run(s, "SELECT pg_catalog.pg_try_advisory_xact_lock(" SETUP_LOCK_KEY ")", 0, NULL,
		    PGRES_TUPLES_OK, "set-up lock", false, err);
		bool got;

		if (r == NULL)
			return -1;
		got = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
		PQclear(r);
		if (got)
			return 0;
		if (tries == 0 && lock_holder(s, setup_lock_where, 0, NULL, who, sizeof who))
			rb_info("waiting for the set-up lock, held by %s", who);
		if (wait < 0)
			return 0;	/* (the script's pg_advisory_xact_lock waits) */
		if (rb_mono_ms() - start >= wait)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000000L }, NULL);
	}
	fmt_wait(wait, dur, sizeof dur);
	if (lock_holder(s, setup_lock_where, 0, NULL, who, sizeof who))
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "the set-up lock (advisory key %s) is held by %s: "
		    "not granted within %s (--lock-timeout)", SETUP_LOCK_KEY, who, dur);
	return rb_seterr(err, RB_EXIT_TEMPFAIL, "the set-up lock (advisory key %s) was not granted within "
	    "%s (--lock-timeout); its holder has let go since: run rb-setup again", SETUP_LOCK_KEY, dur);
}

/* The tables a change of the schema alters (ALTER TABLE, the view made
 * again), those that exist, in the order the delivery path locks them:
 * grants (a worker door's relaybus_allowed), lanes, the view with the
 * events, deliveries */
static const char lock_list_sql[] =
    "SELECT pg_catalog.string_agg(pg_catalog.format('%I.%I', $1::pg_catalog.text, x.t), ', ' ORDER BY x.o) "
    "FROM pg_catalog.unnest(ARRAY['relaybus_grants', 'relaybus_lanes', 'relaybus_worker_events', "
    "  'relaybus_events', 'relaybus_deliveries']) WITH ORDINALITY AS x(t, o) "
    "WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', $1::pg_catalog.text, x.t)) IS NOT NULL";

static int
cmd(struct rb_store *s, const char *sql, struct rb_error *err)
{
	return pg_run_cmd(s, sql, "set-up", err);
}

/*
 * Lock the tables a change of the schema alters, first: attempts of
 * TABLE_LOCK_TRY_MS each, in a savepoint that gives back what an attempt
 * got, with a backoff between them, for at most --lock-timeout; then 75
 * naming a session that holds one of them.  What the DDL locks besides
 * (the completion history's index, say) waits at most what is left.
 */
int
pg_setup_lock_tables(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	const char *p[1] = { s->schema };
	PGresult *res = pg_run(s, lock_list_sql, 1, p, PGRES_TUPLES_OK, "set-up", false, err);
	int64_t wait = wait_ms(o), start = rb_mono_ms(), backoff = 50;
	char *list, *lock, who[600], dur[32], left[32];

	if (res == NULL)
		return -1;
	if (PQgetisnull(res, 0, 0)) {	/* (nothing set up yet: nothing to wait for) */
		PQclear(res);
		return 0;
	}
	list = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	lock = xasprintf("LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", list);
	for (int tries = 0;; tries++) {
		PGresult *r;
		bool busy;

		if (cmd(s, "SAVEPOINT relaybus_setup_lock", err) < 0 ||
		    cmd(s, "SET LOCAL lock_timeout = '" TABLE_LOCK_TRY_MS "'", err) < 0)
			goto fail;
		r = PQexec(pg_be(s)->conn, lock);
		busy = strcmp(pg_sqlstate(r), "55P03") == 0;	/* lock_not_available */
		if (r != NULL && PQresultStatus(r) == PGRES_COMMAND_OK) {
			PQclear(r);
			if (cmd(s, "RELEASE SAVEPOINT relaybus_setup_lock", err) < 0)
				goto fail;
			break;
		}
		if (!busy) {
			pg_fail(s, r, "set-up", err);
			PQclear(r);
			goto fail;
		}
		PQclear(r);
		if (cmd(s, "ROLLBACK TO SAVEPOINT relaybus_setup_lock", err) < 0)
			goto fail;
		if (tries == 0)
			rb_info("waiting for the tables of schema %s (%s)", s->schema, list);
		if (wait >= 0 && rb_mono_ms() - start >= wait) {
			const char *pl[1] = { list };

			fmt_wait(wait, dur, sizeof dur);
			if (lock_holder(s, "l.locktype = 'relation' AND l.relation::pg_catalog.regclass::pg_catalog.text "
			    "= ANY (pg_catalog.string_to_array($1, ', '))", 1, pl, who, sizeof who))
				rb_seterr(err, RB_EXIT_TEMPFAIL, "the tables of schema %s are held by %s: not "
				    "granted within %s (--lock-timeout); nothing was changed", s->schema, who, dur);
			else
				rb_seterr(err, RB_EXIT_TEMPFAIL, "the tables of schema %s were not granted within %s "
				    "(--lock-timeout); nothing was changed: run rb-setup again", s->schema, dur);
			goto fail;
		}
		nanosleep(&(struct timespec){ .tv_sec = backoff / 1000, .tv_nsec = (backoff % 1000) * 1000000L },
		    NULL);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	/* the DDL's other locks: at most what is left of the wait */
	if (wait >= 0) {
		int64_t rest = wait - (rb_mono_ms() - start);
		char *q;

		snprintf(left, sizeof left, "%lld", (long long)(rest > 100 ? rest : 100));
		q = xasprintf("SET LOCAL lock_timeout = %s", left);
		if (cmd(s, q, err) < 0) {
			free(q);
			goto fail;
		}
		free(q);
	}
	free(lock);
	free(list);
	return 0;
fail:
	free(lock);
	free(list);
	return -1;
}
