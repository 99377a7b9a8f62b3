/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_int.h: PRIVATE to the MongoDB backend (store_mongo*.c).
 *
 * The data model (relaybus(7) "MongoDB"): in the URL's database (default
 * "relaybus"), collections named <schema>.<name>:
 *   events        {_id: event id, name, key, payload, headers, handlers, createdAt}
 *   deliveries    {_id: delivery id (int64), eventId, handler, laneId, key, seq,
 *                  status: pending|dead, availableAt, attempts, claims, lastError,
 *                  createdAt, updatedAt, lane: "ready"|"parked", parkNext}
 *   lanes         {_id: "<handler>/<lane>", handler, laneId, epoch, owner, holder,
 *                  leaseExpiresAt, inFlight: [ids], chainEarly, lost: [ids], lostOwner,
 *                  lostChainEarly, failed, buried (the exact counters)}
 *   keys          {_id: key, seq}
 *   counters      {_id: "deliveries", n}, {_id: "historyPurged/<handler>", kind, handler, n}
 *   subscriptions {handler, pattern, createdAt}
 *   schema_version{_id: 1, installedAt}
 *   completed_deliveries (rb-setup --completion-history)
 */
#ifndef STORE_MONGO_INT_H
#define STORE_MONGO_INT_H

#include <stdio.h>

#include <mongoc/mongoc.h>

#include "store_int.h"

#define MG_VERSION	1
/* how long a wait for work sleeps between claims (no LISTEN on MongoDB) */
#define MG_POLL_MS	200

struct mg_be {
	mongoc_uri_t		*uri;
	mongoc_client_t		*client;
	mongoc_database_t	*db;
	char			 holder[40];	/* this store instance, kept across reconnects */
	bool			 broken;
	bool			 ready;		/* the schema is set up */
	char			*seeded;	/* the handler whose lanes exist (checked once) */
};

static inline struct mg_be *
mg_be(const struct rb_store *s)
{
	return s->be;
}

/* the collection <schema>.<name> (new, the caller destroys it) */
mongoc_collection_t *mg_coll(struct rb_store *, const char *name);
/* err from a failed libmongoc call: 69 unreachable, 75 transient, 70 else */
int	mg_err(struct rb_store *, const bson_error_t *, const char *what, struct rb_error *);
/* store_mongo_api.c: the checks of the C API's entry points (<rb_mongo.h>) */
int	mg_api_check(const char *fn, mongoc_client_session_t *, mongoc_database_t *, const char **schema,
	    struct rb_error *);
int64_t	mg_now(void);
/* run fn in a transaction (retried on TransientTransactionError) */
typedef bool (*mg_txn_fn)(mongoc_client_session_t *, void *ctx, bson_error_t *);
int	mg_txn(struct rb_store *, mg_txn_fn, void *ctx, const char *what, struct rb_error *);
/* opts with the session's lsid (init'ed here; bson_destroy it) */
void	mg_sopts(mongoc_client_session_t *, bson_t *opts);
/* JSON <-> BSON */
void	mg_append_json(bson_t *, const char *key, const json_t *);
json_t	*mg_iter_json(const bson_iter_t *);
/* the text of a BSON value as JSON, new string */
char	*mg_iter_json_text(const bson_iter_t *);
/* RFC 3339 UTC with milliseconds */
void	mg_fmt_time(int64_t ms, char buf[32]);
int	mg_seed_lanes(struct rb_store *, const char *handler, struct rb_error *);
/* a lane document's _id, "handler/lane" (a handler name is at most 200 bytes) */
#define MG_LANE_ID_LEN	208
static inline void
mg_lane_id(char buf[MG_LANE_ID_LEN], const char *handler, int lane)
{
	snprintf(buf, MG_LANE_ID_LEN, "%s/%d", handler, lane);
}
bool	mg_history(struct rb_store *);
/* 0 when s->schema is set up, else -1 + err (78, "run rb-setup") */
int	mg_ready(struct rb_store *, const char *what, struct rb_error *);
/* bson helpers */
int64_t	mg_get_int(const bson_t *, const char *key, int64_t dflt);
const char *mg_get_str(const bson_t *, const char *key);

/* store_mongo_upgrade.c: a 0.1.0 database upgraded in place (repeatable) */
int	mg_upgrade_010(struct rb_store *, struct rb_error *);

/* store_mongo_publish.c */
int	mg_publish(struct rb_store *, const char *, size_t, struct rb_publish_acks *, struct rb_error *);

/* store_mongo_lanes.c */
int	mg_claim(struct rb_store *, const struct rb_claim_opts *, struct rb_dl ***, struct rb_error *);
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
