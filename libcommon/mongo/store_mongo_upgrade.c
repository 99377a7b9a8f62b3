/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_upgrade.c: the upgrade of a relaybus 0.1.0 MongoDB database,
 * run by set-up (mg_setup) before it creates the indexes.
 *
 * relaybus 0.1.0 (relaybus(7), UPGRADING FROM 0.1.0) leased each delivery
 * document: a claim set status "processing", attempts + 1, leaseOwner,
 * leaseToken and leaseExpiresAt, a completion status "completed" and
 * completedAt; the due time was dueAt; events had no handlers and no
 * createdAt; there were no lanes, subscriptions or schema_version.  Each step
 * below is a no-op when done (or on a fresh database), so the upgrade runs
 * whenever the schema_version document is missing, and a run that died
 * halfway is finished by the next.  The laneId backfill comes last: a
 * delivery without laneId is what marks a 0.1.0 database (mg_schema_info).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

#define UPGRADE_BATCH	1000

static bool
str_is(const char *a, const char *b)
{
	return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* the indexes of 0.1.0 that this schema has not (createIndex's default names) */
static const char *const old_indexes[] = {
	"eventId_1_handler_1", "status_1_dueAt_1", "handler_1_status_1_dueAt_1", "handler_1_key_1_seq_1",
	"leaseExpiresAt_1", "status_1_createdAt_1", "handler_1_createdAt_1", "completedAt_1",
};

static int
update_many(struct rb_store *s, const char *coll, bson_t *q, bson_t *u, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, coll);
	bson_error_t e;
	bool ok = mongoc_collection_update_many(c, q, u, NULL, NULL, &e);

	bson_destroy(q);
	bson_destroy(u);
	mongoc_collection_destroy(c);
	return ok ? 0 : mg_err(s, &e, "upgrade", err);
}

/* run bulk b (of n updates), then destroy it */
static int
bulk_run(struct rb_store *s, mongoc_bulk_operation_t *b, size_t n, struct rb_error *err)
{
	bson_t reply;
	bson_error_t e;
	bool ok = n == 0 || mongoc_bulk_operation_execute(b, &reply, &e);

	if (n > 0)
		bson_destroy(&reply);
	mongoc_bulk_operation_destroy(b);
	return ok ? 0 : mg_err(s, &e, "upgrade", err);
}

/* events.handlers (every handler with a delivery, completed ones included)
 * and events.createdAt (its first delivery's), a batch at a time */
static int
upgrade_events(struct rb_store *s, struct rb_error *err)
{
	mongoc_collection_t *ec = mg_coll(s, "events"), *dc = mg_coll(s, "deliveries");
	int rc = 0;

	for (size_t got = UPGRADE_BATCH; rc == 0 && got == UPGRADE_BATCH;) {
		bson_t *q = BCON_NEW("handlers", "{", "$exists", BCON_BOOL(false), "}");
		bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "createdAt", BCON_INT32(1), "}",
		    "limit", BCON_INT64(UPGRADE_BATCH));
		mongoc_cursor_t *cur = mongoc_collection_find_with_opts(ec, q, opts, NULL);
		const bson_t *d;
		bson_t **evs = NULL, dq = BSON_INITIALIZER, in, arr;
		bson_error_t e;
		mongoc_bulk_operation_t *b;

		got = 0;
		while (mongoc_cursor_next(cur, &d)) {
			evs = xrealloc(evs, (got + 1) * sizeof *evs);
			evs[got++] = bson_copy(d);
		}
		if (mongoc_cursor_error(cur, &e))
			rc = mg_err(s, &e, "upgrade", err);
		mongoc_cursor_destroy(cur);
		bson_destroy(q);
		bson_destroy(opts);
		/* their deliveries */
		BSON_APPEND_DOCUMENT_BEGIN(&dq, "eventId", &in);
		BSON_APPEND_ARRAY_BEGIN(&in, "$in", &arr);
		for (size_t i = 0; i < got; i++) {
			char ks[16];
			const char *kp;
			bson_iter_t it;

			bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
			if (bson_iter_init_find(&it, evs[i], "_id"))
				bson_append_iter(&arr, kp, -1, &it);
		}
		bson_append_array_end(&in, &arr);
		bson_append_document_end(&dq, &in);
		bson_t **dels = NULL;
		size_t nd = 0;

		if (rc == 0 && got > 0) {
			opts = BCON_NEW("projection", "{", "eventId", BCON_INT32(1), "handler", BCON_INT32(1),
			    "createdAt", BCON_INT32(1), "}");
			cur = mongoc_collection_find_with_opts(dc, &dq, opts, NULL);
			while (mongoc_cursor_next(cur, &d)) {
				dels = xrealloc(dels, (nd + 1) * sizeof *dels);
				dels[nd++] = bson_copy(d);
			}
			if (mongoc_cursor_error(cur, &e))
				rc = mg_err(s, &e, "upgrade", err);
			mongoc_cursor_destroy(cur);
			bson_destroy(opts);
		}
		bson_destroy(&dq);
		b = mongoc_collection_create_bulk_operation_with_opts(ec, NULL);
		for (size_t i = 0; rc == 0 && i < got; i++) {
			const char *id = mg_get_str(evs[i], "_id");
			bson_t uq = BSON_INITIALIZER, u = BSON_INITIALIZER, set, hs;
			int64_t created = -1;
			uint32_t nh = 0;
			bson_iter_t it;

			if (id == NULL)
				id = "";
			bson_iter_init_find(&it, evs[i], "_id");
			bson_append_iter(&uq, "_id", -1, &it);
			BSON_APPEND_DOCUMENT_BEGIN(&uq, "handlers", &in);
			BSON_APPEND_BOOL(&in, "$exists", false);
			bson_append_document_end(&uq, &in);
			BSON_APPEND_DOCUMENT_BEGIN(&u, "$set", &set);
			BSON_APPEND_ARRAY_BEGIN(&set, "handlers", &hs);
			for (size_t k = 0; k < nd; k++) {
				const char *ev = mg_get_str(dels[k], "eventId"), *h = mg_get_str(dels[k], "handler");
				bool seen = false;
				int64_t at = mg_get_int(dels[k], "createdAt", -1);

				if (ev == NULL || h == NULL || strcmp(ev, id) != 0)
					continue;
				if (at >= 0 && (created < 0 || at < created))
					created = at;
				for (size_t j = 0; j < k && !seen; j++)
					seen = str_is(mg_get_str(dels[j], "eventId"), id) &&
					    str_is(mg_get_str(dels[j], "handler"), h);
				if (!seen) {
					char ks[16];
					const char *kp;

					bson_uint32_to_string(nh++, &kp, ks, sizeof ks);
					bson_append_utf8(&hs, kp, -1, h, -1);
				}
			}
			bson_append_array_end(&set, &hs);
			if (!bson_has_field(evs[i], "createdAt"))
				BSON_APPEND_DATE_TIME(&set, "createdAt", created >= 0 ? created : mg_now());
			bson_append_document_end(&u, &set);
			mongoc_bulk_operation_update_one(b, &uq, &u, false);
			bson_destroy(&uq);
			bson_destroy(&u);
		}
		if (bulk_run(s, b, rc == 0 ? got : 0, err) < 0)
			rc = -1;
		for (size_t i = 0; i < got; i++)
			bson_destroy(evs[i]);
		for (size_t k = 0; k < nd; k++)
			bson_destroy(dels[k]);
		free(evs);
		free(dels);
	}
	mongoc_collection_destroy(ec);
	mongoc_collection_destroy(dc);
	return rc;
}

/* deliveries.laneId (rb_lane_of, as publish computes it), a batch at a time */
static int
upgrade_lanes(struct rb_store *s, struct rb_error *err)
{
	mongoc_collection_t *dc = mg_coll(s, "deliveries");
	int rc = 0;

	for (size_t got = UPGRADE_BATCH; rc == 0 && got == UPGRADE_BATCH;) {
		bson_t *q = BCON_NEW("laneId", "{", "$exists", BCON_BOOL(false), "}");
		bson_t *opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "eventId", BCON_INT32(1),
		    "key", BCON_INT32(1), "}", "limit", BCON_INT64(UPGRADE_BATCH));
		mongoc_cursor_t *cur = mongoc_collection_find_with_opts(dc, q, opts, NULL);
		mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(dc, NULL);
		const bson_t *d;
		bson_error_t e;

		got = 0;
		while (mongoc_cursor_next(cur, &d)) {
			const char *ev = mg_get_str(d, "eventId");
			int32_t lane = rb_lane_of(mg_get_str(d, "key"), ev != NULL ? ev : "");
			bson_t uq = BSON_INITIALIZER;
			bson_t *u = BCON_NEW("$set", "{", "laneId", BCON_INT32(lane), "}");
			bson_iter_t it;

			bson_iter_init_find(&it, d, "_id");
			bson_append_iter(&uq, "_id", -1, &it);
			mongoc_bulk_operation_update_one(b, &uq, u, false);
			bson_destroy(&uq);
			bson_destroy(u);
			got++;
		}
		if (mongoc_cursor_error(cur, &e))
			rc = mg_err(s, &e, "upgrade", err);
		mongoc_cursor_destroy(cur);
		bson_destroy(q);
		bson_destroy(opts);
		if (bulk_run(s, b, rc == 0 ? got : 0, err) < 0)
			rc = -1;
	}
	mongoc_collection_destroy(dc);
	return rc;
}

/* each key's counter at least its deliveries' highest sequence */
static int
upgrade_keys(struct rb_store *s, struct rb_error *err)
{
	mongoc_collection_t *dc = mg_coll(s, "deliveries"), *kc = mg_coll(s, "keys");
	bson_t *pipe = BCON_NEW("pipeline", "[",
	    "{", "$match", "{", "key", "{", "$ne", BCON_NULL, "}", "seq", "{", "$ne", BCON_NULL, "}", "}", "}",
	    "{", "$group", "{", "_id", BCON_UTF8("$key"), "seq", "{", "$max", BCON_UTF8("$seq"), "}", "}", "}",
	    "]");
	mongoc_cursor_t *cur = mongoc_collection_aggregate(dc, MONGOC_QUERY_NONE, pipe, NULL, NULL);
	bson_t *bopts = BCON_NEW("ordered", BCON_BOOL(false));
	mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(kc, bopts);
	const bson_t *d;
	bson_error_t e;
	size_t n = 0;
	int rc = 0;

	while (mongoc_cursor_next(cur, &d)) {
		const char *k = mg_get_str(d, "_id");
		bson_t *q, *u;

		if (k == NULL)
			continue;
		q = BCON_NEW("_id", BCON_UTF8(k));
		u = BCON_NEW("$max", "{", "seq", BCON_INT64(mg_get_int(d, "seq", 0)), "}");
		mongoc_bulk_operation_update_one(b, q, u, true);
		bson_destroy(q);
		bson_destroy(u);
		n++;
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, "upgrade", err);
	mongoc_cursor_destroy(cur);
	if (bulk_run(s, b, rc == 0 ? n : 0, err) < 0)
		rc = -1;
	bson_destroy(bopts);
	bson_destroy(pipe);
	mongoc_collection_destroy(dc);
	mongoc_collection_destroy(kc);
	return rc;
}

/* the lanes of every handler with deliveries */
static int
upgrade_seed(struct rb_store *s, struct rb_error *err)
{
	mongoc_collection_t *dc = mg_coll(s, "deliveries");
	bson_t *cmd = BCON_NEW("distinct", BCON_UTF8(mongoc_collection_get_name(dc)), "key", BCON_UTF8("handler"));
	bson_t reply;
	bson_error_t e;
	bson_iter_t it, v;
	int rc = 0;

	if (!mongoc_collection_read_command_with_opts(dc, cmd, NULL, NULL, &reply, &e))
		rc = mg_err(s, &e, "upgrade", err);
	else if (bson_iter_init_find(&it, &reply, "values") && bson_iter_recurse(&it, &v))
		while (rc == 0 && bson_iter_next(&v))
			if (BSON_ITER_HOLDS_UTF8(&v))
				rc = mg_seed_lanes(s, bson_iter_utf8(&v, NULL), err);
	bson_destroy(&reply);
	bson_destroy(cmd);
	mongoc_collection_destroy(dc);
	return rc;
}

int
mg_upgrade_010(struct rb_store *s, struct rb_error *err)
{
	mongoc_collection_t *dc;

	/* processing -> pending, its attempt (counted at the claim) kept */
	if (update_many(s, "deliveries", BCON_NEW("status", BCON_UTF8("processing")),
	    BCON_NEW("$set", "{", "status", BCON_UTF8("pending"), "updatedAt", BCON_DATE_TIME(mg_now()), "}"),
	    err) < 0)
		return -1;
	if (update_many(s, "deliveries", BCON_NEW("$or", "[",
		"{", "leaseOwner", "{", "$exists", BCON_BOOL(true), "}", "}",
		"{", "leaseToken", "{", "$exists", BCON_BOOL(true), "}", "}",
		"{", "leaseExpiresAt", "{", "$exists", BCON_BOOL(true), "}", "}", "]"),
	    BCON_NEW("$unset", "{", "leaseOwner", BCON_UTF8(""), "leaseToken", BCON_UTF8(""),
		"leaseExpiresAt", BCON_UTF8(""), "}"), err) < 0)
		return -1;
	if (update_many(s, "deliveries", BCON_NEW("dueAt", "{", "$exists", BCON_BOOL(true), "}"),
	    BCON_NEW("$rename", "{", "dueAt", BCON_UTF8("availableAt"), "}"), err) < 0)
		return -1;
	if (update_many(s, "deliveries", BCON_NEW("claims", "{", "$exists", BCON_BOOL(false), "}"),
	    BCON_NEW("$set", "{", "claims", BCON_INT64(0), "}"), err) < 0)
		return -1;
	/* 0.1.0's parked ones too: this release parks behind a marker
	 * (store_mongo_park.c) that 0.1.0 did not write */
	if (update_many(s, "deliveries", BCON_NEW("lane", "{", "$ne", BCON_UTF8("ready"), "}"),
	    BCON_NEW("$set", "{", "lane", BCON_UTF8("ready"), "}"), err) < 0)
		return -1;
	if (upgrade_events(s, err) < 0 || upgrade_keys(s, err) < 0)
		return -1;
	dc = mg_coll(s, "deliveries");
	for (size_t i = 0; i < sizeof old_indexes / sizeof old_indexes[0]; i++) {
		bson_error_t e;

		/* 27 IndexNotFound, 26 NamespaceNotFound: gone already */
		if (!mongoc_collection_drop_index_with_opts(dc, old_indexes[i], NULL, &e) &&
		    e.code != 27 && e.code != 26) {
			mongoc_collection_destroy(dc);
			return mg_err(s, &e, "upgrade", err);
		}
	}
	mongoc_collection_destroy(dc);
	if (upgrade_seed(s, err) < 0)
		return -1;
	return upgrade_lanes(s, err);
}
