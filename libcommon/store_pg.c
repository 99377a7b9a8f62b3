/* SPDX-License-Identifier: MIT */
/*
 * store_pg.c: the PostgreSQL backend's ops table (rb_store_pg_ops) and its
 * connection: open, close, reconnect, LISTEN/NOTIFY, libpq's version.  The work is in the
 * files by job (store_pg_int.h lists them) over one exec/error layer
 * (store_pg_exec.c); the set-up script and the server-side functions
 * (publish, claim, complete, fail, extend, relinquish, and the roles' grants)
 * are in schema_pg.sql.  The hot path is one round
 * trip per operation:
 *   publish  = SELECT relaybus_publish_batch($1)           (one transaction)
 *   claim    = SELECT relaybus_claim(...)                  (one transaction)
 *   complete = DELETE ... USING unnest($arrays), lanes     (one statement)
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
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_url.h"

/* Every statement of struct pg_be, rendered for the schema at open. */
static const struct {
	size_t		 at;	/* offsetof the char * in struct pg_be */
	const char	*tmpl;
} pg_statements[] = {
	{ offsetof(struct pg_be, q_publish), pg_tmpl_publish },
	{ offsetof(struct pg_be, q_claim), pg_tmpl_claim },
	{ offsetof(struct pg_be, q_claim_ids), pg_tmpl_claim_ids },
	{ offsetof(struct pg_be, q_fetch), pg_tmpl_fetch },
	{ offsetof(struct pg_be, q_extend), pg_tmpl_extend },
	{ offsetof(struct pg_be, q_complete), pg_tmpl_complete },
	{ offsetof(struct pg_be, q_complete_hist), pg_tmpl_complete_hist },
	{ offsetof(struct pg_be, q_fail), pg_tmpl_fail },
	{ offsetof(struct pg_be, q_relinquish), pg_tmpl_relinquish },
	{ offsetof(struct pg_be, q_relinquish_owner), pg_tmpl_relinquish_owner },
	{ offsetof(struct pg_be, q_relinquish_leases), pg_tmpl_relinquish_leases },
	{ offsetof(struct pg_be, q_lock_lane), pg_tmpl_lock_lane },
};
#define N_STATEMENTS	(sizeof pg_statements / sizeof pg_statements[0])

static char **
statement(struct pg_be *be, size_t i)
{
	return (char **)((char *)be + pg_statements[i].at);
}

/* ---- connection ---------------------------------------------------------- */

static int
pg_connect(struct rb_store *s, struct rb_error *err)
{
	pg_be(s)->prepared = 0;
	return pg_connect_to(s, &pg_be(s)->conn, err);
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

static int
pg_open(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = xcalloc(1, sizeof *be);

	s->be = be;
	be->history = -1;
	new_holder(be->holder, sizeof be->holder);
	rb_sb_init(&be->claim_live);
	rb_sb_init(&be->claim_live_lanes);
	for (size_t i = 0; i < N_STATEMENTS; i++)
		*statement(be, i) = pg_render(pg_statements[i].tmpl, s->schema);
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
	free(be->claim_live.s);
	free(be->claim_live_lanes.s);
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

static int pg_listen(struct rb_store *, struct rb_error *);

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
	be->claim_pending = false;
	pg_complete_forget(be);
	if (pg_connect(s, err) < 0)
		return -1;
	if (be->listening)
		return pg_listen(s, err);
	return 0;
}

/* ---- wake-up ------------------------------------------------------------- */

static int
pg_listen(struct rb_store *s, struct rb_error *err)
{
	char sql[128];

	snprintf(sql, sizeof sql, "LISTEN relaybus_%s", s->schema);
	if (pg_run_cmd(s, sql, "listen", err) < 0)
		return -1;
	pg_be(s)->listening = true;
	return 0;
}

static int
pg_socket(const struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	return be != NULL && be->conn != NULL ? PQsocket(be->conn) : -1;
}

static int
pg_notified(struct rb_store *s, const char *handler, int timeout_ms, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGnotify *n;
	int hit = 0;

	if (timeout_ms > 0) {
		struct pollfd pfd = { .fd = PQsocket(be->conn), .events = POLLIN };
		int pr = poll(&pfd, 1, timeout_ms);

		if (pr < 0 && errno != EINTR)
			return rb_seterr(err, RB_EXIT_OSERR, "poll: %s", strerror(errno));
	}
	if (PQconsumeInput(be->conn) == 0) {
		char msg[300];

		snprintf(msg, sizeof msg, "%s", PQerrorMessage(be->conn));
		msg[strcspn(msg, "\n")] = '\0';
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "connection lost: %s", msg);
	}
	while ((n = PQnotifies(be->conn)) != NULL) {
		if (handler == NULL || strcmp(n->extra, handler) == 0)
			hit = 1;
		PQfreemem(n);
	}
	return hit;
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
	.setup = pg_setup,
	.setup_script = pg_setup_script,
	.schema_info = pg_schema_info,
	.publish = pg_publish,
	.claim = pg_claim,
	.claim_send = pg_claim_send,
	.claim_recv = pg_claim_recv,
	.complete_send = pg_complete_send,
	.complete_recv = pg_complete_recv,
	.extend = pg_extend,
	.complete = pg_complete,
	.relinquish = pg_relinquish,
	.relinquish_owner = pg_relinquish_owner,
	.relinquish_leases = pg_relinquish_leases,
	.listen = pg_listen,
	.socket = pg_socket,
	.fetch_send = pg_fetch_send,
	.fetch_recv = pg_fetch_recv,
	.fetch_socket = pg_fetch_socket,
	.complete_socket = pg_complete_socket,
	.notified = pg_notified,
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
