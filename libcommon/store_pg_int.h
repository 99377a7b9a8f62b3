/* SPDX-License-Identifier: MIT */
/*
 * store_pg_int.h: PRIVATE to the PostgreSQL backend (store_pg*.c; it pulls
 * in libpq-fe.h, so nothing else includes it).  The backend's state, its
 * one exec/error layer (store_pg_exec.c) and the slots each file of the
 * backend implements for rb_store_pg_ops (store_pg.c):
 *
 *   store_pg.c           the ops table, open/close/reconnect, LISTEN, version
 *   store_pg_exec.c      render, text arrays, the SQLSTATE -> exit code map,
 *                        prepare/exec/send/retry, connections, column readers
 *   store_pg_setup.c     the set-up script and rb_store_setup
 *   store_pg_version.c   schema versions (rb_store_schema_info) and the parts
 *                        of the set-up script around schema_pg.sql: the
 *                        version guard, lane_pg.sql, the 0.1.0 upgrade
 *   store_pg_publish.c   publish, and rb_pg_publish (rb_pg.h)
 *   store_pg_claim.c     claim, fetch on the second connection, extend, relinquish
 *   store_pg_complete.c  completion (one statement, in two steps, --sql, failures)
 *   store_pg_admin.c     rb_admin.h
 *   store_pg_inspect.c   rb_inspect.h
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

struct pg_be {
	PGconn	*conn;
	/* this store instance's lane holder (relaybus_lanes.holder), made at
	 * open and kept across reconnects: claims, renewals and hand-backs by
	 * owner name touch only the lanes held under it */
	char	 holder[24];
	bool	 listening;
	int	 history;	/* -1 unknown, 0 no completion history, 1 yes */
	/* rendered statements, built once per store (pg_statements in store_pg.c) */
	char	*q_publish, *q_claim, *q_claim_ids, *q_fetch, *q_extend, *q_complete, *q_complete_hist,
		*q_fail, *q_relinquish, *q_relinquish_owner, *q_relinquish_leases, *q_lock_lane;
	unsigned prepared;		/* hot statements prepared on this connection (bits) */
	/* a claim sent and not collected yet (rb_store_claim_send) */
	bool	 claim_pending;
	int	 claim_tries;
	char	 claim_params[5][256];	/* its parameters, kept for a retry */
	struct rb_sbuf claim_live;	/* ... and the sixth: p_live ("{1,2}") */
	struct rb_sbuf claim_live_lanes;	/* ... and the ninth (claim ids only): their lanes */
	bool	 claim_lanes_known;
	bool	 claim_live_known;
	bool	 claim_quiet;		/* ... and the seventh: p_search false */
	bool	 claim_early;		/* ... and the eleventh: p_chain_early */
	bool	 claim_text;		/* rb_claim_opts.line_text */
	char	 claim_chain[16];	/* ... and the eighth: p_chain */
	bool	 claim_apart;		/* rb_claim_opts.apart: relaybus_claim_ids */
	/* a completion sent and not collected yet (rb_store_complete_send) */
	bool	 complete_pending, complete_hist;
	int	 complete_tries;
	struct rb_dl *const *complete_v;	/* what it completes (the caller's) */
	size_t	 complete_n;
	struct pg_fence *complete_fa;	/* its parameters, kept for a retry */
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

/* store_pg.c: the backend's slots */
extern const struct rb_store_ops rb_store_pg_ops;

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
void	pg_arr_end(struct rb_sbuf *b);

/* ---- store_pg_exec.c: errors ------------------------------------------- */

/**
 * The one map from a failure to an exit code and message, for every file
 * of the backend: c is the connection it happened on, res its result (NULL:
 * none), what prefixes the message.  A lost connection, 08/40/53/57 are
 * RB_EXIT_TEMPFAIL; an undefined table, function or schema means "schema
 * not set up" (RB_EXIT_CONFIG); RBV01, the set-up's guard against a schema
 * a newer relaybus set up, RB_EXIT_PROTOCOL; 42501 and authentication failures (28000,
 * 28P01) RB_EXIT_NOPERM; 22/23 RB_EXIT_DATAERR; anything else
 * RB_EXIT_SOFTWARE.  Returns -1.
 */
int	pg_fail_on(struct rb_store *, PGconn *c, const PGresult *res, const char *what,
	    struct rb_error *err);
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
/** pg_run (retried) of a SELECT of one lane function of schema_pg.sql that returns the
 * number of rows it changed; that number, or -1. */
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
 * The answer to the statement out on c: RB_CLAIM_PENDING when it has not
 * arrived yet (only without wait), -1 when the connection broke before it
 * did, else 0 with *res (NULL: none) and c ready for the next statement.
 * An answer read in full before the connection broke is still taken: a
 * claim that committed has its deliveries.
 */
int	pg_take_result(PGconn *c, bool wait, PGresult **res);
/** A statement on the main connection was not sent or its connection broke: pg_fail, claim_pending cleared. */
int	pg_send_failed(struct rb_store *, const char *what, struct rb_error *err);
/**
 * 1 when the schema keeps completion history (relaybus_completions), 0
 * when not, -1 on error; asked on c once per connection of the store.
 */
int	pg_history(struct rb_store *, PGconn *c, const char *what, struct rb_error *err);

/* ---- store_pg_exec.c: connections -------------------------------------- */

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
/**
 * A statement on a side connection (c: conn2, conn3) failed (res: its
 * error, or NULL): pg_fail_on, and the connection closed if it broke.
 */
int	pg_side_failed(struct rb_store *, PGconn *c, void (*close_fn)(struct pg_be *), const PGresult *res,
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

/* ---- the statement templates, rendered by pg_open ---------------------- */

extern const char pg_tmpl_publish[];
extern const char pg_tmpl_claim[], pg_tmpl_claim_ids[], pg_tmpl_fetch[], pg_tmpl_extend[],
	pg_tmpl_relinquish[], pg_tmpl_relinquish_owner[], pg_tmpl_relinquish_leases[];
extern const char pg_tmpl_complete[], pg_tmpl_complete_hist[], pg_tmpl_fail[], pg_tmpl_lock_lane[];

/* ---- the slots, by file ------------------------------------------------ */

/* store_pg_setup.c */
char	*pg_setup_script(const char *schema, const struct rb_setup_opts *, struct rb_error *);
int	pg_setup(struct rb_store *, const struct rb_setup_opts *, struct rb_error *);
/* store_pg_version.c */
int	pg_schema_info(struct rb_store *, struct rb_schema_info *, struct rb_error *);
/** The set-up before schema_pg.sql (after the advisory lock): the version
 * guard (SQLSTATE RBV01: the schema is newer), lane_pg.sql, upgrade_010_pg.sql. */
void	pg_setup_before(struct rb_sbuf *, const char *schema);
/** The set-up after schema_pg.sql: upgrade_010_post_pg.sql and the version check (RBV02). */
void	pg_setup_after(struct rb_sbuf *, const char *schema);
/* store_pg_publish.c */
int	pg_publish(struct rb_store *, const char *events, size_t n, struct rb_publish_acks *,
	    struct rb_error *);
/* store_pg_claim.c */
int	pg_claim(struct rb_store *, const struct rb_claim_opts *, json_t **, struct rb_error *);
int	pg_claim_send(struct rb_store *, const struct rb_claim_opts *, struct rb_error *);
int	pg_claim_recv(struct rb_store *, bool wait, struct rb_dl ***, struct rb_error *);
int	pg_fetch_send(struct rb_store *, struct rb_dl *const *, size_t, bool text, struct rb_error *);
int	pg_fetch_recv(struct rb_store *, bool wait, struct rb_error *);
int	pg_fetch_socket(const struct rb_store *);
int	pg_extend(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *);
int	pg_relinquish(struct rb_store *, const char *handler, const char *owner, struct rb_error *);
int	pg_relinquish_owner(struct rb_store *, const char *handler, const char *owner, struct rb_error *);
int	pg_relinquish_leases(struct rb_store *, const json_t *leases, struct rb_error *);
/** Close the second connection and forget the fetch out on it. */
void	pg_close_conn2(struct pg_be *);
/* store_pg_complete.c */
int	pg_complete(struct rb_store *, const struct rb_complete_opts *, const json_t *, json_t **,
	    struct rb_error *);
int	pg_complete_send(struct rb_store *, struct rb_dl *const *, size_t, bool apart, struct rb_error *);
int	pg_complete_recv(struct rb_store *, bool wait, unsigned char *, struct rb_error *);
int	pg_complete_socket(const struct rb_store *);
/** Forget the completion out (its arrays freed). */
void	pg_complete_forget(struct pg_be *);
/** Close the third connection, and with it the completion out on it. */
void	pg_close_conn3(struct pg_be *);
/* store_pg_admin.c */
int	pg_admin_stats(struct rb_store *, json_t **, struct rb_error *);
int	pg_admin_list(struct rb_store *, const struct rb_admin_filter *, json_t **, struct rb_error *);
int	pg_admin_show(struct rb_store *, const char *event_id, json_t **, struct rb_error *);
int	pg_admin_apply(struct rb_store *, enum rb_admin_action, const json_t *targets, const char *reason,
	    json_t **, struct rb_error *);
int	pg_admin_purge(struct rb_store *, enum rb_admin_purge, int64_t older_than_ms, int batch,
	    struct rb_error *);
int	pg_admin_purge_keys(struct rb_store *, char **after, int batch, struct rb_error *);
int	pg_admin_lanes(struct rb_store *, const char *handler, bool all, json_t **, struct rb_error *);
int	pg_admin_subscriptions(struct rb_store *, const char *handler, json_t **, struct rb_error *);
/* store_pg_inspect.c */
int	pg_inspect_lifecycle(struct rb_store *, const struct rb_inspect_opts *, json_t **,
	    struct rb_error *);
int	pg_inspect_sample(struct rb_store *, json_t **, struct rb_error *);

struct rb_sbuf;

/**
 * rb-setup --grant/--revoke (store_pg_grants.c): record o's grants and
 * revokes and apply every recorded grant (relaybus_apply_grants), in the
 * set-up's transaction.  A granted role that does not exist: RB_EXIT_USAGE.
 */
int	pg_grants_setup(struct rb_store *, const struct rb_setup_opts *o, struct rb_error *err);
/** The same as SQL statements for --print-sql, appended to b (o checked already). */
void	pg_grants_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o);

#endif
