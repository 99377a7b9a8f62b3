/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_keys.c: the key counters on MongoDB ({_id: key, seq} in
 * <schema>.keys).  A publish takes a key's next sequence from its counter
 * inside its transaction ($inc, an upsert), so every publish of a key
 * writes the counter document.
 *
 * Purge (rb-admin purge --keys), the rule of PostgreSQL: a counter goes
 * when no pending or dead delivery of its key is left (a completed one is
 * deleted; one relaybus 0.1.0 left "completed" needs no counter).  One
 * transaction a batch: read the counters, look for the keys' deliveries,
 * delete the counters of those that have none.  A publish of one of those
 * keys that commits after this snapshot wrote the counter document, so the
 * delete conflicts with it (WriteConflict) and the batch is read again; a
 * publish that commits later conflicts with the delete, and its retry
 * starts the key again from 1, after everything of the key that ran.
 * The deliveries are found through the claim index ready_key (handler,
 * laneId, status, lane, key): the handlers that have deliveries (the
 * index's first field), the key's lane (rb_lane_of), the key.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

struct kpurge {
	struct rb_store	*s;
	const char	*after;
	int		 batch;
	json_t		*handlers;	/* of the deliveries */
	char		*last;		/* out: the last key looked at */
	int		 n;		/* out: deleted */
};

/* the handlers that have deliveries (distinct over the first field of an index) */
static json_t *
delivery_handlers(struct rb_store *s, mongoc_client_session_t *cs, bson_error_t *e)
{
	mongoc_collection_t *c = mg_coll(s, "deliveries");
	bson_t cmd = BSON_INITIALIZER, opts, reply;
	bson_iter_t it, v;
	json_t *r = NULL;

	BSON_APPEND_UTF8(&cmd, "distinct", mongoc_collection_get_name(c));
	BSON_APPEND_UTF8(&cmd, "key", "handler");
	mg_sopts(cs, &opts);
	if (mongoc_collection_read_command_with_opts(c, &cmd, NULL, &opts, &reply, e)) {
		r = json_array();
		if (bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &v))
			while (bson_iter_next(&v))
				if (BSON_ITER_HOLDS_UTF8(&v))
					json_array_append_new(r, json_string(bson_iter_utf8(&v, NULL)));
	}
	bson_destroy(&reply);
	bson_destroy(&opts);
	bson_destroy(&cmd);
	mongoc_collection_destroy(c);
	return r;
}

/* a pending or dead delivery of key: 1, none 0, -1 error */
static int
key_needed(struct kpurge *k, mongoc_client_session_t *cs, mongoc_collection_t *dc, const char *key,
    bson_error_t *e)
{
	bson_t q = BSON_INITIALIZER, in, st, opts;
	mongoc_cursor_t *cur;
	const bson_t *d;
	int rc;

	if (json_array_size(k->handlers) == 0)
		return 0;
	BSON_APPEND_DOCUMENT_BEGIN(&q, "handler", &in);
	mg_append_json(&in, "$in", k->handlers);
	bson_append_document_end(&q, &in);
	BSON_APPEND_INT32(&q, "laneId", rb_lane_of(key, NULL));
	BSON_APPEND_DOCUMENT_BEGIN(&q, "status", &st);
	{
		bson_t a;

		BSON_APPEND_ARRAY_BEGIN(&st, "$in", &a);
		BSON_APPEND_UTF8(&a, "0", "pending");
		BSON_APPEND_UTF8(&a, "1", "dead");
		bson_append_array_end(&st, &a);
	}
	bson_append_document_end(&q, &st);
	BSON_APPEND_UTF8(&q, "key", key);
	mg_sopts(cs, &opts);
	BSON_APPEND_INT64(&opts, "limit", 1);
	cur = mongoc_collection_find_with_opts(dc, &q, &opts, NULL);
	rc = mongoc_cursor_next(cur, &d) ? 1 : 0;
	if (mongoc_cursor_error(cur, e))
		rc = -1;
	mongoc_cursor_destroy(cur);
	bson_destroy(&opts);
	bson_destroy(&q);
	return rc;
}

static bool
kpurge_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct kpurge *k = ctx;
	mongoc_collection_t *kc = mg_coll(k->s, "keys"), *dc = mg_coll(k->s, "deliveries");
	bson_t q = BSON_INITIALIZER, gt, opts, del = BSON_INITIALIZER, din, arr;
	mongoc_cursor_t *cur;
	const bson_t *d;
	int ndel = 0;
	bool ok = true;

	free(k->last);
	k->last = NULL;
	k->n = 0;
	json_decref(k->handlers);
	if ((k->handlers = delivery_handlers(k->s, cs, e)) == NULL)
		ok = false;
	if (k->after != NULL) {
		BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &gt);
		BSON_APPEND_UTF8(&gt, "$gt", k->after);
		bson_append_document_end(&q, &gt);
	}
	mg_sopts(cs, &opts);
	{
		bson_t sort;

		BSON_APPEND_DOCUMENT_BEGIN(&opts, "sort", &sort);
		BSON_APPEND_INT32(&sort, "_id", 1);
		bson_append_document_end(&opts, &sort);
	}
	BSON_APPEND_INT64(&opts, "limit", k->batch);
	BSON_APPEND_DOCUMENT_BEGIN(&del, "_id", &din);
	BSON_APPEND_ARRAY_BEGIN(&din, "$in", &arr);
	cur = ok ? mongoc_collection_find_with_opts(kc, &q, &opts, NULL) : NULL;
	while (ok && mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;
		const char *key;
		int need;

		/* (a key is a string: a publish's, or an upgraded 0.1.0 one) */
		if (!bson_iter_init_find(&it, d, "_id") || !BSON_ITER_HOLDS_UTF8(&it))
			continue;
		key = bson_iter_utf8(&it, NULL);
		free(k->last);
		k->last = xstrdup(key);
		if ((need = key_needed(k, cs, dc, key, e)) < 0)
			ok = false;
		else if (need == 0) {
			char ix[16];

			snprintf(ix, sizeof ix, "%d", ndel++);
			BSON_APPEND_UTF8(&arr, ix, key);
		}
	}
	if (ok && cur != NULL && mongoc_cursor_error(cur, e))
		ok = false;
	if (cur != NULL)
		mongoc_cursor_destroy(cur);
	bson_append_array_end(&din, &arr);
	bson_append_document_end(&del, &din);
	if (ok && ndel > 0) {
		bson_t dopts, reply;

		mg_sopts(cs, &dopts);
		ok = mongoc_collection_delete_many(kc, &del, &dopts, &reply, e);
		if (ok)
			k->n = (int)mg_get_int(&reply, "deletedCount", 0);
		bson_destroy(&reply);
		bson_destroy(&dopts);
	}
	bson_destroy(&del);
	bson_destroy(&opts);
	bson_destroy(&q);
	mongoc_collection_destroy(kc);
	mongoc_collection_destroy(dc);
	return ok;
}

int
mg_admin_purge_keys(struct rb_store *s, char **after, int batch, struct rb_error *err)
{
	struct kpurge k = { .s = s, .after = *after, .batch = batch };
	int rc;

	if (batch < 1)
		return rb_seterr(err, RB_EXIT_USAGE, "purge: invalid batch");
	if (mg_ready(s, "purge", err) < 0)
		return -1;
	rc = mg_txn(s, kpurge_txn, &k, "purge", err);
	json_decref(k.handlers);
	if (rc < 0) {
		free(k.last);
		return -1;
	}
	free(*after);
	*after = k.last;
	return k.n;
}

/*
 * Requeue of a dead keyed delivery (rb-admin requeue), the rule of
 * PostgreSQL's requeue_reorder_sql: when a later delivery of its handler
 * and key is in flight (it started, or may have, once this one was
 * buried), this one could no longer run first; it goes to the back of its
 * key, with a new sequence from the key's counter, in the transaction
 * that makes it pending.  Else it keeps its place (its old sequence: it is
 * the key's head again).  The claim's key rule (store_mongo_lanes.c) holds
 * it anyway while anything of its key runs, so a claim that records a
 * later one concurrently cannot put the two side by side either.
 */
struct requeue {
	struct rb_store	*s;
	const bson_t	*d, *q, *u;
	int64_t		 n;	/* out: modified */
	int64_t		 seq;	/* out: the new sequence, 0 when kept */
};

/* a later delivery of d's handler and key on its lane's inFlight list: 1, 0, -1 */
static int
later_in_flight(struct requeue *r, mongoc_client_session_t *cs, bson_error_t *e)
{
	mongoc_collection_t *lc = mg_coll(r->s, "lanes"), *dc = mg_coll(r->s, "deliveries");
	const char *h = mg_get_str(r->d, "handler"), *key = mg_get_str(r->d, "key");
	char lid[MG_LANE_ID_LEN];
	bson_t *lq, opts, q = BSON_INITIALIZER, in, gt;
	mongoc_cursor_t *cur;
	const bson_t *ld, *dd;
	bson_iter_t it;
	int rc = 0;

	mg_lane_id(lid, h, (int)mg_get_int(r->d, "laneId", 0));
	lq = BCON_NEW("_id", BCON_UTF8(lid));
	mg_sopts(cs, &opts);
	cur = mongoc_collection_find_with_opts(lc, lq, &opts, NULL);
	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	if (mongoc_cursor_next(cur, &ld) && bson_iter_init_find(&it, ld, "inFlight") &&
	    BSON_ITER_HOLDS_ARRAY(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_t ids;

		bson_iter_array(&it, &len, &data);
		if (bson_init_static(&ids, data, len))
			bson_append_array(&in, "$in", -1, &ids);
	} else {
		bson_t empty = BSON_INITIALIZER;

		bson_append_array(&in, "$in", -1, &empty);
	}
	bson_append_document_end(&q, &in);
	if (mongoc_cursor_error(cur, e))
		rc = -1;
	mongoc_cursor_destroy(cur);
	BSON_APPEND_UTF8(&q, "handler", h);
	BSON_APPEND_UTF8(&q, "key", key);
	BSON_APPEND_UTF8(&q, "status", "pending");
	BSON_APPEND_DOCUMENT_BEGIN(&q, "seq", &gt);
	BSON_APPEND_INT64(&gt, "$gt", mg_get_int(r->d, "seq", 0));
	bson_append_document_end(&q, &gt);
	BSON_APPEND_INT64(&opts, "limit", 1);
	if (rc == 0) {
		cur = mongoc_collection_find_with_opts(dc, &q, &opts, NULL);
		rc = mongoc_cursor_next(cur, &dd) ? 1 : 0;
		if (mongoc_cursor_error(cur, e))
			rc = -1;
		mongoc_cursor_destroy(cur);
	}
	bson_destroy(&q);
	bson_destroy(&opts);
	bson_destroy(lq);
	mongoc_collection_destroy(lc);
	mongoc_collection_destroy(dc);
	return rc;
}

static bool
requeue_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct requeue *r = ctx;
	mongoc_collection_t *dc = mg_coll(r->s, "deliveries"), *kc = mg_coll(r->s, "keys");
	bson_t opts, reply;
	int later;
	bool ok;

	r->n = 0;
	r->seq = 0;
	mg_sopts(cs, &opts);
	ok = (later = later_in_flight(r, cs, e)) >= 0;
	if (ok)
		ok = mongoc_collection_update_one(dc, r->q, r->u, &opts, &reply, e);
	if (ok) {
		r->n = mg_get_int(&reply, "modifiedCount", 0);
		bson_destroy(&reply);
	}
	if (ok && r->n == 1 && later == 1) {
		/* to the back of its key */
		bson_t *kq = BCON_NEW("_id", BCON_UTF8(mg_get_str(r->d, "key")));
		bson_t *ku = BCON_NEW("$inc", "{", "seq", BCON_INT64(1), "}");
		mongoc_find_and_modify_opts_t *fm = mongoc_find_and_modify_opts_new();
		bson_t extra;

		mongoc_find_and_modify_opts_set_update(fm, ku);
		mongoc_find_and_modify_opts_set_flags(fm, MONGOC_FIND_AND_MODIFY_UPSERT |
		    MONGOC_FIND_AND_MODIFY_RETURN_NEW);
		mg_sopts(cs, &extra);
		mongoc_find_and_modify_opts_append(fm, &extra);
		ok = mongoc_collection_find_and_modify_with_opts(kc, kq, fm, &reply, e);
		if (ok) {
			bson_iter_t it, v;

			if (bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
			    bson_iter_recurse(&it, &v) && bson_iter_find(&v, "seq"))
				r->seq = bson_iter_as_int64(&v);
		}
		bson_destroy(&reply);
		bson_destroy(&extra);
		mongoc_find_and_modify_opts_destroy(fm);
		bson_destroy(kq);
		bson_destroy(ku);
		if (ok && r->seq > 0) {
			bson_t *dq = BCON_NEW("_id", BCON_INT64(mg_get_int(r->d, "_id", 0)));
			bson_t *du = BCON_NEW("$set", "{", "seq", BCON_INT64(r->seq), "}");

			ok = mongoc_collection_update_one(dc, dq, du, &opts, NULL, e);
			bson_destroy(dq);
			bson_destroy(du);
		}
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(dc);
	mongoc_collection_destroy(kc);
	return ok;
}

int
mg_requeue_keyed(struct rb_store *s, const bson_t *d, const bson_t *q, const bson_t *u, int64_t *modified,
    struct rb_error *err)
{
	struct requeue r = { .s = s, .d = d, .q = q, .u = u };

	if (mg_txn(s, requeue_txn, &r, "requeue", err) < 0)
		return -1;
	*modified = r.n;
	return 0;
}
