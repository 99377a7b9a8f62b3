/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the store's front and records, without a database: a
 * backend that fills in nothing but the required slots is refused the
 * same way by every front function; the URL picks the backend of the
 * set-up script; the delivery line every backend prints is spelled once,
 * byte for byte.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "rb_admin.h"
#include "rb_exit.h"
#include "rb_inspect.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "tap.h"

/* ---- a backend with only the required slots ------------------------------- */

static int
bare_open(struct rb_store *s, struct rb_error *err)
{
	(void)s;
	(void)err;
	return 0;
}

static void
bare_close(struct rb_store *s)
{
	(void)s;
}

static void
bare_version(char *buf, size_t len)
{
	snprintf(buf, len, "bare 1.0");
}

static const char *const bare_schemes[] = { "bare", NULL };

static const struct rb_store_ops bare_ops = {
	.name = "bare",
	.schemes = bare_schemes,
	.version = bare_version,
	.open = bare_open,
	.close = bare_close,
};

static void
refused(int rc, const struct rb_error *err, const char *slot)
{
	char want[128];

	snprintf(want, sizeof want, "%s not supported by the bare backend", slot);
	ok(rc == -1 && err->exit_code == RB_EXIT_UNAVAILABLE && strcmp(err->msg, want) == 0,
	    "%s: 69, '%s'", slot, err->msg);
}

static void
test_unsupported(void)
{
	struct rb_store s = { .ops = &bare_ops, .schema = "public" };
	struct rb_claim_opts co = { .handler = "h", .owner = "o", .batch = 1, .lease_ms = 1000,
	    .max_attempts = 1 };
	struct rb_complete_opts cpo = { .max_attempts = 1 };
	struct rb_setup_opts so = { 0 };
	struct rb_admin_filter f = { 0 };
	struct rb_publish_acks acks;
	struct rb_schema_info info;
	struct rb_error err;
	char *after = NULL;
	struct rb_dl **dls;
	unsigned char outcome[1];
	json_t *arr = json_array(), *out = (json_t *)&out;

#define TRY(slot, call) do { memset(&err, 0, sizeof err); refused((call), &err, slot); } while (0)
	TRY("reconnect", rb_store_reconnect(&s, &err));
	TRY("setup", rb_store_setup(&s, &so, &err));
	TRY("schema_info", rb_store_schema_info(&s, &info, &err));
	/* (so every program but rb-setup refuses such a backend at start, the same way) */
	TRY("schema_info", rb_store_require_schema(&s, &err));
	TRY("publish", rb_store_publish_text(&s, "[]", 0, &acks, &err));
	TRY("claim", rb_store_claim(&s, &co, &out, &err));
	ok(out == NULL, "claim: out-parameter NULL");
	TRY("claim_send", rb_store_claim_send(&s, &co, &err));
	TRY("claim_recv", rb_store_claim_recv(&s, true, &dls, &err));
	TRY("fetch_send", rb_store_fetch_send(&s, NULL, 0, true, &err));
	TRY("fetch_recv", rb_store_fetch_recv(&s, true, &err));
	TRY("complete", rb_store_complete(&s, &cpo, arr, &out, &err));
	TRY("complete_send", rb_store_complete_send(&s, NULL, 0, false, &err));
	TRY("complete_recv", rb_store_complete_recv(&s, true, outcome, &err));
	TRY("extend", rb_store_extend(&s, "h", "o", 1000, &err));
	TRY("relinquish", rb_store_relinquish(&s, "h", "o", &err));
	TRY("relinquish_owner", rb_store_relinquish_owner(&s, "h", "o", &err));
	TRY("relinquish_leases", rb_store_relinquish_leases(&s, arr, &err));
	TRY("listen", rb_store_listen(&s, &err));
	TRY("notified", rb_store_notified(&s, NULL, 0, &err));
	TRY("admin_stats", rb_admin_stats(&s, &out, &err));
	TRY("admin_list", rb_admin_list(&s, &f, &out, &err));
	TRY("admin_show", rb_admin_show(&s, "e", &out, &err));
	TRY("admin_apply", rb_admin_apply(&s, RB_ADMIN_BURY, arr, NULL, &out, &err));
	TRY("admin_purge", rb_admin_purge(&s, RB_PURGE_DEAD, 0, 1, &err));
	TRY("admin_purge_keys", rb_admin_purge_keys(&s, &after, 1, &err));
	TRY("admin_lanes", rb_admin_lanes(&s, NULL, true, &out, &err));
	TRY("admin_subscriptions", rb_admin_subscriptions(&s, NULL, &out, &err));
	TRY("inspect_sample", rb_inspect_sample(&s, &out, &err));
	ok(out == NULL, "inspect_sample: out-parameter NULL");
#undef TRY
	ok(rb_store_socket(&s) == -1 && rb_store_fetch_socket(&s) == -1 &&
	    rb_store_complete_socket(&s) == -1, "no socket slots: -1, no error");
	ok(!rb_store_broken(&s), "no broken slot: not broken");
	is_str(rb_store_backend(&s), "bare", "the backend's name");
	json_decref(arr);
}

/* ---- the backend of a URL, for the set-up script ------------------------ */

static void
test_setup_script(void)
{
	struct rb_setup_opts so = { 0 };
	struct rb_error err = { 0 };
	char *sql;

	unsetenv("RELAYBUS_URL");
	unsetenv("RELAYBUS_SCHEMA");
	sql = rb_store_setup_script(NULL, "s_one", &so, &err);
	ok(sql != NULL && strstr(sql, "\"s_one\".relaybus_deliveries") != NULL,
	    "no URL: the PostgreSQL script for the schema given");
	free(sql);
	sql = rb_store_setup_script("host=/nowhere dbname=x", NULL, &so, &err);
	ok(sql != NULL && strstr(sql, "\"public\".relaybus_deliveries") != NULL,
	    "a conninfo string: PostgreSQL, schema public, no connection");
	free(sql);
	setenv("RELAYBUS_SCHEMA", "from_env", 1);
	sql = rb_store_setup_script("postgresql://u:pw@127.0.0.1:1/x", NULL, &so, &err);
	ok(sql != NULL && strstr(sql, "\"from_env\".relaybus_deliveries") != NULL,
	    "postgresql://, schema from $RELAYBUS_SCHEMA");
	free(sql);
	setenv("RELAYBUS_SCHEMA", "Bad-Name", 1);
	memset(&err, 0, sizeof err);
	sql = rb_store_setup_script(NULL, NULL, &so, &err);
	ok(sql == NULL && err.exit_code == RB_EXIT_CONFIG, "an invalid $RELAYBUS_SCHEMA: 78 (%s)", err.msg);
	unsetenv("RELAYBUS_SCHEMA");
	memset(&err, 0, sizeof err);
	sql = rb_store_setup_script("mysql://u:pw@h/d", NULL, &so, &err);
	ok(sql == NULL && err.exit_code == RB_EXIT_CONFIG && strstr(err.msg, "u:xxxxx@h") != NULL &&
	    strstr(err.msg, "use postgresql://") != NULL, "an unknown scheme: 78, redacted (%s)", err.msg);
	memset(&err, 0, sizeof err);
	setenv("RELAYBUS_URL", "mongodb+srv://u:pw@h/d", 1);
	sql = rb_store_setup_script(NULL, NULL, &so, &err);
	/* (69 either way: without libmongoc not part of this build; with it,
	 * a backend that has no set-up script) */
	ok(sql == NULL && err.exit_code == RB_EXIT_UNAVAILABLE &&
#ifdef HAVE_MONGO
	    strcmp(err.msg, "setup_script not supported by the mongodb backend") == 0 &&
#else
	    strstr(err.msg, "the mongodb backend is not part of this build") != NULL &&
#endif
	    strstr(err.msg, "pw") == NULL, "$RELAYBUS_URL mongodb+srv://: 69 (%s)", err.msg);
	unsetenv("RELAYBUS_URL");
}

static void
test_backends(void)
{
	char *b = rb_store_backends();

#ifdef HAVE_MONGO
	ok(strncmp(b, "postgresql, mongodb; libpq ", 27) == 0 && strstr(b, ", libmongoc 1.") != NULL,
	    "backends and versions: '%s'", b);
#else
	ok(strncmp(b, "postgresql; libpq ", 18) == 0 && strchr(b + 18, '.') != NULL &&
	    strspn(b + 18, "0123456789.") == strlen(b + 18), "backends and versions: '%s'", b);
#endif
	free(b);
}

/* ---- the delivery line -------------------------------------------------- */

static void
test_delivery_line(void)
{
	struct rb_delivery_fields f = {
		.id = "42", .event_id = "e\"1", .handler = "mailer", .name = "user.signed_up",
		.key = NULL, .sequence = "7", .payload = "{ \"a\" : [1, 2.50, \"\\u00e9\"] }",
		.headers = "{}", .created_at = "2026-01-31T12:00:00.123Z",
		.lane = 3, .attempts = 2, .epoch = 4, .claims = 5,
	};
	static const char want[] =
	    "{\"event_id\":\"e\\\"1\",\"handler\":\"mailer\",\"name\":\"user.signed_up\",\"key\":null,"
	    "\"payload\":{\"a\":[1,2.50,\"\\u00e9\"]},\"headers\":{},\"attempt\":3,\"lease\":\"3:4:5\","
	    "\"created_at\":\"2026-01-31T12:00:00.123Z\",\"delivery_id\":\"42\",\"lane\":3,\"sequence\":7}\n";
	struct rb_sbuf b;
	struct rb_dl *d;
	json_t *o, *parsed;
	char *dump;

	rb_sb_init(&b);
	rb_delivery_line(&f, "3:4:5", &b);
	is_str(b.s, want, "the line, byte for byte");
	o = rb_delivery_object(&f, false, &b);
	parsed = json_loads(want, 0, NULL);
	ok(json_equal(o, parsed), "the object is the line parsed");
	dump = json_dumps(o, JSON_COMPACT);
	ok(dump != NULL && strncmp(dump, "{\"event_id\":", 12) == 0 && strstr(dump, "\"sequence\":7}") != NULL,
	    "the object's members in the line's order");
	free(dump);
	json_decref(parsed);
	json_decref(o);
	o = rb_delivery_object(&f, true, &b);
	is_str(json_string_value(json_object_get(o, RB_LINE_TEXT_KEY)), want, "with text: the line under %s",
	    RB_LINE_TEXT_KEY);
	ok(json_object_get(o, "payload") == NULL, "with text: no payload member");
	json_decref(o);
	d = rb_dl_new(&f);
	ok(!d->fetched && d->id == 42 && d->attempt == 3 && strcmp(d->lease, "3:4:5") == 0 &&
	    strcmp(d->sequence, "7") == 0, "rb_dl_new: the claim's part");
	rb_dl_fill(d, &f, true, &b);
	ok(d->fetched && d->key == NULL && d->tlen == strlen(want) && strcmp(d->text, want) == 0,
	    "rb_dl_fill: the same line");
	o = rb_dl_result(d);
	is_str(json_string_value(json_object_get(o, "lease")), "3:4:5", "rb_dl_result: its lease");
	json_decref(o);
	rb_dl_free(d);
	free(b.s);
}

static void
test_statuses(void)
{
	ok(rb_admin_status_valid("pending,dead") && rb_admin_status_valid("completed"), "known statuses");
	ok(!rb_admin_status_valid("pending,") && !rb_admin_status_valid("done") &&
	    !rb_admin_status_valid(NULL), "unknown statuses");
}

int
main(void)
{
	test_unsupported();
	test_setup_script();
	test_backends();
	test_delivery_line();
	test_statuses();
	return done_testing();
}
