/* SPDX-License-Identifier: MIT */
/*
 * store_pg_ha.c: which server a connection reached, against the one the
 * store had (relaybus(7), HA AND FAILOVER), and connecting (pg_connect_to,
 * pg_open_side), which checks it.  Every connection of the store
 * (the first, a reconnect, the side ones) reads the server's system
 * identifier (pg_control_system()) and, on a primary, its current timeline:
 * the first 8 hex digits of pg_walfile_name(pg_current_wal_lsn()), which
 * show a promotion at once (pg_control_checkpoint() lags until the next
 * checkpoint).  The first connection records them; a later one is refused
 * when it reached
 *   - another cluster (another system identifier),
 *   - an older timeline than the store saw (an old primary restarted
 *     without being demoted: a split brain), or
 *   - a standby, once the store has been on a primary;
 * and a newer timeline is logged as a failover.  libpq 15 always takes the
 * first read-write host of a multi-host URL, so a refused server is passed
 * over by connecting to the URL's other hosts one by one.
 *
 * What this cannot see: two standbys promoted onto the same timeline (both
 * on timeline N+1 of the same system), and a failover between two of the
 * store's connections that it never saw.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_url.h"

/* What a connection reached. */
struct pg_ident {
	char		 sysid[24];	/* "": unknown (pg_control_system() revoked) */
	unsigned long	 timeline;	/* 0: a standby */
};

static const char q_ident[] =
    "SELECT (SELECT system_identifier::text FROM pg_control_system()), "
    "CASE WHEN pg_is_in_recovery() THEN NULL "
    "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";
static const char q_ident_nosys[] =
    "SELECT NULL::text, CASE WHEN pg_is_in_recovery() THEN NULL "
    "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END";

void
pg_server_name(PGconn *c, char *buf, size_t size)
{
	const char *h = c != NULL ? PQhost(c) : NULL, *p = c != NULL ? PQport(c) : NULL;

	if (h == NULL || *h == '\0')
		snprintf(buf, size, "the server");
	else if (p == NULL || *p == '\0')
		snprintf(buf, size, "%s", h);
	else
		snprintf(buf, size, "%s:%s", h, p);
}

/* Read what c reached: 0, or -1 + err (the statement failed). */
static int
read_ident(struct rb_store *s, PGconn *c, struct pg_ident *id, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res = PQexec(c, be->sysid_denied ? q_ident_nosys : q_ident);
	const char *st = pg_sqlstate(res);

	if (res != NULL && PQresultStatus(res) != PGRES_TUPLES_OK && strcmp(st, "42501") == 0 &&
	    !be->sysid_denied) {
		/* an operator may revoke pg_control_system() */
		PQclear(res);
		be->sysid_denied = true;
		rb_warn("cannot read the server's system identifier (pg_control_system(): permission "
		    "denied): a reconnect to another cluster will not be noticed");
		res = PQexec(c, q_ident_nosys);
		st = pg_sqlstate(res);
	}
	memset(id, 0, sizeof *id);
	if (res != NULL && PQresultStatus(res) != PGRES_TUPLES_OK && strcmp(st, "55000") == 0) {
		/* "recovery is in progress": a standby */
		PQclear(res);
		return 0;
	}
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		pg_fail_on(s, c, res, "which server", err);
		PQclear(res);
		return -1;
	}
	if (!PQgetisnull(res, 0, 0))
		snprintf(id->sysid, sizeof id->sysid, "%s", PQgetvalue(res, 0, 0));
	if (!PQgetisnull(res, 0, 1))
		id->timeline = strtoul(PQgetvalue(res, 0, 1), NULL, 16);
	PQclear(res);
	return 0;
}

/*
 * id against what the store had: NULL when it is accepted (and recorded),
 * else why it is refused (in why).
 */
static const char *
judge(struct pg_be *be, const char *name, const struct pg_ident *id, char *why, size_t size)
{
	if (id->sysid[0] != '\0' && be->sysid[0] != '\0' && strcmp(id->sysid, be->sysid) != 0) {
		snprintf(why, size, "it is another cluster (system identifier %s, not %s as before)",
		    id->sysid, be->sysid);
		return why;
	}
	if (id->timeline == 0 && be->timeline != 0) {
		snprintf(why, size, "it is not a primary (recovery is in progress)");
		return why;
	}
	if (id->timeline != 0 && id->timeline < be->timeline) {
		snprintf(why, size, "it is on timeline %lu, older than timeline %lu seen before: an old "
		    "primary restarted without being demoted (split brain)", id->timeline, be->timeline);
		return why;
	}
	if (be->sysid[0] == '\0')
		snprintf(be->sysid, sizeof be->sysid, "%s", id->sysid);
	if (id->timeline > be->timeline) {
		if (be->timeline != 0)
			rb_warn("%s is on timeline %lu, newer than timeline %lu before: a failover; events "
			    "acknowledged before it may be lost unless replication was synchronous",
			    name, id->timeline, be->timeline);
		be->timeline = id->timeline;
	}
	return NULL;
}

/* A refusal: an error the first time it is said, then only with -v. */
static void
say_refused(struct pg_be *be, const char *msg)
{
	if (strcmp(be->refused, msg) != 0) {
		rb_error("%s", msg);
		snprintf(be->refused, sizeof be->refused, "%s", msg);
	} else
		rb_info("%s", msg);
}

/* Element i of a comma-separated list (into buf); when the list has one
 * element, that one for every i (libpq's rule for port).  NULL: none. */
static const char *
list_at(const char *list, int i, char *buf, size_t size)
{
	int n = 0;

	if (list == NULL || *list == '\0')
		return NULL;
	if (strchr(list, ',') == NULL) {
		snprintf(buf, size, "%s", list);
		return buf;
	}
	for (const char *p = list;; n++) {
		size_t len = strcspn(p, ",");

		if (n == i) {
			snprintf(buf, size, "%.*s", (int)len, p);
			return len > 0 ? buf : NULL;
		}
		if (p[len] == '\0')
			return NULL;
		p += len + 1;
	}
}

static int
list_len(const char *list)
{
	int n = 1;

	if (list == NULL || *list == '\0')
		return 0;
	for (const char *p = list; *p != '\0'; p++)
		n += *p == ',';
	return n;
}

/* Connect to host i of the connection options of like (its other options
 * as they are). */
static PGconn *
connect_host(PGconn *like, int i, const char *app)
{
	PQconninfoOption *o = PQconninfo(like);
	const char **keys, **vals;
	char hbuf[256], abuf[256], pbuf[32];
	size_t n = 0, cap = 0;
	PGconn *c;

	if (o == NULL)
		return NULL;
	for (PQconninfoOption *p = o; p->keyword != NULL; p++)
		cap++;
	keys = xcalloc(cap + 2, sizeof *keys);
	vals = xcalloc(cap + 2, sizeof *vals);
	for (PQconninfoOption *p = o; p->keyword != NULL; p++) {
		const char *v = p->val;

		if (strcmp(p->keyword, "host") == 0)
			v = list_at(v, i, hbuf, sizeof hbuf);
		else if (strcmp(p->keyword, "hostaddr") == 0)
			v = list_at(v, i, abuf, sizeof abuf);
		else if (strcmp(p->keyword, "port") == 0)
			v = list_at(v, i, pbuf, sizeof pbuf);
		if (v == NULL || *v == '\0')
			continue;
		keys[n] = p->keyword;
		vals[n++] = v;
	}
	keys[n] = "fallback_application_name";
	vals[n++] = app;
	c = PQconnectdbParams(keys, vals, 0);
	free(keys);
	free(vals);
	PQconninfoFree(o);
	return c;
}

/*
 * The server *conn reached against the one the store had: 0 when it is
 * accepted (the first is recorded; a newer timeline is logged as a
 * failover); else the URL's other hosts are tried one by one, and *conn is
 * the first accepted, or NULL and -1 + err (RB_EXIT_UNAVAILABLE: another
 * cluster, an older timeline, or a standby once the store was on a primary).
 */
static int
pg_server_check(struct rb_store *s, PGconn **conn, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	struct pg_ident id;
	char name[300], why[300], msg[sizeof be->refused];
	const char *no;
	int hosts;

	if (read_ident(s, *conn, &id, err) < 0)
		return -1;
	pg_server_name(*conn, name, sizeof name);
	if ((no = judge(be, name, &id, why, sizeof why)) == NULL)
		return 0;
	snprintf(msg, sizeof msg, "refusing %s: %s", name, no);
	say_refused(be, msg);
	/* the URL's other hosts, one by one */
	{
		PQconninfoOption *o = PQconninfo(*conn);

		hosts = 0;
		for (PQconninfoOption *p = o; p != NULL && p->keyword != NULL; p++)
			if (strcmp(p->keyword, "host") == 0 || strcmp(p->keyword, "hostaddr") == 0)
				if (list_len(p->val) > hosts)
					hosts = list_len(p->val);
		PQconninfoFree(o);
	}
	for (int i = 0; i < hosts; i++) {
		PGconn *c = connect_host(*conn, i, s->app);
		char other[300];
		struct rb_error e = { 0 };

		if (c == NULL || PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			continue;
		}
		pg_server_name(c, other, sizeof other);
		if (strcmp(other, name) == 0 || read_ident(s, c, &id, &e) < 0) {
			PQfinish(c);
			continue;
		}
		if ((no = judge(be, other, &id, why, sizeof why)) != NULL) {
			char m2[sizeof be->refused];

			snprintf(m2, sizeof m2, "refusing %s: %s", other, no);
			say_refused(be, m2);
			PQfinish(c);
			continue;
		}
		rb_info("%s refused, %s taken instead", name, other);
		PQfinish(*conn);
		*conn = c;
		return 0;
	}
	PQfinish(*conn);
	*conn = NULL;
	return rb_seterr(err, RB_EXIT_UNAVAILABLE, "%s", msg);
}

/* ---- connecting ---------------------------------------------------------- */

/*
 * Did the server refuse the role (SQLSTATE 28P01 or 28000 at connect: a
 * wrong or missing password, or pg_hba.conf)?  libpq gives a failed
 * connection no SQLSTATE: it says itself when a password was needed and
 * none given, the rest is only in the server's message (English unless
 * the server's lc_messages says otherwise).
 */
static bool
refused_role(PGconn *c, const char *msg)
{
	return PQconnectionNeedsPassword(c) || strstr(msg, "authentication failed") != NULL ||
	    strstr(msg, "no password supplied") != NULL || strstr(msg, "pg_hba.conf") != NULL;
}

/*
 * relaybus's own statements resolve names in pg_catalog only: every
 * relaybus name in them is qualified with the schema, and an operator or
 * function another role put in a schema on the login's search_path
 * (public, "$user") would otherwise win over pg_catalog's inexact or
 * polymorphic match (bigint * interval, text[] && text[], jsonb ->>
 * unknown) and run as this session's role.  The session's own path is
 * kept for the caller's --sql (pg_user_path).  Not behind a transaction
 * pooler, which keeps no session setting: there the role's setting must
 * say it (relaybus(7), SECURITY).
 */
static int
pin_search_path(struct rb_store *s, PGconn *c, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res;

	if (be->pooler)
		return 0;
	res = PQexec(c, "SELECT x.p, pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false) "
	    "FROM (SELECT pg_catalog.current_setting('search_path') AS p OFFSET 0) x");
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		pg_fail_on(s, c, res, "connect", err);
		PQclear(res);
		return -1;
	}
	free(be->user_path);
	be->user_path = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return 0;
}

int
pg_connect_to(struct rb_store *s, PGconn **conn, struct rb_error *err)
{
	const char *keys[4], *vals[4];
	int n = 0;

	if (s->url != NULL) {
		keys[n] = "dbname";
		vals[n++] = s->url;
	}
	keys[n] = "fallback_application_name";
	vals[n++] = s->app;
	keys[n] = NULL;
	vals[n] = NULL;
	*conn = PQconnectdbParams(keys, vals, 1);
	if (*conn == NULL)
		return rb_seterr(err, RB_EXIT_OSERR, "out of memory");
	pg_log_notices(*conn, false);
	if (PQstatus(*conn) != CONNECTION_OK) {
		char msg[sizeof err->msg];
		/* (a string libpq cannot parse is a bad URL, and its error quotes it) */
		bool bad = rb_pg_conn_error(s->url, PQerrorMessage(*conn), msg, sizeof msg);

		return rb_seterr(err, bad ? RB_EXIT_CONFIG
		    : refused_role(*conn, msg) ? RB_EXIT_NOPERM : RB_EXIT_UNAVAILABLE,
		    "cannot connect to %s: %s", s->url_redacted, msg);
	}
	if (pg_server_check(s, conn, err) < 0)
		return -1;
	pg_log_notices(*conn, true);
	return pin_search_path(s, *conn, err);
}

int
pg_open_side(struct rb_store *s, PGconn **c, void (*close_fn)(struct pg_be *), const char *setup,
    const char *what, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res;

	if (*c != NULL && PQstatus(*c) == CONNECTION_OK)
		return 0;
	close_fn(be);
	if (pg_connect_to(s, c, err) < 0) {
		close_fn(be);
		return -1;
	}
	if (setup == NULL)
		return 0;
	res = PQexec(*c, setup);
	if (res == NULL || PQresultStatus(res) != PGRES_COMMAND_OK) {
		pg_fail_on(s, *c, res, what, err);
		PQclear(res);
		close_fn(be);
		return -1;
	}
	PQclear(res);
	return 0;
}
