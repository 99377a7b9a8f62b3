/* SPDX-License-Identifier: MIT */
/* Unit tests: the JSON-lines reader (blank lines, CRLF, overlong lines, no final newline). */
#include "config.h"

#include <stdlib.h>
#include <unistd.h>

#include "rb_jsonl.h"
#include "rb_util.h"
#include "tap.h"

/* A reader over the bytes of s through a pipe. */
static struct rb_jsonl_reader *
reader_of(const char *s, size_t max)
{
	int fds[2];
	size_t n = strlen(s);

	if (pipe(fds) < 0)
		abort();
	if (fork() == 0) {
		close(fds[0]);
		while (n > 0) {
			ssize_t w = write(fds[1], s, n > 7 ? 7 : n);	/* small writes: lines cross reads */
			if (w <= 0)
				_exit(1);
			s += w;
			n -= (size_t)w;
		}
		_exit(0);
	}
	close(fds[1]);
	return rb_jsonl_reader_new(fds[0], max);
}

/* rb_json_sb_dump prints every value exactly as json_dumps does. */
static void
test_dump(void)
{
	static const char *const docs[] = {
	    "{}", "[]", "{\"a\":[1,-2,3.5,1e300,-0.0,true,false,null,\"x\"],\"b\":{\"c\":{}}}",
	    "{\"s\":\"q\\\"uote back\\\\slash tab\\t nl\\n ctl\\u0001 \\u00e9 \\u2028 /\"}",
	    "{\"big\":9223372036854775807,\"neg\":-9223372036854775808,\"r\":1.5,\"z\":0}",
	    "{\"k\\u0001ey\":1,\"\":\"\"}", "\"just a string\"", "42", "[[[[]]],{\"a\":[{}]}]" };

	for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
		json_t *v = json_loads(docs[i], JSON_DECODE_ANY, NULL);
		char *theirs = v != NULL ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		struct rb_sbuf b;

		rb_sb_init(&b);
		if (v != NULL)
			rb_json_sb_dump(&b, v);
		ok(theirs != NULL && strcmp(b.s, theirs) == 0, "dump %zu as jansson: %s", i, b.s);
		free(b.s);
		free(theirs);
		json_decref(v);
	}
}

/* The members rb_json_scan found are the object jansson parses. */
static bool
scan_agrees(const char *s, size_t n, int count, const struct rb_json_member *m)
{
	json_t *o = json_loadb(s, n, JSON_REJECT_DUPLICATES, NULL);
	bool same = o != NULL && json_is_object(o) && (size_t)count == json_object_size(o);

	for (int i = 0; same && i < count && i < 32; i++) {
		char key[256];
		json_t *v = json_loadb(m[i].val, m[i].vlen, JSON_DECODE_ANY, NULL);

		snprintf(key, sizeof key, "%.*s", (int)m[i].klen, m[i].key);
		same = v != NULL && (m[i].escaped || json_equal(v, json_object_get(o, key)));
		json_decref(v);
	}
	json_decref(o);
	return same;
}

static void
test_scan(void)
{
	static const char *const good[] = {
	    "{}", " {\"a\" : 1 } ", "{\"event_id\":\"e1\",\"lease\":\"3.4.0\",\"ok\":true,\"retry_ms\":250}",
	    "{\"a\":{\"b\":[1,2,{\"c\":null}]},\"d\":\"\\u00e9\\ud83d\\ude00\\n\",\"e\":-0.5,\"f\":false}",
	    "{\"u\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
	    "{\"t\":1764492000123456,\"m\":-922337203685477580,\"r\":3.14159265358979323846}" };
	static const char *const bad[] = {
	    "", "[]", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":1}x", "{\"a\":01}", "{\"a\":1.}",
	    "{\"a\":-}", "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}",
	    "{\"a\":\"\\u0000\"}", "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800x\"}", "{\"a\":\"\xff\"}",
	    "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\xf4\x90\x80\x80\"}",
	    "{\"a\":1,\"a\":2}", "{\"a\":{\"x\":1,\"x\":2}}", "{\"a\":1e5}", "{\"a\":1234567890123456789}", "{\"a\":-9223372036854775809}", "{\"a\":\"x}" };
	struct rb_json_member m[32];
	unsigned seed = 12345;
	long agreed = 0, doubted = 0;

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		int c = rb_json_scan(good[i], strlen(good[i]), m, 32);

		ok(c >= 0 && scan_agrees(good[i], strlen(good[i]), c, m), "scan takes %s", good[i]);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ok(rb_json_scan(bad[i], strlen(bad[i]), m, 32) < 0, "scan leaves %s to jansson", bad[i]);
	{
		const char *line = "{\"event_id\":\"e1\",\"lease\":\"3.4.0\",\"ok\":true}";
		int c = rb_json_scan(line, strlen(line), m, 32);

		ok(c == 3 && m[1].type == '"' && m[1].vlen == 7 && memcmp(m[1].val, "\"3.4.0\"", 7) == 0 &&
		    m[2].type == 't' && m[0].klen == 8, "scan: members, types and spans");
	}
	/* mutations of a delivery line: whatever the scan takes, jansson takes the same way */
	for (int k = 0; k < 20000; k++) {
		char buf[256];
		const char *base = good[3];
		size_t n = strlen(base);
		int c;

		memcpy(buf, base, n);
		for (int j = 0; j < 1 + k % 3; j++) {
			static const char alphabet[] = "{}[]\",:\\ 0123456789.-+eEtrufalsn\x01\xc3\xa9\xff";

			seed = seed * 1103515245 + 12345;
			buf[(seed >> 8) % n] = alphabet[(seed >> 20) % (sizeof alphabet - 1)];
		}
		c = rb_json_scan(buf, n, m, 32);
		if (c < 0)
			doubted++;
		else if (scan_agrees(buf, n, c, m))
			agreed++;
	}
	ok(agreed + doubted == 20000, "20,000 mutated lines: every one the scan took, jansson took the same "
	    "(%ld taken, %ld left to jansson)", agreed, doubted);
}

/* Strings escaped and texts compacted as jansson prints them, whatever
 * the place of a quote, backslash, control or non-ASCII byte (they are
 * looked for eight bytes at a time). */
static void
test_string_places(void)
{
	static const char *const special[] = { "\"", "\\", "\n", "\x01", "\x1f", "\x7f", "\xc3\xa9", "\xe2\x80\xa8" };
	long bad_string = 0, bad_compact = 0, n = 0;

	for (size_t k = 0; k < sizeof special / sizeof special[0]; k++)
		for (size_t len = 0; len <= 24; len++)
			for (size_t at = 0; at <= len; at++) {
				char s[64], pretty[256];
				json_t *v, *o;
				char *theirs;
				struct rb_sbuf b;

				/* at a's, the special one, len - at a's */
				memset(s, 'a', sizeof s);
				memcpy(s + at, special[k], strlen(special[k]));
				s[len + strlen(special[k])] = '\0';
				n++;
				v = json_string(s);
				theirs = json_dumps(v, JSON_ENCODE_ANY);
				rb_sb_init(&b);
				rb_json_sb_string(&b, s, strlen(s));
				if (theirs == NULL || strcmp(b.s, theirs) != 0)
					bad_string++;
				/* the same string in a text as PostgreSQL prints jsonb */
				snprintf(pretty, sizeof pretty, "{\"k\": %s, \"n\": [1, 2], \"t\": \"x y\"}", theirs);
				free(theirs);
				o = json_pack("{s:O, s:[i,i], s:s}", "k", v, "n", 1, 2, "t", "x y");
				theirs = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
				b.len = 0;
				rb_json_sb_compact(&b, pretty, strlen(pretty));
				rb_sb_putn(&b, "", 0);
				if (theirs == NULL || b.len != strlen(theirs) || memcmp(b.s, theirs, b.len) != 0)
					bad_compact++;
				free(theirs);
				free(b.s);
				json_decref(o);
				json_decref(v);
			}
	ok(bad_string == 0, "%ld strings escaped as jansson does (%ld differ)", n, bad_string);
	ok(bad_compact == 0, "%ld texts compacted as jansson prints them (%ld differ)", n, bad_compact);
}

/* rb_json_sb_compact on a text cut after a backslash inside a string
 * (invalid JSON, never from PostgreSQL): the bytes as they were (security
 * audit F15: the pointer stepped one past the end there, never read, so
 * nothing observable; an exact-size buffer, so ASan would see a read) */
static void
test_compact_cut(void)
{
	static const char text[] = "{\"k\": \"a b\\";
	size_t n = strlen(text);
	char *exact = malloc(n);
	struct rb_sbuf b;

	memcpy(exact, text, n);
	rb_sb_init(&b);
	rb_json_sb_compact(&b, exact, n);
	rb_sb_putn(&b, "", 0);
	ok(b.len == n - 1 && memcmp(b.s, "{\"k\":\"a b\\", b.len) == 0,
	    "a text cut after a backslash is kept, the space outside the string dropped: '%.*s'", (int)b.len, b.s);
	free(b.s);
	free(exact);
}

/* rb_json_members: the wanted members; numbers elsewhere are syntax only */
static void
test_members(void)
{
	static const char *const want[] = { "event_id", "retry_ms", "ok", NULL };
	static const char big[] = "{\"event_id\":\"e-1\",\"payload\":{\"n\":123456789012345678901234567890,"
	    "\"x\":1e400,\"a\":[1e-400,{\"k\\u00e9\":-99999999999999999999}]},\"ok\":true}";
	static const char *const bad[] = {
		"{\"event_id\":\"e\",\"p\":1e400,\"retry_ms\":1e400}",	/* a wanted member overflows */
		"{\"event_id\":\"e\",\"p\":1e400,\"event_id\":\"f\"}",	/* duplicate top-level key */
		"{\"event_id\":\"e\",\"p\":1e400,\"q\":[1,]}",		/* invalid after the big number */
		"{\"event_id\":\"e\",\"p\":1e400",				/* truncated */
		"[1e400]",
	};
	json_t *o;
	char err[256];

	ok(rb_json_members(big, strlen(big), want, &o, err, sizeof err) == 0 &&
	    strcmp(json_string_value(json_object_get(o, "event_id")), "e-1") == 0 &&
	    json_is_true(json_object_get(o, "ok")) && json_object_get(o, "retry_ms") == NULL,
	    "members of a line with numbers jansson cannot hold");
	json_decref(o);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ok(rb_json_members(bad[i], strlen(bad[i]), want, &o, err, sizeof err) < 0 && o == NULL &&
		    strncmp(err, "invalid JSON:", 13) == 0, "members refuses %s (%s)", bad[i], err);
	}
	ok(rb_json_members("{\"ok\":true,\"retry_ms\":5}", 24, want, &o, err, sizeof err) == 0 &&
	    json_integer_value(json_object_get(o, "retry_ms")) == 5, "members of a plain line");
	json_decref(o);
}

int
main(void)
{
	struct rb_jsonl_reader *r;
	const char *line;
	size_t len;
	json_t *o;
	char err[200];

	r = reader_of("{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}", 0);
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"a\":1}") == 0, "first line");
	is_int(rb_jsonl_lineno(r), 1, "line 1");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"b\":2}") == 0,
	    "blank lines skipped, CR stripped");
	is_int(rb_jsonl_lineno(r), 4, "blank lines still count");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"c\":3}") == 0 && len == 7,
	    "last line without newline");
	is_int(rb_jsonl_lineno(r), 5, "line 5");
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "then end of input");
	rb_jsonl_reader_free(r);

	r = reader_of("{\"x\":\"0123456789012345678901234567890123456789\"}\n{\"ok\":1}\n", 20);
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_TOOLONG, "overlong line reported");
	is_int(rb_jsonl_lineno(r), 1, "with its number");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"ok\":1}") == 0,
	    "the next line is read after an overlong one");
	is_int(rb_jsonl_lineno(r), 2, "line 2");
	rb_jsonl_reader_free(r);

	/* an overlong line far beyond the buffer, without newline */
	{
		size_t big = 300000;
		char *s = malloc(big + 1);

		memset(s, 'x', big);
		s[big] = '\0';
		r = reader_of(s, 1000);
		is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_TOOLONG, "huge line without newline");
		is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "then eof");
		rb_jsonl_reader_free(r);
		free(s);
	}

	r = reader_of("", 0);
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "empty input");
	rb_jsonl_reader_free(r);

	{
		int fds[2];

		if (pipe(fds) < 0)
			abort();
		r = rb_jsonl_reader_new(fds[0], 0);
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_AGAIN, "timeout with no input");
		if (write(fds[1], "{\"p\":", 5) != 5)
			abort();
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_AGAIN, "timeout with half a line");
		ok(!rb_jsonl_buffered(r), "no complete line buffered");
		if (write(fds[1], "1}\n", 3) != 3)
			abort();
		ok(rb_jsonl_next(r, 10, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"p\":1}") == 0,
		    "the line completes");
		close(fds[1]);
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_EOF, "eof after close");
		rb_jsonl_reader_free(r);
		close(fds[0]);
	}

	ok(rb_jsonl_parse("{\"a\":1}", 7, &o, err, sizeof err) == 0 && json_is_object(o), "parse object");
	json_decref(o);
	ok(rb_jsonl_parse("[1]", 3, &o, err, sizeof err) < 0 && strcmp(err, "not a JSON object") == 0,
	    "array rejected");
	ok(rb_jsonl_parse("{\"a\":", 5, &o, err, sizeof err) < 0 && strncmp(err, "invalid JSON:", 13) == 0,
	    "truncated JSON rejected");
	ok(rb_jsonl_parse("{\"a\":1,\"a\":2}", 13, &o, err, sizeof err) < 0, "duplicate keys rejected");
	ok(rb_jsonl_parse("{\"a\":\"\xff\"}", 8, &o, err, sizeof err) < 0, "invalid UTF-8 rejected");
	ok(rb_jsonl_parse("{\"a\":\"\\u0000\"}", 13, &o, err, sizeof err) < 0, "NUL in a string rejected");
	{
		/* rb_jsonl_put_string prints what jansson prints for the same string */
		static const char *const cases[] = { "plain", "q\"uote", "back\\slash", "tab\tnl\ncr\r",
		    "ctl\x01\x1f\b\f", "utf-8 \xc3\xa9 / slash", "" };

		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
			char *mine = NULL, *theirs;
			size_t sz = 0;
			FILE *f = open_memstream(&mine, &sz);
			json_t *js = json_string(cases[i]);

			ok(rb_jsonl_put_string(f, cases[i]) == 0 && fclose(f) == 0, "put_string %zu", i);
			theirs = json_dumps(js, JSON_ENCODE_ANY);
			ok(mine != NULL && theirs != NULL && strcmp(mine, theirs) == 0, "put_string %zu as jansson: %s",
			    i, mine != NULL ? mine : "(null)");
			free(mine);
			free(theirs);
			json_decref(js);
		}
	}
	test_dump();
	test_string_places();
	test_scan();
	test_members();
	test_compact_cut();
	return done_testing();
}
