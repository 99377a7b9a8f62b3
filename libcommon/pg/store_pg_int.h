/* SPDX-License-Identifier: MIT */
/*
 * store_pg_int.h: PRIVATE to the PostgreSQL backend (libcommon/pg/; it
 * pulls in libpq-fe.h, so nothing else includes it): the backend's core,
 * what every file of it shares:
 *
 *   struct pg_be          the backend's state (one per store)
 *   store_pg_exec.c       render, text arrays, the SQLSTATE -> exit code map,
 *                         prepare/exec/send/retry, the answer out on the main
 *                         connection (pg_settle), column readers
 *   store_pg_ha.c         connections (the first and the two side ones), and
 *                         which server each reached
 *   store_pg_cursor.c     the claim cursors of a long-lived claimer
 *   store_pg_url.c        connection strings (store_pg_url.h)
 *
 * Above the core, the steps by job (store_pg_steps.h), and on top
 * store_pg.c: the ops table, open/close/reconnect, LISTEN and the calls
 * without waiting.  A file uses only files below it: the core no step,
 * a step never store_pg.c (tests/check_includes.py).
 *
 * Every statement is a template with @S@ for the quoted schema (pg_render)
 * and runs with parameters only.  Every failure goes through pg_fail_on,
 * so that one server error gets one exit code in every file.
 */
#ifndef STORE_PG_INT_H
#define STORE_PG_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"

struct pg_fence;	/* a completion's fence arrays (store_pg_complete.c) */
struct pg_fail_args;	/* relaybus_fail's parameters (store_pg_complete.c) */

/* What a connection has out (pgqd's DbState): one statement at a time. */
enum pg_job {
	PG_IDLE,
	PG_CLAIM,	/* the main connection: a claim (relaybus_claim or _ids) */
	PG_FETCH,	/* the second: the events of what a claim took */
	PG_COMPLETE,	/* the main or the third: a completion of successes */
};

/* Deliveries a claim took whose events are not read yet (owned). */
struct pg_claimed {
	struct rb_dl	**v;
	size_t		 n;
};

/*
 * The claim cursors of a long-lived claimer (store_pg_cursor.c;
 * relaybus_claim_ids, "Claim cursors"): the ticks of its last claims, and
 * what its last claim handed back, as the text of the claim's parameters.
 */
enum { PG_TICKS = 8, PG_CURSOR_PARAMS = 10 };
struct pg_cursors {
	int64_t	 rescan_ms;	/* $RELAYBUS_PG_RESCAN; 0: no cursors */
	char	*handler;	/* whose cursors these are */
	char	*tick_c[PG_TICKS], *tick_x[PG_TICKS];	/* a ring, the newest at next - 1 */
	int	 next;
	char	*g, *cl, *cu, *ck;	/* the global cursor and the lanes' */
	char	*mine;		/* the lanes held after the last claim */
	char	*mine_t;	/* ... and the versions of their rows (ctids) */
	char	*others;	/* the lanes others held at the last pass */
	char	*kf;		/* the lanes of 64 keyed deliveries or more since the last pass */
	int64_t	 free_in_ms;	/* the last claim's: a lease of another's ends in this many ms (0: none) */
	int64_t	 dropped_at;	/* when the cursors were last dropped (the safety net) */
	int64_t	 pass_at;	/* when a claim last read every lane row */
	struct rb_sbuf tc, tx;	/* the ticks as array literals */
	/* the claim out: its ten cursor parameters (NULL: none) */
	const char *params[PG_CURSOR_PARAMS];
};

/*
 * One claim's arguments by name, as the text of the statement's
 * parameters (relaybus_claim, relaybus_claim_ids and their worker doors
 * take the same: PG_CLAIM_ARGS in store_pg_claim.c), kept for a retry.
 * The holder (p_holder, p_holder_live) is the store's, and the ten
 * cursors are struct pg_cursors' params: claim_param_list (store_pg_claim.c)
 * makes the parameter list of the three, the one place that knows the order.
 */
struct pg_claim_args {
	char	 handler[256], owner[256];	/* p_handler, p_owner */
	char	 batch[16], lease_ms[24];	/* p_batch, p_lease_ms */
	char	 max_attempts[16], chain[16];	/* p_max_attempts, p_chain (1: heads only) */
	struct rb_sbuf live;		/* p_live ("{1,2}"): the ids still running ... */
	bool	 live_known;		/* ... when the caller knows them (else NULL) */
	struct rb_sbuf live_lanes;	/* p_live_lanes: their lanes ... */
	bool	 lanes_known;		/* ... when known (else NULL) */
	bool	 search;		/* p_search: look for more lanes */
	bool	 chain_early;		/* p_chain_early */
};

int	pg_cursors_env(struct pg_cursors *, struct rb_error *);
void	pg_cursors_drop(struct pg_cursors *, bool all);
void	pg_cursors_free(struct pg_cursors *);
void	pg_cursors_params(struct pg_cursors *, const char *handler, bool want);
void	pg_cursors_take(struct pg_cursors *, const PGresult *);
bool	pg_cursors_row(const PGresult *, int row);

struct pg_be {
	PGconn	*conn;
	/* this store instance's lane holder (relaybus_lanes.holder), made at
	 * open and kept across reconnects: claims, renewals and hand-backs by
	 * owner name touch only the lanes held under it */
	char	 holder[24];
	/* its liveness lock (relaybus_hold) on the first connection: wanted
	 * (the last claim asked for it), and whether this connection has it */
	bool	 want_live;
	enum { PG_LIVE_UNTRIED, PG_LIVE_HELD, PG_LIVE_BUSY, PG_LIVE_OFF } live;
	bool	 listening;
	char	*wake_for;	/* rb_store_listen's handler; NULL: any */
	bool	 woken;		/* a notification for it came, not reported yet */
	/* wake-ups rate-limited (pg_wake_claimed): whether the next claim's
	 * answer says if the last wake-up reported brought anything, and
	 * until when the next one is held back */
	bool	 wake_check;
	int64_t	 wake_quiet_until;	/* rb_mono_ms */
	long	 wake_found;	/* claimed since the last wake-up's claim, that one's included */
	/* how many connections the calls without waiting may use (1..3):
	 * $RELAYBUS_PG_CONNECTIONS, else 2 (pg_connections) */
	int	 connections;
	/* $RELAYBUS_PG_POOLER transaction: behind a transaction-pooling
	 * PgBouncer, where a session's state does not outlive a transaction:
	 * no named prepared statements, no LISTEN (polling), no SET */
	bool	 pooler;
	/* the search_path the server gave the session before pg_connect_to
	 * pinned it to pg_catalog, pg_temp (the caller's --sql runs under
	 * it); NULL: not read (behind a transaction pooler) */
	char	*user_path;
	/* the wake-up of a publish (store_pg_publish.c), found out on each
	 * connection's first publish: 0 not yet, 1 sent by the store after the
	 * commit (the session's relaybus.notify is then off), -1 by the
	 * publish function in the transaction, or not at all */
	int	 wake;
	int	 history;	/* -1 unknown, 0 no completion history, 1 yes */
	/* the session's user lacks the owner's privileges (a role rb-setup
	 * --grant made): the statements are the pg_tmpl_w_* ones (pg_open) */
	bool	 worker, worker_known;
	/* rendered statements, built once per store (pg_statements in store_pg.c) */
	char	*q_publish, *q_publish1, *q_wake, *q_claim, *q_claim_ids, *q_fetch, *q_extend, *q_complete, *q_complete_hist,
		*q_fail, *q_relinquish, *q_relinquish_owner, *q_relinquish_leases, *q_lock_lane, *q_hold;
	unsigned prepared;		/* hot statements prepared on this connection (bits) */
	/* the second connection, for reading what a claim took (opened on
	 * first use), and the third, for completions beside the claims */
	PGconn	*conn2, *conn3;
	unsigned prepared2, prepared3;
	enum pg_job job, job2, job3;	/* what conn, conn2 and conn3 have out */
	/* the claim out on conn (job PG_CLAIM) or the last one: its
	 * parameters, kept for a retry, and whether it reads the events on
	 * conn2 (relaybus_claim_ids) */
	int	 claim_tries;
	struct pg_claim_args claim;	/* (the holder's two and the cursors' nine are below) */
	bool	 claim_ids;
	struct pg_cursors cursors;	/* ... the claim cursors */
	struct pg_claimed fetch;	/* being read on conn2 (job2 PG_FETCH) ... */
	struct pg_claimed waiting;	/* ... and the next, waiting for conn2 */
	/* the completion out on conn or conn3 (job or job3 PG_COMPLETE) */
	struct rb_result *complete_v;	/* the caller's */
	size_t	 complete_n;
	bool	 complete_hist;
	int	 complete_tries;
	struct pg_fence *complete_fa;	/* its parameters, kept for a retry */
	/* ... with failures (on conn only, never beside a claim): the
	 * successes' deletion, then relaybus_fail; each part's results (their
	 * places in complete_v), and whether the failures' part is out */
	size_t	*complete_ok_at, *complete_fail_at;
	size_t	 complete_nok, complete_nfail;
	bool	 complete_failing;
	struct pg_fail_args *complete_ff;	/* its parameters, kept for a retry */
	/* the server the store had (store_pg_ha.c): its system identifier
	 * ("": not known yet, or not readable) and the newest timeline seen
	 * on a primary (0: none yet) */
	char	 sysid[24];
	unsigned long timeline;
	bool	 sysid_denied;		/* pg_control_system() gave 42501 */
	char	 refused[400];		/* the last refusal said */
	/* the answer of the statement out on conn, by its job, for pg_settle:
	 * pg_claim_answer and pg_complete_answer, set by pg_open (store_pg.c),
	 * so that the core calls no step file above it */
	bool	(*answer_claim)(struct rb_store *, bool wait);
	bool	(*answer_complete)(struct rb_store *, bool wait);
};

static inline struct pg_be *
pg_be(const struct rb_store *s)
{
	return s->be;
}

/* ---- store_pg_exec.c: text --------------------------------------------- */

/** tmpl with @S@ replaced by the quoted schema and @CHAN@ by the channel name; new string. */
char	*pg_render(const char *tmpl, const char *schema);

/*
 * PostgreSQL array literals, the one builder for every array parameter
 * (fences, failures, relinquished lanes, ids): pg_arr_start (b initialized,
 * or zeroed; emptied first), any number of pg_arr_text/pg_arr_int, then
 * pg_arr_end.  Text is quoted and escaped; NULL gives a NULL element.
 */
void	pg_arr_start(struct rb_sbuf *b);
void	pg_arr_text(struct rb_sbuf *b, const char *v);
void	pg_arr_int(struct rb_sbuf *b, int64_t v);
/** A row's address (rb_dl.addr: block << 16 | offset) as a tid element; 0 gives NULL. */
void	pg_arr_addr(struct rb_sbuf *b, uint64_t addr);
/** A tid's text, "(block,offset)", as rb_dl.addr; 0 for NULL or anything else. */
uint64_t pg_addr(const char *v);
void	pg_arr_end(struct rb_sbuf *b);

/* ---- store_pg_exec.c: errors ------------------------------------------- */

/**
 * The one map from a failure to an exit code and message, for every file
 * of the backend: c is the connection it happened on, res its result (NULL:
 * none), what prefixes the message.  A lost connection (libpq says it is
 * bad, or SQLSTATE 57P or 08) is "connection lost: " and the server's first
 * line (pg_lost_reason; what and the rest of the text only with -v),
 * RB_EXIT_TEMPFAIL; 40/53/57 are RB_EXIT_TEMPFAIL; an undefined table, function or schema means "schema
 * not set up" (RB_EXIT_CONFIG); RBV01, the set-up's guard against a schema
 * a newer relaybus set up, RB_EXIT_PROTOCOL; 42501 and authentication failures (28000,
 * 28P01) RB_EXIT_NOPERM; 22/23 RB_EXIT_DATAERR; anything else
 * RB_EXIT_SOFTWARE.  Returns -1.
 */
int	pg_fail_on(struct rb_store *, PGconn *c, const PGresult *res, const char *what,
	    struct rb_error *err);
/** Why c was lost, in one line: the server's primary message (res's, or the
 * first line of the connection's error without "FATAL:"), never its CONTEXT,
 * LINE or QUERY. */
void	pg_lost_reason(PGconn *c, const PGresult *res, char *out, size_t size);
/** pg_fail_on the main connection. */
int	pg_fail(struct rb_store *, const PGresult *res, const char *what, struct rb_error *err);
/** A deadlock or serialization failure: running it again may succeed. */
bool	pg_retryable(const PGresult *res);
/** The SQLSTATE of a failed result, "" when it has none. */
const char *pg_sqlstate(const PGresult *res);

/* ---- store_pg_exec.c: running statements ------------------------------- */

/** Run sql with text parameters on c, prepared once per connection when it is a hot statement. */
PGresult *pg_exec(struct pg_be *, PGconn *c, const char *sql, int n, const char *const *params);
/** pg_exec without waiting (PQsendQuery*): 1 sent, 0 not. */
int	pg_send(struct pg_be *, PGconn *c, const char *sql, int n, const char *const *params);
/**
 * res when its status is want; else err filled (pg_fail_on), *retry (may
 * be NULL) set when pg_retryable, res cleared and NULL.
 */
PGresult *pg_expect(struct rb_store *, PGconn *c, PGresult *res, ExecStatusType want,
	    const char *what, bool *retry, struct rb_error *err);
/**
 * pg_exec + pg_expect; with retry (the statement is its own transaction)
 * a deadlock or serialization failure runs it again, up to five times.
 */
PGresult *pg_run_on(struct rb_store *, PGconn *c, const char *sql, int n, const char *const *params,
	    ExecStatusType want, const char *what, bool retry, struct rb_error *err);
/** pg_run_on the main connection. */
PGresult *pg_run(struct rb_store *, const char *sql, int n, const char *const *params,
	    ExecStatusType want, const char *what, bool retry, struct rb_error *err);
/** pg_run (retried) of a lane statement: an UPDATE, or for a worker role
 * (pg_be.worker) a SELECT of the lane function of schema_pg.sql that
 * returns the number of rows it changed; that number, or -1. */
int	pg_run_affected(struct rb_store *, const char *sql, int n, const char *const *params,
	    const char *what, struct rb_error *err);
/**
 * Any statement on c: without parameters as a simple query (so sql may
 * hold several statements), else with them; its result when it is
 * COMMAND_OK or TUPLES_OK, else NULL + err.
 */
PGresult *pg_query(struct rb_store *, PGconn *c, const char *sql, int n, const char *const *params,
	    const char *what, struct rb_error *err);
/** pg_query, result dropped: 0 or -1. */
int	pg_cmd_on(struct rb_store *, PGconn *c, const char *sql, int n, const char *const *params,
	    const char *what, struct rb_error *err);
/** pg_cmd_on the main connection without parameters. */
int	pg_run_cmd(struct rb_store *, const char *sql, const char *what, struct rb_error *err);
/** ROLLBACK on the main connection, errors ignored. */
void	pg_rollback_quietly(struct rb_store *);
/**
 * The answer to the statement out on c: PG_PENDING when it has not
 * arrived yet (only without wait), -1 when the connection broke before it
 * did, else 0 with *res (NULL: none) and c ready for the next statement.
 * An answer read in full before the connection broke is still taken: a
 * claim that committed has its deliveries.
 */
#define PG_PENDING	(-2)
int	pg_take_result(PGconn *c, bool wait, PGresult **res);
/**
 * 1 when the schema keeps completion history (relaybus_completions), 0
 * when not, -1 on error; asked on c once per connection of the store.
 */
int	pg_history(struct rb_store *, PGconn *c, const char *what, struct rb_error *err);

/* ---- store_pg_exec.c: the calls without waiting ------------------------- */

/** How many connections the calls without waiting may use now (1..3). */
int	pg_connections(const struct rb_store *);
/** Take the answer out on the main connection (waiting for it: be->answer_claim
 * or be->answer_complete), so that a statement can go there; what it says is
 * pushed onto s->evq. */
void	pg_settle(struct rb_store *);
/**
 * A claim's answer came (claimed deliveries): after a wake-up whose claim
 * found nothing, and nothing was claimed since the one before, the next
 * wake-up is held back PG_WAKE_QUIET_MS.
 */
void	pg_wake_claimed(struct pg_be *, int claimed);

/* ---- store_pg_exec.c: notices and side connections ----------------------- */

/** What the server says outside an answer on c goes to the log; with track,
 * c's FATAL outside an answer is also kept for pg_lost_reason. */
void	pg_log_notices(PGconn *c, bool track);
/**
 * A statement on a side connection (c: conn2, conn3) failed (res: its
 * error, or NULL): pg_fail_on, and the connection closed if it broke.
 */
int	pg_side_failed(struct rb_store *, PGconn *c, void (*close_fn)(struct pg_be *), const PGresult *res,
	    const char *what, struct rb_error *err);

/* ---- store_pg_ha.c: connections, and which server they reached ---------- */

/** "host:port" of c. */
void	pg_server_name(PGconn *c, char *buf, size_t size);
/**
 * Connect *conn to the store's URL (application_name: the store's app,
 * server notices to the log).  -1 + err: RB_EXIT_NOPERM when the server
 * refused the role (its password, or pg_hba.conf), else RB_EXIT_UNAVAILABLE.
 */
int	pg_connect_to(struct rb_store *, PGconn **conn, struct rb_error *err);
/**
 * Open a side connection (conn2, conn3) unless it is open and sound, and
 * run setup (NULL: nothing) on it; closed with close_fn when that fails.
 */
int	pg_open_side(struct rb_store *, PGconn **c, void (*close_fn)(struct pg_be *), const char *setup,
	    const char *what, struct rb_error *err);
/* ---- store_pg_exec.c: columns ------------------------------------------ */

/** Column j of row i as text (borrowed from res), NULL for SQL NULL.  (Inline: a claim reads 13 a delivery.) */
static inline const char *
pg_col(const PGresult *res, int i, int j)
{
	return PQgetisnull(res, i, j) ? NULL : PQgetvalue(res, i, j);
}
/** Column j of row i as a decimal integer, 0 for SQL NULL. */
json_int_t pg_num(const PGresult *res, int i, int j);
/** Column j of row i as a new JSON value (SQL NULL: null): string, integer, boolean, or JSON text parsed. */
json_t	*pg_jstr(const PGresult *res, int i, int j);
json_t	*pg_jint(const PGresult *res, int i, int j);
json_t	*pg_jbool(const PGresult *res, int i, int j);
json_t	*pg_jjson(const PGresult *res, int i, int j);

#endif
