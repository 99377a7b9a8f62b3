/* SPDX-License-Identifier: MIT */
/*
 * fuzz_jsonl: rb_jsonl.c against jansson and a reference line splitter.
 *   - the reader: the input goes through a pipe in small writes, read with
 *     timeout 0 between them (a line split across reads), then to the end;
 *     lines, numbers, over-long lines and blank lines must match a plain
 *     split on '\n' (one final '\r' stripped, lines of spaces and tabs
 *     skipped but counted); the first byte picks max_line (1 to 48, or the
 *     default), and its top three bits set make the input over 64 KiB (the
 *     buffer grows);
 *   - rb_json_scan against json_loadb(JSON_REJECT_DUPLICATES): when it
 *     vouches for a line, jansson takes it as an object of as many members,
 *     each with the same key, type and value;
 *   - the writers: rb_json_sb_dump byte for byte as json_dumps(COMPACT |
 *     ENCODE_ANY), rb_json_sb_string as jansson escapes a string,
 *     rb_json_sb_compact the same value without whitespace outside strings.
 */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_jsonl.h"
#include "rb_util.h"
#include "fuzz.h"

/* ---- the reader ------------------------------------------------------------------ */

struct got {
	int	st;		/* RB_JSONL_LINE or RB_JSONL_TOOLONG */
	long	lineno;
	size_t	off, len;	/* into the input, for a line */
};

static bool
blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t')
			return false;
	return true;
}

static void
check_reader(const uint8_t *data, size_t size)
{
	size_t max_line = size > 0 && data[0] % 64 < 48 ? (size_t)(data[0] % 64) + 1 : 0;
	/* writes of 1 to 23 bytes (a quarter of the inputs), else of 251 */
	size_t step = size > 1 && data[1] < 64 ? (size_t)(data[1] % 23) + 1 : 251;
	size_t total, pos = 0, nwant = 0, ngot = 0;
	bool big = size > 0 && (data[0] & 0xE0) == 0xE0;	/* an eighth of the inputs */
	char *in;
	struct got *want, *got;
	struct rb_jsonl_reader *r;
	int fds[2];

	/* the input, or for "big" as many copies as make it over 64 KiB */
	total = big && size > 0 ? size * (70000 / size + 1) : size;
	in = malloc(total + 1);
	for (size_t i = 0; i < total; i++)
		in[i] = (char)data[i % (size > 0 ? size : 1)];
	if (big)
		step = 4093;
	/* the reference */
	{
		size_t lines = 2;

		for (const char *q = in; (q = memchr(q, '\n', total - (size_t)(q - in))) != NULL; q++)
			lines++;
		want = calloc(lines, sizeof *want);
		got = calloc(lines, sizeof *got);
	}
	{
		size_t start = 0;
		long lineno = 0;
		size_t lim = max_line == 0 ? RB_JSONL_DEFAULT_MAX : max_line;

		while (start < total) {
			const char *nl = memchr(in + start, '\n', total - start);
			size_t n = nl != NULL ? (size_t)(nl - (in + start)) : total - start;
			size_t next = start + n + (nl != NULL ? 1 : 0);

			lineno++;
			if (n > 0 && in[start + n - 1] == '\r')
				n--;
			if (n > lim)
				want[nwant++] = (struct got){ RB_JSONL_TOOLONG, lineno, 0, 0 };
			else if (!blank(in + start, n))
				want[nwant++] = (struct got){ RB_JSONL_LINE, lineno, start, n };
			start = next;
		}
	}
	if (pipe(fds) < 0)
		abort();
	r = rb_jsonl_reader_new(fds[0], max_line);
	for (;;) {
		const char *line;
		size_t len;
		int st;

		if (pos < total) {
			size_t n = total - pos < step ? total - pos : step;

			if (write(fds[1], in + pos, n) != (ssize_t)n)
				abort();
			pos += n;
		}
		if (pos == total && fds[1] >= 0) {
			close(fds[1]);
			fds[1] = -1;
		}
		while ((st = rb_jsonl_next(r, pos < total ? 0 : -1, &line, &len)) == RB_JSONL_LINE ||
		    st == RB_JSONL_TOOLONG) {
			FUZZ_CHECK(ngot < nwant, "more lines than the reference (%zu)", nwant);
			got[ngot] = (struct got){ st, rb_jsonl_lineno(r), 0, len };
			if (st == RB_JSONL_LINE) {
				const struct got *w = &want[ngot];

				FUZZ_CHECK(line[len] == '\0', "line %ld not terminated", got[ngot].lineno);
				FUZZ_CHECK(w->st == RB_JSONL_LINE && w->len == len &&
				    memcmp(in + w->off, line, len) == 0, "line %ld differs", got[ngot].lineno);
			}
			FUZZ_CHECK(want[ngot].st == st && want[ngot].lineno == got[ngot].lineno,
			    "item %zu: status %d line %ld, want %d line %ld", ngot, st, got[ngot].lineno,
			    want[ngot].st, want[ngot].lineno);
			ngot++;
		}
		FUZZ_CHECK(st != RB_JSONL_ERR, "read error %d", errno);
		if (st == RB_JSONL_EOF)
			break;
		FUZZ_CHECK(st == RB_JSONL_AGAIN && pos < total, "status %d before the end", st);
	}
	FUZZ_CHECK(ngot == nwant, "%zu lines, want %zu", ngot, nwant);
	rb_jsonl_reader_free(r);
	close(fds[0]);
	free(got);
	free(want);
	free(in);
}

/* ---- the scanner ------------------------------------------------------------------ */

static void
check_scan(const char *s, size_t n)
{
	struct rb_json_member m[8];
	int count = rb_json_scan(s, n, m, 8);
	json_t *v;

	if (count < 0)
		return;
	v = json_loadb(s, n, JSON_REJECT_DUPLICATES, NULL);
	FUZZ_CHECK(v != NULL && json_is_object(v), "scan took what jansson refuses");
	FUZZ_CHECK(json_object_size(v) == (size_t)count, "scan: %d members, jansson %zu", count,
	    json_object_size(v));
	for (int i = 0; i < count && i < 8; i++) {
		char *q = malloc(m[i].klen + 3);
		json_t *key, *val, *jv;

		q[0] = '"';
		memcpy(q + 1, m[i].key, m[i].klen);
		q[m[i].klen + 1] = '"';
		key = json_loadb(q, m[i].klen + 2, JSON_DECODE_ANY, NULL);
		free(q);
		FUZZ_CHECK(key != NULL && json_is_string(key), "member %d: key", i);
		jv = json_object_getn(v, json_string_value(key), json_string_length(key));
		FUZZ_CHECK(jv != NULL, "member %d: no such key in jansson's object", i);
		val = json_loadb(m[i].val, m[i].vlen, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
		FUZZ_CHECK(val != NULL && json_equal(val, jv), "member %d: value", i);
		switch (m[i].type) {
		case '"': FUZZ_CHECK(json_is_string(jv), "type \""); break;
		case 'n': FUZZ_CHECK(json_is_number(jv), "type n"); break;
		case 't': FUZZ_CHECK(json_is_true(jv), "type t"); break;
		case 'f': FUZZ_CHECK(json_is_false(jv), "type f"); break;
		case '0': FUZZ_CHECK(json_is_null(jv), "type 0"); break;
		case '{': FUZZ_CHECK(json_is_object(jv), "type {"); break;
		case '[': FUZZ_CHECK(json_is_array(jv), "type ["); break;
		default: FUZZ_FAIL("type %c", m[i].type);
		}
		/* a string without escapes is its own bytes */
		if (m[i].type == '"' && !m[i].escaped)
			FUZZ_CHECK(json_string_length(jv) == m[i].vlen - 2 &&
			    memcmp(json_string_value(jv), m[i].val + 1, m[i].vlen - 2) == 0, "raw string");
		if (!m[i].escaped)
			FUZZ_CHECK(json_string_length(key) == m[i].klen, "raw key");
		json_decref(val);
		json_decref(key);
	}
	json_decref(v);
}

/* ---- the writers ------------------------------------------------------------------ */

static bool
ws_outside_strings(const char *s, size_t n)
{
	bool in = false;

	for (size_t i = 0; i < n; i++) {
		if (in) {
			if (s[i] == '\\')
				i++;
			else if (s[i] == '"')
				in = false;
		} else if (s[i] == '"')
			in = true;
		else if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')
			return true;
	}
	return false;
}

static void
check_writers(const char *s, size_t n)
{
	json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL), *str;
	struct rb_sbuf b;
	char *want;

	rb_sb_init(&b);
	rb_json_sb_compact(&b, s, n);	/* any text: no crash */
	if (v != NULL) {
		json_t *back = json_loadb(b.s, b.len, JSON_DECODE_ANY, NULL);

		FUZZ_CHECK(back != NULL && json_equal(back, v), "compact changed the value");
		FUZZ_CHECK(!ws_outside_strings(b.s, b.len), "compact left whitespace");
		json_decref(back);
		b.len = 0;
		rb_json_sb_dump(&b, v);
		want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		FUZZ_CHECK(want != NULL && strlen(want) == b.len && memcmp(want, b.s, b.len) == 0,
		    "dump differs from jansson");
		free(want);
		json_decref(v);
	}
	/* the input as a string, when it is UTF-8 */
	if ((str = json_stringn(s, n)) != NULL) {
		b.len = 0;
		rb_json_sb_string(&b, s, n);
		want = json_dumps(str, JSON_ENCODE_ANY);
		FUZZ_CHECK(want != NULL && strlen(want) == b.len && memcmp(want, b.s, b.len) == 0,
		    "string escaping differs from jansson");
		free(want);
		json_decref(str);
	}
	free(b.s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_reader(data, size);
	/* the scanner and the writers on the input after its first byte */
	if (size > 0) {
		char *s = malloc(size);	/* exactly the bytes: overreads are ASan's */

		memcpy(s, data + 1, size - 1);
		check_scan(s, size - 1);
		check_writers(s, size - 1);
		free(s);
	}
	return 0;
}
