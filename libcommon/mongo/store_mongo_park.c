/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_park.c: parking long backlogs of one key out of the claim
 * index on MongoDB (relaybus(7) "MongoDB", parking).
 *
 * A delivery's "lane" is "ready" (a claim reads it) or "parked" (no claim
 * reads it: the claim queries and their indexes have lane: "ready").  A
 * claim that reads a key with more ready deliveries than it can use (the
 * head and its chain, MG_PARK_KEEP at least) parks the rest in one
 * transaction: it marks the last one it keeps, X, with parkNext: K (how
 * many to unpark) and parks the pending ready ones of the key after X.
 * The invariant: every parked delivery has a pending ready "marker" of its
 * key before it.  So the first pending delivery of a key is always ready
 * (a claim sees the true head), and a chain, which stops at a marker,
 * never skips a parked one.  Whatever removes a marker from the pending
 * ready ones (a completion, a burial by the handler, by a takeover's charge
 * or by rb-admin, rb-admin cancel) unparks the key's next K parked ones in
 * the same transaction and marks the last of them when more stay parked:
 * nothing waits for a lease, nothing is read per claim.  A parking and the
 * removal of its marker write the same document, so under snapshot
 * isolation one of them aborts.  New deliveries of a parked key are
 * published ready (after the parked run): a chain stops at the marker
 * before them, and the next claim parks them too.  Parking is best effort:
 * a parking that fails is logged and the deliveries stay ready.
 */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "rb_log.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

bool
mg_unpark(struct rb_store *s, mongoc_client_session_t *cs, const char *handler, int lane, const char *key,
    int64_t k, bson_error_t *e)
{
	mongoc_collection_t *dc;
	mongoc_cursor_t *cur;
	bson_t q = BSON_INITIALIZER, opts, *fopts;
	const bson_t *d;
	int64_t *ids;
	size_t n = 0;
	bool ok;

	if (key == NULL || k <= 0)
		return true;
	if (k > MG_PARK_MAX)
		k = MG_PARK_MAX;
	ids = xcalloc((size_t)k + 1, sizeof *ids);
	dc = mg_coll(s, "deliveries");
	mg_sopts(cs, &opts);
	BSON_APPEND_UTF8(&q, "handler", handler);
	BSON_APPEND_INT32(&q, "laneId", lane);
	BSON_APPEND_UTF8(&q, "status", "pending");
	BSON_APPEND_UTF8(&q, "lane", "parked");
	BSON_APPEND_UTF8(&q, "key", key);
	fopts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "sort", "{", "seq", BCON_INT32(1), "}",
	    "limit", BCON_INT64(k + 1));
	bson_concat(fopts, &opts);
	cur = mongoc_collection_find_with_opts(dc, &q, fopts, NULL);
	while (mongoc_cursor_next(cur, &d))
		if (n <= (size_t)k)
			ids[n++] = mg_get_int(d, "_id", 0);
	ok = !mongoc_cursor_error(cur, e);
	mongoc_cursor_destroy(cur);
	bson_destroy(fopts);
	bson_destroy(&q);
	/* the first K ready again; the K-th the next marker when more stay parked */
	for (size_t i = 0; ok && i < n && i < (size_t)k; i++) {
		bson_t *uq = BCON_NEW("_id", BCON_INT64(ids[i]));
		bson_t *u;

		if (i + 1 == (size_t)k && n > (size_t)k)
			u = BCON_NEW("$set", "{", "lane", BCON_UTF8("ready"), "parkNext", BCON_INT64(k), "}");
		else
			u = BCON_NEW("$set", "{", "lane", BCON_UTF8("ready"), "}", "$unset", "{", "parkNext", BCON_UTF8(""), "}");
		ok = mongoc_collection_update_one(dc, uq, u, &opts, NULL, e);
		bson_destroy(uq);
		bson_destroy(u);
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(dc);
	free(ids);
	return ok;
}

bool
mg_unpark_after(struct rb_store *s, mongoc_client_session_t *cs, const bson_t *d, bson_error_t *e)
{
	int64_t k = mg_get_int(d, "parkNext", 0);
	const char *h = mg_get_str(d, "handler");

	if (k <= 0 || h == NULL)
		return true;
	return mg_unpark(s, cs, h, (int)mg_get_int(d, "laneId", 0), mg_get_str(d, "key"), k, e);
}

/* ---- parking (a claim's, best effort) ----------------------------------------- */

struct pctx {
	struct rb_store		*s;
	const char		*handler;
	const struct mg_park	*v;
	size_t			 n;
	int64_t			 parked;	/* out */
};

static bool
park_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct pctx *p = ctx;
	mongoc_collection_t *dc = mg_coll(p->s, "deliveries");
	bson_t opts;
	bool ok = true;

	p->parked = 0;
	mg_sopts(cs, &opts);
	for (size_t i = 0; ok && i < p->n; i++) {
		const struct mg_park *x = &p->v[i];
		bson_t *q = BCON_NEW("_id", BCON_INT64(x->marker), "status", BCON_UTF8("pending"),
		    "lane", BCON_UTF8("ready"));
		bson_t *u = BCON_NEW("$set", "{", "parkNext", BCON_INT64(x->k), "}");
		bson_t reply, pq = BSON_INITIALIZER, gt, pu = BSON_INITIALIZER, set, unset;

		/* the marker first: still pending and ready, else nothing here */
		ok = mongoc_collection_update_one(dc, q, u, &opts, &reply, e);
		bson_destroy(q);
		bson_destroy(u);
		if (ok && mg_get_int(&reply, "matchedCount", 0) == 1) {
			bson_t r2;

			BSON_APPEND_UTF8(&pq, "handler", p->handler);
			BSON_APPEND_INT32(&pq, "laneId", x->lane);
			BSON_APPEND_UTF8(&pq, "status", "pending");
			BSON_APPEND_UTF8(&pq, "lane", "ready");
			BSON_APPEND_UTF8(&pq, "key", x->key);
			BSON_APPEND_DOCUMENT_BEGIN(&pq, "seq", &gt);
			BSON_APPEND_INT64(&gt, "$gt", x->seq);
			bson_append_document_end(&pq, &gt);
			BSON_APPEND_DOCUMENT_BEGIN(&pu, "$set", &set);
			BSON_APPEND_UTF8(&set, "lane", "parked");
			bson_append_document_end(&pu, &set);
			BSON_APPEND_DOCUMENT_BEGIN(&pu, "$unset", &unset);
			BSON_APPEND_UTF8(&unset, "parkNext", "");
			bson_append_document_end(&pu, &unset);
			ok = mongoc_collection_update_many(dc, &pq, &pu, &opts, &r2, e);
			if (ok)
				p->parked += mg_get_int(&r2, "modifiedCount", 0);
			bson_destroy(&r2);
		}
		bson_destroy(&reply);
		bson_destroy(&pq);
		bson_destroy(&pu);
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(dc);
	return ok;
}

void
mg_park(struct rb_store *s, const char *handler, const struct mg_park *v, size_t n)
{
	struct pctx p = { .s = s, .handler = handler, .v = v, .n = n };
	mongoc_client_session_t *cs;
	bson_error_t e;
	bool ok;

	if (n == 0)
		return;
	/* one try: a conflict means someone else moved these deliveries */
	if ((cs = mongoc_client_start_session(mg_be(s)->client, NULL, &e)) == NULL) {
		rb_info("parking %zu keys of %s: %s", n, handler, e.message);
		return;
	}
	ok = mongoc_client_session_start_transaction(cs, NULL, &e);
	if (ok && park_txn(cs, &p, &e)) {
		bson_t reply;

		ok = mongoc_client_session_commit_transaction(cs, &reply, &e);
		bson_destroy(&reply);
	} else if (ok) {
		mongoc_client_session_abort_transaction(cs, NULL);
		ok = false;
	}
	if (ok)
		rb_debug("parked %" PRId64 " deliveries of %zu keys of %s", p.parked, n, handler);
	else
		rb_info("parking %zu keys of %s (left ready): %s", n, handler, e.message);
	mongoc_client_session_destroy(cs);
}
