/* SPDX-License-Identifier: MIT */
/*
 * store_pg_exec.c: the PostgreSQL backend's one exec/error layer, used by
 * every store_pg*.c (store_pg_int.h): statement templates rendered for a
 * schema, array parameters, the one map from a failure to an exit code,
 * prepare/exec/send with the retry of deadlocks, the answer of a statement
 * sent without waiting (pg_settle), what the server says outside an answer
 * (pg_log_notices), a side connection's failure, the connections the
 * calls without waiting use, and the column readers.  It is the core of
 * the backend: it calls no other file of it (connecting is
 * store_pg_ha.c's, above it).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_url.h"

/* ---- text ---------------------------------------------------------------- */

char *
pg_render(const char *tmpl, const char *schema)
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

void
pg_arr_start(struct rb_sbuf *b)
{
	b->len = 0;
	rb_sb_putn(b, "{", 1);
}

/* (an element follows "{" or a previous element: "," unless first) */
void
pg_arr_text(struct rb_sbuf *b, const char *v)
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

/* (a claim lists hundreds: no snprintf) */
void
pg_arr_int(struct rb_sbuf *b, int64_t v)
{
	char num[24];
	size_t n = 0;

	if (b->len > 1)
		num[n++] = ',';
	n += rb_fmt_int(num + n, v);
	rb_sb_putn(b, num, n);
}

void
pg_arr_addr(struct rb_sbuf *b, uint64_t addr)
{
	char t[48];
	size_t n = 0;

	if (addr == 0) {
		pg_arr_text(b, NULL);
		return;
	}
	if (b->len > 1)
		t[n++] = ',';
	t[n++] = '"';
	t[n++] = '(';
	n += rb_fmt_int(t + n, (int64_t)(addr >> 16));
	t[n++] = ',';
	n += rb_fmt_int(t + n, (int64_t)(addr & 0xffff));
	t[n++] = ')';
	t[n++] = '"';
	rb_sb_putn(b, t, n);
}

uint64_t
pg_addr(const char *v)
{
	unsigned long long blk, off;
	char *e;

	if (v == NULL || *v++ != '(')
		return 0;
	blk = strtoull(v, &e, 10);
	if (e == v || *e++ != ',' || blk > 0xffffffffULL)
		return 0;
	off = strtoull(v = e, &e, 10);
	if (e == v || *e != ')' || off == 0 || off > 0xffff)
		return 0;
	return (uint64_t)blk << 16 | off;
}

void
pg_arr_end(struct rb_sbuf *b)
{
	rb_sb_putn(b, "}", 1);
}

/* ---- errors -------------------------------------------------------------- */

const char *
pg_sqlstate(const PGresult *res)
{
	const char *st = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	return st != NULL ? st : "";
}

static const char *idle_fatal(const PGconn *c);

/* the first line of text that starts with FATAL:, PANIC: or ERROR:, from
 * after that word; NULL if text (NULL: none) has no such line */
static const char *
server_line(const char *text)
{
	static const char *const sev[] = { "FATAL:", "PANIC:", "ERROR:" };

	for (const char *p = text; p != NULL && *p != '\0';) {
		for (size_t i = 0; i < sizeof sev / sizeof sev[0]; i++)
			if (strncmp(p, sev[i], strlen(sev[i])) == 0) {
				p += strlen(sev[i]);
				while (*p == ' ')
					p++;
				return p;
			}
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return NULL;
}

void
pg_lost_reason(PGconn *c, const PGresult *res, char *out, size_t size)
{
	const char *rmsg = res != NULL ? PQresultErrorMessage(res) : "";
	const char *cmsg = c != NULL ? PQerrorMessage(c) : "not connected";
	const char *p = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	size_t len;

	if (size == 0)
		return;
	/* the server's reason (it may be in the connection's error only, when
	 * libpq made the result of what it saw next: the socket closed) */
	if (p == NULL)
		p = server_line(rmsg);
	if (p == NULL)
		p = server_line(cmsg);
	if (p == NULL)
		p = server_line(idle_fatal(c));
	if (p == NULL)
		p = *rmsg != '\0' ? rmsg : cmsg;
	while (*p == '\n' || *p == ' ' || *p == '\t')
		p++;
	len = strcspn(p, "\n");
	while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\r'))
		len--;
	if (len == 0) {
		p = "the server closed the connection";
		len = strlen(p);
	}
	snprintf(out, size, "%.*s", (int)len, p);
}

/* A connection cut by the server (SQLSTATE class 57P: an administrator's
 * pg_terminate_backend or shutdown, a crash, "cannot connect now"), a
 * connection exception (08) or one gone any other way (libpq says it is
 * bad): "connection lost" and the server's first line, the same wherever
 * it happened.  The rest of the server's text (CONTEXT, LINE, QUERY: they
 * name internal functions) only with -v. */
static bool
lost(PGconn *c, const char *state)
{
	return c == NULL || PQstatus(c) == CONNECTION_BAD ||
	    (state != NULL && (strncmp(state, "57P", 3) == 0 || strncmp(state, "08", 2) == 0));
}

/* A permission error the schema's own checks did not word (a role with no
 * relaybus grant at all meets the tables first): name the grant that gives
 * this program what it needs. */
static void
grant_hint(PGconn *c, char *msg, size_t size)
{
	static const struct { const char *prog, *grant; } kinds[] = {
		{ "rb-publish", "publisher=%s" }, { "rb-claim", "worker=%s:HANDLER" },
		{ "rb-complete", "worker=%s:HANDLER" }, { "rb-dispatch", "worker=%s:HANDLER" },
		{ "rb-admin", "admin=%s" },
	};
	const char *prog = rb_log_prog(), *user = c != NULL ? PQuser(c) : NULL;
	size_t n = strlen(msg);

	if (strstr(msg, "rb-setup --grant") != NULL || user == NULL || prog == NULL)
		return;
	for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
		if (strcmp(prog, kinds[i].prog) == 0) {
			char grant[160];

			snprintf(grant, sizeof grant, kinds[i].grant, user);
			snprintf(msg + n, size - n, " (role \"%s\" lacks the grant %s needs: rb-setup --grant %s)",
			    user, prog, grant);
			return;
		}
}

int
pg_fail_on(struct rb_store *s, PGconn *c, const PGresult *res, const char *what, struct rb_error *err)
{
	const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *primary = res != NULL ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char msg[sizeof err->msg];
	int code = RB_EXIT_SOFTWARE;

	if (lost(c, state)) {
		if (rb_log_level() >= RB_LOG_INFO) {
			/* (the connection's error has the server's whole text; a
			 * result libpq made has only what it saw last) */
			const char *full = c != NULL ? PQerrorMessage(c) : "";

			if (*full == '\0' && res != NULL)
				full = PQresultErrorMessage(res);
			rb_pg_error_lines(*full != '\0' ? full : "not connected", msg, sizeof msg);
			rb_info("%s: %s", what, msg);
		}
		pg_lost_reason(c, res, msg, sizeof msg);
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "connection lost: %s", msg);
	}
	if (primary == NULL)
		primary = c != NULL ? PQerrorMessage(c) : "not connected";
	/* (libpq's own messages: one line per host of a multi-host URL) */
	rb_pg_error_lines(primary, msg, sizeof msg);
	if (state == NULL)
		code = RB_EXIT_SOFTWARE;
	else if (strcmp(state, "42P01") == 0 || strcmp(state, "42883") == 0 ||
	    strcmp(state, "3F000") == 0) {
		/* (not the server's words: they name internal functions) */
		rb_seterr(err, RB_EXIT_CONFIG, "%s: schema \"%s\" is not set up: run rb-setup",
		    what, s->schema);
		return -1;
	} else if (strcmp(state, "RBV01") == 0) {
		/* the set-up's guard (store_pg_version.c): a newer relaybus set this schema up */
		rb_seterr(err, RB_EXIT_PROTOCOL, "%s", msg);
		return -1;
	} else if (strcmp(state, "55P03") == 0)
		code = RB_EXIT_TEMPFAIL;	/* lock_not_available: a lock_timeout ran out, try again */
	else if (strcmp(state, "RBP01") == 0)
		code = RB_EXIT_CONFLICT;	/* relaybus_conflict: an id published again with other data */
	else if (strncmp(state, "08", 2) == 0 || strncmp(state, "40", 2) == 0 ||
	    strncmp(state, "53", 2) == 0 || strncmp(state, "57", 2) == 0)
		code = RB_EXIT_TEMPFAIL;
	else if (strcmp(state, "42501") == 0) {
		grant_hint(c, msg, sizeof msg);
		code = RB_EXIT_NOPERM;
	} else if (strcmp(state, "28000") == 0 || strcmp(state, "28P01") == 0)
		code = RB_EXIT_NOPERM;
	else if (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0)
		code = RB_EXIT_DATAERR;
	return rb_seterr(err, code, "%s: %s", what, msg);
}

int
pg_fail(struct rb_store *s, const PGresult *res, const char *what, struct rb_error *err)
{
	return pg_fail_on(s, pg_be(s)->conn, res, what, err);
}

bool
pg_retryable(const PGresult *res)
{
	const char *state = pg_sqlstate(res);

	return strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0;
}

/* ---- running statements -------------------------------------------------- */

/* The hot statements (claim, completion, publish) are prepared once per connection,
 * on first use, and then only bound and run: parsing and planning the
 * completion took 0.33 ms a call, a tenth of the server's time in a drain.
 * Returns the statement's name, or NULL for any other statement or when
 * preparing failed (the caller then sends the text, which reports the
 * error as before).  When preparing lost the connection, *lost is its
 * answer (the server's reason: sending the text would only say "no
 * connection to the server"). */
static const char *
prepared(struct pg_be *be, PGconn *c, const char *sql, int n, PGresult **lost)
{
	static const char *const names[] = { "relaybus_claim", "relaybus_complete", "relaybus_complete_hist",
	    "relaybus_claim_ids", "relaybus_fetch", "relaybus_publish", "relaybus_publish1", "relaybus_wake" };
	const char *const qs[] = { be->q_claim, be->q_complete, be->q_complete_hist, be->q_claim_ids,
	    be->q_fetch, be->q_publish, be->q_publish1, be->q_wake };
	unsigned *mask = c == be->conn2 ? &be->prepared2 : c == be->conn3 ? &be->prepared3 : &be->prepared;
	int which = -1;
	PGresult *res;
	bool ok;

	for (int i = 0; i < (int)(sizeof names / sizeof names[0]) && which < 0; i++)
		if (sql == qs[i])
			which = i;
	/* (a transaction pooler hands the next transaction to any server
	 * connection: a named statement is not there) */
	if (which < 0 || be->pooler)
		return NULL;
	if (*mask & (1u << which))
		return names[which];
	res = PQprepare(c, names[which], sql, n, NULL);
	ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK;
	if (!ok && PQstatus(c) == CONNECTION_BAD && res != NULL) {
		*lost = res;
		return NULL;
	}
	PQclear(res);
	if (!ok)
		return NULL;
	*mask |= 1u << which;
	return names[which];
}

PGresult *
pg_exec(struct pg_be *be, PGconn *c, const char *sql, int n, const char *const *params)
{
	PGresult *lost = NULL;
	const char *name = prepared(be, c, sql, n, &lost);

	if (lost != NULL)
		return lost;
	return name != NULL ? PQexecPrepared(c, name, n, params, NULL, NULL, 0)
	    : PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
}

int
pg_send(struct pg_be *be, PGconn *c, const char *sql, int n, const char *const *params)
{
	PGresult *lost = NULL;
	const char *name = prepared(be, c, sql, n, &lost);

	if (lost != NULL) {
		/* (not sent: the connection's error still says why) */
		PQclear(lost);
		return 0;
	}
	return name != NULL ? PQsendQueryPrepared(c, name, n, params, NULL, NULL, 0)
	    : PQsendQueryParams(c, sql, n, NULL, params, NULL, NULL, 0);
}

PGresult *
pg_expect(struct rb_store *s, PGconn *c, PGresult *res, ExecStatusType want, const char *what,
    bool *retry, struct rb_error *err)
{
	if (retry != NULL)
		*retry = false;
	if (res != NULL && PQresultStatus(res) == want)
		return res;
	if (retry != NULL)
		*retry = pg_retryable(res);
	pg_fail_on(s, c, res, what, err);
	PQclear(res);
	return NULL;
}

PGresult *
pg_run_on(struct rb_store *s, PGconn *c, const char *sql, int n, const char *const *params,
    ExecStatusType want, const char *what, bool retry, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);
	PGresult *res = NULL;
	bool again = false;

	for (int attempt = 0; attempt < (retry ? 5 : 1); attempt++) {
		res = pg_expect(s, c, pg_exec(be, c, sql, n, params), want, what, &again, err);
		if (res != NULL || !again)
			break;
	}
	return res;
}

PGresult *
pg_run(struct rb_store *s, const char *sql, int n, const char *const *params, ExecStatusType want,
    const char *what, bool retry, struct rb_error *err)
{
	return pg_run_on(s, pg_be(s)->conn, sql, n, params, want, what, retry, err);
}

int
pg_run_affected(struct rb_store *s, const char *sql, int n, const char *const *params, const char *what,
    struct rb_error *err)
{
	bool worker = pg_be(s)->worker;
	PGresult *res = pg_run(s, sql, n, params, worker ? PGRES_TUPLES_OK : PGRES_COMMAND_OK, what, true, err);
	int rows;

	if (res == NULL)
		return -1;
	if (worker)
		rows = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
	else
		rows = atoi(PQcmdTuples(res));
	PQclear(res);
	return rows;
}

PGresult *
pg_query(struct rb_store *s, PGconn *c, const char *sql, int n, const char *const *params,
    const char *what, struct rb_error *err)
{
	PGresult *res = n > 0 ? PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0) : PQexec(c, sql);

	if (res != NULL && (PQresultStatus(res) == PGRES_COMMAND_OK ||
	    PQresultStatus(res) == PGRES_TUPLES_OK))
		return res;
	pg_fail_on(s, c, res, what, err);
	PQclear(res);
	return NULL;
}

int
pg_cmd_on(struct rb_store *s, PGconn *c, const char *sql, int n, const char *const *params,
    const char *what, struct rb_error *err)
{
	PGresult *res = pg_query(s, c, sql, n, params, what, err);

	PQclear(res);
	return res != NULL ? 0 : -1;
}

int
pg_run_cmd(struct rb_store *s, const char *sql, const char *what, struct rb_error *err)
{
	return pg_cmd_on(s, pg_be(s)->conn, sql, 0, NULL, what, err);
}

void
pg_rollback_quietly(struct rb_store *s)
{
	PQclear(PQexec(pg_be(s)->conn, "ROLLBACK"));
}

int
pg_take_result(PGconn *c, bool wait, PGresult **res)
{
	PGresult *more;

	if (!wait) {
		int alive = PQconsumeInput(c);

		if (PQisBusy(c))
			return !alive || PQstatus(c) == CONNECTION_BAD ? -1 : PG_PENDING;
	}
	*res = PQgetResult(c);
	while ((more = PQgetResult(c)) != NULL)
		PQclear(more);
	return 0;
}

int
pg_history(struct rb_store *s, PGconn *c, const char *what, struct rb_error *err)
{
	struct pg_be *be = pg_be(s);

	if (be->history < 0) {
		char *q = pg_render("SELECT to_regclass('@S@.relaybus_completions') IS NOT NULL", s->schema);
		PGresult *res = pg_run_on(s, c, q, 0, NULL, PGRES_TUPLES_OK, what, false, err);

		free(q);
		if (res == NULL)
			return -1;
		be->history = PQgetvalue(res, 0, 0)[0] == 't';
		PQclear(res);
	}
	return be->history;
}

/* ---- the calls without waiting -------------------------------------------- */

int
pg_connections(const struct rb_store *s)
{
	return s->connections > 0 ? s->connections : pg_be(s)->connections;
}

void
pg_settle(struct rb_store *s)
{
	struct pg_be *be = pg_be(s);

	while (be->job != PG_IDLE)
		if (be->job == PG_CLAIM)
			be->answer_claim(s, true);
		else
			be->answer_complete(s, true);
}

/*
 * Any role that can connect may NOTIFY relaybus_<schema>, '<handler>': no
 * privilege is needed.  So that a flood of them cannot turn an idle
 * dispatcher into a busy loop of claims, a wake-up whose claim found
 * nothing, when no claim found anything since the last wake-up's claim
 * either, holds the next one back PG_WAKE_QUIET_MS (relaybus(7),
 * OPERATIONS, Wake-ups): at most 10 claims a second come of notifications
 * that bring nothing.  A publisher's notification often finds its
 * deliveries taken already, by the claim that the one before woke, or one
 * after a completion: holding the next one back after each such (a tenth
 * of those at 1,000 events/s) made the commit-to-handler p99 100 ms; it
 * is held back only after a second fruitless one in a row now.
 */
#define PG_WAKE_QUIET_MS 100

void
pg_wake_claimed(struct pg_be *be, int claimed)
{
	be->wake_found += claimed;
	if (!be->wake_check)
		return;
	be->wake_check = false;
	be->wake_quiet_until = be->wake_found == 0 ? rb_mono_ms() + PG_WAKE_QUIET_MS : 0;
	if (be->wake_found == 0)
		rb_debug("a wake-up found nothing, nor did any claim since the one before: "
		    "the next is held back %dms", PG_WAKE_QUIET_MS);
	be->wake_found = claimed;
}

/* ---- notices, and a side connection that failed ------------------------- */

/* The FATAL each connection got outside an answer (a backend terminated
 * while idle: libpq gives it to the notice processor, and its error says
 * only that the server closed the connection), for pg_lost_reason. */
static struct {
	const PGconn *c;
	char msg[256];
} fatal_of[4];

static const char *
idle_fatal(const PGconn *c)
{
	for (size_t i = 0; c != NULL && i < sizeof fatal_of / sizeof fatal_of[0]; i++)
		if (fatal_of[i].c == c)
			return fatal_of[i].msg;
	return NULL;
}

/* (a connection's slot, a free one, else the first) */
static void
idle_fatal_set(const PGconn *c, const char *msg)
{
	size_t i, slot = 0;

	for (i = 0; i < sizeof fatal_of / sizeof fatal_of[0]; i++)
		if (fatal_of[i].c == c)
			break;
	if (i == sizeof fatal_of / sizeof fatal_of[0] && msg == NULL)
		return;
	if (i == sizeof fatal_of / sizeof fatal_of[0])
		for (i = 0; i < sizeof fatal_of / sizeof fatal_of[0]; i++)
			if (fatal_of[i].c == NULL) {
				slot = i;
				break;
			}
	if (i < sizeof fatal_of / sizeof fatal_of[0])
		slot = i;
	fatal_of[slot].c = msg != NULL ? c : NULL;
	snprintf(fatal_of[slot].msg, sizeof fatal_of[slot].msg, "%s", msg != NULL ? msg : "");
}

/* What the server says outside an answer (a NOTICE, a WARNING, the FATAL
 * of a terminated backend) goes through our log, so that -q means quiet:
 * libpq would print it to stderr itself. */
static void
notice_to_log(void *arg, const char *msg)
{
	int len = (int)strcspn(msg, "\n");

	const char *progress = strstr(msg, "relaybus progress: ");

	if (arg != NULL && strncmp(msg, "FATAL:", 6) == 0)
		idle_fatal_set(arg, msg);
	/* (the set-up's steps, raised only when rb-setup asked: a terminal) */
	if (strncmp(msg, "NOTICE:", 7) == 0 && progress != NULL && progress < msg + len)
		rb_progress("%.*s", (int)(msg + len - progress - 19), progress + 19);
	else if (strncmp(msg, "WARNING", 7) == 0)
		rb_warn("server: %.*s", len, msg);
	else
		rb_info("server: %.*s", len, msg);
}

void
pg_log_notices(PGconn *c, bool track)
{
	if (track)
		idle_fatal_set(c, NULL);	/* (a new connection may have the address of one closed) */
	PQsetNoticeProcessor(c, notice_to_log, track ? c : NULL);
}

int
pg_side_failed(struct rb_store *s, PGconn *c, void (*close_fn)(struct pg_be *), const PGresult *res,
    const char *what, struct rb_error *err)
{
	pg_fail_on(s, c, res, what, err);
	if (c != NULL && PQstatus(c) != CONNECTION_OK)
		close_fn(pg_be(s));
	return -1;
}

/* ---- columns ------------------------------------------------------------- */

json_int_t
pg_num(const PGresult *res, int i, int j)
{
	return PQgetisnull(res, i, j) ? 0 : (json_int_t)strtoll(PQgetvalue(res, i, j), NULL, 10);
}

json_t *
pg_jstr(const PGresult *res, int i, int j)
{
	return PQgetisnull(res, i, j) ? json_null() : json_string(PQgetvalue(res, i, j));
}

json_t *
pg_jint(const PGresult *res, int i, int j)
{
	return PQgetisnull(res, i, j) ? json_null() :
	    json_integer(strtoll(PQgetvalue(res, i, j), NULL, 10));
}

json_t *
pg_jbool(const PGresult *res, int i, int j)
{
	return PQgetisnull(res, i, j) ? json_null() : json_boolean(PQgetvalue(res, i, j)[0] == 't');
}

/* (the text form of a json/jsonb column is valid JSON) */
json_t *
pg_jjson(const PGresult *res, int i, int j)
{
	json_t *v;

	if (PQgetisnull(res, i, j))
		return json_null();
	v = json_loads(PQgetvalue(res, i, j), JSON_DECODE_ANY, NULL);
	return v != NULL ? v : json_string(PQgetvalue(res, i, j));
}
