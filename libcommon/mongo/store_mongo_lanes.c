/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_lanes.c: the lane leases on MongoDB (relaybus(7) "MongoDB").
 *
 * A claim writes no delivery document: it reads the lanes of the handler,
 * the candidates of the lanes it holds and of a few free lanes with due
 * work, applies the per-key rules, and records the batch with one
 * unordered bulk write of conditional updates on the lane documents (each
 * on the epoch, owner, holder and lease it read; a lane with picks records
 * the claim's chainEarly).  A takeover of an expired lane that still had
 * deliveries in flight moves them into "lost" (with the previous holder's
 * name and chainEarly) in the write that bumps its epoch, then, in one
 * transaction, charges one attempt to each lost one that may have run and
 * clears "lost": every unkeyed one and, of a key, the first still pending
 * and those after it that may have started (with chainEarly, as long as
 * every pending one before it is lost too and on its first attempt; a lane
 * without chainEarly, from an older release: all of them), as on
 * PostgreSQL.  A completion deletes its deliveries in one transaction after
 * checking each lane's epoch, the delivery's claim count and the lane's
 * inFlight list: it writes the same documents as the charge, so exactly one
 * of the two commits.  A claim reads only ready deliveries (lane: "ready")
 * and parks a long backlog of one key (store_mongo_park.c).
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"
#include "store_mongo_claim.h"

#define PER_LANE	32	/* picks per lane and claim, and in flight on a lane */
#define KEYED_READ_MAX	20000	/* keyed pending deliveries read per claim */

static void
lane_free(struct lane *l)
{
	free(l->owner);
	free(l->holder);
	free(l->lost_owner);
	free(l->inflight.v);
	free(l->lost.v);
	free(l->live.v);
	free(l->picks.v);
}

/* read the lanes of handler into c->l */
static int
read_lanes(struct claim *c, struct rb_error *err)
{
	mongoc_collection_t *coll = mg_coll(c->s, "lanes");
	bson_t *q = BCON_NEW("handler", BCON_UTF8(c->o->handler));
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, q, NULL, NULL);
	const bson_t *d;
	bson_error_t e;
	int rc = 0;

	while (mongoc_cursor_next(cur, &d)) {
		int64_t ln = mg_get_int(d, "laneId", -1);
		struct lane *l;

		if (ln < 0 || ln >= RB_LANES)
			continue;
		l = &c->l[ln];
		l->epoch = mg_get_int(d, "epoch", 0);
		l->owner = dup_str(d, "owner");
		l->holder = dup_str(d, "holder");
		l->expires = mg_get_int(d, "leaseExpiresAt", -1);
		ids_of_iter(&l->inflight, d, "inFlight");
		ids_of_iter(&l->lost, d, "lost");
		l->chain_early = get_tristate(d, "chainEarly");
		l->lost_early = get_tristate(d, "lostChainEarly");
		l->lost_owner = dup_str(d, "lostOwner");
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(c->s, &e, "claim", err);
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	mongoc_collection_destroy(coll);
	return rc;
}

/* which of ids are pending deliveries: into pending */
static int
pending_of(struct rb_store *s, const struct ids *ids, struct ids *pending, const char *what,
    struct rb_error *err)
{
	mongoc_collection_t *coll;
	bson_t q = BSON_INITIALIZER, in, *opts;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_error_t e;
	int rc = 0;

	if (ids->n == 0)
		return 0;
	coll = mg_coll(s, "deliveries");
	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	ids_append_bson(&in, "$in", ids);
	bson_append_document_end(&q, &in);
	BSON_APPEND_UTF8(&q, "status", "pending");
	opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}");
	cur = mongoc_collection_find_with_opts(coll, &q, opts, NULL);
	while (mongoc_cursor_next(cur, &d))
		ids_add(pending, mg_get_int(d, "_id", 0));
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, what, err);
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);
	bson_destroy(&q);
	mongoc_collection_destroy(coll);
	return rc;
}

static void
pick_add(struct claim *c, const bson_t *d)
{
	struct pick *p;
	bson_iter_t it;

	if (c->np == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 64;
		c->p = xrealloc(c->p, c->cap * sizeof *c->p);
	}
	p = &c->p[c->np++];
	memset(p, 0, sizeof *p);
	p->id = mg_get_int(d, "_id", 0);
	p->lane = (int)mg_get_int(d, "laneId", 0);
	p->attempts = (int)mg_get_int(d, "attempts", 0);
	p->claims = mg_get_int(d, "claims", 0);
	p->created = mg_get_int(d, "createdAt", 0);
	p->event_id = dup_str(d, "eventId");
	p->key = dup_str(d, "key");
	p->has_seq = bson_iter_init_find(&it, d, "seq") && !BSON_ITER_HOLDS_NULL(&it);
	p->seq = p->has_seq ? bson_iter_as_int64(&it) : 0;
	ids_add(&c->l[p->lane].picks, p->id);
}

/* a delivery document as a candidate, in a doc array per lane */
struct cand {
	bson_t	*d;
	int	 lane;
	char	*key;
	int64_t	 at;
	bool	 keyed;
};

static mongoc_cursor_t *
find_candidates(struct claim *c, const int *lanes, size_t nl, bool keyed, int64_t limit)
{
	mongoc_collection_t *coll = mg_coll(c->s, "deliveries");
	bson_t q = BSON_INITIALIZER, in, arr, k, at;
	bson_t *opts;
	mongoc_cursor_t *cur;

	BSON_APPEND_UTF8(&q, "handler", c->o->handler);
	BSON_APPEND_DOCUMENT_BEGIN(&q, "laneId", &in);
	BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
	for (size_t i = 0; i < nl; i++) {
		char ks[16];
		const char *kp;

		bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
		bson_append_int32(&arr, kp, -1, lanes[i]);
	}
	bson_append_array_end(&in, &arr);
	bson_append_document_end(&q, &in);
	BSON_APPEND_UTF8(&q, "status", "pending");
	BSON_APPEND_UTF8(&q, "lane", "ready");
	if (keyed) {
		BSON_APPEND_DOCUMENT_BEGIN(&q, "key", &k);
		BSON_APPEND_NULL(&k, "$ne");
		bson_append_document_end(&q, &k);
		opts = BCON_NEW("sort", "{", "laneId", BCON_INT32(1), "key", BCON_INT32(1), "seq", BCON_INT32(1), "}",
		    "limit", BCON_INT64(limit));
	} else {
		BSON_APPEND_NULL(&q, "key");
		BSON_APPEND_DOCUMENT_BEGIN(&q, "availableAt", &at);
		BSON_APPEND_DATE_TIME(&at, "$lte", c->now);
		bson_append_document_end(&q, &at);
		opts = BCON_NEW("sort", "{", "availableAt", BCON_INT32(1), "_id", BCON_INT32(1), "}",
		    "limit", BCON_INT64(limit));
	}
	cur = mongoc_collection_find_with_opts(coll, &q, opts, NULL);
	bson_destroy(&q);
	bson_destroy(opts);
	mongoc_collection_destroy(coll);
	return cur;
}

static bool
is_live(const struct claim *c, const struct lane *l, int64_t id)
{
	if (c->o->live != NULL) {
		for (size_t i = 0; i < c->o->n_live; i++)
			if (c->o->live[i] == id)
				return true;
		return false;
	}
	return ids_has(&l->live, id);
}

/* one of the key's ky[i..j) is running or picked: none of the key can start */
static bool
key_busy(const struct claim *c, const struct lane *l, bson_t **ky, size_t i, size_t j)
{
	for (size_t k = i; k < j; k++) {
		int64_t id = mg_get_int(ky[k], "_id", 0);

		if (is_live(c, l, id) || ids_has(&l->picks, id))
			return true;
	}
	return false;
}

/* The keys of ky (sorted by lane, key, seq) to park: a key with at least
 * MG_PARK_MIN ready ones after its first marker, or, without one, after the
 * first keep (the head and its chain, MG_PARK_KEEP at least). */
static void
park_plan(struct claim *c, bson_t **ky, size_t nky, int chain)
{
	int64_t keep = chain > MG_PARK_KEEP ? chain : MG_PARK_KEEP;

	for (size_t i = 0, j; i < nky; i = j) {
		const char *key = mg_get_str(ky[i], "key");
		int64_t ln = mg_get_int(ky[i], "laneId", -1);
		size_t m = nky, x = nky;
		int64_t k = keep;

		for (j = i + 1; j < nky && mg_get_int(ky[j], "laneId", -1) == ln && str_eq(mg_get_str(ky[j], "key"), key); j++)
			;
		if (key == NULL || ln < 0 || ln >= RB_LANES)
			continue;
		for (size_t t = i; t < j && m == nky; t++)
			if (mg_get_int(ky[t], "parkNext", 0) > 0)
				m = t;
		if (m < nky && j - m - 1 >= MG_PARK_MIN) {
			x = m;
			k = mg_get_int(ky[m], "parkNext", keep);
		} else if (m == nky && j - i >= (size_t)(keep + MG_PARK_MIN))
			x = i + (size_t)keep - 1;
		if (x == nky)
			continue;
		c->park = xrealloc(c->park, (c->npark + 1) * sizeof *c->park);
		c->park[c->npark++] = (struct mg_park){ .lane = (int)ln, .key = xstrdup(key),
		    .marker = mg_get_int(ky[x], "_id", 0), .seq = mg_get_int(ky[x], "seq", 0), .k = k };
	}
}

/* Pick from lanes (in that order) up to want deliveries, by the per-key rules. */
static int
pick_lanes(struct claim *c, const int *lanes, size_t nl, size_t want, struct rb_error *err)
{
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_error_t e;
	bson_t **un = NULL, **ky = NULL;
	size_t nun = 0, nky = 0, cun = 0, cky = 0;
	int chain = c->o->chain > 1 ? c->o->chain : 1;
	int rc = 0;

	if (nl == 0 || want == 0)
		return 0;
	for (int keyed = 0; keyed < 2 && rc == 0; keyed++) {
		cur = find_candidates(c, lanes, nl, keyed,
		    keyed ? KEYED_READ_MAX : (int64_t)(want + (c->o->live ? c->o->n_live : 0) + PER_LANE * nl));
		while (mongoc_cursor_next(cur, &d)) {
			bson_t ***v = keyed ? &ky : &un;
			size_t *n = keyed ? &nky : &nun, *cap = keyed ? &cky : &cun;

			if (*n == *cap) {
				*cap = *cap ? 2 * *cap : 64;
				*v = xrealloc(*v, *cap * sizeof **v);
			}
			(*v)[(*n)++] = bson_copy(d);
		}
		if (mongoc_cursor_error(cur, &e))
			rc = mg_err(c->s, &e, "claim", err);
		mongoc_cursor_destroy(cur);
	}
	for (size_t li = 0; rc == 0 && li < nl && c->np < (size_t)c->o->batch; li++) {
		int ln = lanes[li];
		struct lane *l = &c->l[ln];
		size_t room = l->live.n >= PER_LANE ? 0 : PER_LANE - l->live.n, got = 0;

		/* unkeyed first, oldest first */
		for (size_t i = 0; i < nun && got < room && c->np < (size_t)c->o->batch; i++) {
			if (mg_get_int(un[i], "laneId", -1) != ln)
				continue;
			if (is_live(c, l, mg_get_int(un[i], "_id", 0)) || ids_has(&l->picks, mg_get_int(un[i], "_id", 0)))
				continue;
			pick_add(c, un[i]);
			got++;
		}
		/* then each key's head (and its chain) */
		for (size_t i = 0; i < nky && got < room && c->np < (size_t)c->o->batch;) {
			const char *key = mg_get_str(ky[i], "key");
			size_t j = i;
			int taken = 0;

			if (mg_get_int(ky[i], "laneId", -1) != ln || key == NULL) {
				i++;
				continue;
			}
			while (j < nky && mg_get_int(ky[j], "laneId", -1) == ln && str_eq(mg_get_str(ky[j], "key"), key))
				j++;
			/* ky[i] is the head: due, and nothing of its key running (a
			 * requeued head has a lower seq than one that may run) */
			if (!key_busy(c, l, ky, i, j))
				for (size_t k = i; k < j && taken < chain && got < room &&
				    c->np < (size_t)c->o->batch; k++) {
					if (mg_get_int(ky[k], "availableAt", 0) > c->now)
						break;
					pick_add(c, ky[k]);
					got++;
					taken++;
					/* a marker: parked ones may follow it */
					if (mg_get_int(ky[k], "parkNext", 0) > 0)
						break;
				}
			i = j;
		}
		(void)want;
	}
	park_plan(c, ky, nky, chain);
	for (size_t i = 0; i < nun; i++)
		bson_destroy(un[i]);
	for (size_t i = 0; i < nky; i++)
		bson_destroy(ky[i]);
	free(un);
	free(ky);
	return rc;
}

/* the free lanes (none of ours) with due work, from the owner's own place */
static int
due_free_lanes(struct claim *c, int *out, size_t *nout, struct rb_error *err)
{
	mongoc_collection_t *coll = mg_coll(c->s, "deliveries");
	bson_t cmd = BSON_INITIALIZER, q, at, reply;
	bson_error_t e;
	bson_iter_t it, v;
	bool has[RB_LANES] = { 0 };
	int start = (int)(rb_fnv1a32(c->o->owner, strlen(c->o->owner)) % RB_LANES);

	*nout = 0;
	BSON_APPEND_UTF8(&cmd, "distinct", mongoc_collection_get_name(coll));
	BSON_APPEND_UTF8(&cmd, "key", "laneId");
	BSON_APPEND_DOCUMENT_BEGIN(&cmd, "query", &q);
	BSON_APPEND_UTF8(&q, "handler", c->o->handler);
	BSON_APPEND_UTF8(&q, "status", "pending");
	BSON_APPEND_UTF8(&q, "lane", "ready");
	BSON_APPEND_DOCUMENT_BEGIN(&q, "availableAt", &at);
	BSON_APPEND_DATE_TIME(&at, "$lte", c->now);
	bson_append_document_end(&q, &at);
	bson_append_document_end(&cmd, &q);
	if (!mongoc_collection_read_command_with_opts(coll, &cmd, NULL, NULL, &reply, &e)) {
		bson_destroy(&cmd);
		bson_destroy(&reply);
		mongoc_collection_destroy(coll);
		return mg_err(c->s, &e, "claim", err);
	}
	if (bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &v))
		while (bson_iter_next(&v)) {
			int64_t ln = bson_iter_as_int64(&v);

			if (ln >= 0 && ln < RB_LANES)
				has[ln] = true;
		}
	for (int k = 0; k < RB_LANES; k++) {
		int ln = (start + k) % RB_LANES;

		if (has[ln] && c->l[ln].kind == L_FREE)
			out[(*nout)++] = ln;
	}
	bson_destroy(&cmd);
	bson_destroy(&reply);
	mongoc_collection_destroy(coll);
	return 0;
}

/* The record write: one unordered bulk write of conditional lane updates. */
static int
record(struct claim *c, const bool *read_all, struct rb_error *err)
{
	mongoc_collection_t *coll = mg_coll(c->s, "lanes");
	bson_t *bopts = BCON_NEW("ordered", BCON_BOOL(false));
	mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(coll, bopts);
	const char *holder = mg_be(c->s)->holder;
	size_t nops = 0, npicked = 0;
	bson_t reply;
	bson_error_t e;
	int rc = 0;

	for (int ln = 0; ln < RB_LANES; ln++) {
		struct lane *l = &c->l[ln];
		bson_t q = BSON_INITIALIZER, u = BSON_INITIALIZER, set;
		char id[MG_LANE_ID_LEN];

		if (l->kind == L_OTHER || (l->kind == L_FREE && l->picks.n == 0))
			continue;
		if (l->kind == L_HELD && l->picks.n == 0 && !(read_all[ln] && l->live.n == 0))
			continue;
		mg_lane_id(id, c->o->handler, ln);
		BSON_APPEND_UTF8(&q, "_id", id);
		BSON_APPEND_INT64(&q, "epoch", l->epoch);
		if (l->kind == L_FREE) {
			if (l->owner != NULL)
				BSON_APPEND_UTF8(&q, "owner", l->owner);
			else
				BSON_APPEND_NULL(&q, "owner");
			if (l->expires >= 0)
				BSON_APPEND_DATE_TIME(&q, "leaseExpiresAt", l->expires);
			else
				BSON_APPEND_NULL(&q, "leaseExpiresAt");
		} else {
			BSON_APPEND_UTF8(&q, "owner", c->o->owner);
			BSON_APPEND_UTF8(&q, "holder", holder);
		}
		BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
		if (l->picks.n == 0) {
			/* handed back: a held lane that runs nothing and gave nothing,
			 * or a taken-over lane that gave nothing (a new epoch: no
			 * one charges its lost ones twice) */
			struct ids none = { 0 };

			if (l->kind == L_TAKEN)
				BSON_APPEND_INT64(&set, "epoch", l->epoch + 1);
			BSON_APPEND_NULL(&set, "owner");
			BSON_APPEND_NULL(&set, "holder");
			BSON_APPEND_NULL(&set, "leaseExpiresAt");
			ids_append_bson(&set, "inFlight", &none);
		} else {
			struct ids inf = { 0 };

			if (l->kind == L_FREE) {
				l->new_epoch = l->epoch + 1;
				BSON_APPEND_INT64(&set, "epoch", l->new_epoch);
			} else
				l->new_epoch = l->epoch;
			BSON_APPEND_UTF8(&set, "owner", c->o->owner);
			BSON_APPEND_UTF8(&set, "holder", holder);
			BSON_APPEND_DATE_TIME(&set, "leaseExpiresAt", c->expires);
			/* how its chains run: what a takeover charges */
			BSON_APPEND_BOOL(&set, "chainEarly", c->o->chain_early);
			if (l->kind == L_HELD)
				for (size_t i = 0; i < l->inflight.n; i++)
					if (is_live(c, l, l->inflight.v[i]))
						ids_add(&inf, l->inflight.v[i]);
			for (size_t i = 0; i < l->picks.n; i++)
				ids_add(&inf, l->picks.v[i]);
			ids_append_bson(&set, "inFlight", &inf);
			free(inf.v);
			npicked++;
		}
		bson_append_document_end(&u, &set);
		mongoc_bulk_operation_update_one(b, &q, &u, false);
		nops++;
		bson_destroy(&q);
		bson_destroy(&u);
	}
	if (nops > 0) {
		if (!mongoc_bulk_operation_execute(b, &reply, &e))
			rc = mg_err(c->s, &e, "claim", err);
		else if (mg_get_int(&reply, "nMatched", 0) != (int64_t)nops && npicked > 0) {
			/* some lane moved on meanwhile: keep only the picks of the
			 * lanes that carry them now */
			bson_t *q = BCON_NEW("handler", BCON_UTF8(c->o->handler), "owner", BCON_UTF8(c->o->owner),
			    "holder", BCON_UTF8(holder));
			mongoc_cursor_t *cur = mongoc_collection_find_with_opts(coll, q, NULL, NULL);
			const bson_t *d;

			while (mongoc_cursor_next(cur, &d)) {
				int64_t ln = mg_get_int(d, "laneId", -1);
				struct ids inf = { 0 };

				if (ln < 0 || ln >= RB_LANES)
					continue;
				ids_of_iter(&inf, d, "inFlight");
				c->l[ln].ok = c->l[ln].picks.n > 0 && mg_get_int(d, "epoch", -1) == c->l[ln].new_epoch &&
				    inf.n > 0 && ids_has(&inf, c->l[ln].picks.v[0]);
				free(inf.v);
			}
			if (mongoc_cursor_error(cur, &e))
				rc = mg_err(c->s, &e, "claim", err);
			mongoc_cursor_destroy(cur);
			bson_destroy(q);
		} else
			for (int ln = 0; ln < RB_LANES; ln++)
				c->l[ln].ok = c->l[ln].picks.n > 0;
		bson_destroy(&reply);
	}
	mongoc_bulk_operation_destroy(b);
	bson_destroy(bopts);
	mongoc_collection_destroy(coll);
	return rc;
}

/* the claimed deliveries, with their events, as struct rb_dl */
static int
emit(struct claim *c, struct rb_dl ***out, struct rb_error *err)
{
	mongoc_collection_t *coll = mg_coll(c->s, "events");
	bson_t q = BSON_INITIALIZER, in, arr;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_error_t e;
	bson_t **evs = NULL;
	size_t nev = 0;
	struct rb_sbuf b = { 0 };
	struct rb_dl **res = xcalloc(c->np + 1, sizeof *res);
	size_t nres = 0;
	int rc = 0;

	BSON_APPEND_DOCUMENT_BEGIN(&q, "_id", &in);
	BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
	for (size_t i = 0, k = 0; i < c->np; i++) {
		char ks[16];
		const char *kp;

		if (!c->l[c->p[i].lane].ok)
			continue;
		bson_uint32_to_string((uint32_t)k++, &kp, ks, sizeof ks);
		bson_append_utf8(&arr, kp, -1, c->p[i].event_id, -1);
	}
	bson_append_array_end(&in, &arr);
	bson_append_document_end(&q, &in);
	cur = mongoc_collection_find_with_opts(coll, &q, NULL, NULL);
	while (mongoc_cursor_next(cur, &d)) {
		evs = xrealloc(evs, (nev + 1) * sizeof *evs);
		evs[nev++] = bson_copy(d);
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(c->s, &e, "claim", err);
	mongoc_cursor_destroy(cur);
	bson_destroy(&q);
	/* lane by lane, in the order taken within each */
	for (int ln = 0; rc == 0 && ln < RB_LANES; ln++) {
		if (!c->l[ln].ok)
			continue;
		for (size_t i = 0; i < c->np; i++) {
			struct pick *p = &c->p[i];
			struct rb_delivery_fields f = { 0 };
			const bson_t *ev = NULL;
			char idb[32], seqb[32], cat[32];
			char *payload, *headers;
			bson_iter_t it;

			if (p->lane != ln)
				continue;
			for (size_t k = 0; k < nev && ev == NULL; k++)
				if (str_eq(mg_get_str(evs[k], "_id"), p->event_id))
					ev = evs[k];
			if (ev == NULL)
				continue;	/* (its event is gone) */
			snprintf(idb, sizeof idb, "%" PRId64, p->id);
			snprintf(seqb, sizeof seqb, "%" PRId64, p->seq);
			mg_fmt_time(p->created, cat);
			payload = bson_iter_init_find(&it, ev, "payload") ? mg_iter_json_text(&it) : xstrdup("null");
			headers = bson_iter_init_find(&it, ev, "headers") ? mg_iter_json_text(&it) : xstrdup("{}");
			f.id = idb;
			f.event_id = p->event_id;
			f.handler = c->o->handler;
			f.name = mg_get_str(ev, "name");
			f.key = p->key;
			f.sequence = p->has_seq ? seqb : NULL;
			f.payload = payload;
			f.headers = headers;
			f.created_at = cat;
			f.lane = ln;
			f.attempts = p->attempts;
			f.epoch = c->l[ln].new_epoch;
			f.claims = p->claims;
			res[nres] = rb_dl_new(&f);
			rb_dl_fill(res[nres++], &f, &b);
			free(payload);
			free(headers);
		}
	}
	for (size_t k = 0; k < nev; k++)
		bson_destroy(evs[k]);
	free(evs);
	free(b.s);
	mongoc_collection_destroy(coll);
	if (rc < 0) {
		for (size_t i = 0; i < nres; i++)
			rb_dl_free(res[i]);
		free(res);
		return -1;
	}
	*out = res;
	return (int)nres;
}

int
mg_claim(struct rb_store *s, const struct rb_claim_opts *o, struct rb_dl ***out, struct rb_error *err)
{
	struct mg_be *be = mg_be(s);
	struct claim *c = xcalloc(1, sizeof *c);
	struct ids probe = { 0 }, pend = { 0 };
	int held[RB_LANES], freel[RB_LANES];
	bool read_all[RB_LANES] = { 0 };
	size_t nheld = 0, nfree = 0;
	int rc = -1;

	if (mg_ready(s, "claim", err) < 0)
		goto out;
	if (be->seeded == NULL || strcmp(be->seeded, o->handler) != 0) {
		if (mg_seed_lanes(s, o->handler, err) < 0)
			goto out;
		free(be->seeded);
		be->seeded = xstrdup(o->handler);
	}
	c->s = s;
	c->o = o;
	c->now = mg_now();
	c->expires = c->now + o->lease_ms;
	if (read_lanes(c, err) < 0)
		goto out;
	/* which in-flight deliveries still run: of lanes of this owner name */
	for (int ln = 0; ln < RB_LANES; ln++)
		if (str_eq(c->l[ln].owner, o->owner) || (c->l[ln].owner != NULL && c->l[ln].expires <= c->now))
			for (size_t i = 0; i < c->l[ln].inflight.n; i++)
				ids_add(&probe, c->l[ln].inflight.v[i]);
	if (pending_of(s, &probe, &pend, "claim", err) < 0)
		goto out;
	for (int ln = 0; ln < RB_LANES; ln++) {
		struct lane *l = &c->l[ln];
		bool mine = str_eq(l->owner, o->owner), ours = mine && str_eq(l->holder, be->holder);
		bool expired = l->owner != NULL && l->expires <= c->now;

		for (size_t i = 0; i < l->inflight.n; i++)
			if (ids_has(&pend, l->inflight.v[i]))
				ids_add(&l->live, l->inflight.v[i]);
		if (ours)
			l->kind = L_HELD;
		else if (l->owner == NULL || expired || (mine && l->live.n == 0))
			/* free; an owner name's lane of another store instance
			 * (a restarted process) only when nothing runs there */
			l->kind = L_FREE;
		else
			l->kind = L_OTHER;
		if (l->kind == L_HELD && o->live != NULL) {
			/* the caller knows what still runs */
			l->live.n = 0;
			for (size_t i = 0; i < l->inflight.n; i++)
				if (is_live(c, l, l->inflight.v[i]))
					ids_add(&l->live, l->inflight.v[i]);
		}
	}
	/* lost ones of held lanes (our takeover whose charge failed) */
	for (int ln = 0; ln < RB_LANES; ln++)
		if (c->l[ln].kind == L_HELD && c->l[ln].lost.n > 0) {
			int t = mgc_charge_lost(c, ln, c->l[ln].epoch, err);

			if (t < 0)
				goto out;
			c->l[ln].kind = t == 0 ? L_HELD : L_OTHER;
		}
	for (int ln = 0; ln < RB_LANES; ln++)
		if (c->l[ln].kind == L_HELD)
			held[nheld++] = ln;
	if (pick_lanes(c, held, nheld, (size_t)o->batch, err) < 0)
		goto out;
	/* the held lanes read to the end: all of them when the batch is short */
	if (c->np < (size_t)o->batch)
		for (size_t i = 0; i < nheld; i++)
			read_all[held[i]] = true;
	if (c->np < (size_t)o->batch && (!o->held_only || nheld == 0)) {
		size_t take = 4, at = 0;

		if (due_free_lanes(c, freel, &nfree, err) < 0)
			goto out;
		while (c->np < (size_t)o->batch && at < nfree) {
			int batch[RB_LANES];
			size_t nb = 0;

			for (; at < nfree && nb < take; at++) {
				struct lane *l = &c->l[freel[at]];

				if (l->owner != NULL && (l->live.n > 0 || l->lost.n > 0)) {
					/* an expired lease with deliveries in flight */
					int t = mgc_take_over(c, freel[at], err);

					if (t < 0)
						goto out;
					if (t > 0) {
						l->kind = L_OTHER;
						continue;
					}
				}
				batch[nb++] = freel[at];
			}
			if (pick_lanes(c, batch, nb, (size_t)o->batch - c->np, err) < 0)
				goto out;
			take *= 2;
		}
	}
	if (record(c, read_all, err) < 0)
		goto out;
	rc = emit(c, out, err);
	if (rc >= 0) {
		/* the backlogs of the lanes this claim holds */
		size_t k = 0;

		for (size_t i = 0; i < c->npark; i++) {
			struct lane *l = &c->l[c->park[i].lane];

			if (l->kind == L_HELD || l->ok)
				c->park[k++] = c->park[i];
			else
				free(c->park[i].key);
		}
		c->npark = k;
		mg_park(s, o->handler, c->park, c->npark);
	}
out:
	for (int ln = 0; ln < RB_LANES; ln++)
		lane_free(&c->l[ln]);
	for (size_t i = 0; i < c->np; i++) {
		free(c->p[i].event_id);
		free(c->p[i].key);
	}
	free(c->p);
	for (size_t i = 0; i < c->npark; i++)
		free(c->park[i].key);
	free(c->park);
	free(c);
	free(probe.v);
	free(pend.v);
	return rc;
}
