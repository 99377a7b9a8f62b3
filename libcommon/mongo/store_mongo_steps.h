/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_steps.h: PRIVATE to the MongoDB backend (libcommon/mongo/):
 * its steps, each a file by job over the core (store_mongo_int.h), and
 * what each implements for rb_store_mongo_ops (store_mongo.c):
 *
 *   store_mongo_upgrade.c   a 0.1.0 database upgraded in place
 *   store_mongo_park.c      a key's backlog parked out of the claim index
 *   store_mongo_keys.c      key counters, the requeue of a keyed delivery
 *   store_mongo_complete.c  completions, extend, relinquish, rb_mongo_complete's part
 *   store_mongo_api.c       the checks of the C API's entry points (<rb_mongo.h>)
 *   store_mongo_publish.c   publish, and rb_mongo_publish
 *   store_mongo_lanes.c     claims (with store_mongo_takeover.c: store_mongo_claim.h)
 *   store_mongo_admin.c     rb_admin.h
 *
 * A step uses the core and the steps it needs, never store_mongo.c, the
 * one file that includes every step.
 */
#ifndef STORE_MONGO_STEPS_H
#define STORE_MONGO_STEPS_H

#include <stdbool.h>
#include <stdint.h>

#include <mongoc/mongoc.h>

#include "rb_admin.h"
#include "rb_store.h"
#include "store_int.h"
#include "store_mongo_int.h"

/* store_mongo_api.c: the checks of the C API's entry points (<rb_mongo.h>) */
int	mg_api_check(const char *fn, mongoc_client_session_t *, mongoc_database_t *, const char **schema,
	    struct rb_error *);

/* store_mongo_upgrade.c: a 0.1.0 database upgraded in place (repeatable) */
int	mg_upgrade_010(struct rb_store *, struct rb_error *);

/* store_mongo_publish.c */
int	mg_publish(struct rb_store *, const char *, size_t, struct rb_publish_acks *, struct rb_error *);

/* store_mongo_lanes.c */
int	mg_claim(struct rb_store *, const struct rb_claim_opts *, struct rb_dl ***, struct rb_error *);
/* store_mongo_complete.c */
int	mg_complete(struct rb_store *, const struct rb_complete_opts *, struct rb_result *, size_t,
	    struct rb_error *);
/* the success path of one result in the caller's transaction cs (rb_mongo_complete):
 * 1 completed, 0 its lease does not hold (nothing written), -1 error e */
int	mg_complete_in(struct rb_store *, mongoc_client_session_t *cs, const struct rb_result *, bson_error_t *e);
int	mg_extend(struct rb_store *, const char *, const char *, int64_t, struct rb_error *);
int	mg_relinquish(struct rb_store *, const char *, const char *, struct rb_error *);
int	mg_relinquish_owner(struct rb_store *, const char *, const char *, struct rb_error *);
int	mg_relinquish_leases(struct rb_store *, const struct rb_result *, size_t, struct rb_error *);
int	mg_in_flight(struct rb_store *, const struct rb_result *, size_t, bool *, struct rb_error *);

/* store_mongo_park.c: a key's backlog parked out of the claim index */
#define MG_PARK_KEEP	4	/* a key's ready deliveries kept by a parking (at least) */
#define MG_PARK_MIN	16	/* parked only when at least this many more are ready */
#define MG_PARK_MAX	10000	/* unparked at most at once */
struct mg_park {
	int		 lane;
	char		*key;
	int64_t		 marker, seq;	/* the last one kept ready, and its seq */
	int64_t		 k;		/* unparked at a time (its parkNext) */
};
/* park, after each marker, the key's pending ready ones: best effort, one transaction */
void	mg_park(struct rb_store *, const char *handler, const struct mg_park *, size_t);
/* in transaction cs: the next k parked ones of the key ready again (the
 * k-th the next marker when more stay parked) */
bool	mg_unpark(struct rb_store *, mongoc_client_session_t *, const char *handler, int lane, const char *key,
	    int64_t k, bson_error_t *);
/* the same when delivery document d (leaving the pending ready ones) is a marker */
bool	mg_unpark_after(struct rb_store *, mongoc_client_session_t *, const bson_t *d, bson_error_t *);

/* store_mongo_admin.c */
int	mg_admin_stats(struct rb_store *, json_t **, struct rb_error *);
int	mg_admin_list(struct rb_store *, const struct rb_admin_filter *, json_t **, struct rb_error *);
int	mg_admin_show(struct rb_store *, const char *, json_t **, struct rb_error *);
int	mg_admin_apply(struct rb_store *, enum rb_admin_action, const json_t *, const char *, json_t **,
	    struct rb_error *);
int	mg_admin_purge(struct rb_store *, enum rb_admin_purge, int64_t, int, struct rb_error *);
/* store_mongo_keys.c: key counters no delivery needs (rb_admin_purge_keys) */
int	mg_admin_purge_keys(struct rb_store *, char **after, int batch, struct rb_error *);
/* requeue dead keyed delivery d (update u where q), to the back of its key
 * when a later one of its key is in flight; *modified 0 or 1 */
int	mg_requeue_keyed(struct rb_store *, const bson_t *d, const bson_t *q, const bson_t *u, int64_t *modified,
	    struct rb_error *);
int	mg_admin_lanes(struct rb_store *, const char *, bool, json_t **, struct rb_error *);
int	mg_admin_subscriptions(struct rb_store *, const char *, json_t **, struct rb_error *);

#endif
