/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_int.h: PRIVATE to the MongoDB backend (libcommon/mongo/): its
 * core, what every file of it shares: the state (struct mg_be) and the
 * functions of store_mongo_core.c.  Above it the steps by job
 * (store_mongo_steps.h), and on top store_mongo.c (the ops table); a file
 * uses only files below it (tests/check_includes.py).
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

/* ---- store_mongo_core.c ---- */

/* the collection <schema>.<name> (new, the caller destroys it) */
mongoc_collection_t *mg_coll(struct rb_store *, const char *name);
/* err from a failed libmongoc call: 69 unreachable, 75 transient, 70 else */
int	mg_err(struct rb_store *, const bson_error_t *, const char *what, struct rb_error *);
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

#endif
