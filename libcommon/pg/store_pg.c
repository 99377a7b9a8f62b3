/* SPDX-License-Identifier: MIT */
/*
 * store_pg.c: the PostgreSQL backend's ops table (rb_store_pg_ops) and its
 * connections: open, close, reconnect, LISTEN/NOTIFY, libpq's version, and
 * for the calls without waiting what to poll and what came (pg_pollfds,
 * pg_service), each connection with what it has out (enum pg_job).  The
 * top of the backend: the work is in the files by job (store_pg_steps.h
 * lists them) over its core (store_pg_int.h: the state and the one
 * exec/error layer, store_pg_exec.c), none of which calls this file; the
 * set-up script and the server-side functions
 * (publish, claim, complete, fail, extend, relinquish, and the roles' grants)
 * are in schema_pg.sql.  The hot path is one round
 * trip per operation:
 *   publish  = SELECT relaybus_publish_batch($1)           (one transaction)
 *   claim    = SELECT relaybus_claim(...)                  (one transaction)
 *   complete = DELETE ... USING unnest($arrays), lanes     (one statement)
 * A role rb-setup --grant made takes SECURITY DEFINER doors to the same
 * statements instead (pg_be.worker; the owner's sessions pay nothing).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"
#include "store_pg_url.h"

/* Every statement of struct pg_be, rendered for the schema at open: the
 * owner's form, and the one a worker role takes (pg_be.worker). */
static const struct {
	size_t		 at;	/* offsetof the char * in struct pg_be */
	const char	*tmpl, *wtmpl;
} pg_statements[] = {
	{ offsetof(struct pg_be, q_publish), pg_tmpl_publish, pg_tmpl_publish },
	{ offsetof(struct pg_be, q_publish1), pg_tmpl_publish1, pg_tmpl_publish1 },
	{ offsetof(struct pg_be, q_wake), pg_tmpl_wake, pg_tmpl_wake },
	{ offsetof(struct pg_be, q_claim), pg_tmpl_claim, pg_tmpl_w_claim },
	{ offsetof(struct pg_be, q_claim_ids), pg_tmpl_claim_ids, pg_tmpl_w_claim_ids },
	{ offsetof(struct pg_be, q_fetch), pg_tmpl_fetch, pg_tmpl_w_fetch },
	{ offsetof(struct pg_be, q_extend), pg_tmpl_extend, pg_tmpl_w_extend },
	{ offsetof(struct pg_be, q_complete), pg_tmpl_complete, pg_tmpl_w_complete },
	{ offsetof(struct pg_be, q_complete_hist), pg_tmpl_complete_hist, pg_tmpl_w_complete },
	{ offsetof(struct pg_be, q_fail), pg_tmpl_fail, pg_tmpl_w_fail },
	{ offsetof(struct pg_be, q_relinquish), pg_tmpl_relinquish, pg_tmpl_w_relinquish },
	{ offsetof(struct pg_be, q_relinquish_owner), pg_tmpl_relinquish_owner, pg_tmpl_w_relinquish_owner },
	{ offsetof(struct pg_be, q_relinquish_leases), pg_tmpl_relinquish_leases, pg_tmpl_w_relinquish_leases },
	{ offsetof(struct pg_be, q_lock_lane), pg_tmpl_lock_lane, pg_tmpl_w_lock_lane },
	{ offsetof(struct pg_be, q_hold), pg_tmpl_hold, pg_tmpl_hold },
};
#define N_STATEMENTS	(sizeof pg_statements / sizeof pg_statements[0])

static char **
statement(struct pg_be *be, size_t i)
{
	return (char **)((char *)be + pg_statements[i].at);
}

/* ---- connection ---------------------------------------------------------- */

static void
render_statements(struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	for (size_t i = 0; i < N_STATEMENTS; i++) {
		free(*statement(be, i));
		*statement(be, i) = pg_render(be->worker ? pg_statements[i].wtmpl : pg_statements[i].tmpl,
		    s->schema);
	}
}

/* On the first connection: does the session's user lack the privileges of
 * the schema's owner (the role that ran rb-setup)?  Then it is a role
 * rb-setup --grant made, with no table privilege: its statements are the
 * worker forms, through the SECURITY DEFINER doors of schema_pg.sql.  (No
 * schema yet: the owner's forms; the version check says the rest.) */
static const char worker_sql[] =
    "SELECT NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') FROM pg_catalog.pg_class c "
    "WHERE c.oid = pg_catalog.to_regclass('@S@.relaybus_lanes')";

static int
pg_connect(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res;
	char *q;
	bool worker;

	be->prepared = 0;
	be->wake = 0;		/* a new session: relaybus.notify as the server says */
	be->live = PG_LIVE_UNTRIED;	/* a session lock goes with its session */
	/* (the claim cursors are the last server's: another, or the same one
	 * after a failover, has other xids and other lanes held) */
	pg_cursors_drop(&be->cursors, true);
	if (pg_connect_to(s, &be->conn, err) < 0)
		return -1;
	if (be->worker_known)
		return 0;
	q = pg_render(worker_sql, s->schema);
	res = pg_run_on(s, be->conn, q, 0, NULL, PGRES_TUPLES_OK, "connect", false, err);
	free(q);
	if (res == NULL)
		return -1;
	worker = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	be->worker_known = true;
	if (worker != be->worker) {
		be->worker = worker;
		render_statements(s);
	}
	return 0;
}

/* A new holder id: 64 random bits (the clock, pid and a count if
 * /dev/urandom cannot be read), as decimal text for a bigint parameter. */
static void
new_holder(char *buf, size_t size)
{
	static unsigned count;
	uint64_t h = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	bool ok = fd >= 0 && read(fd, &h, sizeof h) == (ssize_t)sizeof h;

	if (fd >= 0)
		close(fd);
	if (!ok) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		h = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
		    ((uint64_t)getpid() << 40) ^ ((uint64_t)++count << 20);
	}
	snprintf(buf, size, "%" PRId64, (int64_t)(h & INT64_MAX));
}

/* $RELAYBUS_PG_CONNECTIONS: 1, 2 or 3 (unset or empty: 2), else -1. */
static int
connections_env(void)
{
	const char *v = getenv("RELAYBUS_PG_CONNECTIONS");

	if (v == NULL || *v == '\0')
		return 2;
	return (v[0] >= '1' && v[0] <= '3' && v[1] == '\0') ? v[0] - '0' : -1;
}

/* $RELAYBUS_PG_POOLER: unset, empty or "session": 0; "transaction": 1; else -1. */
static int
pooler_env(void)
{
	const char *v = getenv("RELAYBUS_PG_POOLER");

	if (v == NULL || *v == '\0' || strcmp(v, "session") == 0)
		return 0;
	return strcmp(v, "transaction") == 0 ? 1 : -1;
}

static int
pg_open(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = xcalloc(1, sizeof *be);

	s->be = be;
	be->history = -1;
	new_holder(be->holder, sizeof be->holder);
	if ((be->connections = connections_env()) < 0)
		return rb_seterr(err, RB_EXIT_CONFIG, "invalid RELAYBUS_PG_CONNECTIONS '%s': use 1, 2 or 3",
		    getenv("RELAYBUS_PG_CONNECTIONS"));
	switch (pooler_env()) {
	case 0:
		break;
	case 1:
		be->pooler = true;
		break;
	default:
		return rb_seterr(err, RB_EXIT_CONFIG, "invalid RELAYBUS_PG_POOLER '%s': use transaction or session",
		    getenv("RELAYBUS_PG_POOLER"));
	}
	if (pg_cursors_env(&be->cursors, err) < 0)
		return -1;
	rb_sb_init(&be->claim.live);
	rb_sb_init(&be->claim.live_lanes);
	be->answer_claim = pg_claim_answer;
	be->answer_complete = pg_complete_answer;
	render_statements(s);
	return pg_connect(s, err);
}

static void
pg_close(struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	if (be == NULL)
		return;
	if (be->conn != NULL)
		PQfinish(be->conn);
	pg_close_conn2(be);
	pg_close_conn3(be);
	pg_complete_forget(be);
	free(be->wake_for);
	free(be->user_path);
	pg_cursors_free(&be->cursors);
	free(be->claim.live.s);
	free(be->claim.live_lanes.s);
	for (size_t i = 0; i < N_STATEMENTS; i++)
		free(*statement(be, i));
	free(be);
	s->be = NULL;
}

static bool
pg_broken(const struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	return be == NULL || be->conn == NULL || PQstatus(be->conn) != CONNECTION_OK;
}

static void
pg_server(const struct rb_store *s, char *buf, size_t size)
{
	pg_server_name(pg_be(s)->conn, buf, size);
}

static int pg_listen(struct rb_store *, const char *, struct rb_error *);

static int
pg_reconnect(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	/* be->listening survives failed attempts: the next good connection
	 * listens again */
	if (be->conn != NULL)
		PQfinish(be->conn);
	be->conn = NULL;
	pg_close_conn2(be);
	pg_close_conn3(be);
	be->history = -1;
	pg_complete_forget(be);
	be->job = PG_IDLE;
	be->woken = false;
	if (pg_connect(s, err) < 0)
		return -1;
	if (be->listening)
		return pg_listen(s, be->wake_for, err);
	return 0;
}

/* ---- wake-up ------------------------------------------------------------- */

static int
pg_listen(struct rb_store *s, const char *handler, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	char sql[128];

	if (handler != be->wake_for) {
		free(be->wake_for);
		be->wake_for = handler != NULL ? xstrdup(handler) : NULL;
	}
	/* behind a transaction pooler, the LISTEN would be some other
	 * client's session's: no wake-ups, the caller polls (relaybus(7)) */
	if (be->pooler) {
		rb_debug("RELAYBUS_PG_POOLER=transaction: no LISTEN, polling");
		return 0;
	}
	snprintf(sql, sizeof sql, "LISTEN relaybus_%s", s->schema);
	pg_settle(s);
	if (pg_run_cmd(s, sql, "listen", err) < 0)
		return -1;
	be->listening = true;
	return 0;
}

/* ms until a wake-up may be reported: 0 now */
static int64_t
wake_quiet_left(const struct pg_be *be)
{
	int64_t left = be->wake_quiet_until != 0 ? be->wake_quiet_until - rb_mono_ms() : 0;

	return left > 0 ? left : 0;
}

/* The notifications libpq has read (with an answer, or during another
 * statement): whether one is for the handler listened for. */
static void
take_notifies(struct pg_be *be)
{
	PGnotify *n;

	while ((n = PQnotifies(be->conn)) != NULL) {
		if (be->wake_for == NULL || strcmp(n->extra, be->wake_for) == 0)
			be->woken = true;
		PQfreemem(n);
	}
}

/* ---- the calls without waiting: what to poll, and what came ------------- */

/* An answer libpq holds already makes no socket readable. */
static bool
answered(PGconn *c, enum pg_job job)
{
	return job != PG_IDLE && c != NULL && !PQisBusy(c);
}

static int
pg_pollfds(struct rb_store *s, struct pollfd *pfd, int max, int *timeout_ms)
{
	struct pg_be *be = pg_be(s);
	PGconn *const c[3] = { be->conn, be->conn2, be->conn3 };
	const enum pg_job job[3] = { be->job, be->job2, be->job3 };
	int n = 0;

	if (be->conn == NULL)
		return 0;
	take_notifies(be);
	for (int i = 0; i < 3; i++) {
		/* (the first always: notifications, and a break seen while idle) */
		if (c[i] == NULL || (i > 0 && job[i] == PG_IDLE) || PQsocket(c[i]) < 0 || n == max)
			continue;
		pfd[n].fd = PQsocket(c[i]);
		pfd[n].events = POLLIN;
		pfd[n++].revents = 0;
		if (answered(c[i], job[i]))
			*timeout_ms = 0;
	}
	if (be->woken) {
		int64_t left = wake_quiet_left(be);

		if (*timeout_ms < 0 || *timeout_ms > left)
			*timeout_ms = (int)left;
	}
	return n;
}

static void
pg_service(struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	if (be->conn == NULL)
		return;
	/* the first connection: the answer out there first (it may be all
	 * that came before a break), or what came while idle */
	if (be->job == PG_CLAIM)
		pg_claim_answer(s, false);
	else if (be->job == PG_COMPLETE)
		pg_complete_answer(s, false);
	else if (PQconsumeInput(be->conn) == 0) {
		struct rb_error err = { 0 };
		char msg[300];

		pg_lost_reason(be->conn, NULL, msg, sizeof msg);
		rb_seterr(&err, RB_EXIT_TEMPFAIL, "connection lost: %s", msg);
		rb_evq_failed(&s->evq, RB_STORE_WOKEN, 0, &err);
		return;
	}
	if (be->job3 == PG_COMPLETE)
		pg_complete_answer(s, false);
	if (be->job2 == PG_FETCH)
		pg_fetch_answer(s, false);
	take_notifies(be);
	if (be->woken && wake_quiet_left(be) == 0) {
		be->woken = false;
		be->wake_check = true;
		rb_evq_push(&s->evq, &(struct rb_store_event){ .kind = RB_STORE_WOKEN });
	}
}

static void
pg_version(char *buf, size_t len)
{
	int v = PQlibVersion();

	/* 150018 is 15.18; before 10, 90624 was 9.6.24 */
	if (v >= 100000)
		snprintf(buf, len, "libpq %d.%d", v / 10000, v % 10000);
	else
		snprintf(buf, len, "libpq %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
}

static const char *const pg_schemes[] = { "postgresql", "postgres", NULL };

const struct rb_store_ops rb_store_pg_ops = {
	.name = "postgresql",
	.schemes = pg_schemes,
	.version = pg_version,
	.redact = rb_pg_url_redact,
	.open = pg_open,
	.close = pg_close,
	.reconnect = pg_reconnect,
	.broken = pg_broken,
	.server = pg_server,
	.setup = pg_setup,
	.setup_script = pg_setup_script,
	.grant = pg_grants_setup,
	.schema_info = pg_schema_info,
	.publish = pg_publish,
	.claim = pg_claim,
	.extend = pg_extend,
	.extend_plain = pg_extend_plain,
	.complete = pg_complete,
	.relinquish = pg_relinquish,
	.relinquish_owner = pg_relinquish_owner,
	.relinquish_leases = pg_relinquish_leases,
	.in_flight = pg_in_flight,
	.listen = pg_listen,
	.claim_start = pg_claim_start,
	.complete_start = pg_complete_start,
	.claim_ready = pg_claim_ready,
	.complete_ready = pg_complete_ready,
	.pollfds = pg_pollfds,
	.service = pg_service,
	.admin_stats = pg_admin_stats,
	.admin_list = pg_admin_list,
	.admin_show = pg_admin_show,
	.admin_apply = pg_admin_apply,
	.admin_purge = pg_admin_purge,
	.admin_purge_keys = pg_admin_purge_keys,
	.admin_lanes = pg_admin_lanes,
	.admin_subscriptions = pg_admin_subscriptions,
	.inspect_lifecycle = pg_inspect_lifecycle,
	.inspect_sample = pg_inspect_sample,
};
