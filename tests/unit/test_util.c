/* SPDX-License-Identifier: MIT */
/* Unit tests: durations, numbers, URL redaction, FNV-1a, lanes, lease tokens. */
#include "config.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rb_store.h"
#include "rb_trace.h"
#include "rb_util.h"
#include "tap.h"

static void
test_durations(void)
{
	static const struct { const char *in; int64_t ms; } good[] = {
		{ "0", 0 }, { "0s", 0 }, { "250ms", 250 }, { "30s", 30000 }, { "5m", 300000 },
		{ "5min", 300000 }, { "2h", 7200000 }, { "1d", 86400000 }, { "1m30s", 90000 },
		{ "1h30m15s500ms", 5415500 }, { "1d1ms", 86400001 }, { "1.5s", 1500 },
		{ "0.25s", 250 }, { "1.5m", 90000 }, { "2.5h", 9000000 }, { "0.001s", 1 },
		{ "1.000s", 1000 }, { "1.0000000000000000000s", 1000 }, { "0.0000003125d", 27 },
		{ "007s", 7000 }, { "1.5d1.5h", 135000000 },
		{ "9223372036854775807ms", INT64_MAX }, { "106751991167d", 106751991167 * 86400000LL },
	};
	static const struct { const char *in; int rc; } bad[] = {
		{ "", RB_DURATION_SYNTAX }, { "30", RB_DURATION_BARE }, { "250", RB_DURATION_BARE },
		{ "1.5", RB_DURATION_BARE }, { "0.000000030003000000", RB_DURATION_BARE }, { "00", RB_DURATION_BARE }, { "-5s", RB_DURATION_SYNTAX },
		{ "+5s", RB_DURATION_SYNTAX }, { "5 s", RB_DURATION_SYNTAX }, { " 5s", RB_DURATION_SYNTAX },
		{ "5s ", RB_DURATION_SYNTAX }, { "5x", RB_DURATION_SYNTAX }, { "5S", RB_DURATION_SYNTAX },
		{ "s", RB_DURATION_SYNTAX }, { ".5s", RB_DURATION_SYNTAX }, { "5.s", RB_DURATION_SYNTAX },
		{ "1s1m", RB_DURATION_SYNTAX }, { "1m1m", RB_DURATION_SYNTAX },
		{ "1m1min", RB_DURATION_SYNTAX }, { "1m30", RB_DURATION_SYNTAX },
		{ "1us", RB_DURATION_SYNTAX }, { "1..5s", RB_DURATION_SYNTAX },
		{ "0.1ms", RB_DURATION_FRACTION }, { "1.0001s", RB_DURATION_FRACTION },
		{ "0.00000000001d", RB_DURATION_FRACTION },
		{ "9223372036854775808ms", RB_DURATION_RANGE },
		{ "99999999999999999999", RB_DURATION_RANGE },
		{ "9223372036854775807d", RB_DURATION_RANGE },
		{ "106751991168d", RB_DURATION_RANGE },
		{ "106751991167d8h", RB_DURATION_RANGE },
		{ "106751991167.5d", RB_DURATION_RANGE },	/* the fraction overflows */
	};
	int64_t ms;

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		ms = -1;
		ok(rb_parse_duration_ms(good[i].in, &ms) == 0 && ms == good[i].ms,
		    "duration '%s' is %" PRId64 "ms (got %" PRId64 ")", good[i].in, good[i].ms, ms);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		is_int(rb_parse_duration_ms(bad[i].in, &ms), bad[i].rc, "duration '%s' refused", bad[i].in);
	ok(rb_parse_duration_ms(NULL, &ms) == RB_DURATION_SYNTAX, "NULL rejected");
}

static void
test_numbers(void)
{
	int v;
	int64_t w;

	ok(rb_parse_int("42", 1, 100, &v) == 0 && v == 42, "int in range");
	ok(rb_parse_int("0", 1, 100, &v) < 0, "below range");
	ok(rb_parse_int("101", 1, 100, &v) < 0, "above range");
	ok(rb_parse_int("4x", 1, 100, &v) < 0, "trailing garbage");
	ok(rb_parse_int(" 4", 1, 100, &v) < 0, "leading space");
	ok(rb_parse_int("", 1, 100, &v) < 0, "empty");
	ok(rb_parse_int64("-7", -10, 10, &w) == 0 && w == -7, "negative int64");
	ok(rb_parse_int64("99999999999999999999", 0, INT64_MAX, &w) < 0, "int64 overflow");
}

static void
test_redact(void)
{
	struct { const char *in, *want; } cases[] = {
		{ "postgresql://app:s3cret@db.example/relay", "postgresql://app:xxxxx@db.example/relay" },
		{ "postgres://app@db/relay", "postgres://app@db/relay" },
		{ "postgresql://app:p%40ss@db:5432/relay?sslmode=require", "postgresql://app:xxxxx@db:5432/relay?sslmode=require" },
		{ "postgresql://db/relay?user=app&password=hunter2&sslmode=off", "postgresql://db/relay?user=app&password=xxxxx&sslmode=off" },
		{ "host=db user=app password=hunter2 dbname=relay", "host=db user=app password=xxxxx dbname=relay" },
		{ "host=db password = 'a b\\' c' dbname=relay", "host=db password = xxxxx dbname=relay" },
		{ "postgresql://:only@h/d", "postgresql://:xxxxx@h/d" },
		{ "host=db dbname=relay", "host=db dbname=relay" },
		{ "postgresql://u:a@b@h/d", "postgresql://u:xxxxx@h/d" },
	};
	char *r;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		r = rb_url_redact(cases[i].in);
		is_str(r, cases[i].want, "redact %s", cases[i].want);
		free(r);
	}
	r = rb_url_redact(NULL);
	is_str(r, "(environment)", "NULL url names the environment");
	free(r);
}

static void
test_fnv(void)
{
	/* published FNV-1a 32-bit test vectors */
	is_int(rb_fnv1a32("", 0), 0x811c9dc5u, "fnv1a32('')");
	is_int(rb_fnv1a32("a", 1), 0xe40c292cu, "fnv1a32('a')");
	is_int(rb_fnv1a32("foobar", 6), 0xbf9cf968u, "fnv1a32('foobar')");
	is_int(rb_lane_of("a", "ignored"), 0x2c, "lane of key 'a' is its hash mod 256");
	is_int(rb_lane_of(NULL, "foobar"), 0x68, "lane of an unkeyed event is the hash of its id");
	is_int(rb_lane_of("", "x"), 0xc5, "empty key still hashes the key");
}

static void
test_lease(void)
{
	struct rb_lease l = { .lane = 218, .epoch = 7, .claims = 3 }, p;
	char buf[64];

	rb_lease_format(&l, buf, sizeof buf);
	is_str(buf, "218:7:3", "format lane:epoch:claims");
	l = (struct rb_lease){ .lane = 255, .epoch = INT64_MAX, .claims = 2147483647 };
	rb_lease_format(&l, buf, sizeof buf);
	is_str(buf, "255:9223372036854775807:2147483647", "format maxima");
	rb_lease_format(&l, buf, 8);
	is_str(buf, "255:922", "format truncated to the buffer, terminated");
	const int64_t nums[] = { 0, 7, -7, 10, 1234567890123, INT64_MAX, INT64_MIN };
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
		char want[32];

		snprintf(want, sizeof want, "%" PRId64, nums[i]);
		buf[rb_fmt_int(buf, nums[i])] = '\0';
		is_str(buf, want, "rb_fmt_int %s", want);
	}
	l = (struct rb_lease){ .lane = 218, .epoch = 7, .claims = 3 };
	ok(rb_lease_parse("218:7:3", &p) == 0 && p.lane == 218 && p.epoch == 7 && p.claims == 3,
	    "parse round trip");
	ok(rb_lease_parse("0:0:0", &p) == 0, "zeros parse");
	ok(rb_lease_parse("255:9223372036854775807:2147483647", &p) == 0, "maxima parse");
	const char *bad[] = { "", "1", "1:2", "1:2:", ":2:3", "256:1:1", "-1:1:1", "1:-2:3",
	    "1:2:3:4", "a:b:c", "1 :2:3", "1:2:3 ", "1:9223372036854775808:1", "1:1:2147483648",
	    "+1:2:3", "1::3" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ok(rb_lease_parse(bad[i], &p) < 0, "malformed token '%s' rejected", bad[i]);
	ok(rb_lease_parse(NULL, &p) < 0, "NULL token rejected");
	ok(rb_lease_parsen("218:7:3\",\"ok\"", 7, &p) == 0 && p.lane == 218 && p.epoch == 7 && p.claims == 3,
	    "parsen: the token in a line, by its length");
	ok(rb_lease_parsen("218:7:31", 7, &p) == 0 && p.claims == 3 && rb_lease_parsen("218:7:3", 6, &p) < 0,
	    "parsen: only the bytes given");
	ok(rb_lease_parsen("1:2:3333333333333333333333333333333333333333333333333333333333333", 65, &p) < 0,
	    "parsen: too long");
}

static void
test_names(void)
{
	ok(rb_ident_valid("public"), "public is a schema name");
	ok(rb_ident_valid("_rb_1"), "underscore and digits");
	ok(!rb_ident_valid("Public"), "uppercase rejected");
	ok(!rb_ident_valid("1abc"), "leading digit rejected");
	ok(!rb_ident_valid("a;drop"), "punctuation rejected");
	ok(!rb_ident_valid(""), "empty rejected");
	ok(!rb_ident_valid("pg_temp") && !rb_ident_valid("pg_catalog") && !rb_ident_valid("pg_x"),
	    "pg_* rejected: PostgreSQL's own");
	ok(!rb_ident_valid("information_schema"), "information_schema rejected");
	ok(rb_ident_valid("pg") && rb_ident_valid("my_pg_x") && rb_ident_valid("information_schema2"),
	    "names that only contain them accepted");
	ok(rb_handler_valid("mailer.v2:eu-1"), "handler with . : -");
	ok(!rb_handler_valid("mail er"), "space in handler rejected");
	ok(!rb_handler_valid(""), "empty handler rejected");
}

static void
test_validate(void)
{
	struct rb_error err;
	json_t *e;

	e = json_loads("{\"name\":\"a\",\"payload\":{}}", 0, NULL);
	ok(rb_event_validate(e, &err) == 0, "minimal event is valid");
	json_decref(e);
	e = json_loads("{\"payload\":1}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0 && strcmp(err.msg, "missing field 'name'") == 0, "missing name");
	json_decref(e);
	e = json_loads("{\"name\":\"a\"}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0 && strcmp(err.msg, "missing field 'payload'") == 0, "missing payload");
	json_decref(e);
	e = json_loads("{\"name\":3,\"payload\":1}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0 && strcmp(err.msg, "field 'name' must be a string") == 0, "name type");
	json_decref(e);
	e = json_loads("{\"name\":\"a\",\"payload\":1,\"available_at\":\"tomorrow\"}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0, "bad available_at");
	json_decref(e);
	e = json_loads("{\"name\":\"a\",\"payload\":1,\"available_at\":\"2026-01-31T12:00:00.5+01:00\"}", 0, NULL);
	ok(rb_event_validate(e, &err) == 0, "available_at with fraction and offset");
	json_decref(e);
	e = json_loads("{\"name\":\"a\",\"payload\":1,\"delay_ms\":-1}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0, "negative delay");
	json_decref(e);
	e = json_loads("{\"name\":\"a\",\"payload\":1,\"handlers\":[\"x y\"]}", 0, NULL);
	ok(rb_event_validate(e, &err) < 0, "bad handler name in handlers");
	json_decref(e);
	e = json_loads("{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2\"}", 0, NULL);
	ok(rb_result_validate(e, &err) < 0 && strstr(err.msg, "lease") != NULL, "malformed lease in a result");
	json_decref(e);
	e = json_loads("{\"event_id\":\"e\",\"handler\":\"h\",\"lease\":\"1:2:3\",\"ok\":\"yes\"}", 0, NULL);
	ok(rb_result_validate(e, &err) < 0, "ok must be boolean");
	json_decref(e);
}

/* W3C traceparent (rb_trace.h) and the stores' timestamps (rb_parse_iso_ms) */
static void
test_trace(void)
{
	static const char *const good[] = {
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
		"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later",	/* a later version */
	};
	static const char *const bad[] = {
		"", "00", "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
		"00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
		"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",	/* 00 is exactly 55 */
		"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
		"00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
	};
	char tp[RB_TRACEPARENT_LEN + 1], tp2[RB_TRACEPARENT_LEN + 1], ts[RB_TRACESTATE_MAX + 1];
	const char *line;

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
		ok(rb_traceparent_valid(good[i]), "traceparent valid: %s", good[i]);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ok(!rb_traceparent_valid(bad[i]), "traceparent invalid: '%s'", bad[i]);
	rb_traceparent_new(tp);
	rb_traceparent_new(tp2);
	ok(strlen(tp) == RB_TRACEPARENT_LEN && rb_traceparent_valid(tp) && strncmp(tp, "00-", 3) == 0 &&
	    strcmp(tp + 52, "-01") == 0, "a new traceparent: version 00, sampled: %s", tp);
	ok(strncmp(tp + 3, tp2 + 3, 32) != 0, "two new traceparents: two traces");
	line = "{\"event_id\":\"e\",\"headers\":{\"TraceParent\":\"01-0af7651916cd43dd8448eb211c80319c-"
	    "b7ad6b7169203331-01-later\",\"tracestate\":\"a=b\"},\"payload\":{}}";
	ok(rb_trace_of_line(line, strlen(line), tp, ts), "a line's traceparent, any case");
	is_str(tp, "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "its first 55 bytes");
	is_str(ts, "a=b", "and its tracestate");
	line = "{\"event_id\":\"e\",\"headers\":{\"tracestate\":\"a=b\"},\"payload\":{}}";
	ok(!rb_trace_of_line(line, strlen(line), tp, ts) && ts[0] == '\0', "no traceparent: no tracestate either");
	line = "{\"event_id\":\"e\",\"payload\":{}}";
	ok(!rb_trace_of_line(line, strlen(line), tp, ts), "no headers");
	ok(rb_parse_iso_ms("1970-01-01T00:00:01.500Z") == 1500, "ISO time with ms");
	ok(rb_parse_iso_ms("2026-12-05T16:08:43Z") == INT64_C(1796486923000), "ISO time without ms");
	ok(rb_parse_iso_ms("yesterday") == -1 && rb_parse_iso_ms(NULL) == -1, "not an ISO time");
	ok(rb_parse_iso_ms("2026-12-05T16:08:43.5Z") == INT64_C(1796486923500)
	    && rb_parse_iso_ms("2026-12-05T16:08:43.51Z") == INT64_C(1796486923510)
	    && rb_parse_iso_ms("2026-12-05T16:08:43.5129Z") == INT64_C(1796486923512), "one to four digits of a second");
	ok(rb_parse_iso_ms("2026-12-05T16:08") == -1 && rb_parse_iso_ms("2026-") == -1
	    && rb_parse_iso_ms("2026-12-05 16:08:43Z") == -1, "cut short or another layout");
	/* every day from 1970 to 2104 at 23:59:59.999, and the first and
	 * the last days past their month's end, against timegm */
	{
		int differ = 0;

		for (int y = 1970; y < 2105; y++)
			for (int m = 1; m <= 12; m++)
				for (int d = 1; d <= 32; d++) {
					struct tm tm = { .tm_year = y - 1900, .tm_mon = m - 1, .tm_mday = d,
						.tm_hour = 23, .tm_min = 59, .tm_sec = 59 };
					char buf[64];

					snprintf(buf, sizeof buf, "%04d-%02d-%02dT23:59:59.999Z", y, m, d);
					if (rb_parse_iso_ms(buf) != (int64_t)timegm(&tm) * 1000 + 999)
						differ++;
				}
		ok(differ == 0, "every day of 135 years as timegm says (%d differ)", differ);
	}
}

int
main(void)
{
	test_durations();
	test_numbers();
	test_redact();
	test_fnv();
	test_lease();
	test_names();
	test_validate();
	test_trace();
	return done_testing();
}
