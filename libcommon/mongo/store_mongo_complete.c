/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_complete.c: completion, failure, release and burial on
 * MongoDB, and extending and handing back leases.  A batch's successes are
 * one transaction: read its lanes and deliveries, check each against its
 * lease (the lane's epoch, the delivery's claim count, the lane's inFlight
 * list), delete those that pass (and write their history documents).  The
 * rare path (reschedule, bury, release) is one transaction that updates
 * each delivery and pulls it from its lane's inFlight list.  A delivery
 * that leaves the pending ones as a parking's marker unparks the next ones
 * of its key in the same transaction (store_mongo_park.c).
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

struct res {
	const struct rb_result *r;
	const char	*event_id, *handler;
	struct rb_lease	 l;
	int64_t		 id;		/* 0: not given */
	enum rb_verdict	 verdict;
	/* found in the transaction */
	bool		 exists, fenced;
	bool		 held;		/* the lane is at the lease's epoch (with the id in flight) */
	const bson_t	*doc;		/* its delivery document (cctx's dels) */
	int64_t		 did;
	int		 attempts;
	enum rb_outcome	 outcome;
	int		 new_attempts;
	bool		 kept;		/* rescheduled, due at once, left in the lane's inFlight */
};

struct cctx {
	struct rb_store			*s;
	const struct rb_complete_opts	*o;
	struct res			*v;
	size_t				 n;
	bool				 ok_path, history;
	bson_t				**dels;	/* the deliveries fence read */
	size_t				 nd;
};

static void
cctx_free_dels(struct cctx *c)
{
	for (size_t k = 0; k < c->nd; k++)
		bson_destroy(c->dels[k]);
	free(c->dels);
	c->dels = NULL;
	c->nd = 0;
}

static bool
in_array(const bson_t *d, const char *key, int64_t v)
{
	bson_iter_t it, c;

	if (bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &c))
		while (bson_iter_next(&c))
			if (bson_iter_as_int64(&c) == v)
				return true;
	return false;
}

/* read the results' lanes and deliveries in the transaction; fence each */
static bool
fence(struct cctx *c, mongoc_client_session_t *cs, bson_error_t *e)
{
	mongoc_collection_t *lc = mg_coll(c->s, "lanes"), *dc = mg_coll(c->s, "deliveries");
	bson_t q = BSON_INITIALIZER, in, arr, opts;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t **lanes = NULL, **dels;
	size_t nl = 0, nd;
	bool ok = true;

	cctx_free_dels(c);
	dels = NULL;
	nd = 0;

	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
	for (size_t i = 0; i < c->n; i++) {
		char ks[16], id[MG_LANE_ID_LEN];
		const char *kp;

		mg_lane_id(id, c->v[i].handler, c->v[i].l.lane);
		bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
		bson_append_utf8(&arr, kp, -1, id, -1);
	}
	bson_append_array_end(&in, &arr);
	bson_append_document_end(&q, &in);
	mg_sopts(cs, &opts);
	cur = mongoc_collection_find_with_opts(lc, &q, &opts, NULL);
	while (mongoc_cursor_next(cur, &d)) {
		lanes = xrealloc(lanes, (nl + 1) * sizeof *lanes);
		lanes[nl++] = bson_copy(d);
	}
	if (mongoc_cursor_error(cur, e))
		ok = false;
	mongoc_cursor_destroy(cur);
	bson_destroy(&q);
	if (ok) {
		bson_init(&q);
		BSON_APPEND_DOCUMENT_BEGIN(&q, "eventId", &in);
		BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
		for (size_t i = 0; i < c->n; i++) {
			char ks[16];
			const char *kp;

			bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
			bson_append_utf8(&arr, kp, -1, c->v[i].event_id, -1);
		}
		bson_append_array_end(&in, &arr);
		bson_append_document_end(&q, &in);
		cur = mongoc_collection_find_with_opts(dc, &q, &opts, NULL);
		while (mongoc_cursor_next(cur, &d)) {
			dels = xrealloc(dels, (nd + 1) * sizeof *dels);
			dels[nd++] = bson_copy(d);
		}
		if (mongoc_cursor_error(cur, e))
			ok = false;
		mongoc_cursor_destroy(cur);
		bson_destroy(&q);
	}
	for (size_t i = 0; ok && i < c->n; i++) {
		struct res *r = &c->v[i];
		const bson_t *ld = NULL, *dd = NULL;
		char id[MG_LANE_ID_LEN];
		const char *st;

		r->exists = r->fenced = r->held = false;
		r->doc = NULL;
		mg_lane_id(id, r->handler, r->l.lane);
		for (size_t k = 0; k < nl && ld == NULL; k++)
			if (mg_get_str(lanes[k], "_id") != NULL && strcmp(mg_get_str(lanes[k], "_id"), id) == 0)
				ld = lanes[k];
		/* (a completion leaves its id on the lane's inFlight list) */
		r->held = ld != NULL && mg_get_int(ld, "epoch", -1) == r->l.epoch &&
		    (r->id == 0 || in_array(ld, "inFlight", r->id));
		for (size_t k = 0; k < nd && dd == NULL; k++) {
			const char *ev = mg_get_str(dels[k], "eventId"), *h = mg_get_str(dels[k], "handler");

			if (ev != NULL && h != NULL && strcmp(ev, r->event_id) == 0 && strcmp(h, r->handler) == 0)
				dd = dels[k];
		}
		if (dd == NULL)
			continue;
		r->exists = true;
		r->doc = dd;
		r->did = mg_get_int(dd, "_id", 0);
		r->attempts = (int)mg_get_int(dd, "attempts", 0);
		st = mg_get_str(dd, "status");
		r->fenced = ld != NULL && mg_get_int(ld, "epoch", -1) == r->l.epoch &&
		    mg_get_int(dd, "claims", -1) == r->l.claims && mg_get_int(dd, "laneId", -1) == r->l.lane &&
		    st != NULL && strcmp(st, "pending") == 0 && in_array(ld, "inFlight", r->did) &&
		    (r->id == 0 || r->id == r->did);
		/* (each delivery once: a result given twice completes once) */
		for (size_t k = 0; k < i && r->fenced; k++)
			if (c->v[k].fenced && c->v[k].did == r->did)
				r->fenced = false;
	}
	for (size_t k = 0; k < nl; k++)
		bson_destroy(lanes[k]);
	free(lanes);
	c->dels = dels;
	c->nd = nd;
	bson_destroy(&opts);
	mongoc_collection_destroy(lc);
	mongoc_collection_destroy(dc);
	return ok;
}

static bool
ok_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct cctx *c = ctx;
	mongoc_collection_t *dc;
	bson_t q = BSON_INITIALIZER, in, arr, opts, reply;
	size_t k = 0;
	bool ok;

	if (!fence(c, cs, e))
		return false;
	dc = mg_coll(c->s, "deliveries");
	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
	for (size_t i = 0; i < c->n; i++) {
		char ks[16];
		const char *kp;

		if (!c->v[i].fenced)
			continue;
		bson_uint32_to_string((uint32_t)k++, &kp, ks, sizeof ks);
		bson_append_int64(&arr, kp, -1, c->v[i].did);
	}
	bson_append_array_end(&in, &arr);
	bson_append_document_end(&q, &in);
	mg_sopts(cs, &opts);
	ok = k == 0 || mongoc_collection_delete_many(dc, &q, &opts, &reply, e);
	if (k > 0) {
		if (ok && mg_get_int(&reply, "deletedCount", -1) != (int64_t)k) {
			/* (cannot happen under snapshot isolation: a conflict comes first) */
			bson_set_error(e, MONGOC_ERROR_SERVER, 112, "completion raced a takeover");
			ok = false;
		}
		bson_destroy(&reply);
	}
	for (size_t i = 0; ok && i < c->n; i++)
		if (c->v[i].fenced)
			ok = mg_unpark_after(c->s, cs, c->v[i].doc, e);
	if (ok && k > 0 && c->history) {
		mongoc_collection_t *hc = mg_coll(c->s, "completed_deliveries");

		for (size_t i = 0; ok && i < c->n; i++) {
			if (!c->v[i].fenced)
				continue;
			bson_t *d = BCON_NEW("eventId", BCON_UTF8(c->v[i].event_id), "handler", BCON_UTF8(c->v[i].handler),
			    "deliveryId", BCON_INT64(c->v[i].did), "attempts", BCON_INT32(c->v[i].attempts + 1),
			    "completedAt", BCON_DATE_TIME(mg_now()));

			ok = mongoc_collection_insert_one(hc, d, &opts, NULL, e);
			bson_destroy(d);
		}
		mongoc_collection_destroy(hc);
	}
	bson_destroy(&opts);
	bson_destroy(&q);
	mongoc_collection_destroy(dc);
	return ok;
}

static bool
fail_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct cctx *c = ctx;
	mongoc_collection_t *dc, *lc;
	bson_t opts;
	bool ok = true;
	int64_t now = mg_now();

	if (!fence(c, cs, e))
		return false;
	dc = mg_coll(c->s, "deliveries");
	lc = mg_coll(c->s, "lanes");
	mg_sopts(cs, &opts);
	for (size_t i = 0; ok && i < c->n; i++) {
		struct res *r = &c->v[i];
		bson_t *q, u = BSON_INITIALIZER, set, inc;
		char id[MG_LANE_ID_LEN];

		r->outcome = RB_OUTCOME_LOST;
		r->kept = false;
		if (!r->fenced)
			continue;
		q = BCON_NEW("_id", BCON_INT64(r->did), "claims", BCON_INT64(r->l.claims));
		BSON_APPEND_DOCUMENT_BEGIN(&u, "$inc", &inc);
		BSON_APPEND_INT64(&inc, "claims", 1);
		if (r->verdict != RB_VERDICT_RELEASE)
			BSON_APPEND_INT32(&inc, "attempts", 1);
		bson_append_document_end(&u, &inc);
		BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
		BSON_APPEND_DATE_TIME(&set, "updatedAt", now);
		if (r->verdict == RB_VERDICT_RELEASE) {
			r->outcome = RB_OUTCOME_RELEASED;
			r->new_attempts = r->attempts;
		} else {
			const char *er = r->r->error;
			double delay;
			bool dead = r->verdict == RB_VERDICT_DEAD || r->attempts + 1 >= c->o->max_attempts;

			r->new_attempts = r->attempts + 1;
			r->outcome = dead ? RB_OUTCOME_BURIED : RB_OUTCOME_RESCHEDULED;
			if (r->r->retry_ms >= 0)
				delay = (double)r->r->retry_ms;
			else {
				/* base * factor^min(attempts, 60), as relaybus_fail (no libm) */
				delay = (double)c->o->backoff.base_ms;
				for (int k = 0; k < r->attempts && k < 60 && delay <= (double)c->o->backoff.max_ms; k++)
					delay *= c->o->backoff.factor;
			}
			if (delay > (double)c->o->backoff.max_ms)
				delay = (double)c->o->backoff.max_ms;
			/* (rb_result.keep: due at once, it stays in flight for its
			 * caller to run again, as relaybus_fail's kind 'again') */
			r->kept = !dead && r->verdict == RB_VERDICT_FAIL && r->r->keep && delay <= 0;
			BSON_APPEND_UTF8(&set, "status", dead ? "dead" : "pending");
			BSON_APPEND_UTF8(&set, "lastError", er != NULL ? er : "handler failed");
			BSON_APPEND_DATE_TIME(&set, "availableAt", now + (int64_t)delay);
		}
		bson_append_document_end(&u, &set);
		ok = mongoc_collection_update_one(dc, q, &u, &opts, NULL, e);
		bson_destroy(q);
		bson_destroy(&u);
		if (ok && r->outcome == RB_OUTCOME_BURIED)
			ok = mg_unpark_after(c->s, cs, r->doc, e);
		if (ok) {
			bson_t *lq, *lu;

			mg_lane_id(id, r->handler, r->l.lane);
			lq = BCON_NEW("_id", BCON_UTF8(id));
			/* the exact counters (rb-admin stats): a failed attempt, a burial */
			lu = BCON_NEW("$inc", "{", "failed", BCON_INT64(r->verdict != RB_VERDICT_RELEASE),
			    "buried", BCON_INT64(r->outcome == RB_OUTCOME_BURIED), "}");
			if (!r->kept)
				BCON_APPEND(lu, "$pull", "{", "inFlight", BCON_INT64(r->did), "}");
			ok = mongoc_collection_update_one(lc, lq, lu, &opts, NULL, e);
			bson_destroy(lq);
			bson_destroy(lu);
		}
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(dc);
	mongoc_collection_destroy(lc);
	return ok;
}

static bool
read_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	return fence(ctx, cs, e);
}

static const char mg_done_not_committed[] =
    "\"completed\": true, but the delivery is still pending under this lease (the handler's "
    "transaction did not commit, or did not call rb_mongo_complete)";

/*
 * A result the handler says it completed: gone, completed (by the
 * handler), nothing written; still pending under the lease: the handler's
 * transaction did not commit, so it takes the failure path (error set,
 * verdict kept: mg_complete reschedules it) and runs again; there under
 * another lease: lost.
 */
static int
done_check(struct rb_store *s, struct rb_result *r, struct rb_error *err)
{
	struct res x = { .r = r, .event_id = r->event_id, .handler = r->handler, .l = r->lease,
	    .id = r->delivery_id > 0 ? r->delivery_id : 0, .verdict = r->verdict };
	struct cctx c = { .s = s, .v = &x, .n = 1 };
	int rc = mg_txn(s, read_txn, &c, "complete", err);

	cctx_free_dels(&c);
	if (rc < 0)
		return -1;
	r->by_handler = false;
	r->missing = false;
	r->error = NULL;
	if (!x.exists) {
		r->outcome = RB_OUTCOME_COMPLETED;
		r->by_handler = true;
	} else if (x.fenced)
		r->error = mg_done_not_committed;
	else
		r->outcome = RB_OUTCOME_LOST;
	return 0;
}

int
mg_complete_in(struct rb_store *s, mongoc_client_session_t *cs, const struct rb_result *r, bson_error_t *e)
{
	struct res x = { .r = r, .event_id = r->event_id, .handler = r->handler, .l = r->lease,
	    .id = r->delivery_id > 0 ? r->delivery_id : 0, .verdict = RB_VERDICT_OK };
	struct cctx c = { .s = s, .v = &x, .n = 1, .ok_path = true, .history = mg_history(s) };
	bool ok = ok_txn(cs, &c, e);

	cctx_free_dels(&c);
	return !ok ? -1 : x.fenced ? 1 : 0;
}

int
mg_complete(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *results, size_t n,
    struct rb_error *err)
{
	size_t nok = 0, nfail = 0;
	struct res *v = xcalloc(n + 1, sizeof *v);
	struct res *ok = xcalloc(n + 1, sizeof *ok), *fail = xcalloc(n + 1, sizeof *fail);
	size_t *okat = xcalloc(n + 1, sizeof *okat), *failat = xcalloc(n + 1, sizeof *failat);
	int rc = -1;

	if (o->sql != NULL && *o->sql != '\0') {
		rb_seterr(err, RB_EXIT_USAGE, "--sql is not supported by the mongodb backend");
		goto out;
	}
	if (mg_ready(s, "complete", err) < 0)
		goto out;
	/* "completed": true: the handler completed it in its own transaction
	 * (rb_mongo_complete, relaybus(7) MONGODB DOCUMENTS): checked */
	for (size_t i = 0; i < n; i++)
		if (results[i].verdict == RB_VERDICT_DONE && done_check(s, &results[i], err) < 0)
			goto out;
	for (size_t i = 0; i < n; i++) {
		const struct rb_result *r = &results[i];
		struct res *x = &v[i];

		if (r->verdict == RB_VERDICT_DONE && r->error == NULL)
			continue;	/* (done_check's outcome; x->r stays NULL) */
		x->r = r;
		x->event_id = r->event_id;
		x->handler = r->handler;
		x->l = r->lease;
		x->id = r->delivery_id > 0 ? r->delivery_id : 0;
		x->verdict = r->verdict;
		if (x->verdict == RB_VERDICT_OK) {
			okat[nok] = i;
			ok[nok++] = *x;
		} else {
			failat[nfail] = i;
			fail[nfail++] = *x;
		}
	}
	if (nok > 0) {
		struct cctx c = { .s = s, .o = o, .v = ok, .n = nok, .ok_path = true, .history = mg_history(s) };

		rc = mg_txn(s, ok_txn, &c, "complete", err);
		cctx_free_dels(&c);
		if (rc < 0)
			goto out;
		rc = -1;
		for (size_t k = 0; k < nok; k++)
			v[okat[k]] = ok[k];
	}
	if (nfail > 0) {
		struct cctx c = { .s = s, .o = o, .v = fail, .n = nfail };

		rc = mg_txn(s, fail_txn, &c, "reschedule", err);
		cctx_free_dels(&c);
		if (rc < 0)
			goto out;
		rc = -1;
		for (size_t k = 0; k < nfail; k++)
			v[failat[k]] = fail[k];
	}
	for (size_t i = 0; i < n; i++) {
		struct res *x = &v[i];
		struct rb_result *r = &results[i];
		bool done = x->verdict == RB_VERDICT_OK;

		if (x->r == NULL)
			continue;	/* (done_check's outcome) */
		r->outcome = done ? (x->fenced ? RB_OUTCOME_COMPLETED : RB_OUTCOME_LOST) : x->outcome;
		r->kept = !done && x->fenced && x->kept && x->outcome == RB_OUTCOME_RESCHEDULED;
		if (!done && x->fenced)
			r->attempts = x->new_attempts;
		r->missing = !x->fenced && !x->exists;
		r->by_handler = false;
		if (!done && !x->exists && x->held) {
			/* a failure whose delivery is gone under its still-held
			 * lease: the handler completed it (rb_mongo_complete) and
			 * then crashed, or answered late (as on PostgreSQL) */
			r->outcome = RB_OUTCOME_COMPLETED;
			r->by_handler = true;
			r->missing = false;
		}
	}
	rc = 0;
out:
	free(v);
	free(ok);
	free(fail);
	free(okat);
	free(failat);
	return rc;
}

/* ---- extending and handing back ------------------------------------------- */

static int
lanes_update(struct rb_store *s, bson_t *q, bson_t *u, bool many, const char *what, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "lanes");
	bson_t reply;
	bson_error_t e;
	bool ok = many ? mongoc_collection_update_many(c, q, u, NULL, &reply, &e) :
	    mongoc_collection_update_one(c, q, u, NULL, &reply, &e);
	int rc = ok ? (int)mg_get_int(&reply, "matchedCount", 0) : mg_err(s, &e, what, err);

	bson_destroy(&reply);
	bson_destroy(q);
	bson_destroy(u);
	mongoc_collection_destroy(c);
	return rc;
}

int
mg_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms, struct rb_error *err)
{
	return lanes_update(s, BCON_NEW("handler", BCON_UTF8(handler), "owner", BCON_UTF8(owner)),
	    BCON_NEW("$set", "{", "leaseExpiresAt", BCON_DATE_TIME(mg_now() + lease_ms), "}"), true, "extend", err);
}

int
mg_relinquish_owner(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	return lanes_update(s, BCON_NEW("handler", BCON_UTF8(handler), "owner", BCON_UTF8(owner)),
	    BCON_NEW("$inc", "{", "epoch", BCON_INT64(1), "}", "$set", "{", "owner", BCON_NULL, "holder", BCON_NULL,
		"leaseExpiresAt", BCON_NULL, "inFlight", "[", "]", "}"), true, "relinquish", err);
}

/* Does any id of the lane document's inFlight list name a pending delivery? */
static int
runs_something(struct rb_store *s, const bson_t *lane, struct rb_error *err)
{
	bson_iter_t it;
	mongoc_collection_t *c;
	bson_t q = BSON_INITIALIZER, in;
	bson_error_t e;
	int64_t n;

	if (!bson_iter_init_find(&it, lane, "inFlight") || !BSON_ITER_HOLDS_ARRAY(&it))
		return 0;
	{
		const uint8_t *data;
		uint32_t len;
		bson_t arr;

		bson_iter_array(&it, &len, &data);
		if (!bson_init_static(&arr, data, len) || bson_count_keys(&arr) == 0)
			return 0;
		BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
		BSON_APPEND_ARRAY(&in, "$in", &arr);
		bson_append_document_end(&q, &in);
	}
	BSON_APPEND_UTF8(&q, "status", "pending");
	c = mg_coll(s, "deliveries");
	n = mongoc_collection_count_documents(c, &q, NULL, NULL, NULL, &e);
	bson_destroy(&q);
	mongoc_collection_destroy(c);
	if (n < 0)
		return mg_err(s, &e, "relinquish", err);
	return n > 0;
}

/* hand back the lanes matching q that run nothing (each on the epoch read) */
static int
hand_back(struct rb_store *s, bson_t *q, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "lanes");
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
	const bson_t *d;
	bson_t **lanes = NULL;
	size_t nl = 0;
	bson_error_t e;
	int freed = 0, rc = 0;

	while (mongoc_cursor_next(cur, &d)) {
		lanes = xrealloc(lanes, (nl + 1) * sizeof *lanes);
		lanes[nl++] = bson_copy(d);
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, "relinquish", err);
	mongoc_cursor_destroy(cur);
	for (size_t i = 0; rc == 0 && i < nl; i++) {
		int r = runs_something(s, lanes[i], err);

		if (r < 0)
			rc = -1;
		else if (r == 0) {
			const char *id = mg_get_str(lanes[i], "_id");
			int m = lanes_update(s, BCON_NEW("_id", BCON_UTF8(id != NULL ? id : ""),
			    "epoch", BCON_INT64(mg_get_int(lanes[i], "epoch", 0))),
			    BCON_NEW("$set", "{", "owner", BCON_NULL, "holder", BCON_NULL, "leaseExpiresAt", BCON_NULL,
				"inFlight", "[", "]", "}"), false, "relinquish", err);

			if (m < 0)
				rc = -1;
			else
				freed += m;
		}
	}
	for (size_t i = 0; i < nl; i++)
		bson_destroy(lanes[i]);
	free(lanes);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	return rc < 0 ? -1 : freed;
}

int
mg_relinquish(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	return hand_back(s, BCON_NEW("handler", BCON_UTF8(handler), "owner", BCON_UTF8(owner)), err);
}

/* (rb_store_in_flight: the completion's fence, in a transaction that writes nothing) */
static bool
live_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	return fence(ctx, cs, e);
}

int
mg_in_flight(struct rb_store *s, const struct rb_result *v, size_t n, bool *live, struct rb_error *err)
{
	struct res *x = xcalloc(n + 1, sizeof *x);
	struct cctx c = { .s = s, .v = x, .n = n };
	int rc = -1;

	if (mg_ready(s, "in flight", err) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		x[i].r = &v[i];
		x[i].event_id = v[i].event_id;
		x[i].handler = v[i].handler;
		x[i].l = v[i].lease;
		x[i].id = v[i].delivery_id > 0 ? v[i].delivery_id : 0;
	}
	rc = mg_txn(s, live_txn, &c, "in flight", err);
	cctx_free_dels(&c);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < n; i++)
		live[i] = x[i].fenced;
	rc = 0;
out:
	free(x);
	return rc;
}

int
mg_relinquish_leases(struct rb_store *s, const struct rb_result *v, size_t nv, struct rb_error *err)
{
	int freed = 0;

	for (size_t i = 0; i < nv; i++) {
		const char *h = v[i].handler;
		struct rb_lease l = v[i].lease;
		char id[MG_LANE_ID_LEN];
		int n;

		if (h == NULL || !rb_handler_valid(h))
			continue;
		mg_lane_id(id, h, l.lane);
		n = hand_back(s, BCON_NEW("_id", BCON_UTF8(id), "epoch", BCON_INT64(l.epoch),
		    "owner", "{", "$ne", BCON_NULL, "}"), err);
		if (n < 0)
			return -1;
		freed += n;
	}
	return freed;
}
