/* SPDX-License-Identifier: MIT */
/*
 * fuzz_result: result lines, as rb-complete and rb-dispatch read them.
 *   - rb_jsonl_parse + rb_result_validate (rb-complete): no crash, and what
 *     validates has a string event_id and handler, a lease token that
 *     rb_lease_parse takes, booleans where booleans belong;
 *   - the quick reading rb-dispatch does of a co-process's line (its
 *     plain_success and result_fields, in cmd/rb-dispatch.c, pick members
 *     with rb_json_scan): whenever rb_json_scan vouches for a line, the
 *     members event_id, lease, ok, error, retry_ms and dead it finds are
 *     jansson's, and "plain success" told from the scan (event_id and lease
 *     unescaped strings, ok true or absent, no error, retry_ms or dead) is
 *     the same verdict as from jansson's object.
 */
#include "config.h"

#include <stdbool.h>

#include <jansson.h>

#include "rb_jsonl.h"
#include "rb_store.h"
#include "rb_util.h"
#include "fuzz.h"

static const char *const want_keys[] = { "event_id", "lease", "ok", "error", "retry_ms", "dead" };
enum { K_EVENT_ID, K_LEASE, K_OK, K_ERROR, K_RETRY_MS, K_DEAD, K_N };

static void
check_validate(const json_t *o)
{
	struct rb_error err = { 0 };
	struct rb_lease l;
	const json_t *v;

	if (rb_result_validate(o, &err) < 0) {
		FUZZ_CHECK(err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL, "an error without a message");
		return;
	}
	FUZZ_CHECK(json_is_string(json_object_get(o, "event_id")), "validated without event_id");
	FUZZ_CHECK(json_string_length(json_object_get(o, "event_id")) > 0, "validated an empty event_id");
	FUZZ_CHECK(rb_handler_valid(json_string_value(json_object_get(o, "handler"))), "handler");
	FUZZ_CHECK(rb_lease_parse(json_string_value(json_object_get(o, "lease")), &l) == 0, "lease");
	for (const char *const *k = (const char *const[]){ "ok", "dead", "release", NULL }; *k != NULL; k++)
		FUZZ_CHECK((v = json_object_get(o, *k)) == NULL || json_is_boolean(v), "%s not boolean", *k);
	v = json_object_get(o, "retry_ms");
	FUZZ_CHECK(v == NULL || json_is_null(v) || (json_is_integer(v) && json_integer_value(v) >= 0), "retry_ms");
	v = json_object_get(o, "error");
	FUZZ_CHECK(v == NULL || json_is_null(v) || json_is_string(v), "error");
}

static void
check_quick(const char *s, size_t n, const json_t *o)
{
	struct rb_json_member m[32];
	const struct rb_json_member *at[K_N] = { 0 };
	int count = rb_json_scan(s, n, m, 32);
	bool fast, slow;
	const json_t *ev, *lease, *ok;

	if (count < 0 || count > 32)
		return;
	FUZZ_CHECK(o != NULL, "the scan vouches for a line jansson refuses");
	for (int i = 0; i < count; i++)
		for (int k = 0; k < K_N; k++)
			if (m[i].klen == strlen(want_keys[k]) && memcmp(m[i].key, want_keys[k], m[i].klen) == 0)
				at[k] = &m[i];
	for (int k = 0; k < K_N; k++) {
		const json_t *jv = json_object_get(o, want_keys[k]);

		/* (a key spelled with escapes is not found by bytes: the scan is in doubt then) */
		FUZZ_CHECK((at[k] != NULL) == (jv != NULL), "member %s found by one reading only", want_keys[k]);
		if (at[k] != NULL) {
			json_t *v = json_loadb(at[k]->val, at[k]->vlen, JSON_DECODE_ANY, NULL);

			FUZZ_CHECK(v != NULL && json_equal(v, jv), "member %s differs", want_keys[k]);
			json_decref(v);
		}
	}
	fast = at[K_EVENT_ID] != NULL && at[K_EVENT_ID]->type == '"' && !at[K_EVENT_ID]->escaped &&
	    at[K_LEASE] != NULL && at[K_LEASE]->type == '"' && !at[K_LEASE]->escaped &&
	    (at[K_OK] == NULL || at[K_OK]->type == 't') &&
	    at[K_ERROR] == NULL && at[K_RETRY_MS] == NULL && at[K_DEAD] == NULL;
	ev = json_object_get(o, "event_id");
	lease = json_object_get(o, "lease");
	ok = json_object_get(o, "ok");
	slow = json_is_string(ev) && json_is_string(lease) && (ok == NULL || json_is_true(ok)) &&
	    json_object_get(o, "error") == NULL && json_object_get(o, "retry_ms") == NULL &&
	    json_object_get(o, "dead") == NULL;
	/* the fast path may send an escaped id the careful way, never the reverse */
	FUZZ_CHECK(!fast || slow, "plain success by the scan only");
	if (fast) {
		FUZZ_CHECK(json_string_length(ev) == at[K_EVENT_ID]->vlen - 2 &&
		    memcmp(json_string_value(ev), at[K_EVENT_ID]->val + 1, at[K_EVENT_ID]->vlen - 2) == 0,
		    "event_id bytes");
		FUZZ_CHECK(json_string_length(lease) == at[K_LEASE]->vlen - 2 &&
		    memcmp(json_string_value(lease), at[K_LEASE]->val + 1, at[K_LEASE]->vlen - 2) == 0,
		    "lease bytes");
	}
	if (slow && !fast)
		FUZZ_CHECK(at[K_EVENT_ID]->escaped || at[K_LEASE]->escaped,
		    "plain success missed by the scan without an escape");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1), why[256];
	json_t *o = NULL;

	memcpy(s, data, size);
	s[size] = '\0';
	if (rb_jsonl_parse(s, size, &o, why, sizeof why) == 0)
		check_validate(o);
	else
		FUZZ_CHECK(o == NULL && (strncmp(why, "invalid JSON", 12) == 0 || strcmp(why, "not a JSON object") == 0),
		    "reason '%s'", why);
	check_quick(s, size, o);
	json_decref(o);
	free(s);
	return 0;
}
