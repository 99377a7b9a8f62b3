/* SPDX-License-Identifier: MIT */
/*
 * store_pg.c: the PostgreSQL backend, the only file of the delivery path
 * that includes libpq-fe.h.  The set-up script and the server-side
 * functions (publish, claim, complete, fail, extend, relinquish) are in
 * schema_pg.sql; this file renders them for a schema, runs them with
 * parameters only, and turns rows into JSON.  The hot path is one round
 * trip per operation:
 *   publish  = SELECT relaybus_publish_batch($1)           (one transaction)
 *   claim    = SELECT relaybus_claim(...)                  (one transaction)
 *   complete = SELECT relaybus_complete_batch($arrays)     (one statement)
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_pg.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"

extern const char rb_schema_pg_sql[];
extern const char rb_schema_history_pg_sql[];

#define SETUP_LOCK_KEY	"7166535398124000001"

struct fence_arrays;

struct pg_be {
	PGconn	*conn;
	bool	 listening;
	int	 history;	/* -1 unknown, 0 no completion history, 1 yes */
	/* rendered statements, built once per store */
	char	*q_publish, *q_claim, *q_extend, *q_complete, *q_complete_hist, *q_fail,
		*q_relinquish, *q_relinquish_owner, *q_relinquish_leases, *q_lock_lane;
	/* a claim sent and not collected yet (rb_store_claim_send) */
	bool	 claim_pending;
	/* a completion sent and not collected yet (rb_store_complete_send) */
	bool	 complete_pending, complete_hist;
	int	 complete_tries;
	struct rb_dl *const *complete_v;	/* what it completes (the caller's) */
	size_t	 complete_n;
	struct fence_arrays *complete_fa;	/* its parameters, kept for a retry */
	int	 claim_tries;
	char	 claim_params[5][256];	/* its parameters, kept for a retry */
	struct rb_sbuf claim_live;	/* ... and the sixth: p_live ("{1,2}") */
	struct rb_sbuf claim_live_lanes;	/* ... and the ninth (claim ids only): their lanes */
	bool	 claim_lanes_known;
	bool	 claim_live_known;
	bool	 claim_quiet;		/* ... and the seventh: p_search false */
	bool	 claim_text;		/* rb_claim_opts.line_text */
	char	 claim_chain[16];	/* ... and the eighth: p_chain */
	unsigned prepared;		/* hot statements prepared on this connection (bits) */
	bool	 claim_apart;		/* rb_claim_opts.apart: relaybus_claim_ids */
	char	*q_claim_ids, *q_fetch;
	/* the second connection, for rb_store_fetch_send (opened on first use) */
	PGconn	*conn2;
	unsigned prepared2;
	bool	 fetch_pending, fetch_text;
	struct rb_dl *const *fetch_v;	/* what the fetch out reads the events of (the caller's) */
	size_t	 fetch_n;
	/* the third, for completions sent apart (rb_store_complete_send) */
	PGconn	*conn3;
	unsigned prepared3;
	bool	 complete_apart;	/* the completion out is on conn3 */
};

static void complete_async_free(struct pg_be *);
static struct rb_dl **claimed_dls(PGresult *);
static struct rb_dl **claim_dls(PGresult *, bool);

/* ---- text helpers ------------------------------------------------------ */

/* Replace @S@ by the quoted schema and @CHAN@ by the channel name. */
static char *
render(const char *tmpl, const char *schema)
{
	char quoted[64], chan[64];
	size_t cap = strlen(tmpl) * 2 + 256, n = 0;
	char *out = xmalloc(cap);
	const char *p = tmpl;

	snprintf(quoted, sizeof quoted, "\"%s\"", schema);
	snprintf(chan, sizeof chan, "relaybus_%s", schema);
	while (*p != '\0') {
		const char *rep = NULL;
		size_t skip = 0;

		if (strncmp(p, "@S@", 3) == 0) {
			rep = quoted;
			skip = 3;
		} else if (strncmp(p, "@CHAN@", 6) == 0) {
			rep = chan;
			skip = 6;
		}
		size_t need = rep != NULL ? strlen(rep) : 1;
		if (n + need + 1 > cap) {
			cap = (cap + need) * 2;
			out = xrealloc(out, cap);
		}
		if (rep != NULL) {
			memcpy(out + n, rep, need);
			n += need;
			p += skip;
		} else {
			out[n++] = *p++;
		}
	}
	out[n] = '\0';
	return out;
}


/* Append a text[] element, quoted, or NULL. */
static void
sb_array_text(struct rb_sbuf *b, const char *v)
{
	if (b->len > 1)
		rb_sb_puts(b, ",");
	if (v == NULL) {
		rb_sb_puts(b, "NULL");
		return;
	}
	rb_sb_puts(b, "\"");
	for (;;) {
		size_t run = strcspn(v, "\"\\");

		rb_sb_putn(b, v, run);
		v += run;
		if (*v == '\0')
			break;
		rb_sb_putn(b, "\\", 1);
		rb_sb_putn(b, v++, 1);
	}
	rb_sb_puts(b, "\"");
}

/* Append "," (unless first) and v in decimal: a claim lists hundreds. */
static void
sb_list_int(struct rb_sbuf *b, bool first, int64_t v)
{
	char num[24];
	size_t n = 0;

	if (!first)
		num[n++] = ',';
	n += rb_fmt_int(num + n, v);
	rb_sb_putn(b, num, n);
}

static void
sb_array_int(struct rb_sbuf *b, int64_t v)
{
	sb_list_int(b, b->len <= 1, v);
}

/* A SQL string literal (standard_conforming_strings) for --print-sql. */
static void
sb_literal(struct rb_sbuf *b, const char *v)
{
	rb_sb_puts(b, "'");
	for (; *v != '\0'; v++) {
		if (*v == '\'')
			rb_sb_putn(b, "'", 1);
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

/* ---- errors -------------------------------------------------------------- */

static struct pg_be *
be_of(const struct rb_store *s)
{
	return s->be;
}

/* Map a failed result (or a NULL one) to an exit code and message. */
static int
pg_fail_on(struct rb_store *s, PGconn *c, PGresult *res, const char *what, struct rb_error *err)
{
	const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *primary = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char msg[400];
	int code = RB_EXIT_SOFTWARE;

	if (primary == NULL)
		primary = c != NULL ? PQerrorMessage(c) : "not connected";
	snprintf(msg, sizeof msg, "%s", primary);
	msg[strcspn(msg, "\n")] = '\0';
	if (c == NULL || PQstatus(c) == CONNECTION_BAD)
		code = RB_EXIT_TEMPFAIL;
	else if (state == NULL)
		code = RB_EXIT_SOFTWARE;
	else if (strcmp(state, "42P01") == 0 || strcmp(state, "42883") == 0 ||
	    strcmp(state, "3F000") == 0) {
		rb_seterr(err, RB_EXIT_CONFIG, "%s: schema \"%s\" is not set up (%s): run rb-setup",
		    what, s->schema, msg);
		return -1;
	} else if (strncmp(state, "08", 2) == 0 || strncmp(state, "40", 2) == 0 ||
	    strncmp(state, "53", 2) == 0 || strncmp(state, "57", 2) == 0)
		code = RB_EXIT_TEMPFAIL;
	else if (strcmp(state, "42501") == 0)
		code = RB_EXIT_NOPERM;
	else if (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0)
		code = RB_EXIT_DATAERR;
	return rb_seterr(err, code, "%s: %s", what, msg);
}

static int
pg_fail(struct rb_store *s, PGresult *res, const char *what, struct rb_error *err)
{
	return pg_fail_on(s, be_of(s)->conn, res, what, err);
}

static bool
retryable(PGresult *res)
{
	const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	return state != NULL && (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
}

/* The hot statements (claim, completion) are prepared once per connection,
 * on first use, and then only bound and run: parsing and planning the
 * completion took 0.33 ms a call, a tenth of the server's time in a drain.
 * Returns the statement's name, or NULL for any other statement or when
 * preparing failed (the caller then sends the text, which reports the
 * error as before). */
static const char *
prepared(struct pg_be *be, PGconn *c, const char *sql, int n)
{
	static const char *const names[] = { "relaybus_claim", "relaybus_complete", "relaybus_complete_hist",
	    "relaybus_claim_ids", "relaybus_fetch" };
	const char *const qs[] = { be->q_claim, be->q_complete, be->q_complete_hist, be->q_claim_ids,
	    be->q_fetch };
	unsigned *mask = c == be->conn2 ? &be->prepared2 : c == be->conn3 ? &be->prepared3 : &be->prepared;
	int which = -1;
	PGresult *res;
	bool ok;

	for (int i = 0; i < (int)(sizeof names / sizeof names[0]) && which < 0; i++)
		if (sql == qs[i])
			which = i;
	if (which < 0)
		return NULL;
	if (*mask & (1u << which))
		return names[which];
	res = PQprepare(c, names[which], sql, n, NULL);
	ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK;
	PQclear(res);
	if (!ok)
		return NULL;
	*mask |= 1u << which;
	return names[which];
}

static PGresult *
exec_on(struct pg_be *be, PGconn *c, const char *sql, int n, const char *const *params)
{
	const char *name = prepared(be, c, sql, n);

	return name != NULL ? PQexecPrepared(c, name, n, params, NULL, NULL, 0)
	    : PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
}

static int
send_q(struct pg_be *be, PGconn *c, const char *sql, int n, const char *const *params)
{
	const char *name = prepared(be, c, sql, n);

	return name != NULL ? PQsendQueryPrepared(c, name, n, params, NULL, NULL, 0)
	    : PQsendQueryParams(c, sql, n, NULL, params, NULL, NULL, 0);
}

/* Run a parameterized statement (text params) on connection c; retries a
 * deadlock or a serialization failure a few times when it runs in its own
 * transaction. */
static PGresult *
run_on(struct rb_store *s, PGconn *c, const char *sql, int n, const char *const *params,
    ExecStatusType want, const char *what, bool retry, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	PGresult *res = NULL;

	for (int attempt = 0; attempt < (retry ? 5 : 1); attempt++) {
		PQclear(res);
		res = exec_on(be, c, sql, n, params);
		if (res != NULL && PQresultStatus(res) == want)
			return res;
		if (!retryable(res))
			break;
	}
	pg_fail_on(s, c, res, what, err);
	PQclear(res);
	return NULL;
}

/* run_on the main connection */
static PGresult *
run(struct rb_store *s, const char *sql, int n, const char *const *params, ExecStatusType want,
    const char *what, bool retry, struct rb_error *err)
{
	return run_on(s, be_of(s)->conn, sql, n, params, want, what, retry, err);
}

/* Run a statement that returns the number of rows it changed (the lane
 * functions of schema_pg.sql); returns that number, or -1. */
static int
run_affected(struct rb_store *s, const char *sql, int n, const char *const *params, const char *what,
    struct rb_error *err)
{
	PGresult *res = run(s, sql, n, params, PGRES_TUPLES_OK, what, true, err);
	int rows;

	if (res == NULL)
		return -1;
	rows = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
	PQclear(res);
	return rows;
}

static int
run_cmd(struct rb_store *s, const char *sql, const char *what, struct rb_error *err)
{
	PGresult *res = PQexec(be_of(s)->conn, sql);
	int rc = 0;

	if (res == NULL || (PQresultStatus(res) != PGRES_COMMAND_OK &&
	    PQresultStatus(res) != PGRES_TUPLES_OK))
		rc = pg_fail(s, res, what, err);
	PQclear(res);
	return rc;
}

static void
rollback_quietly(struct rb_store *s)
{
	PGresult *res = PQexec(be_of(s)->conn, "ROLLBACK");

	PQclear(res);
}

/* ---- connection ---------------------------------------------------------- */

/* What the server says outside an answer (a NOTICE, a WARNING, the FATAL
 * of a terminated backend) goes through our log, so that -q means quiet:
 * libpq would print it to stderr itself. */
static void
notice_to_log(void *arg, const char *msg)
{
	int len = (int)strcspn(msg, "\n");

	(void)arg;
	if (strncmp(msg, "WARNING", 7) == 0)
		rb_warn("server: %.*s", len, msg);
	else
		rb_info("server: %.*s", len, msg);
}

static int
connect_to(struct rb_store *s, PGconn **conn, struct rb_error *err)
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
	PQsetNoticeProcessor(*conn, notice_to_log, NULL);
	if (PQstatus(*conn) != CONNECTION_OK) {
		char msg[400];

		snprintf(msg, sizeof msg, "%s", PQerrorMessage(*conn));
		msg[strcspn(msg, "\n")] = '\0';
		return rb_seterr(err, RB_EXIT_UNAVAILABLE, "cannot connect to %s: %s",
		    s->url_redacted, msg);
	}
	return 0;
}

static int
pg_connect(struct rb_store *s, struct rb_error *err)
{
	be_of(s)->prepared = 0;
	return connect_to(s, &be_of(s)->conn, err);
}

/* The second and third connections go with the first: closed with it,
 * and with them whatever was out on them. */
static void
close_conn3(struct pg_be *be)
{
	if (be->conn3 != NULL)
		PQfinish(be->conn3);
	be->conn3 = NULL;
	be->prepared3 = 0;
	if (be->complete_apart)
		complete_async_free(be);
	be->complete_apart = false;
}

static void
close_conn2(struct pg_be *be)
{
	if (be->conn2 != NULL)
		PQfinish(be->conn2);
	be->conn2 = NULL;
	be->prepared2 = 0;
	be->fetch_pending = false;
	be->fetch_v = NULL;
	be->fetch_n = 0;
}

/* publish: one row per event, in input order */
static const char q_publish_tmpl[] =
    "SELECT event_id, deliveries, duplicate, array_to_json(handlers)::text "
    "FROM @S@.relaybus_publish_batch($1::jsonb) ORDER BY ord";

static int
pg_open(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = xcalloc(1, sizeof *be);
	const char *sc = s->schema;

	s->be = be;
	be->history = -1;
	rb_sb_init(&be->claim_live);
	rb_sb_init(&be->claim_live_lanes);
	be->q_publish = render(q_publish_tmpl, sc);
	be->q_claim = render(
	    "SELECT id, event_id, handler, lane, epoch, claims, attempts, name, key, sequence, "
	    "payload::text, headers::text, created_at "
	    "FROM @S@.relaybus_claim($1, $2, $3::integer, $4::bigint, $5::integer, $6::bigint[], $7::boolean, $8::integer, "
	    "$9::smallint[])", sc);
	be->q_claim_ids = render("SELECT id, event_id, handler, lane, epoch, claims, attempts, sequence, created_at "
	    "FROM @S@.relaybus_claim_ids($1, $2, $3::integer, $4::bigint, $5::integer, $6::bigint[], $7::boolean, $8::integer, "
	    "$9::smallint[])", sc);
	/* the events of what a claim took, on the second connection, by the
	 * position of their event id in $1 (the connection runs with
	 * enable_seqscan off, as the claim does: young tables have no
	 * statistics) */
	be->q_fetch = render(
	    "SELECT p.o, e.name, e.key, e.payload::text, e.headers::text "
	    "FROM unnest($1::text[]) WITH ORDINALITY p(eid, o) "
	    "CROSS JOIN LATERAL (SELECT * FROM @S@.relaybus_worker_events ee WHERE ee.id = p.eid OFFSET 0) e", sc);
	/* (a worker role has no table privilege: what the delivery path
	 * writes goes through the functions of schema_pg.sql, "Roles") */
	be->q_extend = render("SELECT @S@.relaybus_extend($1, $2, $3::bigint)", sc);
/* Completion: relaybus_complete_batch (schema_pg.sql), one statement
 * fenced by lane epoch, in_flight membership and claims; each row deleted
 * returns the position of its result.  It writes the history rows itself
 * when the schema keeps them (a worker role cannot leave them out), so
 * both statements are the same call. */
#define COMPLETE_CALL \
	"SELECT ord FROM @S@.relaybus_complete_batch($1::text[], $2::text[], $3::smallint[], $4::bigint[], " \
	"$5::integer[], $6::bigint[])"
	be->q_complete = render(COMPLETE_CALL, sc);
	be->q_complete_hist = render(COMPLETE_CALL, sc);
	be->q_fail = render(
	    "SELECT ord, outcome, attempts, missing FROM @S@.relaybus_fail($1::text[], $2::text[], "
	    "$3::smallint[], $4::bigint[], $5::integer[], $6::text[], $7::bigint[], $8::text[], "
	    "$9::integer, $10::bigint, $11::bigint, $12::double precision) ORDER BY ord", sc);
	be->q_relinquish = render("SELECT @S@.relaybus_relinquish($1, $2)", sc);
	be->q_relinquish_owner = render("SELECT @S@.relaybus_relinquish_owner($1, $2)", sc);
	be->q_relinquish_leases = render(
	    "SELECT @S@.relaybus_relinquish_leases($1::text[], $2::smallint[], $3::bigint[])", sc);
	/* (a row when the lane row is locked KEY SHARE at that epoch) */
	be->q_lock_lane = render("SELECT 1 WHERE @S@.relaybus_lock_lane($1, $2::smallint, $3::bigint)", sc);
	return pg_connect(s, err);
}

static void
pg_close(struct rb_store *s)
{
	struct pg_be *be = be_of(s);

	if (be == NULL)
		return;
	if (be->conn != NULL)
		PQfinish(be->conn);
	close_conn2(be);
	close_conn3(be);
	complete_async_free(be);
	free(be->q_publish);
	free(be->q_claim_ids);
	free(be->q_fetch);
	free(be->claim_live.s);
	free(be->claim_live_lanes.s);
	free(be->q_claim);
	free(be->q_extend);
	free(be->q_complete);
	free(be->q_complete_hist);
	free(be->q_fail);
	free(be->q_relinquish);
	free(be->q_relinquish_owner);
	free(be->q_relinquish_leases);
	free(be->q_lock_lane);
	free(be);
	s->be = NULL;
}

static bool
pg_broken(const struct rb_store *s)
{
	struct pg_be *be = be_of(s);

	return be == NULL || be->conn == NULL || PQstatus(be->conn) != CONNECTION_OK;
}

static int pg_listen(struct rb_store *, struct rb_error *);

static int
pg_reconnect(struct rb_store *s, struct rb_error *err)
{
	struct pg_be *be = be_of(s);

	/* be->listening survives failed attempts: the next good connection
	 * listens again */
	if (be->conn != NULL)
		PQfinish(be->conn);
	be->conn = NULL;
	close_conn2(be);
	close_conn3(be);
	be->history = -1;
	be->claim_pending = false;
	complete_async_free(be);
	if (pg_connect(s, err) < 0)
		return -1;
	if (be->listening)
		return pg_listen(s, err);
	return 0;
}

/* ---- set-up -------------------------------------------------------------- */

static void
setup_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o, bool with_subs)
{
	char *sql;

	rb_sb_puts(b, "SELECT pg_advisory_xact_lock(" SETUP_LOCK_KEY ");\n");
	sql = render(rb_schema_pg_sql, schema);
	rb_sb_puts(b, sql);
	free(sql);
	if (o->completion_history) {
		sql = render(rb_schema_history_pg_sql, schema);
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
		q = render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) VALUES (", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, ", ");
		sb_literal(b, p);
		rb_sb_puts(b, ", ");
		sb_literal(b, like);
		rb_sb_puts(b, ") ON CONFLICT DO NOTHING;\n");
		q = render("SELECT @S@.relaybus_seed_lanes(", schema);
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
		q = render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = ", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, " AND pattern = ");
		sb_literal(b, p);
		rb_sb_puts(b, ";\n");
		free(buf);
	}
	rb_pg_grants_script(b, schema, o);	/* last: it covers every function made above */
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
rb_setup_sql(const char *schema, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;

	if (schema == NULL || !rb_ident_valid(schema)) {
		rb_seterr(err, RB_EXIT_USAGE, "invalid schema name");
		return NULL;
	}
	if (check_subscriptions(o, err) < 0)
		return NULL;
	rb_sb_init(&b);
	rb_sb_puts(&b, "-- relaybus schema set-up; apply in one transaction with the workers stopped\n"
	    "BEGIN;\n");
	setup_script(&b, schema, o, true);
	rb_sb_puts(&b, "COMMIT;\n");
	return b.s;
}

static int
pg_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;
	int rc = -1;

	if (check_subscriptions(o, err) < 0)
		return -1;
	rb_sb_init(&b);
	setup_script(&b, s->schema, o, false);
	if (run_cmd(s, "BEGIN", "set-up", err) < 0)
		goto out;
	/* quiet the NOTICEs of CREATE ... IF NOT EXISTS on a second run */
	if (run_cmd(s, "SET LOCAL client_min_messages = warning", "set-up", err) < 0 ||
	    run_cmd(s, b.s, "set-up", err) < 0)
		goto fail;
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf, *like, *q1, *q2;
		const char *h, *p;

		rb_subscription_parse(o->subscribe[i], &buf, &h, &p, NULL);
		like = glob_to_like(p);
		const char *params[3] = { h, p, like };
		q1 = render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) "
		    "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", s->schema);
		q2 = render("SELECT @S@.relaybus_seed_lanes($1)", s->schema);
		PGresult *r1 = run(s, q1, 3, params, PGRES_COMMAND_OK, "subscribe", false, err);
		PGresult *r2 = r1 != NULL ? run(s, q2, 1, params, PGRES_TUPLES_OK, "subscribe", false, err) : NULL;
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
		q = render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = $1 AND pattern = $2", s->schema);
		PGresult *r = run(s, q, 2, params, PGRES_COMMAND_OK, "unsubscribe", false, err);
		bool ok = r != NULL;
		PQclear(r);
		free(q);
		free(buf);
		if (!ok)
			goto fail;
	}
	/* last: the privileges of every function made above */
	if (rb_pg_grants_setup(s, o, err) < 0)
		goto fail;
	if (run_cmd(s, "COMMIT", "set-up", err) < 0)
		goto out;
	rc = 0;
	goto out;
fail:
	rollback_quietly(s);
out:
	free(b.s);
	return rc;
}

/* ---- publish ------------------------------------------------------------- */

static void
pg_clear_result(void *res)
{
	PQclear(res);
}

/* The acks of a publish statement's result (which they then own). */
static int
acks_of_result(PGresult *res, size_t n, struct rb_publish_acks *acks, struct rb_error *err)
{
	if ((size_t)PQntuples(res) != n) {
		int got = PQntuples(res);

		PQclear(res);
		return rb_seterr(err, RB_EXIT_SOFTWARE, "publish: %d outcomes for %zu events", got, n);
	}
	acks->v = xcalloc(n > 0 ? n : 1, sizeof *acks->v);
	acks->n = n;
	acks->priv = res;
	acks->free_priv = pg_clear_result;
	for (size_t i = 0; i < n; i++) {
		acks->v[i].id = PQgetvalue(res, (int)i, 0);
		acks->v[i].deliveries = atoi(PQgetvalue(res, (int)i, 1));
		acks->v[i].duplicate = PQgetvalue(res, (int)i, 2)[0] == 't';
		acks->v[i].handlers = PQgetvalue(res, (int)i, 3);
	}
	return 0;
}

static int
pg_publish(struct rb_store *s, const char *events, size_t n, struct rb_publish_acks *acks,
    struct rb_error *err)
{
	const char *params[1] = { events };
	PGresult *res;

	res = run(s, be_of(s)->q_publish, 1, params, PGRES_TUPLES_OK, "publish", true, err);
	if (res == NULL)
		return -1;
	return acks_of_result(res, n, acks, err);
}

int
rb_pg_publish(PGconn *conn, const char *schema, const json_t *event, json_t **ack,
    struct rb_error *err)
{
	struct rb_store s = { .ops = &rb_store_pg_ops };
	struct pg_be be = { .conn = conn, .history = -1 };
	struct rb_publish_acks acks = { 0 };
	json_t *arr;
	char *text;
	int rc = -1;

	*ack = NULL;
	if (schema == NULL)
		schema = RB_DEFAULT_SCHEMA;
	if (!rb_ident_valid(schema))
		return rb_seterr(err, RB_EXIT_USAGE, "invalid schema name");
	if (rb_event_validate(event, err) < 0)
		return -1;
	s.schema = (char *)schema;
	s.be = &be;
	be.q_publish = render(q_publish_tmpl, schema);
	arr = json_pack("[O]", event);
	text = json_dumps(arr, JSON_COMPACT);
	/* no retry: the statement runs in the caller's transaction */
	const char *params[1] = { text };
	PGresult *res = PQexecParams(conn, be.q_publish, 1, NULL, params, NULL, NULL, 0);
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		pg_fail(&s, res, "publish", err);
		PQclear(res);
	} else if (acks_of_result(res, 1, &acks, err) == 0) {
		json_t *a = rb_publish_acks_json(&acks);

		*ack = json_incref(json_array_get(a, 0));
		json_decref(a);
		rb_publish_acks_clear(&acks);
		rc = 0;
	}
	free(text);
	json_decref(arr);
	free(be.q_publish);
	return rc;
}

/* ---- claim --------------------------------------------------------------- */

static json_t *
json_or_null(const char *text)
{
	json_t *v = text != NULL ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;

	return v != NULL ? v : json_null();
}

/* The claim's parameters, as text, in be->claim_params (the caller checked
 * that handler and owner fit); the sixth, the ids still running, is NULL
 * when the caller does not know them. */
static void
claim_params(struct pg_be *be, const struct rb_claim_opts *o, const char *params[9])
{
	snprintf(be->claim_params[0], sizeof be->claim_params[0], "%s", o->handler);
	snprintf(be->claim_params[1], sizeof be->claim_params[1], "%s", o->owner);
	snprintf(be->claim_params[2], sizeof be->claim_params[2], "%d", o->batch);
	snprintf(be->claim_params[3], sizeof be->claim_params[3], "%" PRId64, o->lease_ms);
	snprintf(be->claim_params[4], sizeof be->claim_params[4], "%d", o->max_attempts);
	for (int i = 0; i < 5; i++)
		params[i] = be->claim_params[i];
	be->claim_live.len = 0;
	be->claim_live_known = o->live != NULL;
	if (o->live != NULL) {
		rb_sb_puts(&be->claim_live, "{");
		for (size_t i = 0; i < o->n_live; i++)
			sb_list_int(&be->claim_live, i == 0, o->live[i]);
		rb_sb_puts(&be->claim_live, "}");
	}
	params[5] = be->claim_live_known ? be->claim_live.s : NULL;
	be->claim_live_lanes.len = 0;
	be->claim_lanes_known = o->live != NULL && o->live_lanes != NULL;
	if (be->claim_lanes_known) {
		rb_sb_puts(&be->claim_live_lanes, "{");
		for (size_t i = 0; i < o->n_live; i++)
			sb_list_int(&be->claim_live_lanes, i == 0, o->live_lanes[i]);
		rb_sb_puts(&be->claim_live_lanes, "}");
	}
	params[8] = be->claim_lanes_known ? be->claim_live_lanes.s : NULL;
	be->claim_quiet = o->no_search;
	be->claim_text = o->line_text;
	params[6] = be->claim_quiet ? "false" : "true";
	snprintf(be->claim_chain, sizeof be->claim_chain, "%d", o->chain > 1 ? o->chain : 1);
	params[7] = be->claim_chain;
}

/* Append a JSON string, or null for NULL. */
static void
sb_str(struct rb_sbuf *b, const char *v)
{
	if (v == NULL)
		rb_sb_putn(b, "null", 4);
	else
		rb_json_sb_string(b, v, strlen(v));
}

/* One claimed delivery's columns, as text (NULL: SQL NULL). */
struct dcols {
	const char	*id, *event_id, *handler, *name, *key, *sequence, *payload, *headers, *created_at;
	int		 lane, attempts;
	int64_t		 epoch, claims;
};

/* A delivery's line (b: reset first), made from the columns as they come
 * (the jsonb text compacted), never parsed: rb-dispatch spent a third of
 * its time parsing payloads only to print them again.  The members are
 * in the order the delivery objects have them. */
static void
line_of(const struct dcols *c, const char *token, struct rb_sbuf *b)
{
	char num[32];

	b->len = 0;
	rb_sb_puts(b, "{\"event_id\":");
	sb_str(b, c->event_id);
	rb_sb_puts(b, ",\"handler\":");
	sb_str(b, c->handler);
	rb_sb_puts(b, ",\"name\":");
	sb_str(b, c->name);
	rb_sb_puts(b, ",\"key\":");
	sb_str(b, c->key);
	for (int k = 0; k < 2; k++) {
		const char *v = k == 0 ? c->payload : c->headers;

		rb_sb_puts(b, k == 0 ? ",\"payload\":" : ",\"headers\":");
		if (v == NULL)
			rb_sb_puts(b, "null");
		else
			rb_json_sb_compact(b, v, strlen(v));
	}
	rb_sb_puts(b, ",\"attempt\":");
	rb_sb_putn(b, num, rb_fmt_int(num, c->attempts + 1));
	rb_sb_puts(b, ",\"lease\":\"");
	rb_sb_puts(b, token);
	rb_sb_puts(b, "\",\"created_at\":");
	sb_str(b, c->created_at);
	rb_sb_puts(b, ",\"delivery_id\":");
	sb_str(b, c->id);
	rb_sb_puts(b, ",\"lane\":");
	rb_sb_putn(b, num, rb_fmt_int(num, c->lane));
	rb_sb_puts(b, ",\"sequence\":");
	rb_sb_puts(b, c->sequence == NULL ? "null" : c->sequence);
	rb_sb_puts(b, "}\n");
}

/*
 * A delivery as a JSON object.  With text, it carries its whole line
 * (line_of) under RB_LINE_TEXT_KEY instead of payload and headers.
 * b: scratch.
 */
static json_t *
delivery_of(const struct dcols *c, bool text, struct rb_sbuf *b)
{
	struct rb_lease l = { .lane = c->lane, .epoch = c->epoch, .claims = c->claims };
	char token[64];
	json_t *d = json_object();

	rb_lease_format(&l, token, sizeof token);
	/* with text, only the members a caller works with (the rest are in the
	 * line): each one costs an allocation or three */
	json_object_set_new(d, "event_id", json_string(c->event_id));
	json_object_set_new(d, "handler", json_string(c->handler));
	if (!text)
		json_object_set_new(d, "name", json_string(c->name));
	json_object_set_new(d, "key", c->key == NULL ? json_null() : json_string(c->key));
	if (!text) {
		json_object_set_new(d, "payload", json_or_null(c->payload));
		json_object_set_new(d, "headers", json_or_null(c->headers));
	}
	json_object_set_new(d, "attempt", json_integer(c->attempts + 1));
	json_object_set_new(d, "lease", json_string(token));
	if (!text)
		json_object_set_new(d, "created_at", json_string(c->created_at));
	json_object_set_new(d, "delivery_id", json_string(c->id));
	json_object_set_new(d, "lane", json_integer(c->lane));
	if (!text)
		json_object_set_new(d, "sequence", c->sequence == NULL ? json_null() :
		    json_integer(strtoll(c->sequence, NULL, 10)));
	if (text) {
		line_of(c, token, b);
		json_object_set_new(d, RB_LINE_TEXT_KEY, json_stringn_nocheck(b->s, b->len));
	}
	return d;
}

/* A claimed delivery, without its event yet (rb_dl): one allocation. */
static struct rb_dl *
dl_new(const struct dcols *c)
{
	size_t le = strlen(c->event_id) + 1, lh = strlen(c->handler) + 1;
	size_t ls = c->sequence != NULL ? strlen(c->sequence) + 1 : 0;
	size_t lc = c->created_at != NULL ? strlen(c->created_at) + 1 : 0;
	struct rb_dl *d = xmalloc(sizeof *d + le + lh + ls + lc);
	char *p = (char *)(d + 1);
	struct rb_lease l = { .lane = c->lane, .epoch = c->epoch, .claims = c->claims };

	memset(d, 0, sizeof *d);
	d->id = strtoll(c->id, NULL, 10);
	d->epoch = c->epoch;
	d->claims = c->claims;
	d->lane = c->lane;
	d->attempt = c->attempts + 1;
	rb_lease_format(&l, d->lease, sizeof d->lease);
	memcpy(p, c->event_id, le);
	d->event_id = p;
	p += le;
	memcpy(p, c->handler, lh);
	d->handler = p;
	p += lh;
	if (c->sequence != NULL) {
		memcpy(p, c->sequence, ls);
		d->sequence = p;
		p += ls;
	}
	if (c->created_at != NULL) {
		memcpy(p, c->created_at, lc);
		d->created_at = p;
	}
	return d;
}

/* Its event's part (c: the claim's columns and the event's): the key and
 * the line (text) or the delivery object.  b: scratch. */
static void
dl_fill(struct rb_dl *d, const struct dcols *c, bool text, struct rb_sbuf *b)
{
	size_t lk = c->key != NULL ? strlen(c->key) + 1 : 0;

	if (text)
		line_of(c, d->lease, b);
	else {
		d->line = delivery_of(c, false, b);
		b->len = 0;
	}
	d->mem = xmalloc(lk + b->len + 1);
	if (c->key != NULL) {
		memcpy(d->mem, c->key, lk);
		d->key = d->mem;
	}
	if (text) {
		memcpy(d->mem + lk, b->s, b->len);
		d->mem[lk + b->len] = '\0';
		d->text = d->mem + lk;
		d->tlen = b->len;
	}
	d->fetched = true;
}

static const char *
col(const PGresult *res, int i, int c)
{
	return PQgetisnull(res, i, c) ? NULL : PQgetvalue(res, i, c);
}

/* Row i of a claim's result (relaybus_claim's columns). */
static struct dcols
claim_cols(const PGresult *res, int i)
{
	return (struct dcols){
		.id = col(res, i, 0), .event_id = col(res, i, 1), .handler = col(res, i, 2),
		.lane = atoi(PQgetvalue(res, i, 3)), .epoch = strtoll(PQgetvalue(res, i, 4), NULL, 10),
		.claims = strtoll(PQgetvalue(res, i, 5), NULL, 10), .attempts = atoi(PQgetvalue(res, i, 6)),
		.name = col(res, i, 7), .key = col(res, i, 8), .sequence = col(res, i, 9),
		.payload = col(res, i, 10), .headers = col(res, i, 11), .created_at = col(res, i, 12),
	};
}

/* The deliveries of a claim's result (relaybus_claim's columns). */
static json_t *
claim_rows(PGresult *res, bool text)
{
	json_t *arr = json_array();
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (int i = 0; i < PQntuples(res); i++) {
		struct dcols c = claim_cols(res, i);

		json_array_append_new(arr, delivery_of(&c, text, &b));
	}
	free(b.s);
	return arr;
}

/* The deliveries of a claim's result (relaybus_claim's columns), as rb_dl. */
static struct rb_dl **
claim_dls(PGresult *res, bool text)
{
	int n = PQntuples(res);
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (int i = 0; i < n; i++) {
		struct dcols c = claim_cols(res, i);

		v[i] = dl_new(&c);
		dl_fill(v[i], &c, text, &b);
	}
	free(b.s);
	return v;
}

static int
pg_claim(struct rb_store *s, const struct rb_claim_opts *o, json_t **out, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	const char *params[9];
	PGresult *res;

	claim_params(be, o, params);
	res = run(s, be->q_claim, 9, params, PGRES_TUPLES_OK, "claim", true, err);
	if (res == NULL)
		return -1;
	*out = claim_rows(res, o->line_text);
	PQclear(res);
	return (int)json_array_size(*out);
}

/* The connection is lost or refused the query: an error like run()'s. */
static int
send_failed(struct rb_store *s, const char *what, struct rb_error *err)
{
	be_of(s)->claim_pending = false;
	return pg_fail(s, NULL, what, err);
}

static int
pg_claim_send(struct rb_store *s, const struct rb_claim_opts *o, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	const char *params[9];

	if (be->claim_pending || (be->complete_pending && !be->complete_apart))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "claim: a statement is in progress already");
	claim_params(be, o, params);
	be->claim_tries = 1;
	be->claim_apart = o->apart;
	if (!send_q(be, be->conn, o->apart ? be->q_claim_ids : be->q_claim, 9, params))
		return send_failed(s, "claim", err);
	be->claim_pending = true;
	return 0;
}

/*
 * The answer to the statement out on c: RB_CLAIM_PENDING when it has not
 * arrived yet (only without wait), -1 when the connection broke before it
 * did, else 0 with *res (NULL: none) and c ready for the next statement.
 * An answer read in full before the connection broke is still taken: a
 * claim that committed has its deliveries.
 */
static int
take_result(PGconn *c, bool wait, PGresult **res)
{
	PGresult *more;

	if (!wait) {
		int alive = PQconsumeInput(c);

		if (PQisBusy(c))
			return !alive || PQstatus(c) == CONNECTION_BAD ? -1 : RB_CLAIM_PENDING;
	}
	*res = PQgetResult(c);
	while ((more = PQgetResult(c)) != NULL)
		PQclear(more);
	return 0;
}

static int
pg_claim_recv(struct rb_store *s, bool wait, struct rb_dl ***out, struct rb_error *err)
{
	struct pg_be *be = be_of(s);

	if (!be->claim_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "claim: no claim in progress");
	for (;;) {
		PGresult *res;
		int rc = take_result(be->conn, wait, &res);

		if (rc == RB_CLAIM_PENDING)
			return rc;
		if (rc < 0)
			return send_failed(s, "claim", err);
		be->claim_pending = false;
		if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK) {
			int n = PQntuples(res);

			*out = be->claim_apart ? claimed_dls(res) : claim_dls(res, be->claim_text);
			PQclear(res);
			return n;
		}
		/* a deadlock or serialization failure: the claim runs again, as run() does */
		if (retryable(res) && be->claim_tries < 5) {
			const char *params[9];

			PQclear(res);
			for (int i = 0; i < 5; i++)
				params[i] = be->claim_params[i];
			params[5] = be->claim_live_known ? be->claim_live.s : NULL;
			params[6] = be->claim_quiet ? "false" : "true";
			params[7] = be->claim_chain;
			params[8] = be->claim_lanes_known ? be->claim_live_lanes.s : NULL;
			be->claim_tries++;
			if (!send_q(be, be->conn, be->claim_apart ? be->q_claim_ids : be->q_claim, 9, params))
				return send_failed(s, "claim", err);
			be->claim_pending = true;
			continue;
		}
		pg_fail(s, res, "claim", err);
		PQclear(res);
		return -1;
	}
}

/* ---- reading what a claim took, on the second connection ------------------ */

/* Open a side connection (conn2, conn3) unless it is open and sound, and
 * run setup (NULL: nothing) on it; closed with close_fn when that fails. */
static int
open_side(struct rb_store *s, PGconn **c, void (*close_fn)(struct pg_be *), const char *setup,
    const char *what, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	PGresult *res;

	if (*c != NULL && PQstatus(*c) == CONNECTION_OK)
		return 0;
	close_fn(be);
	if (connect_to(s, c, err) < 0) {
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

/* What relaybus_claim_ids returned: the delivery rows without events. */
static struct rb_dl **
claimed_dls(PGresult *res)
{
	int n = PQntuples(res);
	struct rb_dl **v = xcalloc(n > 0 ? (size_t)n : 1, sizeof *v);

	for (int i = 0; i < n; i++) {
		struct dcols c = {
			.id = PQgetvalue(res, i, 0), .event_id = PQgetvalue(res, i, 1),
			.handler = PQgetvalue(res, i, 2), .lane = atoi(PQgetvalue(res, i, 3)),
			.epoch = strtoll(PQgetvalue(res, i, 4), NULL, 10),
			.claims = strtoll(PQgetvalue(res, i, 5), NULL, 10), .attempts = atoi(PQgetvalue(res, i, 6)),
			.sequence = col(res, i, 7), .created_at = PQgetvalue(res, i, 8),
		};

		v[i] = dl_new(&c);
	}
	return v;
}

/* A statement on a side connection (c: conn2, conn3) failed (res: its
 * error, or NULL): an error as run()'s, and the connection closed if it
 * broke. */
static int
side_failed(struct rb_store *s, PGconn *c, void (*close_fn)(struct pg_be *), PGresult *res,
    const char *what, struct rb_error *err)
{
	pg_fail_on(s, c, res, what, err);
	if (c != NULL && PQstatus(c) != CONNECTION_OK)
		close_fn(be_of(s));
	return -1;
}

static int
fetch_failed(struct rb_store *s, PGresult *res, struct rb_error *err)
{
	struct pg_be *be = be_of(s);

	be->fetch_pending = false;
	be->fetch_v = NULL;
	be->fetch_n = 0;
	return side_failed(s, be->conn2, close_conn2, res, "fetch", err);
}

static int
pg_fetch_send(struct rb_store *s, struct rb_dl *const *claimed, size_t n, bool text, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	struct rb_sbuf ids;
	const char *params[1];
	int ok;

	if (be->fetch_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "fetch: a fetch is in progress already");
	/* (with enable_seqscan off, as the claim runs: young tables have no
	 * statistics) */
	if (open_side(s, &be->conn2, close_conn2, "SET enable_seqscan = off", "fetch", err) < 0)
		return -1;
	rb_sb_init(&ids);
	rb_sb_puts(&ids, "{");
	for (size_t i = 0; i < n; i++)
		sb_array_text(&ids, claimed[i]->event_id);
	rb_sb_puts(&ids, "}");
	params[0] = ids.s;
	ok = send_q(be, be->conn2, be->q_fetch, 1, params);
	free(ids.s);
	if (!ok)
		return fetch_failed(s, NULL, err);
	be->fetch_pending = true;
	be->fetch_text = text;
	be->fetch_v = claimed;
	be->fetch_n = n;
	return 0;
}

static int
pg_fetch_recv(struct rb_store *s, bool wait, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	PGresult *res;
	struct rb_sbuf b;
	int rc, got = 0;

	if (!be->fetch_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "fetch: no fetch in progress");
	if ((rc = take_result(be->conn2, wait, &res)) == RB_CLAIM_PENDING)
		return rc;
	if (rc < 0)
		return fetch_failed(s, NULL, err);
	be->fetch_pending = false;
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		fetch_failed(s, res, err);
		PQclear(res);
		return -1;
	}
	/* each claimed delivery with its event (one that is gone is left as
	 * it is): the rows come in any order, each with its place */
	rb_sb_init(&b);
	for (int i = 0; i < PQntuples(res); i++) {
		long o = strtol(PQgetvalue(res, i, 0), NULL, 10);
		struct rb_dl *d = o >= 1 && (size_t)o <= be->fetch_n ? be->fetch_v[o - 1] : NULL;
		char id[32];
		struct dcols c;

		if (d == NULL || d->fetched)
			continue;
		id[rb_fmt_int(id, d->id)] = '\0';
		c = (struct dcols){
			.id = id, .event_id = d->event_id, .handler = d->handler, .lane = d->lane,
			.epoch = d->epoch, .claims = d->claims, .attempts = d->attempt - 1,
			.sequence = d->sequence, .created_at = d->created_at,
			.name = col(res, i, 1), .key = col(res, i, 2),
			.payload = col(res, i, 3), .headers = col(res, i, 4),
		};
		dl_fill(d, &c, be->fetch_text, &b);
		got++;
	}
	free(b.s);
	be->fetch_v = NULL;
	be->fetch_n = 0;
	PQclear(res);
	return got;
}

static int
pg_fetch_socket(const struct rb_store *s)
{
	struct pg_be *be = be_of(s);

	return be != NULL && be->conn2 != NULL && be->fetch_pending ? PQsocket(be->conn2) : -1;
}

static int
pg_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	char lease[32];
	const char *params[3] = { handler, owner, lease };

	snprintf(lease, sizeof lease, "%" PRId64, lease_ms);
	return run_affected(s, be_of(s)->q_extend, 3, params, "extend", err);
}

/* ---- complete ------------------------------------------------------------ */

static int
history_enabled(struct rb_store *s, PGconn *c, struct rb_error *err)
{
	struct pg_be *be = be_of(s);

	if (be->history < 0) {
		char *q = render("SELECT to_regclass('@S@.relaybus_completions') IS NOT NULL", s->schema);
		PGresult *res = run_on(s, c, q, 0, NULL, PGRES_TUPLES_OK, "complete", false, err);

		free(q);
		if (res == NULL)
			return -1;
		be->history = PQgetvalue(res, 0, 0)[0] == 't';
		PQclear(res);
	}
	return be->history;
}

struct fence_arrays {
	struct rb_sbuf ev, h, lane, epoch, claims, id;
};

static void
fa_init(struct fence_arrays *a)
{
	rb_sb_init(&a->ev);
	rb_sb_init(&a->h);
	rb_sb_init(&a->lane);
	rb_sb_init(&a->epoch);
	rb_sb_init(&a->claims);
	rb_sb_init(&a->id);
	rb_sb_puts(&a->id, "{");
	rb_sb_puts(&a->ev, "{");
	rb_sb_puts(&a->h, "{");
	rb_sb_puts(&a->lane, "{");
	rb_sb_puts(&a->epoch, "{");
	rb_sb_puts(&a->claims, "{");
}

static void
fa_add(struct fence_arrays *a, const json_t *r)
{
	struct rb_lease l;

	rb_lease_parse(json_string_value(json_object_get(r, "lease")), &l);
	sb_array_text(&a->ev, json_string_value(json_object_get(r, "event_id")));
	sb_array_text(&a->h, json_string_value(json_object_get(r, "handler")));
	sb_array_int(&a->lane, l.lane);
	sb_array_int(&a->epoch, l.epoch);
	sb_array_int(&a->claims, l.claims);
	{
		const char *id = json_string_value(json_object_get(r, "delivery_id"));
		int64_t v;

		if (id != NULL && rb_parse_int64(id, 1, INT64_MAX, &v) == 0)
			sb_array_int(&a->id, v);
		else
			sb_array_text(&a->id, NULL);
	}
}

static void
fa_add_dl(struct fence_arrays *a, const struct rb_dl *d)
{
	sb_array_text(&a->ev, d->event_id);
	sb_array_text(&a->h, d->handler);
	sb_array_int(&a->lane, d->lane);
	sb_array_int(&a->epoch, d->epoch);
	sb_array_int(&a->claims, d->claims);
	sb_array_int(&a->id, d->id);
}

static void
fa_close(struct fence_arrays *a)
{
	rb_sb_puts(&a->ev, "}");
	rb_sb_puts(&a->h, "}");
	rb_sb_puts(&a->lane, "}");
	rb_sb_puts(&a->epoch, "}");
	rb_sb_puts(&a->claims, "}");
	rb_sb_puts(&a->id, "}");
}

static void
fa_free(struct fence_arrays *a)
{
	free(a->ev.s);
	free(a->h.s);
	free(a->lane.s);
	free(a->epoch.s);
	free(a->claims.s);
	free(a->id.s);
}

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
	char *q = render("SELECT 1 WHERE @S@.relaybus_delivery_exists($1, $2)", s->schema);
	const char *params[2] = { event_id, handler };
	PGresult *res = run_on(s, c, q, 2, params, PGRES_TUPLES_OK, "complete", false, err);
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
	struct fence_arrays a;
	PGresult *res;
	int rc, hist = history_enabled(s, be_of(s)->conn, err);

	if (hist < 0)
		return -1;
	fa_init(&a);
	for (size_t k = 0; k < n; k++)
		fa_add(&a, json_array_get(results, idx[k]));
	fa_close(&a);
	const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };

	res = run(s, hist ? be_of(s)->q_complete_hist : be_of(s)->q_complete, 6, params,
	    PGRES_TUPLES_OK, "complete", true, err);
	fa_free(&a);
	if (res == NULL)
		return -1;
	rc = complete_outcomes(s, be_of(s)->conn, results, idx, n, res, outcomes, err);
	PQclear(res);
	return rc;
}

/* ---- completion in two steps (rb_store_complete_send) ---------------------------------- */

static void
complete_async_free(struct pg_be *be)
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
	const struct fence_arrays *a = be->complete_fa;
	const char *params[6] = { a->ev.s, a->h.s, a->lane.s, a->epoch.s, a->claims.s, a->id.s };

	return send_q(be, complete_conn(be), be->complete_hist ? be->q_complete_hist : be->q_complete, 6,
	    params);
}

/* The completion out failed (res: its error, or NULL: the connection
 * broke).  Apart, the third connection is closed when it broke, and the
 * claim on the first one is not touched. */
static int
complete_failed(struct rb_store *s, PGresult *res, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	bool apart = be->complete_apart;

	complete_async_free(be);
	if (!apart)
		return res != NULL ? pg_fail(s, res, "complete", err) : send_failed(s, "complete", err);
	return side_failed(s, be->conn3, close_conn3, res, "complete", err);
}

static int
pg_complete_send(struct rb_store *s, struct rb_dl *const *v, size_t n, bool apart, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	int hist;

	if (be->complete_pending || (!apart && be->claim_pending))
		return rb_seterr(err, RB_EXIT_SOFTWARE, "complete: a statement is in progress already");
	if (apart && open_side(s, &be->conn3, close_conn3, NULL, "complete", err) < 0)
		return -1;
	be->complete_apart = apart;
	if ((hist = history_enabled(s, complete_conn(be), err)) < 0) {
		if (apart && PQstatus(be->conn3) != CONNECTION_OK)
			close_conn3(be);
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

static int
pg_complete_recv(struct rb_store *s, bool wait, unsigned char *outcome, struct rb_error *err)
{
	struct pg_be *be = be_of(s);

	if (!be->complete_pending)
		return rb_seterr(err, RB_EXIT_SOFTWARE, "complete: no completion in progress");
	for (;;) {
		PGresult *res;
		int got = take_result(complete_conn(be), wait, &res);

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
					complete_async_free(be);
					return -1;
				}
				if (!ex)
					outcome[k] = RB_DL_MISSING;
			}
			complete_async_free(be);
			return 0;
		}
		/* a deadlock or serialization failure: the statement runs again, as run() does */
		if (retryable(res) && be->complete_tries < 5) {
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

static int
pg_complete_socket(const struct rb_store *s)
{
	struct pg_be *be = be_of(s);

	return be != NULL && be->complete_pending && be->complete_apart && be->conn3 != NULL ?
	    PQsocket(be->conn3) : -1;
}

/* Complete one result with the caller's SQL in the same transaction. */
static int
complete_sql(struct rb_store *s, const struct rb_complete_opts *o, const json_t *r, size_t i,
    json_t *outcomes, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
	struct rb_lease l;
	char lane[16], epoch[32];
	const char *handler = json_string_value(json_object_get(r, "handler"));
	const char *lp[3] = { handler, lane, epoch };
	PGresult *res;
	char *text;
	int hist = history_enabled(s, be_of(s)->conn, err);

	if (hist < 0)
		return -1;
	rb_lease_parse(json_string_value(json_object_get(r, "lease")), &l);
	snprintf(lane, sizeof lane, "%d", l.lane);
	snprintf(epoch, sizeof epoch, "%" PRId64, l.epoch);
	if (run_cmd(s, "BEGIN", "complete", err) < 0)
		return -1;
	/* KEY SHARE on the lane row: a takeover (FOR UPDATE) skips the lane
	 * until this transaction ends; the owner's claims do not wait */
	res = run(s, be->q_lock_lane, 3, lp, PGRES_TUPLES_OK, "complete", false, err);
	if (res == NULL)
		goto fail;
	if (PQntuples(res) == 0) {
		PQclear(res);
		rollback_quietly(s);
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
		rollback_quietly(s);
		/* the statement failed: the handler failed, count it as an attempt */
		json_object_set_new(json_array_get(outcomes, i), "error", json_string(msg));
		return 1;
	}
	PQclear(res);
	{
		struct fence_arrays a;

		fa_init(&a);
		fa_add(&a, r);
		fa_close(&a);
		const char *params[6] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, a.id.s };
		res = run(s, hist ? be->q_complete_hist : be->q_complete, 6, params,
		    PGRES_TUPLES_OK, "complete", false, err);
		fa_free(&a);
	}
	if (res == NULL)
		goto fail;
	if (PQntuples(res) == 0) {
		/* fenced out: the SQL's effect must not commit either */
		PQclear(res);
		rollback_quietly(s);
		set_outcome(outcomes, i, r, "lost");
		return 0;
	}
	PQclear(res);
	if (run_cmd(s, "COMMIT", "complete", err) < 0)
		return -1;
	set_outcome(outcomes, i, r, "completed");
	return 0;
fail:
	rollback_quietly(s);
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
	struct fence_arrays a;
	struct rb_sbuf kinds, retry, errors;
	char maxa[16], base[32], maxms[32], factor[32];
	PGresult *res;

	fa_init(&a);
	rb_sb_init(&kinds);
	rb_sb_init(&retry);
	rb_sb_init(&errors);
	rb_sb_puts(&kinds, "{");
	rb_sb_puts(&retry, "{");
	rb_sb_puts(&errors, "{");
	for (size_t k = 0; k < n; k++) {
		const json_t *r = json_array_get(results, idx[k]);
		const json_t *rm = json_object_get(r, "retry_ms");
		const json_t *e = json_object_get(r, "error");
		const json_t *oe = json_object_get(json_array_get(outcomes, idx[k]), "error");

		fa_add(&a, r);
		sb_array_text(&kinds, fail_kind(r));
		if (json_is_integer(rm))
			sb_array_int(&retry, json_integer_value(rm));
		else
			sb_array_text(&retry, NULL);
		if (json_is_string(oe))
			sb_array_text(&errors, json_string_value(oe));
		else
			sb_array_text(&errors, json_is_string(e) ? json_string_value(e) :
			    (json_is_true(json_object_get(r, "release")) ? NULL : "handler failed"));
	}
	fa_close(&a);
	rb_sb_puts(&kinds, "}");
	rb_sb_puts(&retry, "}");
	rb_sb_puts(&errors, "}");
	snprintf(maxa, sizeof maxa, "%d", o->max_attempts);
	snprintf(base, sizeof base, "%" PRId64, o->backoff.base_ms);
	snprintf(maxms, sizeof maxms, "%" PRId64, o->backoff.max_ms);
	snprintf(factor, sizeof factor, "%g", o->backoff.factor);
	const char *params[12] = { a.ev.s, a.h.s, a.lane.s, a.epoch.s, a.claims.s, kinds.s, retry.s,
	    errors.s, maxa, base, maxms, factor };
	res = run(s, be_of(s)->q_fail, 12, params, PGRES_TUPLES_OK, "reschedule", true, err);
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

static int
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

static int
pg_relinquish(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[2] = { handler, owner };

	return run_affected(s, be_of(s)->q_relinquish, 2, params, "relinquish", err);
}

static int
pg_relinquish_owner(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	const char *params[2] = { handler, owner };

	return run_affected(s, be_of(s)->q_relinquish_owner, 2, params, "relinquish", err);
}

static int
pg_relinquish_leases(struct rb_store *s, const json_t *leases, struct rb_error *err)
{
	struct rb_sbuf h, lane, epoch;
	size_t i;
	json_t *v;
	int n;

	if (json_array_size(leases) == 0)
		return 0;
	rb_sb_init(&h);
	rb_sb_init(&lane);
	rb_sb_init(&epoch);
	rb_sb_puts(&h, "{");
	rb_sb_puts(&lane, "{");
	rb_sb_puts(&epoch, "{");
	json_array_foreach(leases, i, v) {
		struct rb_lease l;

		if (rb_lease_parse(json_string_value(json_object_get(v, "lease")), &l) < 0 ||
		    !json_is_string(json_object_get(v, "handler")))
			continue;
		sb_array_text(&h, json_string_value(json_object_get(v, "handler")));
		sb_array_int(&lane, l.lane);
		sb_array_int(&epoch, l.epoch);
	}
	rb_sb_puts(&h, "}");
	rb_sb_puts(&lane, "}");
	rb_sb_puts(&epoch, "}");
	const char *params[3] = { h.s, lane.s, epoch.s };
	n = run_affected(s, be_of(s)->q_relinquish_leases, 3, params, "relinquish", err);
	free(h.s);
	free(lane.s);
	free(epoch.s);
	return n;
}

/* ---- wake-up ------------------------------------------------------------- */

static int
pg_listen(struct rb_store *s, struct rb_error *err)
{
	char sql[128];

	snprintf(sql, sizeof sql, "LISTEN relaybus_%s", s->schema);
	if (run_cmd(s, sql, "listen", err) < 0)
		return -1;
	be_of(s)->listening = true;
	return 0;
}

static int
pg_socket(const struct rb_store *s)
{
	struct pg_be *be = be_of(s);

	return be != NULL && be->conn != NULL ? PQsocket(be->conn) : -1;
}

static int
pg_notified(struct rb_store *s, const char *handler, int timeout_ms, struct rb_error *err)
{
	struct pg_be *be = be_of(s);
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

static const char *const pg_schemes[] = { "postgres", "postgresql", NULL };

const struct rb_store_ops rb_store_pg_ops = {
	.name = "postgresql",
	.schemes = pg_schemes,
	.open = pg_open,
	.close = pg_close,
	.reconnect = pg_reconnect,
	.broken = pg_broken,
	.setup = pg_setup,
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
};

/* ---- for the other backend files (store_pg_int.h) ------------------------ */

PGconn *
rb_pg_conn(struct rb_store *s)
{
	if (s == NULL || s->ops != &rb_store_pg_ops || be_of(s) == NULL)
		return NULL;
	return be_of(s)->conn;
}

char *
rb_pg_render(const struct rb_store *s, const char *tmpl)
{
	return render(tmpl, s->schema);
}

int
rb_pg_fail(struct rb_store *s, PGresult *res, const char *what, struct rb_error *err)
{
	return pg_fail(s, res, what, err);
}
