/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_core.c: the MongoDB backend's core, what every file of it
 * uses (store_mongo_int.h): collections, errors, transactions, JSON <->
 * BSON, times, and the schema's state (set up, with completion history,
 * a handler's lanes seeded).  It calls no other file of the backend.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"

int64_t
mg_now(void)
{
	return rb_wall_ms();
}

void
mg_fmt_time(int64_t ms, char buf[32])
{
	rb_fmt_iso_ms(ms, buf);
}

mongoc_collection_t *
mg_coll(struct rb_store *s, const char *name)
{
	char full[128];

	snprintf(full, sizeof full, "%s.%s", s->schema, name);
	return mongoc_database_get_collection(mg_be(s)->db, full);
}

static bool
transient_code(uint32_t code)
{
	/* WriteConflict, LockTimeout, NoSuchTransaction, MaxTimeMSExpired (a
	 * write waiting for a transaction), TransactionTooOld */
	return code == 112 || code == 24 || code == 251 || code == 50 || code == 225;
}

int
mg_err(struct rb_store *s, const bson_error_t *e, const char *what, struct rb_error *err)
{
	if (e->domain == MONGOC_ERROR_SERVER_SELECTION || e->domain == MONGOC_ERROR_STREAM) {
		mg_be(s)->broken = e->domain == MONGOC_ERROR_STREAM;
		return rb_seterr(err, RB_EXIT_UNAVAILABLE, "%s: cannot reach MongoDB at %s: %s", what,
		    s->url_redacted, e->message);
	}
	if (e->domain == MONGOC_ERROR_CLIENT && e->code == MONGOC_ERROR_CLIENT_AUTHENTICATE)
		return rb_seterr(err, RB_EXIT_NOPERM, "%s: %s", what, e->message);
	if (e->code == 13 || e->code == 18)
		return rb_seterr(err, RB_EXIT_NOPERM, "%s: %s", what, e->message);
	if (transient_code(e->code))
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "%s: %s", what, e->message);
	return rb_seterr(err, RB_EXIT_SOFTWARE, "%s: %s", what, e->message);
}

void
mg_sopts(mongoc_client_session_t *cs, bson_t *opts)
{
	bson_error_t e;

	bson_init(opts);
	if (cs != NULL)
		mongoc_client_session_append(cs, opts, &e);
}

int
mg_txn(struct rb_store *s, mg_txn_fn fn, void *ctx, const char *what, struct rb_error *err)
{
	mongoc_client_session_t *cs;
	bson_error_t e;
	int64_t until = rb_mono_ms() + 55000;

	if ((cs = mongoc_client_start_session(mg_be(s)->client, NULL, &e)) == NULL)
		return mg_err(s, &e, what, err);
	for (int tries = 0;; tries++) {
		bson_t reply;
		bool ok;

		if (!mongoc_client_session_start_transaction(cs, NULL, &e)) {
			mongoc_client_session_destroy(cs);
			return mg_err(s, &e, what, err);
		}
		ok = fn(cs, ctx, &e);
		if (ok) {
			ok = mongoc_client_session_commit_transaction(cs, &reply, &e);
			bson_destroy(&reply);
			if (ok)
				break;
		} else
			mongoc_client_session_abort_transaction(cs, NULL);
		if (!transient_code(e.code) || rb_mono_ms() > until) {
			mongoc_client_session_destroy(cs);
			return mg_err(s, &e, what, err);
		}
		usleep((useconds_t)(1000 * (1 + rand() % (tries < 8 ? 1 << tries : 256))));
	}
	mongoc_client_session_destroy(cs);
	return 0;
}

/* ---- JSON <-> BSON ---------------------------------------------------------- */

static void
append_json_doc(bson_t *d, const json_t *o)
{
	const char *k;
	json_t *v;

	json_object_foreach((json_t *)o, k, v)
		mg_append_json(d, k, v);
}

void
mg_append_json(bson_t *b, const char *key, const json_t *v)
{
	bson_t child;

	switch (json_typeof(v)) {
	case JSON_OBJECT:
		bson_append_document_begin(b, key, -1, &child);
		append_json_doc(&child, v);
		bson_append_document_end(b, &child);
		break;
	case JSON_ARRAY:
		bson_append_array_begin(b, key, -1, &child);
		for (size_t i = 0; i < json_array_size(v); i++) {
			char ks[16];
			const char *kp;

			bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
			mg_append_json(&child, kp, json_array_get(v, i));
		}
		bson_append_array_end(b, &child);
		break;
	case JSON_STRING:
		bson_append_utf8(b, key, -1, json_string_value(v), (int)json_string_length(v));
		break;
	case JSON_INTEGER:
		bson_append_int64(b, key, -1, json_integer_value(v));
		break;
	case JSON_REAL:
		bson_append_double(b, key, -1, json_real_value(v));
		break;
	case JSON_TRUE:
		bson_append_bool(b, key, -1, true);
		break;
	case JSON_FALSE:
		bson_append_bool(b, key, -1, false);
		break;
	default:
		bson_append_null(b, key, -1);
	}
}

json_t *
mg_iter_json(const bson_iter_t *it)
{
	bson_iter_t c;
	json_t *r;
	uint32_t len;
	const char *s;
	char ts[32];

	switch (bson_iter_type(it)) {
	case BSON_TYPE_DOCUMENT:
		r = json_object();
		if (bson_iter_recurse(it, &c))
			while (bson_iter_next(&c))
				json_object_set_new(r, bson_iter_key(&c), mg_iter_json(&c));
		return r;
	case BSON_TYPE_ARRAY:
		r = json_array();
		if (bson_iter_recurse(it, &c))
			while (bson_iter_next(&c))
				json_array_append_new(r, mg_iter_json(&c));
		return r;
	case BSON_TYPE_UTF8:
		s = bson_iter_utf8(it, &len);
		return json_stringn(s, len);
	case BSON_TYPE_INT32:
		return json_integer(bson_iter_int32(it));
	case BSON_TYPE_INT64:
		return json_integer(bson_iter_int64(it));
	case BSON_TYPE_DOUBLE:
		return json_real(bson_iter_double(it));
	case BSON_TYPE_BOOL:
		return json_boolean(bson_iter_bool(it));
	case BSON_TYPE_DATE_TIME:
		mg_fmt_time(bson_iter_date_time(it), ts);
		return json_string(ts);
	default:
		return json_null();
	}
}

char *
mg_iter_json_text(const bson_iter_t *it)
{
	json_t *j = mg_iter_json(it);
	char *t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);

	json_decref(j);
	if (t == NULL)
		t = xstrdup("null");
	return t;
}

int64_t
mg_get_int(const bson_t *d, const char *key, int64_t dflt)
{
	bson_iter_t it;

	if (!bson_iter_init_find(&it, d, key))
		return dflt;
	if (BSON_ITER_HOLDS_INT32(&it) || BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_DOUBLE(&it))
		return bson_iter_as_int64(&it);
	if (BSON_ITER_HOLDS_DATE_TIME(&it))
		return bson_iter_date_time(&it);
	return dflt;
}

const char *
mg_get_str(const bson_t *d, const char *key)
{
	bson_iter_t it;

	if (!bson_iter_init_find(&it, d, key) || !BSON_ITER_HOLDS_UTF8(&it))
		return NULL;
	return bson_iter_utf8(&it, NULL);
}

/* ---- the schema's state ------------------------------------------------------ */

int
mg_seed_lanes(struct rb_store *s, const char *handler, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "lanes");
	bson_t *q = BCON_NEW("handler", BCON_UTF8(handler));
	bson_error_t e;
	int64_t n = mongoc_collection_count_documents(c, q, NULL, NULL, NULL, &e);
	int rc = 0;

	bson_destroy(q);
	if (n < 0)
		rc = mg_err(s, &e, "claim", err);
	else if (n < RB_LANES) {
		bson_t *opts = BCON_NEW("ordered", BCON_BOOL(false));
		mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(c, opts);
		bson_t reply;

		for (int l = 0; l < RB_LANES; l++) {
			char id[MG_LANE_ID_LEN];

			mg_lane_id(id, handler, l);
			bson_t *d = BCON_NEW("_id", BCON_UTF8(id), "handler", BCON_UTF8(handler),
			    "laneId", BCON_INT32(l), "epoch", BCON_INT64(0), "owner", BCON_NULL,
			    "holder", BCON_NULL, "leaseExpiresAt", BCON_NULL, "inFlight", "[", "]",
			    "lost", "[", "]");
			mongoc_bulk_operation_insert(b, d);
			bson_destroy(d);
		}
		/* (duplicates: another process seeded them first) */
		if (!mongoc_bulk_operation_execute(b, &reply, &e) && e.code != 11000)
			rc = mg_err(s, &e, "seed lanes", err);
		bson_destroy(&reply);
		mongoc_bulk_operation_destroy(b);
		bson_destroy(opts);
	}
	mongoc_collection_destroy(c);
	return rc;
}

int
mg_ready(struct rb_store *s, const char *what, struct rb_error *err)
{
	mongoc_collection_t *c;
	bson_t *q;
	bson_error_t e;
	int64_t n;

	if (mg_be(s)->ready)
		return 0;
	c = mg_coll(s, "schema_version");
	q = BCON_NEW("_id", BCON_INT32(MG_VERSION));
	n = mongoc_collection_count_documents(c, q, NULL, NULL, NULL, &e);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	if (n < 0)
		return mg_err(s, &e, what, err);
	if (n == 0)
		return rb_seterr(err, RB_EXIT_CONFIG, "%s: schema \"%s\" is not set up (no %s.schema_version in %s): run rb-setup",
		    what, s->schema, s->schema, mongoc_database_get_name(mg_be(s)->db));
	mg_be(s)->ready = true;
	return 0;
}

bool
mg_history(struct rb_store *s)
{
	mongoc_collection_t *c = mg_coll(s, "schema_version");
	bson_t *q = BCON_NEW("_id", BCON_INT32(MG_VERSION));
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
	const bson_t *d;
	bool h = false;

	if (mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;

		h = bson_iter_init_find(&it, d, "completionHistory") && bson_iter_as_bool(&it);
	}
	mongoc_cursor_destroy(cur);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	return h;
}
