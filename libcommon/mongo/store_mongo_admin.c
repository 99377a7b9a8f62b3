/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_admin.c: rb_admin.h on MongoDB.  Statistics and listings are
 * scans of the deliveries (as on PostgreSQL: no index serves them), with
 * "processing" meaning pending and on a lane's inFlight list.  Requeue,
 * bury and cancel are conditional writes on each delivery (its status and
 * claim count as read), so that a delivery a claim took meanwhile is left
 * alone by a bury or cancel that saw it idle only if its claim count moved.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_admin.h"
#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

/* what is in flight: every id of a lane's inFlight list, with its lane's lease */
struct flight {
	int64_t	 id;
	char	*owner;
	int64_t	 until;		/* -1: none */
};

struct flights {
	struct flight	*v;
	size_t		 n;
};

static void
flights_free(struct flights *f)
{
	for (size_t i = 0; i < f->n; i++)
		free(f->v[i].owner);
	free(f->v);
}

static int
load_flights(struct rb_store *s, struct flights *f, const char *what, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "lanes");
	bson_t *q = BCON_NEW("inFlight.0", "{", "$exists", BCON_BOOL(true), "}");
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
	const bson_t *d;
	bson_error_t e;
	int rc = 0;

	memset(f, 0, sizeof *f);
	while (mongoc_cursor_next(cur, &d)) {
		bson_iter_t it, a;

		if (!bson_iter_init_find(&it, d, "inFlight") || !bson_iter_recurse(&it, &a))
			continue;
		while (bson_iter_next(&a)) {
			const char *o = mg_get_str(d, "owner");

			f->v = xrealloc(f->v, (f->n + 1) * sizeof *f->v);
			f->v[f->n].id = bson_iter_as_int64(&a);
			f->v[f->n].owner = o != NULL ? xstrdup(o) : NULL;
			f->v[f->n].until = mg_get_int(d, "leaseExpiresAt", -1);
			f->n++;
		}
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, what, err);
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	return rc;
}

static const struct flight *
flying(const struct flights *f, int64_t id)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->v[i].id == id)
			return &f->v[i];
	return NULL;
}

static json_t *
jstr(const bson_t *d, const char *key)
{
	const char *v = mg_get_str(d, key);

	return v != NULL ? json_string(v) : json_null();
}

static json_t *
jtime(int64_t ms)
{
	char b[32];

	if (ms < 0)
		return json_null();
	mg_fmt_time(ms, b);
	return json_string(b);
}

/* ---- statistics ------------------------------------------------------------ */

static json_t *
handler_row(json_t *handlers, const char *h, bool hist)
{
	json_t *r;
	size_t i;

	json_array_foreach(handlers, i, r)
		if (strcmp(json_string_value(json_object_get(r, "handler")), h) == 0)
			return r;
	r = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:i, s:i, s:n}", "handler", h, "pending", 0, "due", 0,
	    "delayed", 0, "processing", 0, "dead", 0, "completed", hist ? json_integer(0) : json_null(),
	    "completed_total", hist ? json_integer(0) : json_null(), "failed_total", 0, "buried_total", 0,
	    "oldest_pending_age_ms");
	json_array_append_new(handlers, r);
	return r;
}

static void
bump(json_t *o, const char *k, int64_t by)
{
	json_object_set_new(o, k, json_integer(json_integer_value(json_object_get(o, k)) + by));
}

static int
cmp_handler(const void *a, const void *b)
{
	return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "handler")),
	    json_string_value(json_object_get(*(json_t *const *)b, "handler")));
}

/* Whether an event with this (not a string) id has a delivery: a count. */
static int
has_delivery(struct rb_store *s, mongoc_collection_t *dc, const bson_t *ev, struct rb_error *err)
{
	bson_t dq = BSON_INITIALIZER;
	bson_iter_t it;
	bson_error_t e;
	int64_t n;

	if (bson_iter_init_find(&it, ev, "_id"))
		bson_append_iter(&dq, "eventId", -1, &it);
	n = mongoc_collection_count_documents(dc, &dq, NULL, NULL, NULL, &e);
	bson_destroy(&dq);
	return n < 0 ? mg_err(s, &e, "stats", err) : n > 0;
}

/*
 * Events without deliveries: the events in _id order merged with the
 * deliveries' event ids in the same order (both through an index: _id, and
 * event_handler, which covers the second).  Two reads, where a count an
 * event made stats a round trip an event (rb-setup's line after an upgrade
 * of 2,500 events: 60 s on the test server).  MongoDB orders strings by
 * their bytes, as strcmp does; an id that is not a string is counted alone.
 */
static int
count_orphans(struct rb_store *s, int64_t *orphans, struct rb_error *err)
{
	mongoc_collection_t *ec = mg_coll(s, "events"), *dc = mg_coll(s, "deliveries");
	bson_t q = BSON_INITIALIZER;
	bson_t *eo = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "sort", "{", "_id", BCON_INT32(1), "}");
	bson_t *dopts = BCON_NEW("projection", "{", "_id", BCON_INT32(0), "eventId", BCON_INT32(1), "}",
	    "sort", "{", "eventId", BCON_INT32(1), "handler", BCON_INT32(1), "}");
	mongoc_cursor_t *ce = mongoc_collection_find_with_opts(ec, &q, eo, NULL);
	mongoc_cursor_t *cd = mongoc_collection_find_with_opts(dc, &q, dopts, NULL);
	const bson_t *d, *x;
	char *at = NULL;	/* the deliveries' event id in hand; NULL: none left */
	bool more = true;
	bson_error_t e;
	int rc = 0;

	while (rc == 0 && mongoc_cursor_next(ce, &d)) {
		const char *id = mg_get_str(d, "_id");

		if (id == NULL) {
			rc = has_delivery(s, dc, d, err);
			*orphans += rc == 0;
			rc = rc < 0 ? -1 : 0;
			continue;
		}
		while (more && (at == NULL || strcmp(at, id) < 0)) {
			const char *v;

			if (!mongoc_cursor_next(cd, &x)) {
				more = false;
				free(at);
				at = NULL;
			} else if ((v = mg_get_str(x, "eventId")) != NULL) {
				free(at);
				at = xstrdup(v);
			}
		}
		if (at == NULL || strcmp(at, id) != 0)
			(*orphans)++;
	}
	if (rc == 0 && (mongoc_cursor_error(ce, &e) || mongoc_cursor_error(cd, &e)))
		rc = mg_err(s, &e, "stats", err);
	free(at);
	mongoc_cursor_destroy(ce);
	mongoc_cursor_destroy(cd);
	bson_destroy(eo);
	bson_destroy(dopts);
	mongoc_collection_destroy(ec);
	mongoc_collection_destroy(dc);
	return rc;
}

int
mg_admin_stats(struct rb_store *s, json_t **out, struct rb_error *err)
{
	bool hist;
	struct flights fl;
	json_t *handlers = json_array(), *total, *sorted;
	mongoc_collection_t *c;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t q = BSON_INITIALIZER;
	bson_error_t e;
	int64_t now = mg_now(), oldest = -1, orphans = 0;
	int rc = 0;

	if (mg_ready(s, "stats", err) < 0 || load_flights(s, &fl, "stats", err) < 0) {
		json_decref(handlers);
		return -1;
	}
	hist = mg_history(s);
	c = mg_coll(s, "deliveries");
	cur = mongoc_collection_find_with_opts(c, &q, NULL, NULL);
	while (mongoc_cursor_next(cur, &d)) {
		const char *h = mg_get_str(d, "handler"), *st = mg_get_str(d, "status");
		json_t *r;

		if (h == NULL || st == NULL)
			continue;
		r = handler_row(handlers, h, hist);
		if (strcmp(st, "dead") == 0)
			bump(r, "dead", 1);
		else if (strcmp(st, "completed") == 0) {
			/* one relaybus 0.1.0 left (mg_upgrade_010) */
			if (!json_is_integer(json_object_get(r, "completed")))
				json_object_set_new(r, "completed", json_integer(0));
			bump(r, "completed", 1);
		} else if (flying(&fl, mg_get_int(d, "_id", 0)) != NULL)
			bump(r, "processing", 1);
		else {
			int64_t age = now - mg_get_int(d, "createdAt", now);
			json_t *o = json_object_get(r, "oldest_pending_age_ms");

			bump(r, "pending", 1);
			bump(r, mg_get_int(d, "availableAt", 0) <= now ? "due" : "delayed", 1);
			if (!json_is_integer(o) || json_integer_value(o) < age)
				json_object_set_new(r, "oldest_pending_age_ms", json_integer(age));
			if (age > oldest)
				oldest = age;
		}
	}
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, "stats", err);
	mongoc_cursor_destroy(cur);
	mongoc_collection_destroy(c);
	/* handlers with only subscriptions, lanes or history count too; the
	 * exact counters: failures and burials in the lane documents,
	 * completions in the history and what purges removed from it */
	for (int k = 0; rc == 0 && k < 4; k++) {
		static const char *const colls[] = { "subscriptions", "lanes", "completed_deliveries", "counters" };
		mongoc_cursor_t *cc;

		if (k >= 2 && !hist)
			break;
		c = mg_coll(s, colls[k]);
		if (k == 3)
			BSON_APPEND_UTF8(&q, "kind", "historyPurged");
		cc = mongoc_collection_find_with_opts(c, &q, NULL, NULL);
		if (k == 3)
			bson_reinit(&q);
		while (mongoc_cursor_next(cc, &d)) {
			const char *h = mg_get_str(d, "handler");
			json_t *r;

			if (h == NULL)
				continue;
			r = handler_row(handlers, h, hist);
			if (k == 1) {
				bump(r, "failed_total", mg_get_int(d, "failed", 0));
				bump(r, "buried_total", mg_get_int(d, "buried", 0));
			} else if (k == 2) {
				bump(r, "completed", 1);
				bump(r, "completed_total", 1);
			} else if (k == 3)
				bump(r, "completed_total", mg_get_int(d, "n", 0));
		}
		if (mongoc_cursor_error(cc, &e))
			rc = mg_err(s, &e, "stats", err);
		mongoc_cursor_destroy(cc);
		mongoc_collection_destroy(c);
	}
	/* events without deliveries */
	if (rc == 0)
		rc = count_orphans(s, &orphans, err);
	bson_destroy(&q);
	flights_free(&fl);
	if (rc < 0) {
		json_decref(handlers);
		return -1;
	}
	{
		size_t n = json_array_size(handlers);
		json_t **v = xcalloc(n + 1, sizeof *v);

		for (size_t i = 0; i < n; i++)
			v[i] = json_array_get(handlers, i);
		qsort(v, n, sizeof *v, cmp_handler);
		sorted = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append(sorted, v[i]);
		free(v);
		json_decref(handlers);
	}
	total = json_pack("{s:n, s:i, s:i, s:i, s:i, s:i}", "handler", "pending", 0, "due", 0, "delayed", 0,
	    "processing", 0, "dead", 0);
	json_object_set_new(total, "completed", hist ? json_integer(0) : json_null());
	json_object_set_new(total, "completed_total", hist ? json_integer(0) : json_null());
	json_object_set_new(total, "failed_total", json_integer(0));
	json_object_set_new(total, "buried_total", json_integer(0));
	{
		static const char *const counts[] = { "pending", "due", "delayed", "processing", "dead", "completed",
		    "completed_total", "failed_total", "buried_total" };
		size_t i;
		json_t *r;

		json_array_foreach(sorted, i, r)
			for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
				if (k == 5 && json_is_integer(json_object_get(r, counts[k])) &&
				    !json_is_integer(json_object_get(total, counts[k])))
					json_object_set_new(total, counts[k], json_integer(0));
				if (json_is_integer(json_object_get(r, counts[k])) &&
				    json_is_integer(json_object_get(total, counts[k])))
					bump(total, counts[k], json_integer_value(json_object_get(r, counts[k])));
			}
	}
	json_object_set_new(total, "oldest_pending_age_ms", oldest >= 0 ? json_integer(oldest) : json_null());
	*out = json_pack("{s:b, s:I, s:o, s:o}", "history", hist, "events_without_deliveries", (json_int_t)orphans,
	    "handlers", sorted, "total", total);
	return 0;
}

/* ---- listings -------------------------------------------------------------- */

static int
list_into(struct rb_store *s, const struct rb_admin_filter *f, const bool flags[RB_ADMIN_NSTATUS], bool hist,
    json_t *rows, struct rb_error *err)
{
	struct flights fl;
	mongoc_collection_t *c, *ec;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t q = BSON_INITIALIZER, *opts;
	bson_error_t e;
	int rc = 0;

	/* (completed: the deliveries relaybus 0.1.0 left, then the history) */
	if (flags[0] || flags[1] || flags[2] || flags[3]) {
		if (load_flights(s, &fl, "list", err) < 0)
			return -1;
		if (f->handler != NULL)
			BSON_APPEND_UTF8(&q, "handler", f->handler);
		if (f->key != NULL)
			BSON_APPEND_UTF8(&q, "key", f->key);
		if (f->event_id != NULL)
			BSON_APPEND_UTF8(&q, "eventId", f->event_id);
		opts = BCON_NEW("sort", "{", "createdAt", BCON_INT32(1), "_id", BCON_INT32(1), "}");
		c = mg_coll(s, "deliveries");
		ec = mg_coll(s, "events");
		cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
		while (mongoc_cursor_next(cur, &d) && (f->limit <= 0 || (int64_t)json_array_size(rows) < f->limit)) {
			const char *st = mg_get_str(d, "status");
			const struct flight *fly = flying(&fl, mg_get_int(d, "_id", 0));
			bool completed = st != NULL && strcmp(st, "completed") == 0;
			int state = completed ? 3 : st != NULL && strcmp(st, "dead") == 0 ? 2 : fly != NULL ? 1 : 0;
			json_t *o = json_object();
			char idb[32];
			bson_t *eq = BCON_NEW("_id", BCON_UTF8(mg_get_str(d, "eventId") ? mg_get_str(d, "eventId") : ""));
			mongoc_cursor_t *c2;
			const bson_t *ev;
			json_t *name = json_null();

			if (!flags[state]) {
				json_decref(o);
				bson_destroy(eq);
				continue;
			}
			c2 = mongoc_collection_find_with_opts(ec, eq, NULL, NULL);
			if (mongoc_cursor_next(c2, &ev)) {
				json_decref(name);
				name = jstr(ev, "name");
			}
			mongoc_cursor_destroy(c2);
			bson_destroy(eq);
			snprintf(idb, sizeof idb, "%" PRId64, mg_get_int(d, "_id", 0));
			json_object_set_new(o, "delivery_id", json_string(idb));
			json_object_set_new(o, "event_id", jstr(d, "eventId"));
			json_object_set_new(o, "handler", jstr(d, "handler"));
			json_object_set_new(o, "name", name);
			json_object_set_new(o, "key", jstr(d, "key"));
			json_object_set_new(o, "status", json_string(rb_admin_statuses[state]));
			json_object_set_new(o, "attempts", json_integer(mg_get_int(d, "attempts", 0)));
			json_object_set_new(o, "last_error", jstr(d, "lastError"));
			json_object_set_new(o, "available_at", jtime(mg_get_int(d, "availableAt", -1)));
			json_object_set_new(o, "lane", json_integer(mg_get_int(d, "laneId", 0)));
			json_object_set_new(o, "owner", state == 1 && fly->owner ? json_string(fly->owner) : json_null());
			json_object_set_new(o, "lease_expires_at", state == 1 ? jtime(fly->until) : json_null());
			json_object_set_new(o, "created_at", jtime(mg_get_int(d, "createdAt", -1)));
			json_object_set_new(o, "updated_at", jtime(mg_get_int(d, "updatedAt", -1)));
			if (completed)
				json_object_set_new(o, "completed_at", jtime(mg_get_int(d, "completedAt", -1)));
			json_array_append_new(rows, o);
		}
		if (mongoc_cursor_error(cur, &e))
			rc = mg_err(s, &e, "list", err);
		mongoc_cursor_destroy(cur);
		bson_destroy(opts);
		mongoc_collection_destroy(c);
		mongoc_collection_destroy(ec);
		flights_free(&fl);
		bson_reinit(&q);
	}
	if (rc == 0 && flags[3] && hist) {
		if (f->handler != NULL)
			BSON_APPEND_UTF8(&q, "handler", f->handler);
		if (f->event_id != NULL)
			BSON_APPEND_UTF8(&q, "eventId", f->event_id);
		opts = BCON_NEW("sort", "{", "completedAt", BCON_INT32(1), "eventId", BCON_INT32(1), "handler",
		    BCON_INT32(1), "}");
		c = mg_coll(s, "completed_deliveries");
		cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
		while (mongoc_cursor_next(cur, &d) && (f->limit <= 0 || (int64_t)json_array_size(rows) < f->limit)) {
			json_t *o = json_object();

			json_object_set_new(o, "delivery_id", json_null());
			json_object_set_new(o, "event_id", jstr(d, "eventId"));
			json_object_set_new(o, "handler", jstr(d, "handler"));
			json_object_set_new(o, "name", json_null());
			json_object_set_new(o, "key", json_null());
			json_object_set_new(o, "status", json_string("completed"));
			json_object_set_new(o, "attempts", json_integer(mg_get_int(d, "attempts", 0)));
			json_object_set_new(o, "completed_at", jtime(mg_get_int(d, "completedAt", -1)));
			json_array_append_new(rows, o);
		}
		if (mongoc_cursor_error(cur, &e))
			rc = mg_err(s, &e, "list", err);
		mongoc_cursor_destroy(cur);
		bson_destroy(opts);
		mongoc_collection_destroy(c);
	}
	bson_destroy(&q);
	return rc;
}

int
mg_admin_list(struct rb_store *s, const struct rb_admin_filter *f, json_t **out, struct rb_error *err)
{
	bool flags[RB_ADMIN_NSTATUS];
	json_t *rows;

	if (rb_admin_status_flags(f->status, flags) < 0)
		return rb_seterr(err, RB_EXIT_USAGE, "unknown status in '%s': use pending, processing, dead, completed",
		    f->status);
	if (mg_ready(s, "list", err) < 0)
		return -1;
	rows = json_array();
	if (list_into(s, f, flags, mg_history(s), rows, err) < 0) {
		json_decref(rows);
		return -1;
	}
	*out = rows;
	return (int)json_array_size(rows);
}

int
mg_admin_show(struct rb_store *s, const char *event_id, json_t **out, struct rb_error *err)
{
	struct rb_admin_filter f = { .event_id = event_id };
	bool flags[RB_ADMIN_NSTATUS] = { true, true, true, true };
	mongoc_collection_t *c;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t *q;
	json_t *ev, *dels;
	bool found = false;

	if (mg_ready(s, "show", err) < 0)
		return -1;
	ev = json_object();
	json_object_set_new(ev, "event_id", json_string(event_id));
	c = mg_coll(s, "events");
	q = BCON_NEW("_id", BCON_UTF8(event_id));
	cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
	if (mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;

		found = true;
		json_object_set_new(ev, "name", jstr(d, "name"));
		json_object_set_new(ev, "key", jstr(d, "key"));
		json_object_set_new(ev, "payload", bson_iter_init_find(&it, d, "payload") ? mg_iter_json(&it) : json_null());
		json_object_set_new(ev, "headers", bson_iter_init_find(&it, d, "headers") ? mg_iter_json(&it) : json_object());
		json_object_set_new(ev, "handlers", bson_iter_init_find(&it, d, "handlers") ? mg_iter_json(&it) : json_array());
		json_object_set_new(ev, "created_at", jtime(mg_get_int(d, "createdAt", -1)));
	}
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	dels = json_array();
	if (list_into(s, &f, flags, mg_history(s), dels, err) < 0) {
		json_decref(ev);
		json_decref(dels);
		return -1;
	}
	if (!found && json_array_size(dels) == 0) {
		json_decref(ev);
		json_decref(dels);
		return 0;
	}
	json_object_set_new(ev, "deliveries", dels);
	*out = ev;
	return 0;
}

/* ---- requeue, bury, cancel ------------------------------------------------ */

struct bury {
	struct rb_store	*s;
	const bson_t	*q, *u;		/* u NULL: cancel (delete) */
	const char	*handler;
	int		 lane;
	const bson_t	*doc;		/* the delivery (a parking's marker: unpark) */
	int64_t		 n;	/* out: buried */
};

static bool
bury_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct bury *b = ctx;
	mongoc_collection_t *dc = mg_coll(b->s, "deliveries"), *lc = mg_coll(b->s, "lanes");
	bson_t opts, reply;
	bool ok;

	mg_sopts(cs, &opts);
	b->n = 0;
	ok = b->u != NULL ? mongoc_collection_update_one(dc, b->q, b->u, &opts, &reply, e) :
	    mongoc_collection_delete_one(dc, b->q, &opts, &reply, e);
	if (ok)
		b->n = mg_get_int(&reply, b->u != NULL ? "modifiedCount" : "deletedCount", 0);
	bson_destroy(&reply);
	if (ok && b->n == 1 && b->doc != NULL)
		ok = mg_unpark_after(b->s, cs, b->doc, e);
	if (ok && b->n == 1 && b->handler != NULL && b->u != NULL) {
		char id[MG_LANE_ID_LEN];
		bson_t *lq, *lu;

		mg_lane_id(id, b->handler, b->lane);
		lq = BCON_NEW("_id", BCON_UTF8(id));
		lu = BCON_NEW("$inc", "{", "buried", BCON_INT64(1), "}");
		ok = mongoc_collection_update_one(lc, lq, lu, &opts, NULL, e);
		bson_destroy(lq);
		bson_destroy(lu);
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(dc);
	mongoc_collection_destroy(lc);
	return ok;
}

int
mg_admin_apply(struct rb_store *s, enum rb_admin_action action, const json_t *targets, const char *reason,
    json_t **out, struct rb_error *err)
{
	static const char *const done[] = { "requeued", "buried", "cancelled" };
	mongoc_collection_t *c;
	struct flights fl;
	json_t *outcomes = json_array();
	size_t i;
	const json_t *t;
	int changed = 0, rc = 0;

	if (json_array_size(targets) == 0) {
		*out = outcomes;
		return 0;
	}
	if (mg_ready(s, "apply", err) < 0 || load_flights(s, &fl, "apply", err) < 0) {
		json_decref(outcomes);
		return -1;
	}
	c = mg_coll(s, "deliveries");
	json_array_foreach(targets, i, t) {
		const char *ev = json_string_value(json_object_get(t, "event_id"));
		const char *h = json_string_value(json_object_get(t, "handler"));
		bson_t *q = BCON_NEW("eventId", BCON_UTF8(ev != NULL ? ev : ""));
		bson_t *opts = BCON_NEW("sort", "{", "handler", BCON_INT32(1), "}");
		mongoc_cursor_t *cur;
		const bson_t *d;
		bson_error_t e;
		bool any = false;

		if (h != NULL)
			BSON_APPEND_UTF8(q, "handler", h);
		cur = mongoc_collection_find_with_opts(c, q, opts, NULL);
		while (rc == 0 && mongoc_cursor_next(cur, &d)) {
			int64_t id = mg_get_int(d, "_id", 0), claims = mg_get_int(d, "claims", 0);
			const char *st = mg_get_str(d, "status");
			bool dead = st != NULL && strcmp(st, "dead") == 0, infl = !dead && flying(&fl, id) != NULL;
			bool completed = st != NULL && strcmp(st, "completed") == 0;
			bool act = action == RB_ADMIN_REQUEUE ? dead : (!dead && !infl && !completed);
			json_t *o = json_object();
			char idb[32];
			const char *outcome = "skipped", *status = infl ? "processing" : st;

			any = true;
			if (act) {
				bson_t *fq = BCON_NEW("_id", BCON_INT64(id), "claims", BCON_INT64(claims),
				    "status", BCON_UTF8(dead ? "dead" : "pending"));
				bson_t reply;
				bool ok;

				if (action == RB_ADMIN_CANCEL && mg_get_int(d, "parkNext", 0) > 0) {
					/* a parking's marker: with the unparking, in one transaction */
					struct bury b = { .s = s, .q = fq, .doc = d };

					ok = mg_txn(s, bury_txn, &b, "cancel", err) == 0;
					bson_init(&reply);
					BSON_APPEND_INT64(&reply, "deletedCount", b.n);
					if (!ok)
						rc = -1;
				} else if (action == RB_ADMIN_CANCEL)
					ok = mongoc_collection_delete_one(c, fq, NULL, &reply, &e);
				else {
					/* (requeued: ready, as any delivery that becomes pending) */
					bson_t *u = action == RB_ADMIN_REQUEUE ?
					    BCON_NEW("$set", "{", "status", BCON_UTF8("pending"), "attempts", BCON_INT32(0),
						"availableAt", BCON_DATE_TIME(mg_now()), "updatedAt", BCON_DATE_TIME(mg_now()),
						"lane", BCON_UTF8("ready"), "}",
						"$unset", "{", "parkNext", BCON_UTF8(""), "}",
						"$inc", "{", "claims", BCON_INT64(1), "}") :
					    BCON_NEW("$set", "{", "status", BCON_UTF8("dead"), "lastError",
						BCON_UTF8(reason != NULL ? reason : "buried by rb-admin"),
						"updatedAt", BCON_DATE_TIME(mg_now()), "}");

					if (action == RB_ADMIN_BURY) {
						/* with the lane's burial counter, in one transaction */
						struct bury b = { .s = s, .q = fq, .u = u, .handler = mg_get_str(d, "handler"),
						    .lane = (int)mg_get_int(d, "laneId", 0), .doc = d };

						ok = mg_txn(s, bury_txn, &b, "bury", err) == 0;
						bson_init(&reply);
						BSON_APPEND_INT64(&reply, "modifiedCount", b.n);
						if (!ok)
							rc = -1;
					} else if (mg_get_str(d, "key") != NULL) {
						/* keyed: to the back of its key if a later one runs */
						int64_t m = 0;

						ok = mg_requeue_keyed(s, d, fq, u, &m, err) == 0;
						bson_init(&reply);
						BSON_APPEND_INT64(&reply, "modifiedCount", m);
						if (!ok)
							rc = -1;
					} else
						ok = mongoc_collection_update_one(c, fq, u, NULL, &reply, &e);
					bson_destroy(u);
				}
				if (!ok && rc == 0)
					rc = mg_err(s, &e, "apply", err);
				else if (ok && mg_get_int(&reply, action == RB_ADMIN_CANCEL ? "deletedCount" : "modifiedCount", 0) == 1) {
					outcome = done[action];
					status = action == RB_ADMIN_REQUEUE ? "pending" : action == RB_ADMIN_BURY ? "dead" : NULL;
					changed++;
				}
				bson_destroy(&reply);
				bson_destroy(fq);
			}
			snprintf(idb, sizeof idb, "%" PRId64, id);
			json_object_set_new(o, "event_id", json_string(ev));
			json_object_set_new(o, "handler", jstr(d, "handler"));
			json_object_set_new(o, "delivery_id", json_string(idb));
			json_object_set_new(o, "outcome", json_string(outcome));
			json_object_set_new(o, "status", status != NULL ? json_string(status) : json_null());
			json_array_append_new(outcomes, o);
		}
		if (rc == 0 && mongoc_cursor_error(cur, &e))
			rc = mg_err(s, &e, "apply", err);
		mongoc_cursor_destroy(cur);
		bson_destroy(q);
		bson_destroy(opts);
		if (rc == 0 && !any)
			json_array_append_new(outcomes, json_pack("{s:s?, s:s?, s:n, s:s, s:n}", "event_id", ev,
			    "handler", h, "delivery_id", "outcome", "missing", "status"));
		if (rc < 0)
			break;
	}
	mongoc_collection_destroy(c);
	flights_free(&fl);
	if (rc < 0) {
		json_decref(outcomes);
		return -1;
	}
	*out = outcomes;
	return changed;
}

/* ---- purge ----------------------------------------------------------------- */

struct hpurge {
	struct rb_store	*s;
	const bson_t	*q;
	const char	*handler;
	int64_t		 n;	/* out: deleted */
};

static bool
hpurge_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct hpurge *h = ctx;
	mongoc_collection_t *hc = mg_coll(h->s, "completed_deliveries"), *cc = mg_coll(h->s, "counters");
	bson_t opts, reply;
	bool ok;

	mg_sopts(cs, &opts);
	h->n = 0;
	ok = mongoc_collection_delete_one(hc, h->q, &opts, &reply, e);
	if (ok)
		h->n = mg_get_int(&reply, "deletedCount", 0);
	bson_destroy(&reply);
	if (ok && h->n == 1 && h->handler != NULL) {
		char *id = xasprintf("historyPurged/%s", h->handler);
		bson_t *q = BCON_NEW("_id", BCON_UTF8(id));
		bson_t *u = BCON_NEW("$inc", "{", "n", BCON_INT64(1), "}",
		    "$set", "{", "kind", BCON_UTF8("historyPurged"), "handler", BCON_UTF8(h->handler), "}");

		bson_append_bool(&opts, "upsert", -1, true);
		ok = mongoc_collection_update_one(cc, q, u, &opts, NULL, e);
		bson_destroy(q);
		bson_destroy(u);
		free(id);
	}
	bson_destroy(&opts);
	mongoc_collection_destroy(hc);
	mongoc_collection_destroy(cc);
	return ok;
}

int
mg_admin_purge(struct rb_store *s, enum rb_admin_purge kind, int64_t older_than_ms, int batch,
    struct rb_error *err)
{
	/* (by enum rb_admin_purge; RB_PURGE_COMPLETED: what relaybus 0.1.0 left) */
	static const char *const colls[] = { "deliveries", "events", "completed_deliveries", "deliveries" };
	static const char *const when[] = { "updatedAt", "createdAt", "completedAt", "completedAt" };
	mongoc_collection_t *c, *dc;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t *q, *opts;
	bson_error_t e;
	int64_t cut = mg_now() - older_than_ms;
	int n = 0, rc = 0;

	if (batch < 1 || older_than_ms < 0)
		return rb_seterr(err, RB_EXIT_USAGE, "purge: invalid batch or age");
	if (mg_ready(s, "purge", err) < 0)
		return -1;
	if (kind == RB_PURGE_HISTORY && !mg_history(s))
		return 0;
	c = mg_coll(s, colls[kind]);
	dc = mg_coll(s, "deliveries");
	q = BCON_NEW(when[kind], "{", "$lt", BCON_DATE_TIME(cut), "}");
	if (kind == RB_PURGE_DEAD || kind == RB_PURGE_COMPLETED)
		BSON_APPEND_UTF8(q, "status", kind == RB_PURGE_DEAD ? "dead" : "completed");
	opts = BCON_NEW("sort", "{", when[kind], BCON_INT32(1), "}", "limit", BCON_INT64(kind == RB_PURGE_EVENTS ?
	    (int64_t)batch * 4 : batch));
	cur = mongoc_collection_find_with_opts(c, q, opts, NULL);
	while (rc == 0 && n < batch && mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;
		bson_t del = BSON_INITIALIZER, reply;

		if (!bson_iter_init_find(&it, d, "_id"))
			continue;
		if (kind == RB_PURGE_EVENTS) {
			bson_t *dq = BCON_NEW("eventId", BCON_UTF8(mg_get_str(d, "_id") ? mg_get_str(d, "_id") : ""));
			int64_t k = mongoc_collection_count_documents(dc, dq, NULL, NULL, NULL, &e);

			bson_destroy(dq);
			if (k < 0) {
				rc = mg_err(s, &e, "purge", err);
				break;
			}
			if (k > 0)
				continue;
		}
		bson_append_iter(&del, "_id", -1, &it);
		if (kind == RB_PURGE_DEAD || kind == RB_PURGE_COMPLETED)
			BSON_APPEND_UTF8(&del, "status", kind == RB_PURGE_DEAD ? "dead" : "completed");
		if (kind == RB_PURGE_HISTORY) {
			/* with its handler's count of purged history, in one transaction */
			struct hpurge hp = { .s = s, .q = &del, .handler = mg_get_str(d, "handler") };

			if (mg_txn(s, hpurge_txn, &hp, "purge", err) < 0)
				rc = -1;
			n += (int)hp.n;
			bson_destroy(&del);
			continue;
		}
		if (!mongoc_collection_delete_one(c, &del, NULL, &reply, &e))
			rc = mg_err(s, &e, "purge", err);
		else
			n += (int)mg_get_int(&reply, "deletedCount", 0);
		bson_destroy(&reply);
		bson_destroy(&del);
	}
	if (rc == 0 && mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, "purge", err);
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	bson_destroy(opts);
	mongoc_collection_destroy(c);
	mongoc_collection_destroy(dc);
	return rc < 0 ? -1 : n;
}

/* ---- lanes and subscriptions ---------------------------------------------- */

int
mg_admin_lanes(struct rb_store *s, const char *handler, bool all, json_t **out, struct rb_error *err)
{
	mongoc_collection_t *c;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t q = BSON_INITIALIZER, *opts;
	bson_error_t e;
	json_t *rows;
	int64_t now = mg_now();

	if (mg_ready(s, "lanes", err) < 0)
		return -1;
	if (handler != NULL)
		BSON_APPEND_UTF8(&q, "handler", handler);
	opts = BCON_NEW("sort", "{", "handler", BCON_INT32(1), "laneId", BCON_INT32(1), "}");
	c = mg_coll(s, "lanes");
	cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
	rows = json_array();
	while (mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;
		json_t *ids = bson_iter_init_find(&it, d, "inFlight") ? mg_iter_json(&it) : json_array();
		int64_t until = mg_get_int(d, "leaseExpiresAt", -1);
		const char *owner = mg_get_str(d, "owner");
		json_t *o;

		if (!json_is_array(ids)) {
			json_decref(ids);
			ids = json_array();
		}
		if (!all && owner == NULL && json_array_size(ids) == 0) {
			json_decref(ids);
			continue;
		}
		/* (ids as text, as PostgreSQL's array_to_json(in_flight::text[])) */
		{
			json_t *t = json_array();
			size_t i;
			json_t *v;

			json_array_foreach(ids, i, v) {
				char b[32];

				snprintf(b, sizeof b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
				json_array_append_new(t, json_string(b));
			}
			json_decref(ids);
			ids = t;
		}
		o = json_object();
		json_object_set_new(o, "handler", jstr(d, "handler"));
		json_object_set_new(o, "lane", json_integer(mg_get_int(d, "laneId", 0)));
		json_object_set_new(o, "epoch", json_integer(mg_get_int(d, "epoch", 0)));
		json_object_set_new(o, "owner", owner != NULL ? json_string(owner) : json_null());
		json_object_set_new(o, "lease_expires_at", jtime(until));
		json_object_set_new(o, "expired", until < 0 ? json_null() : json_boolean(until <= now));
		json_object_set_new(o, "in_flight", json_integer((json_int_t)json_array_size(ids)));
		json_object_set_new(o, "in_flight_ids", ids);
		json_array_append_new(rows, o);
	}
	if (mongoc_cursor_error(cur, &e)) {
		mongoc_cursor_destroy(cur);
		bson_destroy(opts);
		bson_destroy(&q);
		mongoc_collection_destroy(c);
		json_decref(rows);
		return mg_err(s, &e, "lanes", err);
	}
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);
	bson_destroy(&q);
	mongoc_collection_destroy(c);
	*out = rows;
	return (int)json_array_size(rows);
}

int
mg_admin_subscriptions(struct rb_store *s, const char *handler, json_t **out, struct rb_error *err)
{
	mongoc_collection_t *c;
	mongoc_cursor_t *cur;
	const bson_t *d;
	bson_t q = BSON_INITIALIZER, *opts;
	bson_error_t e;
	json_t *rows;
	int rc = 0;

	if (mg_ready(s, "subscriptions", err) < 0)
		return -1;
	if (handler != NULL)
		BSON_APPEND_UTF8(&q, "handler", handler);
	opts = BCON_NEW("sort", "{", "handler", BCON_INT32(1), "pattern", BCON_INT32(1), "}");
	c = mg_coll(s, "subscriptions");
	cur = mongoc_collection_find_with_opts(c, &q, opts, NULL);
	rows = json_array();
	while (mongoc_cursor_next(cur, &d))
		json_array_append_new(rows, json_pack("{s:o, s:o, s:o}", "handler", jstr(d, "handler"),
		    "pattern", jstr(d, "pattern"), "created_at", jtime(mg_get_int(d, "createdAt", -1))));
	if (mongoc_cursor_error(cur, &e))
		rc = mg_err(s, &e, "subscriptions", err);
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);
	bson_destroy(&q);
	mongoc_collection_destroy(c);
	if (rc < 0) {
		json_decref(rows);
		return -1;
	}
	*out = rows;
	return (int)json_array_size(rows);
}
