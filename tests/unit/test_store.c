/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the store's front and records, without a database: a
 * backend that fills in nothing but the required slots is refused the
 * same way by every front function; the URL picks the backend of the
 * set-up script; the delivery line every backend prints is spelled once,
 * byte for byte.
 */
#include "config.h"

#include <poll.h>
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
	struct rb_dl **dls = (struct rb_dl **)&dls;
	struct rb_result res[1] = { { .event_id = "e", .handler = "h" } };
	json_t *arr = json_array(), *out = (json_t *)&out;

#define TRY(slot, call) do { memset(&err, 0, sizeof err); refused((call), &err, slot); } while (0)
	TRY("reconnect", rb_store_reconnect(&s, &err));
	TRY("setup", rb_store_setup(&s, &so, &err));
	TRY("schema_info", rb_store_schema_info(&s, &info, &err));
	/* (so every program but rb-setup refuses such a backend at start, the same way) */
	TRY("schema_info", rb_store_require_schema(&s, &err));
	TRY("publish", rb_store_publish_text(&s, "[]", 0, &acks, &err));
	TRY("claim", rb_store_claim(&s, &co, &dls, &err));
	ok(dls == NULL, "claim: out-parameter NULL");
	TRY("complete", rb_store_complete(&s, &cpo, res, 1, &err));
	ok(res[0].outcome == RB_OUTCOME_LOST && res[0].attempts == -1 && res[0].sql_error == NULL,
	    "complete: the outcomes reset (lost, attempts -1)");
	TRY("extend", rb_store_extend(&s, "h", "o", 1000, &err));
	TRY("relinquish", rb_store_relinquish(&s, "h", "o", &err));
	TRY("relinquish_owner", rb_store_relinquish_owner(&s, "h", "o", &err));
	TRY("relinquish_leases", rb_store_relinquish_leases(&s, res, 1, &err));
	TRY("listen", rb_store_listen(&s, "h", &err));
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
	TRY("claim", rb_store_claim_start(&s, &co, &err));
	TRY("complete", rb_store_complete_start(&s, &cpo, res, 1, &err));
#undef TRY
	{
		struct pollfd pfd[4];
		struct rb_store_event ev;
		int timeout = 100;

		ok(rb_store_pollfds(&s, pfd, 4, &timeout) == 0 && timeout == 100 && rb_store_service(&s, &ev) == 0,
		    "no descriptors, nothing to report, no error");
		ok(rb_store_notified(&s, 0, &err) == 0, "notified: no wake-up");
	}
	ok(!rb_store_broken(&s), "no broken slot: not broken");
	is_str(rb_store_backend(&s), "bare", "the backend's name");
	json_decref(arr);
}

/* ---- the face without waiting, over a backend that only does things at once ---- */

static int sync_claims, sync_fail;

static struct rb_dl *
fake_dl(int64_t id, const char *event_id)
{
	struct rb_delivery_fields f = { .id = "0", .event_id = event_id, .handler = "h", .name = "n",
	    .payload = "{}", .headers = "{}", .created_at = "2026-01-31T12:00:00Z", .lane = 7,
	    .epoch = 1, .claims = 2 };
	struct rb_sbuf b;
	struct rb_dl *d = rb_dl_new(&f);

	rb_sb_init(&b);
	rb_dl_fill(d, &f, &b);
	free(b.s);
	d->id = id;
	return d;
}

static int
sync_claim(struct rb_store *s, const struct rb_claim_opts *o, struct rb_dl ***out, struct rb_error *err)
{
	(void)s;
	if (sync_fail)
		return rb_seterr(err, RB_EXIT_TEMPFAIL, "down");
	sync_claims++;
	*out = xcalloc(2, sizeof **out);
	(*out)[0] = fake_dl(1, "e1");
	(*out)[1] = fake_dl(2, "e2");
	return o->batch < 2 ? o->batch : 2;
}

static int
sync_complete(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    struct rb_error *err)
{
	(void)s;
	(void)o;
	(void)err;
	for (size_t i = 0; i < n; i++)
		v[i].outcome = v[i].verdict == RB_VERDICT_OK ? RB_OUTCOME_COMPLETED : RB_OUTCOME_RESCHEDULED;
	return 0;
}

static const char *const sync_schemes[] = { "sync", NULL };

static const struct rb_store_ops sync_ops = {
	.name = "sync", .schemes = sync_schemes, .version = bare_version, .open = bare_open,
	.close = bare_close, .claim = sync_claim, .complete = sync_complete,
};

static void
free_dls(struct rb_dl **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		rb_dl_free(v[i]);
	free(v);
}

static void
test_emulated(void)
{
	struct rb_store s = { .ops = &sync_ops, .schema = "public" };
	struct rb_claim_opts co = { .handler = "h", .owner = "o", .batch = 2, .lease_ms = 1000,
	    .max_attempts = 1 };
	struct rb_complete_opts cpo = { .max_attempts = 1 };
	struct rb_store_event ev;
	struct rb_error err = { 0 };
	struct rb_result res[2];
	struct pollfd pfd[3];
	int timeout = 500;

	ok(rb_store_claim_ready(&s) && rb_store_complete_ready(&s), "always ready");
	ok(rb_store_pollfds(&s, pfd, 3, &timeout) == 0 && timeout == 500, "nothing to poll, nothing to report");
	ok(rb_store_service(&s, &ev) == 0, "service: nothing");
	ok(rb_store_claim_start(&s, &co, &err) == 0 && sync_claims == 1, "claim_start runs the claim at once");
	ok(rb_store_pollfds(&s, pfd, 3, &timeout) == 0 && timeout == 0, "then no descriptor, but no wait either");
	ok(rb_store_service(&s, &ev) == 1 && ev.kind == RB_STORE_CLAIMED && ev.claimed == 2 && ev.n == 2 &&
	    ev.v[1]->id == 2, "service reports CLAIMED with the deliveries");
	ok(rb_store_service(&s, &ev) == 0, "and nothing after it");
	{
		struct rb_store_event got = ev;

		res[0] = rb_result_of(got.v[0], RB_VERDICT_OK);
		res[1] = rb_result_of(got.v[1], RB_VERDICT_FAIL);
		ok(rb_store_complete_start(&s, &cpo, res, 2, &err) == 0, "complete_start runs the completion at once");
		ok(rb_store_service(&s, &ev) == 1 && ev.kind == RB_STORE_COMPLETED && ev.results == res &&
		    ev.nresults == 2 && res[0].outcome == RB_OUTCOME_COMPLETED &&
		    res[1].outcome == RB_OUTCOME_RESCHEDULED, "service reports COMPLETED, the outcomes filled in");
		free_dls(got.v, got.n);
	}
	co.batch = 1;
	sync_fail = 1;
	memset(&err, 0, sizeof err);
	ok(rb_store_claim_start(&s, &co, &err) == -1 && err.exit_code == RB_EXIT_TEMPFAIL &&
	    rb_store_service(&s, &ev) == 0, "a claim that fails at once: -1 from start, nothing reported");
	sync_fail = 0;
	{
		struct rb_dl **v;

		ok(rb_store_claim(&s, &co, &v, &err) == 1 && v[0]->id == 1, "rb_store_claim: the slot itself");
		free_dls(v, 2);
	}
	rb_evq_free(&s.evq);
}

/* ---- the synchronous calls over a backend that only starts things ------- */

static int
async_claim_start(struct rb_store *s, const struct rb_claim_opts *o, bool wait, struct rb_error *err)
{
	struct rb_store_event ev = { .kind = RB_STORE_CLAIMED, .claimed = 1, .n = 1 };

	(void)o;
	(void)err;
	ev.v = xcalloc(1, sizeof *ev.v);
	ev.v[0] = fake_dl(wait ? 10 : 20, "e3");
	rb_evq_push(&s->evq, &ev);
	return 0;
}

static int
async_complete_start(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    bool wait, struct rb_error *err)
{
	struct rb_store_event ev = { .kind = RB_STORE_COMPLETED, .results = v, .nresults = n };

	(void)o;
	(void)wait;
	(void)err;
	for (size_t i = 0; i < n; i++)
		v[i].outcome = RB_OUTCOME_BURIED;
	rb_evq_push(&s->evq, &ev);
	return 0;
}

static const struct rb_store_ops async_ops = {
	.name = "async", .schemes = sync_schemes, .version = bare_version, .open = bare_open,
	.close = bare_close, .claim_start = async_claim_start, .complete_start = async_complete_start,
};

static void
test_sync_over_async(void)
{
	struct rb_store s = { .ops = &async_ops, .schema = "public" };
	struct rb_claim_opts co = { .handler = "h", .owner = "o", .batch = 2, .lease_ms = 1000,
	    .max_attempts = 1 };
	struct rb_complete_opts cpo = { .max_attempts = 1 };
	struct rb_store_event ev;
	struct rb_error err = { 0 };
	struct rb_result r;
	struct rb_dl **v;

	rb_evq_push(&s.evq, &(struct rb_store_event){ .kind = RB_STORE_WOKEN });
	ok(rb_store_claim_start(&s, &co, &err) == 0, "a claim started (not waited for)");
	ok(rb_store_claim(&s, &co, &v, &err) == 1 && v[0]->id == 10, "rb_store_claim: start with wait, its answer");
	r = rb_result_of(v[0], RB_VERDICT_DEAD);
	ok(rb_store_complete(&s, &cpo, &r, 1, &err) == 0 && r.outcome == RB_OUTCOME_BURIED,
	    "rb_store_complete: start with wait, its outcomes");
	ok(rb_store_service(&s, &ev) == 1 && ev.kind == RB_STORE_WOKEN, "what came before is still reported, in order");
	ok(rb_store_service(&s, &ev) == 1 && ev.kind == RB_STORE_CLAIMED && ev.v[0]->id == 20,
	    "the started claim's answer too");
	free_dls(ev.v, ev.n);
	ok(rb_store_service(&s, &ev) == 0, "the waited-for answers are not reported again");
	free_dls(v, 1);
	rb_evq_push(&s.evq, &(struct rb_store_event){ .kind = RB_STORE_CLAIMED, .claimed = 1, .n = 1,
	    .v = xcalloc(1, sizeof *ev.v) });
	s.evq.v[s.evq.head].v[0] = fake_dl(30, "e4");
	rb_evq_free(&s.evq);	/* (its deliveries freed: valgrind and ASan say so) */
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
	ok(!d->fetched && d->id == 42 && d->attempt == 3 && d->lease.lane == 3 && d->lease.epoch == 4 &&
	    d->lease.claims == 5 && strcmp(d->sequence, "7") == 0, "rb_dl_new: the claim's part, the lease as integers");
	rb_dl_fill(d, &f, &b);
	ok(d->fetched && d->key == NULL && d->tlen == strlen(want) && strcmp(d->text, want) == 0,
	    "rb_dl_fill: the same line");
	{
		struct rb_result r = rb_result_of(d, RB_VERDICT_RELEASE);

		ok(r.delivery_id == 42 && r.lease.lane == 3 && r.lease.epoch == 4 && r.lease.claims == 5 &&
		    r.event_id == d->event_id && r.verdict == RB_VERDICT_RELEASE && r.retry_ms < 0 &&
		    r.attempts == -1, "rb_result_of: the delivery's lease and id, no object");
	}
	rb_dl_free(d);
	free(b.s);
}

/* A failure kept in flight runs again (rb_dl_again): the next attempt, the
 * lease's claims one up, in the line too; a payload that spells those
 * members, and the key, stay as they were. */
static void
test_dl_again(void)
{
	struct rb_delivery_fields f = {
		.id = "9", .event_id = "ev", .handler = "h", .name = "n", .key = "K\"1",
		.sequence = "2", .payload = "{\"x\":1, \"attempt\":1, \"lease\":\"0:0:0\", \"created_at\":\"t\"}",
		.headers = NULL, .created_at = "2026-01-31T12:00:00Z", .lane = 7, .attempts = 0, .epoch = 3, .claims = 1,
	};
	static const char want[] =
	    "{\"event_id\":\"ev\",\"handler\":\"h\",\"name\":\"n\",\"key\":\"K\\\"1\","
	    "\"payload\":{\"x\":1,\"attempt\":1,\"lease\":\"0:0:0\",\"created_at\":\"t\"},"
	    "\"headers\":null,\"attempt\":5,\"lease\":\"7:3:2\",\"created_at\":\"2026-01-31T12:00:00Z\","
	    "\"delivery_id\":\"9\",\"lane\":7,\"sequence\":2}\n";
	struct rb_sbuf b;
	struct rb_dl *d = rb_dl_new(&f);

	rb_sb_init(&b);
	rb_dl_fill(d, &f, &b);
	rb_dl_again(d, 4);
	ok(d->attempt == 5 && d->lease.lane == 7 && d->lease.epoch == 3 && d->lease.claims == 2,
	    "rb_dl_again: the next attempt, the claims one up");
	is_str(d->text, want, "rb_dl_again: the line with both, the payload's look-alikes untouched");
	ok(d->tlen == strlen(want) && strcmp(d->key, "K\"1") == 0, "rb_dl_again: its length and key");
	rb_dl_free(d);
	free(b.s);
}

/* ---- outcomes and result lines ------------------------------------------ */

static void
test_results(void)
{
	static const char *const names[RB_NOUTCOMES] = { "completed", "rescheduled", "buried", "released", "lost" };
	static const struct {
		const char	*line;
		enum rb_verdict	 verdict;
		const char	*error;
		int64_t		 retry_ms, id;
	} cases[] = {
		{ "{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"delivery_id\":\"9\"}",
		  RB_VERDICT_OK, NULL, -1, 9 },
		{ "{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"ok\":false,\"error\":\"x\","
		  "\"retry_ms\":50}", RB_VERDICT_FAIL, "x", 50, 0 },
		{ "{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"ok\":false,\"dead\":true,"
		  "\"delivery_id\":\"no\"}", RB_VERDICT_DEAD, NULL, -1, 0 },
		{ "{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"dead\":true,\"release\":true}",
		  RB_VERDICT_RELEASE, NULL, -1, 0 },
	};
	struct rb_error err = { 0 };
	struct rb_result r;
	json_t *o;

	for (int i = 0; i < RB_NOUTCOMES; i++)
		ok(strcmp(rb_outcome_name((enum rb_outcome)i), names[i]) == 0 &&
		    rb_outcome_of(names[i]) == (enum rb_outcome)i, "outcome %d is '%s' both ways", i, names[i]);
	ok(rb_outcome_of("gone") == RB_OUTCOME_LOST && rb_outcome_of(NULL) == RB_OUTCOME_LOST,
	    "an unknown outcome word is lost");
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		o = json_loads(cases[i].line, 0, NULL);
		ok(rb_result_parse(o, &r, &err) == 0 && r.verdict == cases[i].verdict &&
		    (cases[i].error == NULL ? r.error == NULL : r.error != NULL && strcmp(r.error, cases[i].error) == 0) &&
		    r.retry_ms == cases[i].retry_ms && r.delivery_id == cases[i].id && r.lease.lane == 1 &&
		    r.lease.epoch == 2 && r.lease.claims == 3 && strcmp(r.handler, "h") == 0,
		    "result line %zu: verdict %d, its error, retry_ms and delivery_id", i, (int)r.verdict);
		json_decref(o);
	}
	o = json_loads("{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"retry_ms\":1.5}", 0, NULL);
	ok(rb_result_parse(o, &r, &err) < 0 && strcmp(err.msg, "field 'retry_ms' must be a whole number >= 0") == 0,
	    "a bad retry_ms: %s", err.msg);
	json_decref(o);
	o = json_loads("{\"ok\":\"yes\"}", 0, NULL);
	ok(rb_result_verdict(o, &r, &err) < 0 && strcmp(err.msg, "field 'ok' must be true or false") == 0,
	    "the verdict alone is checked as a result line's: %s", err.msg);
	json_decref(o);
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
	test_emulated();
	test_sync_over_async();
	test_setup_script();
	test_backends();
	test_delivery_line();
	test_dl_again();
	test_results();
	test_statuses();
	return done_testing();
}
