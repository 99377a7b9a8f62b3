/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_takeover.c: the takeover of an expired lane on MongoDB (see
 * store_mongo_lanes.c's head comment): the write that bumps the lane's epoch
 * and moves what was in flight into "lost", then the charge of one attempt to
 * each lost delivery that may have run, in one transaction.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "store_mongo_claim.h"

/* A charge: one transaction that reads a lane's lost deliveries, charges
 * one attempt to each that may have run, and clears "lost". */
struct chg {
	struct rb_store	*s;
	const char	*handler;
	int		 lane;
	int64_t		 epoch;		/* the lane's, after its takeover */
	int		 max_attempts;
	bool		 moved;		/* out: the lane is at another epoch */
};

/* a lost delivery, or a pending one before it of its key */
struct lrow {
	int64_t	 id, seq;
	char	*key;		/* NULL: unkeyed */
	int	 attempts;
	int64_t	 park_k;	/* parkNext: a parking's marker */
	bool	 lost;
};

struct lrows {
	struct lrow	*v;
	size_t		 n;
};

static bool
read_rows(mongoc_collection_t *dc, const bson_t *q, const bson_t *opts, const struct ids *lost,
    struct lrows *r, bson_error_t *e)
{
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(dc, q, opts, NULL);
	const bson_t *d;
	bool ok;

	while (mongoc_cursor_next(cur, &d)) {
		struct lrow *w;
		int64_t id = mg_get_int(d, "_id", 0);
		bool dup = false;

		for (size_t i = 0; i < r->n && !dup; i++)
			dup = r->v[i].id == id;
		if (dup)
			continue;
		r->v = xrealloc(r->v, (r->n + 1) * sizeof *r->v);
		w = &r->v[r->n++];
		w->id = id;
		w->seq = mg_get_int(d, "seq", 0);
		w->key = dup_str(d, "key");
		w->attempts = (int)mg_get_int(d, "attempts", 0);
		w->park_k = mg_get_int(d, "parkNext", 0);
		w->lost = ids_has(lost, id);
	}
	ok = !mongoc_cursor_error(cur, e);
	mongoc_cursor_destroy(cur);
	return ok;
}

/* Whether lost delivery w may have run (see the head comment). */
static bool
may_have_run(const struct lrows *r, const struct lrow *w, int early)
{
	if (w->key == NULL || early < 0)
		return true;
	for (size_t i = 0; i < r->n; i++) {
		const struct lrow *x = &r->v[i];

		if (x->key != NULL && strcmp(x->key, w->key) == 0 && x->seq < w->seq &&
		    (early == 0 || x->attempts > 0 || !x->lost))
			return false;
	}
	return true;
}

static bool
charge_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct chg *g = ctx;
	mongoc_collection_t *lc = mg_coll(g->s, "lanes"), *dc = mg_coll(g->s, "deliveries");
	char id[MG_LANE_ID_LEN];
	bson_t opts, q = BSON_INITIALIZER, in, reply;
	bson_t *lq, *popts;
	mongoc_cursor_t *cur;
	const bson_t *d;
	struct ids lost = { 0 }, pass[2] = { { 0 } };
	struct lrows rows = { 0 };
	char *msg = NULL;
	int early = -1;
	bool ok, found = false;

	g->moved = false;
	mg_lane_id(id, g->handler, g->lane);
	mg_sopts(cs, &opts);
	lq = BCON_NEW("_id", BCON_UTF8(id));
	cur = mongoc_collection_find_with_opts(lc, lq, &opts, NULL);
	if (mongoc_cursor_next(cur, &d) && mg_get_int(d, "epoch", -1) == g->epoch) {
		const char *o = mg_get_str(d, "lostOwner");

		found = true;
		ids_of_iter(&lost, d, "lost");
		early = get_tristate(d, "lostChainEarly");
		msg = xasprintf("lease of %s expired: attempt lost", o != NULL ? o : "?");
	}
	ok = !mongoc_cursor_error(cur, e);
	mongoc_cursor_destroy(cur);
	bson_destroy(lq);
	if (ok && !found)
		g->moved = true;
	if (!ok || !found || lost.n == 0)
		goto out;
	popts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "key", BCON_INT32(1), "seq", BCON_INT32(1),
	    "attempts", BCON_INT32(1), "parkNext", BCON_INT32(1), "}");
	bson_concat(popts, &opts);
	/* the lost ones still pending */
	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	ids_append_bson(&in, "$in", &lost);
	bson_append_document_end(&q, &in);
	BSON_APPEND_UTF8(&q, "status", "pending");
	ok = read_rows(dc, &q, popts, &lost, &rows, e);
	bson_destroy(&q);
	/* and the pending ones before them of their keys */
	if (ok && early >= 0) {
		bson_t or, el, lt;
		size_t nk = 0;

		bson_init(&q);
		BSON_APPEND_UTF8(&q, "handler", g->handler);
		BSON_APPEND_INT32(&q, "laneId", g->lane);
		BSON_APPEND_UTF8(&q, "status", "pending");
		BSON_APPEND_ARRAY_BEGIN(&q, "$or", &or);
		for (size_t i = 0, n = rows.n; i < n; i++) {
			char ks[16];
			const char *kp;

			if (rows.v[i].key == NULL)
				continue;
			bson_uint32_to_string((uint32_t)nk++, &kp, ks, sizeof ks);
			bson_append_document_begin(&or, kp, -1, &el);
			BSON_APPEND_UTF8(&el, "key", rows.v[i].key);
			BSON_APPEND_DOCUMENT_BEGIN(&el, "seq", &lt);
			BSON_APPEND_INT64(&lt, "$lt", rows.v[i].seq);
			bson_append_document_end(&el, &lt);
			bson_append_document_end(&or, &el);
		}
		bson_append_array_end(&q, &or);
		if (nk > 0)
			ok = read_rows(dc, &q, popts, &lost, &rows, e);
		bson_destroy(&q);
	}
	bson_destroy(popts);
	for (size_t i = 0; ok && i < rows.n; i++)
		if (rows.v[i].lost && may_have_run(&rows, &rows.v[i], early))
			ids_add(&pass[rows.v[i].attempts + 1 >= g->max_attempts ? 0 : 1], rows.v[i].id);
	/* pass 0: those this attempt buries; pass 1: the rest */
	for (int p = 0; ok && p < 2; p++) {
		bson_t *u;

		if (pass[p].n == 0)
			continue;
		bson_init(&q);
		BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
		ids_append_bson(&in, "$in", &pass[p]);
		bson_append_document_end(&q, &in);
		BSON_APPEND_UTF8(&q, "status", "pending");
		u = BCON_NEW("$inc", "{", "attempts", BCON_INT32(1), "claims", BCON_INT64(1), "}",
		    "$set", "{", "status", BCON_UTF8(p == 0 ? "dead" : "pending"), "lastError", BCON_UTF8(msg),
		    "updatedAt", BCON_DATE_TIME(mg_now()), "}");
		ok = mongoc_collection_update_many(dc, &q, u, &opts, NULL, e);
		bson_destroy(u);
		bson_destroy(&q);
	}
	/* a buried marker: the next parked ones of its key ready */
	for (size_t i = 0; ok && i < rows.n; i++)
		if (rows.v[i].park_k > 0 && ids_has(&pass[0], rows.v[i].id))
			ok = mg_unpark(g->s, cs, g->handler, g->lane, rows.v[i].key, rows.v[i].park_k, e);
	if (ok) {
		bson_t *q2 = BCON_NEW("_id", BCON_UTF8(id), "epoch", BCON_INT64(g->epoch));
		bson_t *u2 = BCON_NEW("$set", "{", "lost", "[", "]", "lostOwner", BCON_NULL, "lostChainEarly", BCON_NULL,
		    "}", "$inc", "{", "failed", BCON_INT64((int64_t)(pass[0].n + pass[1].n)),
		    "buried", BCON_INT64((int64_t)pass[0].n), "}");

		ok = mongoc_collection_update_one(lc, q2, u2, &opts, &reply, e);
		if (ok && mg_get_int(&reply, "matchedCount", 0) != 1)
			g->moved = true;
		bson_destroy(&reply);
		bson_destroy(q2);
		bson_destroy(u2);
	}
out:
	for (size_t i = 0; i < rows.n; i++)
		free(rows.v[i].key);
	free(rows.v);
	free(lost.v);
	free(pass[0].v);
	free(pass[1].v);
	free(msg);
	bson_destroy(&opts);
	mongoc_collection_destroy(lc);
	mongoc_collection_destroy(dc);
	return ok;
}

/* Charge the lost ones of lane ln at epoch: 0 done, 1 the lane moved on, -1 error. */
int
mgc_charge_lost(struct claim *c, int ln, int64_t epoch, struct rb_error *err)
{
	struct chg g = { .s = c->s, .handler = c->o->handler, .lane = ln, .epoch = epoch,
	    .max_attempts = c->o->max_attempts };

	if (mg_txn(c->s, charge_txn, &g, "claim", err) < 0)
		return -1;
	if (!g.moved)
		c->l[ln].lost.n = 0;
	return g.moved ? 1 : 0;
}

/* Take over lane ln (expired, with deliveries in flight or lost): bump its
 * epoch moving them into lost, then charge them.  0 taken, 1 lost the
 * race, -1 error. */
int
mgc_take_over(struct claim *c, int ln, struct rb_error *err)
{
	struct lane *l = &c->l[ln];
	mongoc_collection_t *coll = mg_coll(c->s, "lanes");
	struct ids lost = { 0 }, none = { 0 };
	char id[MG_LANE_ID_LEN];
	bson_t q = BSON_INITIALIZER, u, set, reply;
	bson_error_t e;
	const char *owner = l->owner;
	int early = l->chain_early, rc = 0;

	bson_init(&u);
	for (size_t i = 0; i < l->lost.n; i++)
		ids_add(&lost, l->lost.v[i]);
	for (size_t i = 0; i < l->inflight.n; i++)
		if (!ids_has(&lost, l->inflight.v[i]))
			ids_add(&lost, l->inflight.v[i]);
	if (l->lost.n > 0) {
		/* a taker that died before its charge: its lost ones too */
		if (l->inflight.n == 0) {
			early = l->lost_early;
			owner = l->lost_owner;
		} else if (l->lost_early != early)
			early = -1;
	}
	mg_lane_id(id, c->o->handler, ln);
	BSON_APPEND_UTF8(&q, "_id", id);
	BSON_APPEND_INT64(&q, "epoch", l->epoch);
	BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
	BSON_APPEND_INT64(&set, "epoch", l->epoch + 1);
	BSON_APPEND_UTF8(&set, "owner", c->o->owner);
	BSON_APPEND_UTF8(&set, "holder", mg_be(c->s)->holder);
	BSON_APPEND_DATE_TIME(&set, "leaseExpiresAt", c->expires);
	ids_append_bson(&set, "inFlight", &none);
	ids_append_bson(&set, "lost", &lost);
	if (owner != NULL)
		BSON_APPEND_UTF8(&set, "lostOwner", owner);
	else
		BSON_APPEND_NULL(&set, "lostOwner");
	append_tristate(&set, "lostChainEarly", early);
	bson_append_document_end(&u, &set);
	if (!mongoc_collection_update_one(coll, &q, &u, NULL, &reply, &e))
		rc = mg_err(c->s, &e, "claim", err);
	else if (mg_get_int(&reply, "matchedCount", 0) != 1)
		rc = 1;
	bson_destroy(&reply);
	bson_destroy(&q);
	bson_destroy(&u);
	if (rc == 0)
		rc = mgc_charge_lost(c, ln, l->epoch + 1, err);
	if (rc == 0) {
		l->epoch++;
		l->kind = L_TAKEN;
		l->new_epoch = l->epoch;
		l->inflight.n = 0;
		l->lost.n = 0;
		l->live.n = 0;
	}
	free(lost.v);
	mongoc_collection_destroy(coll);
	return rc;
}
