/* SPDX-License-Identifier: MIT */
/*
 * store_pg_ha.c: which server a connection reached, against the one the
 * store had (relaybus(7), HA AND FAILOVER).  Every connection of the store
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

int
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
