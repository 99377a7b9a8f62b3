/* SPDX-License-Identifier: MIT */
/*
 * What the MongoDB backend needs from a server, checked through libmongoc (the
 * client library the backend uses) against $RELAYBUS_TEST_MONGO_URL: the
 * project's test server (tests/mongo/server.py, started by scripts/test) or a
 * real MongoDB 6+ replica set.  Nothing here depends on the emulator: every
 * check holds on a real server.
 *
 * hello as a replica-set primary; a cursor larger than one batch (getMore) and
 * killCursors; a unique index refusing a duplicate (11000); findAndModify;
 * ordered and unordered bulk writes with one failing statement; a committed
 * transaction (snapshot reads, invisible to others until commit); an aborted
 * one; two transactions writing one document (WriteConflict with
 * TransientTransactionError), two writing different ones (both commit); a
 * write outside a transaction waiting for the transaction that holds the
 * document; mongoc_client_session_with_transaction retrying after a conflict.
 *
 * Skips without RELAYBUS_TEST_MONGO_URL, unless RELAYBUS_REQUIRE_MONGO=1.
 */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "tap.h"

#define DB "relaybus_test_wire"

static mongoc_client_t *ca, *cb;	/* two clients: two "processes" */
static const char *url;

/* ---- helpers ------------------------------------------------------------ */

static mongoc_client_t *
client_new(void)
{
	bson_error_t err;
	mongoc_uri_t *uri = mongoc_uri_new_with_error(url, &err);
	mongoc_client_t *c;

	if (uri == NULL) {
		printf("# bad RELAYBUS_TEST_MONGO_URL: %s\n", err.message);
		return NULL;
	}
	c = mongoc_client_new_from_uri_with_error(uri, &err);
	mongoc_uri_destroy(uri);
	if (c == NULL) {
		printf("# cannot create a client: %s\n", err.message);
		return NULL;
	}
	mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	mongoc_client_set_appname(c, "test_mongo_wire");
	return c;
}

static mongoc_collection_t *
coll(mongoc_client_t *c, const char *name)
{
	return mongoc_client_get_collection(c, DB, name);
}

static int64_t
count(mongoc_client_t *c, const char *name, const bson_t *filter)
{
	mongoc_collection_t *col = coll(c, name);
	bson_error_t err;
	int64_t n = mongoc_collection_count_documents(col, filter, NULL, NULL, NULL, &err);

	if (n < 0)
		printf("# count %s: %s\n", name, err.message);
	mongoc_collection_destroy(col);
	return n;
}

/* the int32/int64/double field `key` of the document {_id: id} seen by client c; -1 when absent */
static int64_t
field_of(mongoc_client_t *c, mongoc_client_session_t *cs, const char *name, const char *id, const char *key)
{
	mongoc_collection_t *col = coll(c, name);
	bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
	bson_t opts = BSON_INITIALIZER;
	bson_error_t err;
	const bson_t *doc;
	mongoc_cursor_t *cur;
	bson_iter_t it;
	int64_t v = -1;

	if (cs != NULL && !mongoc_client_session_append(cs, &opts, &err))
		printf("# session append: %s\n", err.message);
	cur = mongoc_collection_find_with_opts(col, filter, &opts, NULL);
	if (mongoc_cursor_next(cur, &doc) && bson_iter_init_find(&it, doc, key) && BSON_ITER_HOLDS_NUMBER(&it))
		v = bson_iter_as_int64(&it);
	if (mongoc_cursor_error(cur, &err))
		printf("# find %s: %s\n", id, err.message);
	mongoc_cursor_destroy(cur);
	bson_destroy(&opts);
	bson_destroy(filter);
	mongoc_collection_destroy(col);
	return v;
}

/* update {_id: id} with `update` (in session cs when not NULL); fills err and reply */
static bool
update_id(mongoc_client_t *c, mongoc_client_session_t *cs, const char *name, const char *id,
    const bson_t *update, bson_t *reply, bson_error_t *err)
{
	mongoc_collection_t *col = coll(c, name);
	bson_t *filter = BCON_NEW("_id", BCON_UTF8(id));
	bson_t opts = BSON_INITIALIZER;
	bool r = true;

	if (cs != NULL)
		r = mongoc_client_session_append(cs, &opts, err);
	if (r)
		r = mongoc_collection_update_one(col, filter, update, &opts, reply, err);
	else
		bson_init(reply);
	bson_destroy(&opts);
	bson_destroy(filter);
	mongoc_collection_destroy(col);
	return r;
}

static bool
insert_id(mongoc_client_t *c, mongoc_client_session_t *cs, const char *name, const char *id, int n,
    bson_error_t *err)
{
	mongoc_collection_t *col = coll(c, name);
	bson_t *doc = BCON_NEW("_id", BCON_UTF8(id), "n", BCON_INT32(n));
	bson_t opts = BSON_INITIALIZER;
	bool r = true;

	if (cs != NULL)
		r = mongoc_client_session_append(cs, &opts, err);
	if (r)
		r = mongoc_collection_insert_one(col, doc, &opts, NULL, err);
	bson_destroy(&opts);
	bson_destroy(doc);
	mongoc_collection_destroy(col);
	return r;
}

static mongoc_client_session_t *
txn_begin(mongoc_client_t *c)
{
	bson_error_t err;
	mongoc_client_session_t *cs = mongoc_client_start_session(c, NULL, &err);
	mongoc_transaction_opt_t *to = mongoc_transaction_opts_new();
	mongoc_read_concern_t *rc = mongoc_read_concern_new();

	if (cs == NULL) {
		printf("# start session: %s\n", err.message);
		goto out;
	}
	mongoc_read_concern_set_level(rc, MONGOC_READ_CONCERN_LEVEL_SNAPSHOT);
	mongoc_transaction_opts_set_read_concern(to, rc);
	if (!mongoc_client_session_start_transaction(cs, to, &err)) {
		printf("# start transaction: %s\n", err.message);
		mongoc_client_session_destroy(cs);
		cs = NULL;
	}
out:
	mongoc_read_concern_destroy(rc);
	mongoc_transaction_opts_destroy(to);
	return cs;
}

static bool
txn_commit(mongoc_client_session_t *cs, bson_error_t *err)
{
	bson_t reply;
	bool r = mongoc_client_session_commit_transaction(cs, &reply, err);

	bson_destroy(&reply);
	return r;
}

static bool
run(mongoc_client_t *c, const char *db, bson_t *cmd, bson_t *reply, bson_error_t *err)
{
	bool r = mongoc_client_command_simple(c, db, cmd, NULL, reply, err);

	bson_destroy(cmd);
	return r;
}

/* ---- APM: what the client sent ------------------------------------------ */

static int n_getmore, n_killcursors_ok, n_killed;

static void
on_started(const mongoc_apm_command_started_t *e)
{
	if (strcmp(mongoc_apm_command_started_get_command_name(e), "getMore") == 0)
		n_getmore++;
}

static void
on_succeeded(const mongoc_apm_command_succeeded_t *e)
{
	bson_iter_t it, arr;

	if (strcmp(mongoc_apm_command_succeeded_get_command_name(e), "killCursors") != 0)
		return;
	n_killcursors_ok++;
	if (bson_iter_init_find(&it, mongoc_apm_command_succeeded_get_reply(e), "cursorsKilled") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &arr))
		while (bson_iter_next(&arr))
			n_killed++;
}

/* ---- the checks --------------------------------------------------------- */

static void
test_hello(void)
{
	bson_error_t err;
	bson_t reply;
	bson_iter_t it;

	ok(run(ca, "admin", BCON_NEW("hello", BCON_INT32(1)), &reply, &err), "hello: %s", err.message);
	ok(bson_iter_init_find(&it, &reply, "isWritablePrimary") && bson_iter_as_bool(&it), "hello: writable primary");
	ok(bson_iter_init_find(&it, &reply, "setName") && BSON_ITER_HOLDS_UTF8(&it),
	    "hello: a replica set member (setName)");
	ok(bson_iter_init_find(&it, &reply, "maxWireVersion") && bson_iter_as_int64(&it) >= 17,
	    "hello: maxWireVersion >= 17 (MongoDB 6.0+)");
	ok(bson_iter_init_find(&it, &reply, "logicalSessionTimeoutMinutes") && bson_iter_as_int64(&it) > 0,
	    "hello: sessions supported (logicalSessionTimeoutMinutes)");
	bson_destroy(&reply);

	ok(run(ca, "admin", BCON_NEW("ping", BCON_INT32(1)), &reply, &err), "ping: %s", err.message);
	bson_destroy(&reply);
	ok(!run(ca, "admin", BCON_NEW("relaybusNoSuchCommand", BCON_INT32(1)), &reply, &err) &&
	    err.code == 59, "an unknown command: CommandNotFound (59), got %u: %s", err.code, err.message);
	bson_destroy(&reply);
}

static void
test_cursor(void)
{
	mongoc_collection_t *col = coll(ca, "cursor");
	bson_t *docs[250];
	bson_t empty = BSON_INITIALIZER;
	bson_t *opts;
	bson_error_t err;
	const bson_t *doc;
	mongoc_cursor_t *cur;
	bson_iter_t it;
	int i, n = 0, in_order = 1, before;

	for (i = 0; i < 250; i++)
		docs[i] = BCON_NEW("_id", BCON_INT32(i), "pad", BCON_UTF8("some payload"));
	ok(mongoc_collection_insert_many(col, (const bson_t **)docs, 250, NULL, NULL, &err),
	    "insert 250 documents: %s", err.message);
	for (i = 0; i < 250; i++)
		bson_destroy(docs[i]);

	before = n_getmore;
	opts = BCON_NEW("batchSize", BCON_INT32(40), "sort", "{", "_id", BCON_INT32(1), "}");
	cur = mongoc_collection_find_with_opts(col, &empty, opts, NULL);
	while (mongoc_cursor_next(cur, &doc)) {
		if (!bson_iter_init_find(&it, doc, "_id") || bson_iter_as_int64(&it) != n)
			in_order = 0;
		n++;
	}
	ok(!mongoc_cursor_error(cur, &err), "cursor: no error: %s", err.message);
	is_int(n, 250, "cursor: all 250 documents in batches of 40");
	ok(in_order, "cursor: in _id order");
	ok(n_getmore - before >= 6, "cursor: the client fetched the rest with getMore (%d)", n_getmore - before);
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);

	opts = BCON_NEW("batchSize", BCON_INT32(10), "limit", BCON_INT64(25));
	cur = mongoc_collection_find_with_opts(col, &empty, opts, NULL);
	for (n = 0; mongoc_cursor_next(cur, &doc);)
		n++;
	is_int(n, 25, "cursor: limit 25 over batches of 10");
	mongoc_cursor_destroy(cur);
	bson_destroy(opts);

	before = n_killed;
	opts = BCON_NEW("batchSize", BCON_INT32(10));
	cur = mongoc_collection_find_with_opts(col, &empty, opts, NULL);
	ok(mongoc_cursor_next(cur, &doc), "cursor: first document of a partly read cursor");
	ok(mongoc_cursor_get_id(cur) != 0, "cursor: the server keeps it open (id != 0)");
	mongoc_cursor_destroy(cur);
	is_int(n_killed - before, 1, "cursor: destroying it kills it on the server (killCursors: cursorsKilled)");
	bson_destroy(opts);
	bson_destroy(&empty);
	mongoc_collection_destroy(col);
}

static void
test_unique(void)
{
	mongoc_database_t *db = mongoc_client_get_database(ca, DB);
	mongoc_collection_t *col = coll(ca, "uniq");
	bson_t *cmd = BCON_NEW("createIndexes", BCON_UTF8("uniq"), "indexes", "[", "{", "key", "{",
	    "email", BCON_INT32(1), "}", "name", BCON_UTF8("email_1"), "unique", BCON_BOOL(true), "}", "]");
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1), "email", BCON_UTF8("a@example.org"));
	bson_t *d2 = BCON_NEW("_id", BCON_INT32(2), "email", BCON_UTF8("a@example.org"));
	bson_t *d3 = BCON_NEW("_id", BCON_INT32(3), "email", BCON_UTF8("b@example.org"));
	bson_t reply, empty = BSON_INITIALIZER;
	bson_error_t err;
	bson_iter_t it;
	mongoc_cursor_t *cur;
	const bson_t *doc;
	int unique_seen = 0;

	ok(mongoc_database_write_command_with_opts(db, cmd, NULL, &reply, &err), "createIndexes unique: %s",
	    err.message);
	bson_destroy(&reply);
	ok(mongoc_collection_insert_one(col, d1, NULL, NULL, &err), "insert a@: %s", err.message);
	ok(!mongoc_collection_insert_one(col, d2, NULL, &reply, &err), "insert a@ again: refused");
	is_int(err.code, 11000, "duplicate key: 11000 (%s)", err.message);
	ok(bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "writeErrors.0.code", &it) &&
	    bson_iter_as_int64(&it) == 11000, "duplicate key: a writeErrors entry with code 11000");
	bson_destroy(&reply);
	ok(mongoc_collection_insert_one(col, d3, NULL, NULL, &err), "insert b@: %s", err.message);
	is_int(count(ca, "uniq", &empty), 2, "two documents");

	cur = mongoc_collection_find_indexes_with_opts(col, NULL);
	while (mongoc_cursor_next(cur, &doc))
		if (bson_iter_init_find(&it, doc, "name") && strcmp(bson_iter_utf8(&it, NULL), "email_1") == 0 &&
		    bson_iter_init_find(&it, doc, "unique") && bson_iter_as_bool(&it))
			unique_seen = 1;
	ok(unique_seen, "listIndexes: email_1 is unique");
	mongoc_cursor_destroy(cur);

	bson_destroy(cmd);
	bson_destroy(d1);
	bson_destroy(d2);
	bson_destroy(d3);
	bson_destroy(&empty);
	mongoc_collection_destroy(col);
	mongoc_database_destroy(db);
}

/* findAndModify on collection "fam"; returns the int field `key` of reply.value (-1: null) */
static int64_t
fam(const bson_t *query, const bson_t *sort, const bson_t *update, const bson_t *fields,
    mongoc_find_and_modify_flags_t flags, const char *key, bson_t *reply)
{
	mongoc_collection_t *col = coll(ca, "fam");
	mongoc_find_and_modify_opts_t *o = mongoc_find_and_modify_opts_new();
	bson_error_t err;
	bson_iter_t it;
	int64_t v = -1;

	if (sort)
		mongoc_find_and_modify_opts_set_sort(o, sort);
	if (update)
		mongoc_find_and_modify_opts_set_update(o, update);
	if (fields)
		mongoc_find_and_modify_opts_set_fields(o, fields);
	mongoc_find_and_modify_opts_set_flags(o, flags);
	if (!mongoc_collection_find_and_modify_with_opts(col, query, o, reply, &err))
		printf("# findAndModify: %s\n", err.message);
	else if (bson_iter_init(&it, reply) && bson_iter_find_descendant(&it, "value", &it) &&
	    BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_iter_t sub;

		if (bson_iter_recurse(&it, &sub) && bson_iter_find(&sub, key))
			v = bson_iter_as_int64(&sub);
		else
			v = -2;	/* a document without the field */
	}
	mongoc_find_and_modify_opts_destroy(o);
	mongoc_collection_destroy(col);
	return v;
}

static void
test_find_and_modify(void)
{
	bson_t *q = BCON_NEW("_id", BCON_UTF8("k"));
	bson_t *inc = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
	bson_t *qg = BCON_NEW("g", BCON_INT32(1));
	bson_t *by_p = BCON_NEW("p", BCON_INT32(1));
	bson_t *by_p_desc = BCON_NEW("p", BCON_INT32(-1));
	bson_t *take = BCON_NEW("$set", "{", "taken", BCON_BOOL(true), "}");
	bson_t *fields = BCON_NEW("p", BCON_INT32(1), "_id", BCON_INT32(0));
	bson_t *miss = BCON_NEW("_id", BCON_UTF8("k"), "n", BCON_INT32(5));
	bson_t *taken = BCON_NEW("taken", BCON_BOOL(true));
	bson_t reply;
	bson_iter_t it;
	bson_error_t err;
	int i;

	is_int(fam(q, NULL, inc, NULL, MONGOC_FIND_AND_MODIFY_UPSERT | MONGOC_FIND_AND_MODIFY_RETURN_NEW, "n", &reply),
	    1, "findAndModify upsert+new: the new document (n 1)");
	ok(bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "lastErrorObject.upserted", &it),
	    "findAndModify upsert: lastErrorObject.upserted");
	bson_destroy(&reply);
	is_int(fam(q, NULL, inc, NULL, MONGOC_FIND_AND_MODIFY_NONE, "n", &reply), 1,
	    "findAndModify without new: the document before (n 1)");
	ok(bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "lastErrorObject.updatedExisting", &it) &&
	    bson_iter_as_bool(&it), "findAndModify: updatedExisting");
	bson_destroy(&reply);
	is_int(fam(miss, NULL, inc, NULL, MONGOC_FIND_AND_MODIFY_RETURN_NEW, "n", &reply), -1,
	    "findAndModify with a condition that does not hold: value null");
	bson_destroy(&reply);
	is_int(field_of(ca, NULL, "fam", "k", "n"), 2, "findAndModify: n is 2 (not touched by the miss)");

	for (i = 3; i >= 1; i--) {
		bson_t *d = BCON_NEW("g", BCON_INT32(1), "p", BCON_INT32(i));
		mongoc_collection_t *col = coll(ca, "fam");

		ok(mongoc_collection_insert_one(col, d, NULL, NULL, &err), "insert p %d: %s", i, err.message);
		mongoc_collection_destroy(col);
		bson_destroy(d);
	}
	is_int(fam(qg, by_p, take, fields, MONGOC_FIND_AND_MODIFY_RETURN_NEW, "p", &reply), 1,
	    "findAndModify sort {p: 1}: takes the smallest p");
	ok(bson_iter_init(&it, &reply) && !bson_iter_find_descendant(&it, "value._id", &it),
	    "findAndModify fields {_id: 0}: no _id in the value");
	bson_destroy(&reply);
	is_int(count(ca, "fam", taken), 1, "one document taken");
	is_int(fam(qg, by_p_desc, NULL, NULL, MONGOC_FIND_AND_MODIFY_REMOVE, "p", &reply), 3,
	    "findAndModify remove, sort {p: -1}: removes p 3, returns it");
	bson_destroy(&reply);
	is_int(count(ca, "fam", qg), 2, "two of the group left");

	bson_destroy(q);
	bson_destroy(inc);
	bson_destroy(qg);
	bson_destroy(by_p);
	bson_destroy(by_p_desc);
	bson_destroy(take);
	bson_destroy(fields);
	bson_destroy(miss);
	bson_destroy(taken);
}

static void
bulk_case(const char *name, bool ordered, int want_inserted, int want_three)
{
	mongoc_collection_t *col = coll(ca, name);
	bson_t *opts = BCON_NEW("ordered", BCON_BOOL(ordered));
	mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(col, opts);
	int ids[] = { 1, 2, 2, 3 }, i;
	bson_t reply, *three = BCON_NEW("_id", BCON_INT32(3));
	bson_error_t err;
	bson_iter_t it;

	for (i = 0; i < 4; i++) {
		bson_t *d = BCON_NEW("_id", BCON_INT32(ids[i]));

		mongoc_bulk_operation_insert_with_opts(b, d, NULL, &err);
		bson_destroy(d);
	}
	ok(mongoc_bulk_operation_execute(b, &reply, &err) == 0, "%s bulk: fails (one duplicate)", name);
	ok(bson_iter_init_find(&it, &reply, "nInserted") && bson_iter_as_int64(&it) == want_inserted,
	    "%s bulk: nInserted %d", name, want_inserted);
	ok(bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "writeErrors.0.index", &it) &&
	    bson_iter_as_int64(&it) == 2, "%s bulk: writeErrors[0].index is 2", name);
	ok(bson_iter_init(&it, &reply) && bson_iter_find_descendant(&it, "writeErrors.0.code", &it) &&
	    bson_iter_as_int64(&it) == 11000, "%s bulk: writeErrors[0].code is 11000", name);
	ok(bson_iter_init(&it, &reply) && !bson_iter_find_descendant(&it, "writeErrors.1", &it),
	    "%s bulk: one write error", name);
	is_int(count(ca, name, three), want_three, "%s bulk: the statement after the error %s", name,
	    want_three ? "ran" : "did not run");
	bson_destroy(&reply);
	bson_destroy(three);
	bson_destroy(opts);
	mongoc_bulk_operation_destroy(b);
	mongoc_collection_destroy(col);
}

static void
test_bulk(void)
{
	mongoc_collection_t *col = coll(ca, "bulkmix");
	mongoc_bulk_operation_t *b = mongoc_collection_create_bulk_operation_with_opts(col, NULL);
	bson_t *d1 = BCON_NEW("_id", BCON_INT32(1), "s", BCON_UTF8("new"));
	bson_t *d2 = BCON_NEW("_id", BCON_INT32(2), "s", BCON_UTF8("new"));
	bson_t *snew = BCON_NEW("s", BCON_UTF8("new"));
	bson_t *sold = BCON_NEW("$set", "{", "s", BCON_UTF8("done"), "}");
	bson_t *one = BCON_NEW("_id", BCON_INT32(1));
	bson_t reply, empty = BSON_INITIALIZER;
	bson_error_t err;
	bson_iter_t it;

	bulk_case("bulk_ordered", true, 2, 0);
	bulk_case("bulk_unordered", false, 3, 1);

	mongoc_bulk_operation_insert_with_opts(b, d1, NULL, &err);
	mongoc_bulk_operation_insert_with_opts(b, d2, NULL, &err);
	mongoc_bulk_operation_update_many_with_opts(b, snew, sold, NULL, &err);
	mongoc_bulk_operation_remove_one_with_opts(b, one, NULL, &err);
	ok(mongoc_bulk_operation_execute(b, &reply, &err) != 0, "mixed bulk: %s", err.message);
	ok(bson_iter_init_find(&it, &reply, "nModified") && bson_iter_as_int64(&it) == 2, "mixed bulk: nModified 2");
	ok(bson_iter_init_find(&it, &reply, "nRemoved") && bson_iter_as_int64(&it) == 1, "mixed bulk: nRemoved 1");
	is_int(count(ca, "bulkmix", &empty), 1, "mixed bulk: one document left");
	bson_destroy(&reply);
	bson_destroy(d1);
	bson_destroy(d2);
	bson_destroy(snew);
	bson_destroy(sold);
	bson_destroy(one);
	bson_destroy(&empty);
	mongoc_bulk_operation_destroy(b);
	mongoc_collection_destroy(col);
}

static void
test_commit(void)
{
	mongoc_client_session_t *cs;
	bson_t *c1 = BCON_NEW("_id", BCON_UTF8("c1"));
	bson_t *set2 = BCON_NEW("$set", "{", "n", BCON_INT32(2), "}");
	bson_t reply;
	bson_error_t err;

	ok(insert_id(ca, NULL, "txn", "s", 1, &err), "commit: a document s (n 1): %s", err.message);
	cs = txn_begin(ca);
	ok(cs != NULL, "commit: transaction started");
	if (cs == NULL)
		goto out;
	is_int(field_of(ca, cs, "txn", "s", "n"), 1, "commit: the transaction reads s (n 1)");
	ok(update_id(cb, NULL, "txn", "s", set2, &reply, &err), "commit: another client sets s.n = 2: %s",
	    err.message);
	bson_destroy(&reply);
	is_int(field_of(ca, cs, "txn", "s", "n"), 1, "commit: the transaction still reads its snapshot (n 1)");
	ok(insert_id(ca, cs, "txn", "c1", 1, &err), "commit: insert c1 in the transaction: %s", err.message);
	is_int(field_of(ca, cs, "txn", "c1", "n"), 1, "commit: the transaction sees its own write");
	is_int(count(cb, "txn", c1), 0, "commit: another client does not see c1 before commit");
	ok(txn_commit(cs, &err), "commit: commitTransaction: %s", err.message);
	is_int(count(cb, "txn", c1), 1, "commit: another client sees c1 after commit");
	is_int(field_of(cb, NULL, "txn", "s", "n"), 2, "commit: the other client's write is kept (s.n 2)");
	mongoc_client_session_destroy(cs);
out:
	bson_destroy(c1);
	bson_destroy(set2);
}

static void
test_abort(void)
{
	mongoc_client_session_t *cs = txn_begin(ca);
	bson_t *a1 = BCON_NEW("_id", BCON_UTF8("a1"));
	bson_t *inc = BCON_NEW("$inc", "{", "n", BCON_INT32(10), "}");
	bson_t reply;
	bson_error_t err;

	ok(cs != NULL, "abort: transaction started");
	if (cs == NULL)
		goto out;
	ok(insert_id(ca, cs, "txn", "a1", 1, &err), "abort: insert a1 in the transaction: %s", err.message);
	ok(update_id(ca, cs, "txn", "s", inc, &reply, &err), "abort: s.n += 10 in the transaction: %s",
	    err.message);
	bson_destroy(&reply);
	is_int(count(cb, "txn", a1), 0, "abort: another client does not see a1");
	ok(mongoc_client_session_abort_transaction(cs, &err), "abort: abortTransaction: %s", err.message);
	is_int(count(cb, "txn", a1), 0, "abort: a1 is gone for another client");
	is_int(count(ca, "txn", a1), 0, "abort: a1 is gone for the same client");
	is_int(field_of(cb, NULL, "txn", "s", "n"), 2, "abort: s.n is unchanged (2)");
	mongoc_client_session_destroy(cs);
out:
	bson_destroy(a1);
	bson_destroy(inc);
}

static void
test_conflict(void)
{
	mongoc_client_session_t *sa, *sb;
	bson_t *inc1 = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
	bson_t *inc10 = BCON_NEW("$inc", "{", "n", BCON_INT32(10), "}");
	bson_t reply;
	bson_error_t err;

	ok(insert_id(ca, NULL, "conflict", "x", 0, &err), "conflict: a document x: %s", err.message);
	ok(insert_id(ca, NULL, "conflict", "y", 0, &err), "conflict: a document y: %s", err.message);
	sa = txn_begin(ca);
	sb = txn_begin(cb);
	ok(sa != NULL && sb != NULL, "conflict: two transactions");
	if (sa == NULL || sb == NULL)
		goto out;
	ok(update_id(ca, sa, "conflict", "x", inc1, &reply, &err), "conflict: A writes x: %s", err.message);
	bson_destroy(&reply);
	ok(!update_id(cb, sb, "conflict", "x", inc10, &reply, &err), "conflict: B writing x fails");
	is_int(err.code, 112, "conflict: WriteConflict (112): %s", err.message);
	ok(mongoc_error_has_label(&reply, "TransientTransactionError"), "conflict: labelled TransientTransactionError");
	bson_destroy(&reply);
	mongoc_client_session_abort_transaction(sb, &err);
	memset(&err, 0, sizeof err);
	ok(txn_commit(sa, &err), "conflict: A commits: %s", err.message);
	is_int(field_of(cb, NULL, "conflict", "x", "n"), 1, "conflict: x has A's write only (n 1)");
	mongoc_client_session_destroy(sa);
	mongoc_client_session_destroy(sb);

	/* the granularity is the document: two transactions on two documents both commit */
	sa = txn_begin(ca);
	sb = txn_begin(cb);
	ok(sa != NULL && sb != NULL, "no conflict: two transactions");
	if (sa == NULL || sb == NULL)
		goto out;
	ok(update_id(ca, sa, "conflict", "x", inc1, &reply, &err), "no conflict: A writes x: %s", err.message);
	bson_destroy(&reply);
	ok(update_id(cb, sb, "conflict", "y", inc10, &reply, &err), "no conflict: B writes y: %s", err.message);
	bson_destroy(&reply);
	ok(txn_commit(sb, &err), "no conflict: B commits: %s", err.message);
	ok(txn_commit(sa, &err), "no conflict: A commits: %s", err.message);
	is_int(field_of(cb, NULL, "conflict", "x", "n") * 100 + field_of(cb, NULL, "conflict", "y", "n"),
	    2 * 100 + 10, "no conflict: both writes are there (x 2, y 10)");
out:
	if (sa)
		mongoc_client_session_destroy(sa);
	if (sb)
		mongoc_client_session_destroy(sb);
	bson_destroy(inc1);
	bson_destroy(inc10);
}

/* a write outside any transaction, in its own thread and client */
static atomic_int outside_done;
static bool outside_ok;

static void *
outside_writer(void *arg)
{
	mongoc_client_t *c = client_new();
	bson_t *set = BCON_NEW("$set", "{", "outside", BCON_BOOL(true), "}");
	bson_t reply;
	bson_error_t err;

	(void)arg;
	if (c != NULL) {
		outside_ok = update_id(c, NULL, "blocked", "b", set, &reply, &err);
		if (!outside_ok)
			printf("# outside write: %s\n", err.message);
		bson_destroy(&reply);
		mongoc_client_destroy(c);
	}
	bson_destroy(set);
	atomic_store(&outside_done, 1);
	return NULL;
}

static void
test_blocked_write(void)
{
	mongoc_client_session_t *sa;
	bson_t *inc = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
	bson_t *both = BCON_NEW("_id", BCON_UTF8("b"), "n", BCON_INT32(1), "outside", BCON_BOOL(true));
	bson_t reply;
	bson_error_t err;
	pthread_t th;
	struct timespec pause = { 0, 500 * 1000 * 1000 };

	ok(insert_id(ca, NULL, "blocked", "b", 0, &err), "blocked: a document b: %s", err.message);
	sa = txn_begin(ca);
	ok(sa != NULL, "blocked: transaction started");
	if (sa == NULL)
		goto out;
	ok(update_id(ca, sa, "blocked", "b", inc, &reply, &err), "blocked: the transaction writes b: %s",
	    err.message);
	bson_destroy(&reply);
	ok(pthread_create(&th, NULL, outside_writer, NULL) == 0, "blocked: a writer outside the transaction");
	nanosleep(&pause, NULL);
	ok(atomic_load(&outside_done) == 0, "blocked: its write to b waits while the transaction is open");
	ok(txn_commit(sa, &err), "blocked: the transaction commits: %s", err.message);
	pthread_join(th, NULL);
	ok(outside_ok, "blocked: then the outside write succeeds");
	is_int(count(cb, "blocked", both), 1, "blocked: b has both writes (n 1, outside true)");
	mongoc_client_session_destroy(sa);
out:
	bson_destroy(inc);
	bson_destroy(both);
}

struct wt_ctx {
	int calls;
};

static bool
wt_callback(mongoc_client_session_t *cs, void *arg, bson_t **reply, bson_error_t *error)
{
	struct wt_ctx *w = arg;
	bson_t *inc = BCON_NEW("$inc", "{", "n", BCON_INT32(1), "}");
	bson_t *inc100 = BCON_NEW("$inc", "{", "n", BCON_INT32(100), "}");
	bson_t r;
	bool ok_;

	w->calls++;
	/* read first: the snapshot is taken; then someone else commits a write to w */
	(void)field_of(ca, cs, "wt", "w", "n");
	if (w->calls == 1) {
		bson_error_t e2;

		if (!update_id(cb, NULL, "wt", "w", inc100, &r, &e2))
			printf("# the interfering write failed: %s\n", e2.message);
		bson_destroy(&r);
	}
	ok_ = update_id(ca, cs, "wt", "w", inc, &r, error);
	if (!ok_)
		*reply = bson_copy(&r);
	bson_destroy(&r);
	bson_destroy(inc);
	bson_destroy(inc100);
	return ok_;
}

static void
test_with_transaction(void)
{
	bson_error_t err;
	mongoc_client_session_t *cs = mongoc_client_start_session(ca, NULL, &err);
	struct wt_ctx w = { 0 };
	bson_t reply;

	ok(insert_id(ca, NULL, "wt", "w", 0, &err), "with_transaction: a document w: %s", err.message);
	ok(cs != NULL, "with_transaction: a session");
	if (cs == NULL)
		return;
	ok(mongoc_client_session_with_transaction(cs, wt_callback, NULL, &w, &reply, &err),
	    "with_transaction: succeeds in the end: %s", err.message);
	is_int(w.calls, 2, "with_transaction: the callback ran twice (a WriteConflict, then a retry)");
	is_int(field_of(cb, NULL, "wt", "w", "n"), 101, "with_transaction: w has both writes (n 101)");
	bson_destroy(&reply);
	mongoc_client_session_destroy(cs);
}

static void
drop_db(void)
{
	mongoc_database_t *db = mongoc_client_get_database(ca, DB);
	bson_error_t err;

	if (!mongoc_database_drop_with_opts(db, NULL, &err))
		printf("# drop database %s: %s\n", DB, err.message);
	mongoc_database_destroy(db);
}

int
main(void)
{
	mongoc_apm_callbacks_t *apm;

	url = getenv("RELAYBUS_TEST_MONGO_URL");
	if (url == NULL || *url == '\0') {
		const char *req = getenv("RELAYBUS_REQUIRE_MONGO");

		if (req != NULL && strcmp(req, "1") == 0) {
			printf("not ok 1 - RELAYBUS_REQUIRE_MONGO=1 but RELAYBUS_TEST_MONGO_URL is not set\n1..1\n");
			return 1;
		}
		printf("1..0 # SKIP no MongoDB (set RELAYBUS_TEST_MONGO_URL)\n");
		return 0;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	mongoc_init();
	ca = client_new();
	cb = client_new();
	ok(ca != NULL && cb != NULL, "two clients for %s", url);
	if (ca == NULL || cb == NULL)
		goto out;
	apm = mongoc_apm_callbacks_new();
	mongoc_apm_set_command_started_cb(apm, on_started);
	mongoc_apm_set_command_succeeded_cb(apm, on_succeeded);
	mongoc_client_set_apm_callbacks(ca, apm, NULL);
	mongoc_apm_callbacks_destroy(apm);

	drop_db();
	test_hello();
	test_cursor();
	test_unique();
	test_find_and_modify();
	test_bulk();
	test_commit();
	test_abort();
	test_conflict();
	test_blocked_write();
	test_with_transaction();
	drop_db();
out:
	if (ca)
		mongoc_client_destroy(ca);
	if (cb)
		mongoc_client_destroy(cb);
	mongoc_cleanup();
	return done_testing();
}
