/* SPDX-License-Identifier: MIT */
/*
 * store_pg_setup.c: the set-up.  The script is schema_pg.sql (and
 * schema_history_pg.sql) rendered for the schema, under an advisory lock,
 * between what store_pg_version.c puts around it (the version guard, the
 * lane function, the upgrade from relaybus 0.1.0, the version check),
 * plus the subscriptions: rb_store_setup runs it in one transaction with
 * the subscriptions as parameters, rb-setup --print-sql prints it with
 * them as literals; then the grants (store_pg_grants.c).
 */
#include "config.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"

extern const char rb_schema_pg_sql[];
extern const char rb_schema_history_pg_sql[];

/*
 * The set-up lock: a transaction-level advisory lock on a key fixed for
 * every schema of a database.  Any role that can connect may take an
 * advisory lock on any key, this one too: rb-setup waits for it at most
 * SETUP_LOCK_WAIT_MS (--lock-timeout), then exits 75 naming the session
 * that holds it (relaybus(7), OPERATIONS).
 */
#define SETUP_LOCK_KEY	"7166535398124000001"
#define SETUP_LOCK_WAIT_MS 10000

/* A SQL string literal for --print-sql: an E'' literal, which reads the
 * same whatever standard_conforming_strings says (with a plain '' one, a
 * pattern holding \' would end the literal where it is off). */
static void
sb_literal(struct rb_sbuf *b, const char *v)
{
	rb_sb_puts(b, "E'");
	for (; *v != '\0'; v++) {
		if (*v == '\'' || *v == '\\')
			rb_sb_putn(b, v, 1);
		rb_sb_putn(b, v, 1);
	}
	rb_sb_puts(b, "'");
}

/* glob (* and ?) -> LIKE pattern with \ as escape */
static char *
glob_to_like(const char *g)
{
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (; *g != '\0'; g++) {
		if (*g == '*')
			rb_sb_puts(&b, "%");
		else if (*g == '?')
			rb_sb_puts(&b, "_");
		else if (*g == '%' || *g == '_' || *g == '\\') {
			rb_sb_puts(&b, "\\");
			rb_sb_putn(&b, g, 1);
		} else
			rb_sb_putn(&b, g, 1);
	}
	return b.s;
}

static void
setup_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o, bool with_subs)
{
	char *sql;

	rb_sb_puts(b, "SELECT pg_advisory_xact_lock(" SETUP_LOCK_KEY ");\n");
	pg_setup_before(b, schema);
	sql = pg_render(rb_schema_pg_sql, schema);
	rb_sb_puts(b, sql);
	free(sql);
	pg_setup_after(b, schema);
	if (o->completion_history) {
		sql = pg_render(rb_schema_history_pg_sql, schema);
		rb_sb_puts(b, sql);
		free(sql);
	}
	if (!with_subs)
		return;
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf, *like, *q;
		const char *h, *p;

		if (rb_subscription_parse(o->subscribe[i], &buf, &h, &p, NULL) < 0)
			continue;
		like = glob_to_like(p);
		q = pg_render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) VALUES (", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, ", ");
		sb_literal(b, p);
		rb_sb_puts(b, ", ");
		sb_literal(b, like);
		rb_sb_puts(b, ") ON CONFLICT DO NOTHING;\n");
		q = pg_render("SELECT @S@.relaybus_seed_lanes(", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, ");\n");
		free(like);
		free(buf);
	}
	for (size_t i = 0; i < o->n_unsubscribe; i++) {
		char *buf, *q;
		const char *h, *p;

		if (rb_subscription_parse(o->unsubscribe[i], &buf, &h, &p, NULL) < 0)
			continue;
		q = pg_render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = ", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, " AND pattern = ");
		sb_literal(b, p);
		rb_sb_puts(b, ";\n");
		free(buf);
	}
	pg_grants_script(b, schema, o);	/* last: it covers every function made above */
}

static int
check_subscriptions(const struct rb_setup_opts *o, struct rb_error *err)
{
	for (size_t i = 0; i < o->n_subscribe + o->n_unsubscribe; i++) {
		const char *spec = i < o->n_subscribe ? o->subscribe[i] : o->unsubscribe[i - o->n_subscribe];
		char *buf;
		const char *h, *p;

		if (rb_subscription_parse(spec, &buf, &h, &p, err) < 0)
			return -1;
		free(buf);
	}
	for (size_t i = 0; i < o->n_grant + o->n_revoke; i++) {
		char *buf;
		const char *k, *r, *h;

		if (rb_grant_parse(i < o->n_grant ? o->grant[i] : o->revoke[i - o->n_grant], &buf, &k, &r, &h,
		    err) < 0)
			return -1;
		free(buf);
	}
	return 0;
}

char *
pg_setup_script(const char *schema, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;

	if (check_subscriptions(o, err) < 0)
		return NULL;
	rb_sb_init(&b);
	rb_sb_puts(&b, "-- relaybus schema set-up; apply in one transaction with the workers stopped\n"
	    "BEGIN;\n"
	    "SET LOCAL standard_conforming_strings = on;\n");
	setup_script(&b, schema, o, true);
	rb_sb_puts(&b, "COMMIT;\n");
	return b.s;
}

/* The session holding the set-up lock, for the message: "pid N (user U,
 * application_name 'A', in a transaction since T, STATE)", into buf; false
 * when no session holds it now. */
static bool
lock_holder(struct rb_store *s, char *buf, size_t size)
{
	struct rb_error err = { 0 };
	PGresult *r = pg_run(s,
	    "SELECT a.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), "
	    "coalesce(pg_catalog.to_char(a.xact_start, 'YYYY-MM-DD HH24:MI:SS TZ'), ''), "
	    "coalesce(pg_catalog.to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ'), ''), "
	    "coalesce(a.state, '') "
	    "FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
	    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
	    "AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()) "
	    "AND l.classid::bigint = (" SETUP_LOCK_KEY "::bigint >> 32) "
	    "AND l.objid::bigint = (" SETUP_LOCK_KEY "::bigint & 4294967295) "
	    "AND l.pid <> pg_catalog.pg_backend_pid() LIMIT 1", 0, NULL, PGRES_TUPLES_OK, "set-up lock",
	    false, &err);
	bool found = r != NULL && PQntuples(r) == 1;

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

/*
 * Take the set-up lock within o->lock_timeout_ms (0: SETUP_LOCK_WAIT_MS),
 * trying every 100 ms, or fail with 75 naming its holder (said with -v at
 * once).  For ever: the script's own pg_advisory_xact_lock waits.
 */
static int
setup_lock(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	int64_t wait = o->lock_timeout_ms == 0 ? SETUP_LOCK_WAIT_MS : o->lock_timeout_ms;
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
		if (tries == 0 && lock_holder(s, who, sizeof who))
			rb_info("waiting for the set-up lock, held by %s", who);
		if (wait < 0)
			return 0;	/* (the script's pg_advisory_xact_lock waits) */
		if (rb_mono_ms() - start >= wait)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 100 * 1000000L }, NULL);
	}
	snprintf(dur, sizeof dur, wait % 1000 == 0 ? "%llds" : "%lldms",
	    (long long)(wait % 1000 == 0 ? wait / 1000 : wait));
	if (lock_holder(s, who, sizeof who))
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "the set-up lock (advisory key %s) is held by %s: "
		    "not granted within %s (--lock-timeout)", SETUP_LOCK_KEY, who, dur);
	return rb_seterr(err, RB_EXIT_TEMPFAIL, "the set-up lock (advisory key %s) was not granted within "
	    "%s (--lock-timeout); its holder has let go since: run rb-setup again", SETUP_LOCK_KEY, dur);
}

int
pg_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;
	int rc = -1;

	if (check_subscriptions(o, err) < 0)
		return -1;
	rb_sb_init(&b);
	setup_script(&b, s->schema, o, false);
	if (pg_run_cmd(s, "BEGIN", "set-up", err) < 0)
		goto out;
	/* quiet the NOTICEs of CREATE ... IF NOT EXISTS on a second run */
	if (pg_run_cmd(s, "SET LOCAL client_min_messages = warning", "set-up", err) < 0 ||
	    setup_lock(s, o, err) < 0 || pg_run_cmd(s, b.s, "set-up", err) < 0)
		goto fail;
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf, *like, *q1, *q2;
		const char *h, *p;

		rb_subscription_parse(o->subscribe[i], &buf, &h, &p, NULL);
		like = glob_to_like(p);
		const char *params[3] = { h, p, like };
		q1 = pg_render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) "
		    "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", s->schema);
		q2 = pg_render("SELECT @S@.relaybus_seed_lanes($1)", s->schema);
		PGresult *r1 = pg_run(s, q1, 3, params, PGRES_COMMAND_OK, "subscribe", false, err);
		PGresult *r2 = r1 != NULL ? pg_run(s, q2, 1, params, PGRES_TUPLES_OK, "subscribe", false, err) : NULL;
		bool ok = r1 != NULL && r2 != NULL;
		PQclear(r1);
		PQclear(r2);
		free(q1);
		free(q2);
		free(like);
		free(buf);
		if (!ok)
			goto fail;
	}
	for (size_t i = 0; i < o->n_unsubscribe; i++) {
		char *buf, *q;
		const char *h, *p;

		rb_subscription_parse(o->unsubscribe[i], &buf, &h, &p, NULL);
		const char *params[2] = { h, p };
		q = pg_render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = $1 AND pattern = $2", s->schema);
		PGresult *r = pg_run(s, q, 2, params, PGRES_COMMAND_OK, "unsubscribe", false, err);
		bool ok = r != NULL;
		PQclear(r);
		free(q);
		free(buf);
		if (!ok)
			goto fail;
	}
	/* last: the privileges of every function made above */
	if (pg_grants_setup(s, o, err) < 0)
		goto fail;
	if (pg_run_cmd(s, "COMMIT", "set-up", err) < 0)
		goto out;
	rc = 0;
	goto out;
fail:
	pg_rollback_quietly(s);
out:
	free(b.s);
	return rc;
}
