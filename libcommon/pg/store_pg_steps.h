/* SPDX-License-Identifier: MIT */
/*
 * store_pg_steps.h: PRIVATE to the PostgreSQL backend (libcommon/pg/).  The
 * steps of the backend, each a file by job over its core (store_pg_int.h),
 * and what each implements for rb_store_pg_ops (store_pg.c):
 *
 *   store_pg_setup.c       the set-up script and rb_store_setup
 *   store_pg_setup_wait.c  the set-up's locks
 *   store_pg_version.c     schema versions (rb_store_schema_info) and the parts
 *                          of the set-up script around schema_pg.sql: the
 *                          version guard, lane_pg.sql, the 0.1.0 upgrade
 *   store_pg_grants.c      rb-setup --grant/--revoke
 *   store_pg_publish.c     publish, and rb_pg_publish (rb_pg.h)
 *   store_pg_claim.c       claim, fetch on the second connection, extend, relinquish
 *   store_pg_complete.c    completion at once (one statement, --sql, failures)
 *   store_pg_complete_start.c  completion without waiting
 *   store_pg_admin.c       rb_admin.h
 *   store_pg_inspect.c     rb_inspect.h
 *
 * A step uses the core and the steps listed above it that it needs (the
 * set-up its locks, versions and grants; inspect the others), never
 * store_pg.c: the core reaches a step's answer only through struct pg_be
 * (answer_claim, answer_complete), set by store_pg.c, the one file that
 * includes every step (tests/check_includes.py).
 */
#ifndef STORE_PG_STEPS_H
#define STORE_PG_STEPS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "rb_admin.h"
#include "rb_inspect.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_pg_int.h"

/* ---- the statement templates, rendered by pg_open (store_pg.c) ----------- */

extern const char pg_tmpl_publish[], pg_tmpl_publish1[], pg_tmpl_wake[];
extern const char pg_tmpl_claim[], pg_tmpl_claim_ids[], pg_tmpl_fetch[], pg_tmpl_extend[],
	pg_tmpl_relinquish[], pg_tmpl_relinquish_owner[], pg_tmpl_relinquish_leases[], pg_tmpl_hold[];
extern const char pg_tmpl_complete[], pg_tmpl_complete_hist[], pg_tmpl_fail[], pg_tmpl_lock_lane[];
/* the same for a session without the owner's privileges (pg_be.worker) */
extern const char pg_tmpl_w_claim[], pg_tmpl_w_claim_ids[], pg_tmpl_w_fetch[], pg_tmpl_w_extend[],
	pg_tmpl_w_relinquish[], pg_tmpl_w_relinquish_owner[], pg_tmpl_w_relinquish_leases[];
extern const char pg_tmpl_w_complete[], pg_tmpl_w_fail[], pg_tmpl_w_lock_lane[];

/* ---- the slots, by file ------------------------------------------------ */

/* store_pg_setup.c */
char	*pg_setup_script(const char *schema, const struct rb_setup_opts *, struct rb_error *);
int	pg_setup(struct rb_store *, const struct rb_setup_opts *, struct rb_error *);
/* store_pg_setup_wait.c: the set-up's locks, each for at most --lock-timeout */
#define SETUP_LOCK_KEY	"7166535398124000001"
int	pg_setup_lock(struct rb_store *, const struct rb_setup_opts *, struct rb_error *);
int	pg_setup_lock_tables(struct rb_store *, const struct rb_setup_opts *, struct rb_error *);
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
int	pg_claim(struct rb_store *, const struct rb_claim_opts *, struct rb_dl ***, struct rb_error *);
int	pg_extend(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *);
int	pg_extend_plain(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *);
int	pg_relinquish(struct rb_store *, const char *handler, const char *owner, struct rb_error *);
int	pg_relinquish_owner(struct rb_store *, const char *handler, const char *owner, struct rb_error *);
int	pg_relinquish_leases(struct rb_store *, const struct rb_result *, size_t, struct rb_error *);
int	pg_in_flight(struct rb_store *, const struct rb_result *, size_t, bool *, struct rb_error *);
/** Close the second connection and forget what is claimed and not read. */
void	pg_close_conn2(struct pg_be *);
/* store_pg_complete.c */
int	pg_complete(struct rb_store *, const struct rb_complete_opts *, struct rb_result *, size_t,
	    struct rb_error *);
/** A result before its completion: lost until found otherwise, nothing
 * known of its delivery yet. */
void	pg_result_reset(struct rb_result *);
/* ... and what store_pg_complete_start.c sends and reads: a completion's
 * fence arrays, one element per result in the results' order */
struct pg_fence {
	struct rb_sbuf ev, h, lane, epoch, claims, id, addr;
};

/* pg_tmpl_complete's parameters, of a struct pg_fence */
#define COMPLETE_NPARAMS	7
#define COMPLETE_PARAMS(a)	{ (a).ev.s, (a).h.s, (a).lane.s, (a).epoch.s, (a).claims.s, (a).id.s, (a).addr.s }
void	pg_fence_init(struct pg_fence *);
void	pg_fence_add(struct pg_fence *, const struct rb_result *);
void	pg_fence_close(struct pg_fence *);
void	pg_fence_free(struct pg_fence *);
/* relaybus_fail's: the failures' fence arrays, what each asks for, and the backoff */
struct pg_fail_args {
	struct pg_fence	 a;
	struct rb_sbuf	 kinds, retry, errors;
	char		 maxa[16], base[32], maxms[32], factor[32];
};

#define FAIL_NPARAMS	13
#define FAIL_PARAMS(f)	{ (f).a.ev.s, (f).a.h.s, (f).a.lane.s, (f).a.epoch.s, (f).a.claims.s, (f).kinds.s, \
	(f).retry.s, (f).errors.s, (f).maxa, (f).base, (f).maxms, (f).factor, (f).a.id.s }
/** f: relaybus_fail's parameters for the n results of v at idx. */
void	pg_fail_args_init(struct pg_fail_args *f, const struct rb_complete_opts *, const struct rb_result *v,
	    const size_t *idx, size_t n);
void	pg_fail_args_free(struct pg_fail_args *);
/** The outcomes of pg_tmpl_complete (res) for the n results of v at idx
 * (NULL: 0..n-1): completed or lost (missing when gone, asked on c). */
int	pg_complete_outcomes(struct rb_store *, PGconn *c, struct rb_result *v, const size_t *idx, size_t n,
	    PGresult *res, struct rb_error *);
/** The outcomes of relaybus_fail (res) for the n results of v at idx. */
int	pg_fail_outcomes(struct rb_store *, PGconn *c, struct rb_result *v, const size_t *idx, size_t n,
	    PGresult *res, struct rb_error *);
/** Close the third connection, and with it the completion out on it. */
void	pg_close_conn3(struct pg_be *);
/* store_pg_claim.c: the calls without waiting */
bool	pg_claim_ready(const struct rb_store *);
int	pg_claim_start(struct rb_store *, const struct rb_claim_opts *, bool wait, struct rb_error *);
/** The answer of the claim out on conn (PG_CLAIM): true when it came (and
 * was pushed), false when not yet (only without wait). */
bool	pg_claim_answer(struct rb_store *, bool wait);
/** The answer of the fetch out on conn2 (PG_FETCH). */
bool	pg_fetch_answer(struct rb_store *, bool wait);
/** Forget what is claimed and not read (the deliveries freed). */
void	pg_fetch_forget(struct pg_be *);
/* store_pg_complete_start.c: the calls without waiting */
bool	pg_complete_ready(const struct rb_store *);
int	pg_complete_start(struct rb_store *, const struct rb_complete_opts *, struct rb_result *, size_t,
	    bool wait, struct rb_error *);
/** The answer of the completion out on conn or conn3 (PG_COMPLETE). */
bool	pg_complete_answer(struct rb_store *, bool wait);
/** Forget the completion out (its arrays freed). */
void	pg_complete_forget(struct pg_be *);
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
