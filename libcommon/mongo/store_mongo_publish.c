/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_publish.c: publish on MongoDB.  One transaction per batch:
 * each event inserted with its handlers (or, for an id that exists, only
 * the handlers it never had added to its list), a per-key sequence taken
 * from the key's counter document (two publishers of one key conflict, and
 * the retry numbers after the winner: sequences follow commit order), one
 * delivery document per new handler.  Delivery ids are reserved beforehand
 * from a counter outside the transaction (gaps are harmless).
 */
#include "config.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "rb_mongo.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

/* the domain of the error that ends a publish's transaction on a conflict */
#define MG_CONFLICT_DOMAIN	10040

/* ---- publish ------------------------------------------------------------------- */

struct pub_ev {
	const json_t	*e;
	char		 id[64];
	const char	*idp, *name, *key;
	int64_t		 at;
	json_t		*explicit;	/* sorted distinct handlers, or NULL */
	/* the outcome */
	json_t		*newh;
	bool		 dup;
};

struct pub_ctx {
	struct rb_store	*s;
	struct pub_ev	*ev;
	size_t		 n;
	json_t		*subs;		/* [[handler, pattern], ...] */
	int64_t		 next_id;
	const char	*conflict;	/* the id that exists with other data */
};

static bool
glob_match(const char *p, const char *s)
{
	for (; *p != '\0'; p++, s++) {
		if (*p == '*') {
			while (p[1] == '*')
				p++;
			for (const char *t = s;; t++) {
				if (glob_match(p + 1, t))
					return true;
				if (*t == '\0')
					return false;
			}
		}
		if (*s == '\0' || (*p != '?' && *p != *s))
			return false;
	}
	return *s == '\0';
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* a sorted, distinct JSON array of the strings v[0..n) */
static json_t *
sorted_set(const char **v, size_t n)
{
	json_t *r = json_array();

	qsort(v, n, sizeof *v, cmp_str);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || strcmp(v[i], v[i - 1]) != 0)
			json_array_append_new(r, json_string(v[i]));
	return r;
}

static json_t *
route(struct pub_ctx *c, struct pub_ev *ev)
{
	size_t n = json_array_size(c->subs), k = 0;
	const char **v;
	json_t *r;

	if (ev->explicit != NULL)
		return json_incref(ev->explicit);
	v = xcalloc(n + 1, sizeof *v);
	for (size_t i = 0; i < n; i++) {
		json_t *sp = json_array_get(c->subs, i);

		if (glob_match(json_string_value(json_array_get(sp, 1)), ev->name))
			v[k++] = json_string_value(json_array_get(sp, 0));
	}
	r = sorted_set(v, k);
	free(v);
	return r;
}

static json_t *
read_subs(struct rb_store *s, mongoc_client_session_t *cs, bson_error_t *e)
{
	mongoc_collection_t *c = mg_coll(s, "subscriptions");
	bson_t q = BSON_INITIALIZER, opts;
	mongoc_cursor_t *cur;
	const bson_t *d;
	json_t *r = json_array();

	mg_sopts(cs, &opts);
	cur = mongoc_collection_find_with_opts(c, &q, &opts, NULL);
	while (mongoc_cursor_next(cur, &d)) {
		const char *h = mg_get_str(d, "handler"), *p = mg_get_str(d, "pattern");

		if (h != NULL && p != NULL)
			json_array_append_new(r, json_pack("[ss]", h, p));
	}
	if (mongoc_cursor_error(cur, e)) {
		json_decref(r);
		r = NULL;
	}
	mongoc_cursor_destroy(cur);
	bson_destroy(&opts);
	bson_destroy(&q);
	mongoc_collection_destroy(c);
	return r;
}

/* the event of id in the transaction (*ev a copy, or NULL if none): 1, 0 none, -1 error */
static int
find_event(mongoc_collection_t *c, mongoc_client_session_t *cs, const char *id, bson_t **ev,
    bson_error_t *e)
{
	bson_t *q = BCON_NEW("_id", BCON_UTF8(id));
	bson_t *fopts = BCON_NEW("projection", "{", "name", BCON_INT32(1), "key", BCON_INT32(1),
	    "payload", BCON_INT32(1), "handlers", BCON_INT32(1), "}");
	mongoc_cursor_t *cur;
	const bson_t *d;
	int rc = 0;

	mongoc_client_session_append(cs, fopts, e);
	cur = mongoc_collection_find_with_opts(c, q, fopts, NULL);
	*ev = NULL;
	if (mongoc_cursor_next(cur, &d)) {
		*ev = bson_copy(d);
		rc = 1;
	}
	if (mongoc_cursor_error(cur, e)) {
		rc = -1;
		if (*ev != NULL)
			bson_destroy(*ev);
		*ev = NULL;
	}
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	bson_destroy(fopts);
	return rc;
}

/* a field of d as JSON (new; null when absent) */
static json_t *
get_json(const bson_t *d, const char *k)
{
	bson_iter_t it;
	json_t *v;

	if (!bson_iter_init_find(&it, d, k) || (v = mg_iter_json(&it)) == NULL)
		return json_null();
	return v;
}

/* JSON values equal as jsonb compares them: objects whatever their key
 * order, numbers by value (1 and 1.0 are equal), the rest exactly */
static bool
json_same(const json_t *a, const json_t *b)
{
	const char *k;
	json_t *v;

	if (json_is_number(a) && json_is_number(b))
		return json_is_integer(a) && json_is_integer(b) ?
		    json_integer_value(a) == json_integer_value(b) : json_number_value(a) == json_number_value(b);
	if (json_typeof(a) != json_typeof(b))
		return false;
	if (json_is_object(a)) {
		if (json_object_size(a) != json_object_size(b))
			return false;
		json_object_foreach((json_t *)a, k, v)
			if (json_object_get(b, k) == NULL || !json_same(v, json_object_get(b, k)))
				return false;
		return true;
	}
	if (json_is_array(a)) {
		if (json_array_size(a) != json_array_size(b))
			return false;
		for (size_t i = 0; i < json_array_size(a); i++)
			if (!json_same(json_array_get(a, i), json_array_get(b, i)))
				return false;
		return true;
	}
	return json_equal(a, b);
}

/* The rule of relaybus_publish (relaybus(7), MONGODB DOCUMENTS): an id
 * given again is a duplicate when its name, key and payload are the
 * stored ones (as jsonb compares them: json_same; headers are not
 * compared), else a conflict. */
static bool
same_event(const bson_t *d, const struct pub_ev *ev)
{
	const char *name = mg_get_str(d, "name"), *key = mg_get_str(d, "key");
	json_t *p = get_json(d, "payload"), *given = json_object_get(ev->e, "payload");
	bool same;

	same = name != NULL && strcmp(name, ev->name) == 0 &&
	    ((key == NULL && ev->key == NULL) || (key != NULL && ev->key != NULL && strcmp(key, ev->key) == 0)) &&
	    json_same(p, given != NULL ? given : json_null());
	json_decref(p);
	return same;
}

/* handler h is subscribed to event name */
static bool
subscribed(const struct pub_ctx *c, const char *h, const char *name)
{
	for (size_t i = 0; i < json_array_size(c->subs); i++) {
		json_t *sp = json_array_get(c->subs, i);

		if (strcmp(json_string_value(json_array_get(sp, 0)), h) == 0 &&
		    glob_match(json_string_value(json_array_get(sp, 1)), name))
			return true;
	}
	return false;
}

static bool
has_str(const json_t *a, const char *s)
{
	for (size_t i = 0; i < json_array_size(a); i++)
		if (strcmp(json_string_value(json_array_get(a, i)), s) == 0)
			return true;
	return false;
}

static bool
pub_one(struct pub_ctx *c, mongoc_client_session_t *cs, struct pub_ev *ev, mongoc_collection_t *evc,
    mongoc_collection_t *dc, mongoc_collection_t *kc, bson_error_t *e)
{
	json_t *hs = route(c, ev), *existing = NULL;
	bson_t *stored;
	int64_t seq = 0, now = mg_now();
	bson_t opts;
	int f;
	bool ok = true;

	mg_sopts(cs, &opts);
	f = find_event(evc, cs, ev->idp, &stored, e);
	if (f < 0)
		ok = false;
	else if (f == 0) {
		bson_t d = BSON_INITIALIZER;

		BSON_APPEND_UTF8(&d, "_id", ev->idp);
		BSON_APPEND_UTF8(&d, "name", ev->name);
		if (ev->key != NULL)
			BSON_APPEND_UTF8(&d, "key", ev->key);
		else
			BSON_APPEND_NULL(&d, "key");
		mg_append_json(&d, "payload", json_object_get(ev->e, "payload"));
		if (json_is_object(json_object_get(ev->e, "headers")))
			mg_append_json(&d, "headers", json_object_get(ev->e, "headers"));
		else {
			bson_t empty = BSON_INITIALIZER;

			BSON_APPEND_DOCUMENT(&d, "headers", &empty);
		}
		mg_append_json(&d, "handlers", hs);
		BSON_APPEND_DATE_TIME(&d, "createdAt", now);
		ok = mongoc_collection_insert_one(evc, &d, &opts, NULL, e);
		bson_destroy(&d);
		ev->newh = json_incref(hs);
		ev->dup = false;
	} else if (!same_event(stored, ev)) {
		/* refused, the whole transaction (mg_publish reports it, exit 81) */
		c->conflict = ev->idp;
		bson_set_error(e, MG_CONFLICT_DOMAIN, 1, "event id \"%s\" exists with another name, key or payload",
		    ev->idp);
		ok = false;
	} else {
		existing = get_json(stored, "handlers");
		if (!json_is_array(existing)) {
			json_decref(existing);
			existing = json_array();
		}
		ev->dup = true;
		ev->newh = json_array();
		/* only the handlers subscribed to its name that it never had: a
		 * publisher cannot route an existing event elsewhere */
		for (size_t i = 0; i < json_array_size(hs); i++) {
			const char *h = json_string_value(json_array_get(hs, i));

			if (!has_str(existing, h) && subscribed(c, h, ev->name))
				json_array_append(ev->newh, json_array_get(hs, i));
		}
		if (json_array_size(ev->newh) > 0) {
			bson_t *q = BCON_NEW("_id", BCON_UTF8(ev->idp));
			bson_t u = BSON_INITIALIZER, push, each;

			BSON_APPEND_DOCUMENT_BEGIN(&u, "$push", &push);
			BSON_APPEND_DOCUMENT_BEGIN(&push, "handlers", &each);
			mg_append_json(&each, "$each", ev->newh);
			bson_append_document_end(&push, &each);
			bson_append_document_end(&u, &push);
			ok = mongoc_collection_update_one(evc, q, &u, &opts, NULL, e);
			bson_destroy(q);
			bson_destroy(&u);
		}
		json_decref(existing);
	}
	if (stored != NULL)
		bson_destroy(stored);
	if (ok && json_array_size(ev->newh) > 0 && ev->key != NULL) {
		bson_t *q = BCON_NEW("_id", BCON_UTF8(ev->key));
		bson_t *u = BCON_NEW("$inc", "{", "seq", BCON_INT64(1), "}");
		mongoc_find_and_modify_opts_t *fm = mongoc_find_and_modify_opts_new();
		bson_t reply, extra;

		mongoc_find_and_modify_opts_set_update(fm, u);
		mongoc_find_and_modify_opts_set_flags(fm, MONGOC_FIND_AND_MODIFY_UPSERT |
		    MONGOC_FIND_AND_MODIFY_RETURN_NEW);
		mg_sopts(cs, &extra);
		mongoc_find_and_modify_opts_append(fm, &extra);
		ok = mongoc_collection_find_and_modify_with_opts(kc, q, fm, &reply, e);
		if (ok) {
			bson_iter_t it, v;

			if (bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
			    bson_iter_recurse(&it, &v) && bson_iter_find(&v, "seq"))
				seq = bson_iter_as_int64(&v);
		}
		bson_destroy(&reply);
		bson_destroy(&extra);
		mongoc_find_and_modify_opts_destroy(fm);
		bson_destroy(q);
		bson_destroy(u);
	}
	for (size_t i = 0; ok && i < json_array_size(ev->newh); i++) {
		const char *h = json_string_value(json_array_get(ev->newh, i));
		bson_t d = BSON_INITIALIZER;

		BSON_APPEND_INT64(&d, "_id", c->next_id++);
		BSON_APPEND_UTF8(&d, "eventId", ev->idp);
		BSON_APPEND_UTF8(&d, "handler", h);
		BSON_APPEND_INT32(&d, "laneId", rb_lane_of(ev->key, ev->idp));
		if (ev->key != NULL) {
			BSON_APPEND_UTF8(&d, "key", ev->key);
			BSON_APPEND_INT64(&d, "seq", seq);
		} else {
			BSON_APPEND_NULL(&d, "key");
			BSON_APPEND_NULL(&d, "seq");
		}
		BSON_APPEND_UTF8(&d, "status", "pending");
		BSON_APPEND_DATE_TIME(&d, "availableAt", ev->at);
		BSON_APPEND_INT32(&d, "attempts", 0);
		BSON_APPEND_INT64(&d, "claims", 0);
		BSON_APPEND_NULL(&d, "lastError");
		BSON_APPEND_DATE_TIME(&d, "createdAt", now);
		BSON_APPEND_DATE_TIME(&d, "updatedAt", now);
		BSON_APPEND_UTF8(&d, "lane", "ready");
		ok = mongoc_collection_insert_one(dc, &d, &opts, NULL, e);
		bson_destroy(&d);
	}
	bson_destroy(&opts);
	json_decref(hs);
	return ok;
}

static bool
pub_txn(mongoc_client_session_t *cs, void *ctx, bson_error_t *e)
{
	struct pub_ctx *c = ctx;
	mongoc_collection_t *evc = mg_coll(c->s, "events"), *dc = mg_coll(c->s, "deliveries"),
	    *kc = mg_coll(c->s, "keys");
	int64_t first = c->next_id;
	bool ok = true;

	c->conflict = NULL;
	json_decref(c->subs);
	if ((c->subs = read_subs(c->s, cs, e)) == NULL)
		ok = false;
	for (size_t i = 0; ok && i < c->n; i++) {
		json_decref(c->ev[i].newh);
		c->ev[i].newh = NULL;
		ok = pub_one(c, cs, &c->ev[i], evc, dc, kc, e);
	}
	c->next_id = first;	/* (a retry uses the same ids) */
	mongoc_collection_destroy(evc);
	mongoc_collection_destroy(dc);
	mongoc_collection_destroy(kc);
	return ok;
}

/* RFC 3339 (checked by rb_event_validate) to ms */
static int64_t
parse_time(const char *t)
{
	struct tm tm = { 0 };
	int ms = 0, n = 0;
	const char *p;
	int64_t r;

	if (sscanf(t, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
	    &tm.tm_min, &tm.tm_sec, &n) < 6)
		return mg_now();
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	p = t + n;
	if (*p == '.') {
		int digits = 0;

		for (p++; *p >= '0' && *p <= '9'; p++)
			if (digits++ < 3)
				ms = ms * 10 + (*p - '0');
		for (; digits < 3; digits++)
			ms *= 10;
	}
	r = (int64_t)timegm(&tm) * 1000 + ms;
	if (*p == '+' || *p == '-') {
		int hh = (p[1] - '0') * 10 + (p[2] - '0'), mm = (p[4] - '0') * 10 + (p[5] - '0');
		int64_t off = ((int64_t)hh * 60 + mm) * 60000;

		r += *p == '+' ? -off : off;
	}
	return r;
}

static void
uuid4(char out[37])
{
	unsigned char r[16] = { 0 };
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r)
		for (size_t i = 0; i < sizeof r; i++)
			r[i] = (unsigned char)rand();
	if (fd >= 0)
		close(fd);
	r[6] = (r[6] & 0x0f) | 0x40;
	r[8] = (r[8] & 0x3f) | 0x80;
	snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	    r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14],
	    r[15]);
}

struct mg_acks {
	json_t	*keep;		/* the strings' owners */
	char	**texts;
	size_t	 n;
};

static void
free_acks(void *p)
{
	struct mg_acks *a = p;

	for (size_t i = 0; i < a->n; i++)
		free(a->texts[i]);
	free(a->texts);
	json_decref(a->keep);
	free(a);
}

/* reserve n delivery ids outside the transaction (gaps are harmless) */
static int
reserve_ids(struct rb_store *s, int64_t n, int64_t *first, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "counters");
	bson_t *q = BCON_NEW("_id", BCON_UTF8("deliveries"));
	bson_t *u = BCON_NEW("$inc", "{", "n", BCON_INT64(n), "}");
	mongoc_find_and_modify_opts_t *fm = mongoc_find_and_modify_opts_new();
	bson_t reply;
	bson_error_t e;
	bool ok;

	mongoc_find_and_modify_opts_set_update(fm, u);
	mongoc_find_and_modify_opts_set_flags(fm, MONGOC_FIND_AND_MODIFY_UPSERT | MONGOC_FIND_AND_MODIFY_RETURN_NEW);
	ok = mongoc_collection_find_and_modify_with_opts(c, q, fm, &reply, &e);
	if (ok) {
		bson_iter_t it, v;

		*first = 1;
		if (bson_iter_init_find(&it, &reply, "value") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
		    bson_iter_recurse(&it, &v) && bson_iter_find(&v, "n"))
			*first = bson_iter_as_int64(&v) - n + 1;
	}
	bson_destroy(&reply);
	mongoc_find_and_modify_opts_destroy(fm);
	bson_destroy(q);
	bson_destroy(u);
	mongoc_collection_destroy(c);
	return ok ? 0 : mg_err(s, &e, "publish", err);
}

/* publish in a transaction of its own (cs NULL), or in the caller's (cs) */
static int
publish_in(struct rb_store *s, mongoc_client_session_t *cs, const char *events_json, size_t n,
    struct rb_publish_acks *acks, struct rb_error *err)
{
	json_error_t je;
	json_t *events = json_loads(events_json, 0, &je);
	struct pub_ctx c = { .s = s };
	struct mg_acks *ma;
	int64_t maxd = 0;
	int rc = -1;

	if (mg_ready(s, "publish", err) < 0) {
		json_decref(events);
		return -1;
	}
	if (!json_is_array(events) || json_array_size(events) != n) {
		json_decref(events);
		return rb_seterr(err, RB_EXIT_SOFTWARE, "publish: bad event array");
	}
	c.n = n;
	c.ev = xcalloc(n > 0 ? n : 1, sizeof *c.ev);
	for (size_t i = 0; i < n; i++) {
		struct pub_ev *ev = &c.ev[i];
		const json_t *e = json_array_get(events, i), *v;

		ev->e = e;
		ev->name = json_string_value(json_object_get(e, "name"));
		ev->key = json_string_value(json_object_get(e, "key"));
		if ((ev->idp = json_string_value(json_object_get(e, "id"))) == NULL) {
			uuid4(ev->id);
			ev->idp = ev->id;
		}
		if (json_is_string(v = json_object_get(e, "available_at")))
			ev->at = parse_time(json_string_value(v));
		else
			ev->at = mg_now() + (json_is_integer(v = json_object_get(e, "delay_ms")) ?
			    json_integer_value(v) : 0);
		if (json_is_array(v = json_object_get(e, "handlers"))) {
			size_t m = json_array_size(v);
			const char **hv = xcalloc(m + 1, sizeof *hv);

			for (size_t k = 0; k < m; k++)
				hv[k] = json_string_value(json_array_get(v, k));
			ev->explicit = sorted_set(hv, m);
			free(hv);
			maxd += (int64_t)m;
		}
	}
	/* an upper bound of the deliveries: explicit handlers, else every subscription */
	{
		bson_error_t e;
		json_t *subs = read_subs(s, NULL, &e);

		if (subs == NULL) {
			mg_err(s, &e, "publish", err);
			goto out;
		}
		maxd += (int64_t)(json_array_size(subs) * n);
		json_decref(subs);
	}
	if (maxd > 0 && reserve_ids(s, maxd, &c.next_id, err) < 0)
		goto out;
	if (cs != NULL) {
		/* no retry: the caller's transaction, which the caller retries */
		bson_error_t e;

		if (!pub_txn(cs, &c, &e)) {
			if (c.conflict == NULL)
				mg_err(s, &e, "publish", err);
			else
				rb_seterr(err, RB_EXIT_CONFLICT, "publish: event id \"%s\" exists with another name, key or "
				    "payload (conflict): not published", c.conflict);
			goto out;
		}
	} else if (mg_txn(s, pub_txn, &c, "publish", err) < 0) {
		if (c.conflict != NULL)
			rb_seterr(err, RB_EXIT_CONFLICT, "publish: event id \"%s\" exists with another name, key or "
			    "payload (conflict): not published", c.conflict);
		goto out;
	}
	ma = xcalloc(1, sizeof *ma);
	ma->keep = events;
	events = NULL;
	ma->n = n;
	ma->texts = xcalloc(n > 0 ? n : 1, sizeof *ma->texts);
	acks->v = xcalloc(n > 0 ? n : 1, sizeof *acks->v);
	acks->n = n;
	for (size_t i = 0; i < n; i++) {
		struct pub_ev *ev = &c.ev[i];

		char *h = json_dumps(ev->newh, JSON_COMPACT);
		size_t il = strlen(ev->idp);

		/* "id\0handlers" */
		ma->texts[i] = xmalloc(il + strlen(h) + 2);
		memcpy(ma->texts[i], ev->idp, il + 1);
		strcpy(ma->texts[i] + il + 1, h);
		free(h);
		acks->v[i].id = ma->texts[i];
		acks->v[i].handlers = ma->texts[i] + strlen(ma->texts[i]) + 1;
		acks->v[i].deliveries = (int)json_array_size(ev->newh);
		acks->v[i].duplicate = ev->dup;
	}
	acks->priv = ma;
	acks->free_priv = free_acks;
	rc = 0;
out:
	for (size_t i = 0; i < n; i++) {
		json_decref(c.ev[i].explicit);
		json_decref(c.ev[i].newh);
	}
	free(c.ev);
	json_decref(c.subs);
	json_decref(events);
	return rc;
}

int
mg_publish(struct rb_store *s, const char *events_json, size_t n, struct rb_publish_acks *acks,
    struct rb_error *err)
{
	return publish_in(s, NULL, events_json, n, acks, err);
}

/* rb_mongo.h: the store of the application's database, for this call only */
int
rb_mongo_publish(mongoc_client_session_t *cs, mongoc_database_t *db, const char *schema, const json_t *event,
    json_t **ack, struct rb_error *err)
{
	struct mg_be be = { .db = db };
	struct rb_store st = { .be = &be, .url_redacted = (char *)"(the application's client)" };
	struct rb_publish_acks acks = { 0 };
	json_t *arr;
	char *text;
	int rc;

	*ack = NULL;
	if (mg_api_check("rb_mongo_publish", cs, db, &schema, err) < 0)
		return -1;
	if (rb_event_validate(event, err) < 0)
		return -1;
	st.schema = (char *)schema;
	arr = json_pack("[o]", json_deep_copy(event));
	rb_event_id_alias(json_array_get(arr, 0));
	text = json_dumps(arr, JSON_COMPACT);
	rc = publish_in(&st, cs, text, 1, &acks, err);
	if (rc == 0) {
		json_t *a = rb_publish_acks_json(&acks);

		*ack = json_incref(json_array_get(a, 0));
		json_decref(a);
		rb_publish_acks_clear(&acks);
	}
	free(text);
	json_decref(arr);
	return rc;
}
