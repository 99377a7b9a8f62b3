/* SPDX-License-Identifier: MIT */
/*
 * store_mongo.c: the MongoDB backend (libmongoc), its top: the ops table
 * (rb_store_mongo_ops), connection, set-up (with the 0.1.0 upgrade of
 * store_mongo_upgrade.c), wake-up (polling).  The work is in the steps by
 * job (store_mongo_steps.h lists them) over the core (store_mongo_core.c,
 * store_mongo_int.h), none of which calls this file; the data model is in
 * store_mongo_int.h and relaybus(7).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

static const char *const mg_schemes[] = { "mongodb", "mongodb+srv", NULL };

static void
mg_version(char *buf, size_t len)
{
	snprintf(buf, len, "libmongoc %s", mongoc_get_version());
}

/* ---- the store ---------------------------------------------------------------- */

static void
make_holder(char out[40])
{
	unsigned char r[12] = { 0 };
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

	if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
		int64_t t = rb_wall_ms() ^ ((int64_t)getpid() << 20);

		memcpy(r, &t, sizeof t);
	}
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; i < sizeof r; i++)
		snprintf(out + 2 * i, 3, "%02x", r[i]);
}

static int
mg_connect(struct rb_store *s, struct rb_error *err)
{
	struct mg_be *be = mg_be(s);
	bson_t cmd = BSON_INITIALIZER, reply;
	bson_error_t e;
	const char *dbname;
	bool ok;

	be->client = mongoc_client_new_from_uri(be->uri);
	if (be->client == NULL)
		return rb_seterr(err, RB_EXIT_CONFIG, "invalid MongoDB URL %s", s->url_redacted);
	mongoc_client_set_error_api(be->client, MONGOC_ERROR_API_VERSION_2);
	mongoc_client_set_appname(be->client, s->app);
	dbname = mongoc_uri_get_database(be->uri);
	be->db = mongoc_client_get_database(be->client, dbname != NULL && *dbname ? dbname : "relaybus");
	BSON_APPEND_INT32(&cmd, "hello", 1);
	ok = mongoc_client_command_simple(be->client, "admin", &cmd, NULL, &reply, &e);
	bson_destroy(&cmd);
	if (!ok) {
		bson_destroy(&reply);
		return mg_err(s, &e, "connect", err);
	}
	if (mg_get_str(&reply, "setName") == NULL &&
	    !(mg_get_str(&reply, "msg") != NULL && strcmp(mg_get_str(&reply, "msg"), "isdbgrid") == 0)) {
		bson_destroy(&reply);
		return rb_seterr(err, RB_EXIT_UNAVAILABLE,
		    "MongoDB at %s is not a replica set or sharded cluster: relaybus needs transactions",
		    s->url_redacted);
	}
	bson_destroy(&reply);
	be->broken = false;
	return 0;
}

static int
mg_open(struct rb_store *s, struct rb_error *err)
{
	static bool inited;
	struct mg_be *be;
	bson_error_t e;

	if (!inited) {
		mongoc_init();
		inited = true;
	}
	be = xcalloc(1, sizeof *be);
	s->be = be;
	make_holder(be->holder);
	if ((be->uri = mongoc_uri_new_with_error(s->url, &e)) == NULL)
		return rb_seterr(err, RB_EXIT_CONFIG, "invalid MongoDB URL %s: %s", s->url_redacted, e.message);
	if (!mongoc_uri_has_option(be->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS))
		mongoc_uri_set_option_as_int32(be->uri, MONGOC_URI_SERVERSELECTIONTIMEOUTMS, 5000);
	if (!mongoc_uri_has_option(be->uri, MONGOC_URI_CONNECTTIMEOUTMS))
		mongoc_uri_set_option_as_int32(be->uri, MONGOC_URI_CONNECTTIMEOUTMS, 5000);
	return mg_connect(s, err);
}

static void
drop_client(struct mg_be *be)
{
	if (be->db != NULL)
		mongoc_database_destroy(be->db);
	if (be->client != NULL)
		mongoc_client_destroy(be->client);
	be->db = NULL;
	be->client = NULL;
}

static void
mg_close(struct rb_store *s)
{
	struct mg_be *be = mg_be(s);

	if (be == NULL)
		return;
	drop_client(be);
	free(be->seeded);
	if (be->uri != NULL)
		mongoc_uri_destroy(be->uri);
	free(be);
	s->be = NULL;
}

static int
mg_reconnect(struct rb_store *s, struct rb_error *err)
{
	drop_client(mg_be(s));
	return mg_connect(s, err);
}

static bool
mg_broken(const struct rb_store *s)
{
	return mg_be(s)->broken;
}

/* ---- set-up ------------------------------------------------------------------ */

static const char *const collections[] = {
	"events", "deliveries", "lanes", "keys", "counters", "subscriptions", "schema_version",
};

static int
create_coll(struct rb_store *s, const char *name, struct rb_error *err)
{
	char full[128];
	bson_error_t e;
	mongoc_collection_t *c;

	snprintf(full, sizeof full, "%s.%s", s->schema, name);
	c = mongoc_database_create_collection(mg_be(s)->db, full, NULL, &e);
	if (c != NULL) {
		mongoc_collection_destroy(c);
		return 0;
	}
	if (e.code == 48)	/* NamespaceExists: a second rb-setup */
		return 0;
	return mg_err(s, &e, "setup", err);
}

static int
create_index(struct rb_store *s, const char *coll, const char *name, const bson_t *keys, bool unique,
    struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, coll);
	bson_t cmd = BSON_INITIALIZER, arr, ix, reply;
	bson_error_t e;
	bool ok;

	BSON_APPEND_UTF8(&cmd, "createIndexes", mongoc_collection_get_name(c));
	BSON_APPEND_ARRAY_BEGIN(&cmd, "indexes", &arr);
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &ix);
	BSON_APPEND_DOCUMENT(&ix, "key", keys);
	BSON_APPEND_UTF8(&ix, "name", name);
	if (unique)
		BSON_APPEND_BOOL(&ix, "unique", true);
	bson_append_document_end(&arr, &ix);
	bson_append_array_end(&cmd, &arr);
	ok = mongoc_database_write_command_with_opts(mg_be(s)->db, &cmd, NULL, &reply, &e);
	bson_destroy(&cmd);
	bson_destroy(&reply);
	mongoc_collection_destroy(c);
	if (!ok && e.code != 85 && e.code != 86)	/* IndexOptionsConflict / KeySpecsConflict */
		return mg_err(s, &e, "setup", err);
	return 0;
}

#define IDX(s, coll, name, unique, err, ...)						\
	do {										\
		bson_t *k_ = BCON_NEW(__VA_ARGS__);					\
		int rc_ = create_index(s, coll, name, k_, unique, err);			\
		bson_destroy(k_);							\
		if (rc_ < 0)								\
			return -1;							\
	} while (0)

/* drop an index that is no more (of a database set up before parking) */
static int
drop_index(struct rb_store *s, const char *coll, const char *name, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, coll);
	bson_error_t e;
	bool ok = mongoc_collection_drop_index_with_opts(c, name, NULL, &e);

	mongoc_collection_destroy(c);
	/* 27 IndexNotFound, 26 NamespaceNotFound: gone already */
	if (!ok && e.code != 27 && e.code != 26)
		return mg_err(s, &e, "setup", err);
	return 0;
}

/* The schema_info slot: the highest version set-up wrote (rb_cli_open's
 * check at start, rb-setup --check).  One query. */
static int
mg_schema_info(struct rb_store *s, struct rb_schema_info *info, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, "schema_version");
	bson_t *q = bson_new();
	bson_t *opts = BCON_NEW("sort", "{", "_id", BCON_INT32(-1), "}", "limit", BCON_INT64(1));
	mongoc_cursor_t *cur = mongoc_collection_find_with_opts(c, q, opts, NULL);
	const bson_t *d;
	bson_error_t e;
	int v = 0;

	if (mongoc_cursor_next(cur, &d)) {
		bson_iter_t it;

		if (bson_iter_init_find(&it, d, "_id") && BSON_ITER_HOLDS_NUMBER(&it))
			v = (int)bson_iter_as_int64(&it);
	}
	bool failed = mongoc_cursor_error(cur, &e);
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);
	bson_destroy(q);
	mongoc_collection_destroy(c);
	if (failed)
		return mg_err(s, &e, "schema", err);
	info->installed = v;
	info->expected = MG_VERSION;
	info->state = v == 0 ? RB_SCHEMA_ABSENT : v < MG_VERSION ? RB_SCHEMA_OLDER :
	    v > MG_VERSION ? RB_SCHEMA_NEWER : RB_SCHEMA_CURRENT;
	if (v == 0) {
		/* a delivery without laneId: relaybus 0.1.0 (mg_upgrade_010) */
		c = mg_coll(s, "deliveries");
		q = BCON_NEW("laneId", "{", "$exists", BCON_BOOL(false), "}");
		opts = BCON_NEW("projection", "{", "_id", BCON_INT32(1), "}", "limit", BCON_INT64(1));
		cur = mongoc_collection_find_with_opts(c, q, opts, NULL);
		if (mongoc_cursor_next(cur, &d))
			info->state = RB_SCHEMA_010;
		failed = mongoc_cursor_error(cur, &e);
		mongoc_cursor_destroy(cur);
		bson_destroy(opts);
		bson_destroy(q);
		mongoc_collection_destroy(c);
		if (failed)
			return mg_err(s, &e, "schema", err);
	}
	return 0;
}

static int
upsert(struct rb_store *s, const char *coll, bson_t *q, bson_t *u, struct rb_error *err)
{
	mongoc_collection_t *c = mg_coll(s, coll);
	bson_t *opts = BCON_NEW("upsert", BCON_BOOL(true));
	bson_error_t e;
	bool ok = mongoc_collection_update_one(c, q, u, opts, NULL, &e);

	/* (two concurrent upserts: the loser's unique key error; the row is there) */
	if (!ok && e.code == 11000)
		ok = mongoc_collection_update_one(c, q, u, opts, NULL, &e);
	bson_destroy(opts);
	bson_destroy(q);
	bson_destroy(u);
	mongoc_collection_destroy(c);
	return ok ? 0 : mg_err(s, &e, "setup", err);
}

static int
mg_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_schema_info info;

	/* (an application writes the documents itself, relaybus(7) MONGODB
	 * DOCUMENTS: no server-side check could bound its delays) */
	if (o->max_delay_ms > 0)
		return rb_seterr(err, RB_EXIT_UNAVAILABLE, "--max-delay: not supported by the mongodb backend");
	for (size_t i = 0; i < sizeof collections / sizeof collections[0]; i++)
		if (create_coll(s, collections[i], err) < 0)
			return -1;
	if (o->completion_history && create_coll(s, "completed_deliveries", err) < 0)
		return -1;
	/* not set up (yet): a 0.1.0 database, or one whose set-up died */
	if (mg_schema_info(s, &info, err) < 0 || (info.installed == 0 && mg_upgrade_010(s, err) < 0))
		return -1;
	IDX(s, "deliveries", "event_handler", true, err, "eventId", BCON_INT32(1), "handler", BCON_INT32(1));
	/* the claim index: ready deliveries (a parked one is in another range,
	 * which only an unparking reads) */
	IDX(s, "deliveries", "ready_due", false, err, "handler", BCON_INT32(1), "laneId", BCON_INT32(1),
	    "status", BCON_INT32(1), "lane", BCON_INT32(1), "key", BCON_INT32(1), "availableAt", BCON_INT32(1));
	IDX(s, "deliveries", "ready_key", false, err, "handler", BCON_INT32(1), "laneId", BCON_INT32(1),
	    "status", BCON_INT32(1), "lane", BCON_INT32(1), "key", BCON_INT32(1), "seq", BCON_INT32(1));
	if (drop_index(s, "deliveries", "lane_due", err) < 0 || drop_index(s, "deliveries", "lane_key", err) < 0)
		return -1;
	IDX(s, "deliveries", "dead", false, err, "status", BCON_INT32(1), "updatedAt", BCON_INT32(1));
	IDX(s, "lanes", "handler_lane", true, err, "handler", BCON_INT32(1), "laneId", BCON_INT32(1));
	IDX(s, "events", "created", false, err, "createdAt", BCON_INT32(1));
	IDX(s, "subscriptions", "handler_pattern", true, err, "handler", BCON_INT32(1), "pattern", BCON_INT32(1));
	if (o->completion_history)
		IDX(s, "completed_deliveries", "completed", false, err, "completedAt", BCON_INT32(1));
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf;
		const char *h, *p;

		if (rb_subscription_parse(o->subscribe[i], &buf, &h, &p, err) < 0)
			return -1;
		int rc = upsert(s, "subscriptions", BCON_NEW("handler", BCON_UTF8(h), "pattern", BCON_UTF8(p)),
		    BCON_NEW("$setOnInsert", "{", "createdAt", BCON_DATE_TIME(mg_now()), "}"), err);
		if (rc == 0)
			rc = mg_seed_lanes(s, h, err);
		free(buf);
		if (rc < 0)
			return -1;
	}
	for (size_t i = 0; i < o->n_unsubscribe; i++) {
		char *buf;
		const char *h, *p;
		bson_error_t e;

		if (rb_subscription_parse(o->unsubscribe[i], &buf, &h, &p, err) < 0)
			return -1;
		mongoc_collection_t *c = mg_coll(s, "subscriptions");
		bson_t *q = BCON_NEW("handler", BCON_UTF8(h), "pattern", BCON_UTF8(p));
		bool ok = mongoc_collection_delete_many(c, q, NULL, NULL, &e);

		bson_destroy(q);
		mongoc_collection_destroy(c);
		free(buf);
		if (!ok)
			return mg_err(s, &e, "setup", err);
	}
	if (o->completion_history)
		return upsert(s, "schema_version", BCON_NEW("_id", BCON_INT32(MG_VERSION)),
		    BCON_NEW("$setOnInsert", "{", "installedAt", BCON_DATE_TIME(mg_now()), "}",
			"$set", "{", "completionHistory", BCON_BOOL(true), "}"), err);
	return upsert(s, "schema_version", BCON_NEW("_id", BCON_INT32(MG_VERSION)),
	    BCON_NEW("$setOnInsert", "{", "installedAt", BCON_DATE_TIME(mg_now()), "}"), err);
}

/* ---- wake-up: none on MongoDB (polling) -------------------------------------- */

static int
mg_listen(struct rb_store *s, const char *handler, struct rb_error *err)
{
	(void)s;
	(void)handler;
	(void)err;
	return 0;
}

/*
 * No descriptor to poll (every call is done at once), but no notifications
 * either: a wait for work (rb_store_notified, rb-claim --wait) is cut to
 * MG_POLL_MS, after which the caller claims again.
 */
static int
mg_pollfds(struct rb_store *s, struct pollfd *pfd, int max, int *timeout_ms)
{
	(void)s;
	(void)pfd;
	(void)max;
	if (*timeout_ms > MG_POLL_MS)
		*timeout_ms = MG_POLL_MS;
	return 0;
}

/* what store.c's modules[] looks up in relaybus-mongo.so (store_int.h) */
const char rb_store_mongo_relaybus[] = PACKAGE_VERSION;

const struct rb_store_ops rb_store_mongo_ops = {
	.name = "mongodb",
	.schemes = mg_schemes,
	.version = mg_version,
	.open = mg_open,
	.close = mg_close,
	.reconnect = mg_reconnect,
	.broken = mg_broken,
	.setup = mg_setup,
	.schema_info = mg_schema_info,
	.setup_script = NULL,
	.grant = NULL,		/* no roles yet: rb-setup --grant and --revoke exit 69 */
	.publish = mg_publish,
	.claim = mg_claim,
	.complete = mg_complete,
	.extend = mg_extend,
	.relinquish = mg_relinquish,
	.relinquish_owner = mg_relinquish_owner,
	.relinquish_leases = mg_relinquish_leases,
	.in_flight = mg_in_flight,
	.listen = mg_listen,
	.pollfds = mg_pollfds,
	.admin_stats = mg_admin_stats,
	.admin_list = mg_admin_list,
	.admin_show = mg_admin_show,
	.admin_apply = mg_admin_apply,
	.admin_purge = mg_admin_purge,
	.admin_purge_keys = mg_admin_purge_keys,
	.admin_lanes = mg_admin_lanes,
	.admin_subscriptions = mg_admin_subscriptions,
};
