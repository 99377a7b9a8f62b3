/* SPDX-License-Identifier: MIT */
/* rb_jsonl.c: a line reader with a length limit and timeouts, and a writer. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_jsonl.h"
#include "rb_util.h"

struct rb_jsonl_reader {
	int	fd;
	size_t	max_line;
	char	*buf;
	size_t	cap;		/* allocated */
	size_t	start;		/* first unconsumed byte */
	size_t	end;		/* one past the last buffered byte */
	size_t	scan;		/* bytes from start already known to hold no '\n' */
	long	lineno;
	bool	eof;
	bool	skipping;	/* discarding an overlong line up to its newline */
};

struct rb_jsonl_reader *
rb_jsonl_reader_new(int fd, size_t max_line)
{
	struct rb_jsonl_reader *r = xcalloc(1, sizeof *r);

	r->fd = fd;
	r->max_line = max_line == 0 ? RB_JSONL_DEFAULT_MAX : max_line;
	r->cap = 65536;
	r->buf = xmalloc(r->cap);
	return r;
}

void
rb_jsonl_reader_free(struct rb_jsonl_reader *r)
{
	if (r == NULL)
		return;
	free(r->buf);
	free(r);
}

long
rb_jsonl_lineno(const struct rb_jsonl_reader *r)
{
	return r->lineno;
}

bool
rb_jsonl_buffered(const struct rb_jsonl_reader *r)
{
	return memchr(r->buf + r->start, '\n', r->end - r->start) != NULL;
}

/* Read more bytes; 1 read, 0 eof, -1 error, -3 timeout. */
static int
fill(struct rb_jsonl_reader *r, int timeout_ms)
{
	ssize_t n;

	if (r->start > 0 && (r->start == r->end || r->end == r->cap)) {
		memmove(r->buf, r->buf + r->start, r->end - r->start);
		r->end -= r->start;
		r->start = 0;
	}
	if (r->end == r->cap) {
		r->cap *= 2;
		r->buf = xrealloc(r->buf, r->cap);
	}
	if (timeout_ms >= 0) {
		struct pollfd pfd = { .fd = r->fd, .events = POLLIN };
		int pr;

		do
			pr = poll(&pfd, 1, timeout_ms);
		while (pr < 0 && errno == EINTR);
		if (pr < 0)
			return -1;
		if (pr == 0)
			return RB_JSONL_AGAIN;
	}
	do
		n = read(r->fd, r->buf + r->end, r->cap - r->end);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	if (n == 0) {
		r->eof = true;
		return 0;
	}
	r->end += (size_t)n;
	return 1;
}

int
rb_jsonl_next(struct rb_jsonl_reader *r, int timeout_ms, const char **line, size_t *len)
{
	for (;;) {
		char *nl = NULL;
		size_t avail = r->end - r->start;

		if (r->scan < avail)
			nl = memchr(r->buf + r->start + r->scan, '\n', avail - r->scan);
		if (nl == NULL)
			r->scan = avail;
		if (r->skipping) {
			if (nl != NULL) {
				r->start = (size_t)(nl - r->buf) + 1;
				r->scan = 0;
				r->skipping = false;
				continue;
			}
			r->start = r->end;	/* drop what we have */
			r->scan = 0;
		} else if (nl != NULL || (r->eof && avail > 0)) {
			char *s = r->buf + r->start;
			size_t n = nl != NULL ? (size_t)(nl - s) : avail;

			r->start += n + (nl != NULL ? 1 : 0);
			r->scan = 0;
			r->lineno++;
			if (n > 0 && s[n - 1] == '\r')
				n--;
			if (n > r->max_line)
				return RB_JSONL_TOOLONG;
			s[n] = '\0';	/* overwrites '\n' or '\r'; at eof there is room: cap > end or we grow */
			if (strspn(s, " \t") == n)
				continue;	/* blank line */
			*line = s;
			*len = n;
			return RB_JSONL_LINE;
		} else if (avail > r->max_line + 1) {
			/* an overlong line: report it now, skip the rest as it comes */
			r->lineno++;
			r->skipping = true;
			r->start = r->end;
			r->scan = 0;
			return RB_JSONL_TOOLONG;
		}
		if (r->eof)
			return RB_JSONL_EOF;
		if (r->end == r->cap && r->start == 0 && r->cap <= r->max_line + 2) {
			/* grow is handled by fill */
		}
		int f = fill(r, timeout_ms);
		if (f == RB_JSONL_AGAIN)
			return RB_JSONL_AGAIN;
		if (f < 0)
			return RB_JSONL_ERR;
		if (f == 0 && r->end == r->cap) {
			/* need one byte for the terminator of a last line without newline */
			r->cap += 1;
			r->buf = xrealloc(r->buf, r->cap);
		}
	}
}

int
rb_jsonl_parse(const char *line, size_t len, json_t **obj, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *v;

	*obj = NULL;
	v = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (v == NULL) {
		snprintf(err, errlen, "invalid JSON: %s", jerr.text);
		return -1;
	}
	if (!json_is_object(v)) {
		json_decref(v);
		snprintf(err, errlen, "not a JSON object");
		return -1;
	}
	*obj = v;
	return 0;
}

int
rb_jsonl_write(FILE *f, const json_t *obj)
{
	if (json_dumpf(obj, f, JSON_COMPACT) < 0)
		return -1;
	if (putc('\n', f) == EOF)
		return -1;
	return 0;
}

/*
 * The first byte from p on (p itself if p == end) that is a quote, a
 * backslash, a control character or, with high, a byte of 0x80 or more:
 * eight bytes at a time (the strings of a delivery line are most of its
 * bytes, and most of their bytes are none of these).
 */
static const unsigned char *
skip_plain(const unsigned char *p, const unsigned char *end, bool high)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	const uint64_t lo = 0x0101010101010101ULL, hi = 0x8080808080808080ULL;

	while (end - p >= 8) {
		uint64_t x, q, bs, t;

		memcpy(&x, p, 8);
		q = x ^ (lo * '"');
		bs = x ^ (lo * '\\');
		/* a byte below 0x20, a zero byte of q or of bs (each test can
		 * only add false marks above a true one: the lowest is true) */
		t = (((x - lo * 0x20) & ~x) | ((q - lo) & ~q) | ((bs - lo) & ~bs)) & hi;
		if (high)
			t |= x & hi;
		if (t != 0)
			return p + (__builtin_ctzll(t) >> 3);
		p += 8;
	}
#endif
	for (; p < end; p++)
		if (*p < 0x20 || *p == '"' || *p == '\\' || (high && *p >= 0x80))
			break;
	return p;
}

/* Append s (n bytes) to b as a JSON string, escaped as jansson does:
 * ", \\ and control characters; UTF-8 passes through. */
void
rb_json_sb_string(struct rb_sbuf *b, const char *s, size_t n)
{
	const char *run = s, *end = s + n;

	rb_sb_putn(b, "\"", 1);
	for (; s < end; s++) {
		unsigned char c;
		char esc[8];

		s = (const char *)skip_plain((const unsigned char *)s, (const unsigned char *)end, false);
		if (s == end)
			break;
		c = (unsigned char)*s;
		if (s > run)
			rb_sb_putn(b, run, (size_t)(s - run));
		run = s + 1;
		switch (c) {
		case '"': strcpy(esc, "\\\""); break;
		case '\\': strcpy(esc, "\\\\"); break;
		case '\b': strcpy(esc, "\\b"); break;
		case '\f': strcpy(esc, "\\f"); break;
		case '\n': strcpy(esc, "\\n"); break;
		case '\r': strcpy(esc, "\\r"); break;
		case '\t': strcpy(esc, "\\t"); break;
		default: snprintf(esc, sizeof esc, "\\u%04X", c); break;
		}
		rb_sb_puts(b, esc);
	}
	if (end > run)
		rb_sb_putn(b, run, (size_t)(end - run));
	rb_sb_putn(b, "\"", 1);
}

int
rb_jsonl_put_string(FILE *f, const char *s)
{
	static struct rb_sbuf b;	/* reused: rb-publish prints one per ack */

	b.len = 0;
	rb_json_sb_string(&b, s, strlen(s));
	return fwrite(b.s, 1, b.len, f) == b.len ? 0 : -1;
}

void
rb_json_sb_compact(struct rb_sbuf *b, const char *json, size_t n)
{
	const char *p = json, *end = json + n, *run = json;
	bool in_string = false;

	for (; p < end; p++) {
		if (in_string) {
			p = (const char *)skip_plain((const unsigned char *)p, (const unsigned char *)end, false);
			if (p == end)
				break;
			if (*p == '\\') {
				/* (a backslash as the last byte, invalid JSON: never
				 * step past the end) */
				if (p + 1 == end)
					break;
				p++;
			} else if (*p == '"')
				in_string = false;
		} else if (*p == '"')
			in_string = true;
		else if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
			if (p > run)
				rb_sb_putn(b, run, (size_t)(p - run));
			run = p + 1;
		}
	}
	if (end > run)
		rb_sb_putn(b, run, (size_t)(end - run));
}

void
rb_json_sb_dump(struct rb_sbuf *b, const json_t *v)
{
	char num[32], *text;
	const char *key;
	json_t *x;
	size_t i, n = 0;

	switch (json_typeof(v)) {
	case JSON_OBJECT:
		rb_sb_putn(b, "{", 1);
		json_object_foreach((json_t *)v, key, x) {
			if (n++ > 0)
				rb_sb_putn(b, ",", 1);
			rb_json_sb_string(b, key, strlen(key));
			rb_sb_putn(b, ":", 1);
			rb_json_sb_dump(b, x);
		}
		rb_sb_putn(b, "}", 1);
		break;
	case JSON_ARRAY:
		rb_sb_putn(b, "[", 1);
		json_array_foreach(v, i, x) {
			if (i > 0)
				rb_sb_putn(b, ",", 1);
			rb_json_sb_dump(b, x);
		}
		rb_sb_putn(b, "]", 1);
		break;
	case JSON_STRING:
		rb_json_sb_string(b, json_string_value(v), json_string_length(v));
		break;
	case JSON_INTEGER: {
		json_int_t iv = json_integer_value(v);
		unsigned long long u = iv < 0 ? 0ULL - (unsigned long long)iv : (unsigned long long)iv;
		char *q = num + sizeof num;

		do
			*--q = (char)('0' + u % 10);
		while ((u /= 10) > 0);
		if (iv < 0)
			*--q = '-';
		rb_sb_putn(b, q, (size_t)(num + sizeof num - q));
		break;
	}
	case JSON_TRUE:
		rb_sb_putn(b, "true", 4);
		break;
	case JSON_FALSE:
		rb_sb_putn(b, "false", 5);
		break;
	case JSON_NULL:
		rb_sb_putn(b, "null", 4);
		break;
	default:	/* a real: jansson's own formatting */
		if ((text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)) != NULL) {
			rb_sb_puts(b, text);
			free(text);
		}
		break;
	}
}

/* ---- rb_json_scan ----------------------------------------------------------- */

struct scan {
	const char	*p, *end;
	bool		 doubt;		/* valid for all we know, but let jansson decide */
	bool		 lax;		/* syntax only below the top level, any number (rb_json_members) */
};

static void
scan_ws(struct scan *sc)
{
	while (sc->p < sc->end && (*sc->p == ' ' || *sc->p == '\t' || *sc->p == '\n' || *sc->p == '\r'))
		sc->p++;
}

static int
hex4(const char *p)
{
	int v = 0;

	for (int i = 0; i < 4; i++) {
		char c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return -1;
	}
	return v;
}

/* A string at sc->p (on its quote); false if invalid.  *esc: it has a backslash. */
static bool
scan_string(struct scan *sc, bool *esc)
{
	const unsigned char *p = (const unsigned char *)sc->p + 1, *end = (const unsigned char *)sc->end;

	*esc = false;
	while ((p = skip_plain(p, end, true)) < end) {
		unsigned c = *p;

		if (c == '"') {
			sc->p = (const char *)p + 1;
			return true;
		}
		if (c < 0x20)
			return false;
		if (c == '\\') {
			*esc = true;
			if (++p >= end)
				return false;
			if (*p == 'u') {
				int u;

				if (end - p < 5 || (u = hex4((const char *)p + 1)) < 0 || u == 0)
					return false;	/* (jansson refuses \u0000 too) */
				p += 5;
				if (u >= 0xDC00 && u <= 0xDFFF)
					return false;
				if (u >= 0xD800 && u <= 0xDBFF) {
					int lo;

					if (end - p < 6 || p[0] != '\\' || p[1] != 'u' ||
					    (lo = hex4((const char *)p + 2)) < 0xDC00 || lo > 0xDFFF)
						return false;
					p += 6;
				}
				continue;
			}
			if (!strchr("\"\\/bfnrt", *p) || *p == '\0')
				return false;
			p++;
			continue;
		}
		if (c < 0x80) {
			p++;
			continue;
		}
		/* UTF-8, as jansson checks it: no overlong forms, no surrogates, at most U+10FFFF */
		{
			int n;
			unsigned v;

			if (c >= 0xC2 && c <= 0xDF)
				n = 1, v = c & 0x1F;
			else if (c >= 0xE0 && c <= 0xEF)
				n = 2, v = c & 0x0F;
			else if (c >= 0xF0 && c <= 0xF4)
				n = 3, v = c & 0x07;
			else
				return false;
			if (end - p <= n)
				return false;
			for (int i = 1; i <= n; i++) {
				if ((p[i] & 0xC0) != 0x80)
					return false;
				v = (v << 6) | (p[i] & 0x3F);
			}
			if ((n == 2 && v < 0x800) || (n == 3 && v < 0x10000) || v > 0x10FFFF ||
			    (v >= 0xD800 && v <= 0xDFFF))
				return false;
			p += n + 1;
		}
	}
	return false;
}

static bool
scan_number(struct scan *sc)
{
	const char *p = sc->p, *start = p;
	bool real = false;

	if (p < sc->end && *p == '-')
		p++;
	if (p >= sc->end || !(*p >= '0' && *p <= '9'))
		return false;
	if (*p == '0')
		p++;
	else
		while (p < sc->end && *p >= '0' && *p <= '9')
			p++;
	if (p < sc->end && *p == '.') {
		real = true;
		if (++p >= sc->end || !(*p >= '0' && *p <= '9'))
			return false;
		while (p < sc->end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < sc->end && (*p == 'e' || *p == 'E')) {
		if (!sc->lax)
			sc->doubt = true;	/* overflow is jansson's to judge */
		if (++p < sc->end && (*p == '+' || *p == '-'))
			p++;
		if (p >= sc->end || !(*p >= '0' && *p <= '9'))
			return false;
		while (p < sc->end && *p >= '0' && *p <= '9')
			p++;
	}
	if (!sc->lax && (p - start > 300 || (!real && p - start - (*start == '-') > 18)))
		sc->doubt = true;	/* could be too big for jansson */
	sc->p = p;
	return true;
}

static bool scan_value(struct scan *sc, int depth, char *type, bool *esc);

/* An object or array at sc->p; top: fill m (the top-level object). */
static bool
scan_compound(struct scan *sc, int depth, struct rb_json_member *m, int max, int *count)
{
	char close = *sc->p == '{' ? '}' : ']';
	int n = 0;
	struct { const char *k; size_t n; } seen[32];	/* duplicates are refused at every level */

	if (depth > (sc->lax ? 2048 : 64)) {	/* (2048: jansson's limit) */
		sc->doubt = true;
		return false;
	}
	sc->p++;
	scan_ws(sc);
	if (sc->p < sc->end && *sc->p == close) {
		sc->p++;
		*count = 0;
		return true;
	}
	for (;;) {
		const char *key = NULL, *val;
		size_t klen = 0;
		bool kesc = false, vesc;
		char type;

		if (close == '}') {
			if (sc->p >= sc->end || *sc->p != '"')
				return false;
			key = sc->p + 1;
			if (!scan_string(sc, &kesc))
				return false;
			klen = (size_t)(sc->p - 1 - key);
			scan_ws(sc);
			if (sc->p >= sc->end || *sc->p != ':')
				return false;
			sc->p++;
			scan_ws(sc);
		}
		val = sc->p;
		if (!scan_value(sc, depth + 1, &type, &vesc))
			return false;
		if (close == '}' && !(sc->lax && depth > 1)) {
			if (kesc || n >= 32)
				sc->doubt = true;	/* keys spelled with escapes, or many */
			for (int i = 0; i < n && i < 32; i++)
				if (seen[i].n == klen && memcmp(seen[i].k, key, klen) == 0)
					sc->doubt = true;
			if (n < 32)
				seen[n].k = key, seen[n].n = klen;
		}
		if (m != NULL) {
			if (n < max)
				m[n] = (struct rb_json_member){ .key = key, .klen = klen, .val = val,
				    .vlen = (size_t)(sc->p - val), .type = type, .escaped = kesc || vesc };
		}
		n++;
		scan_ws(sc);
		if (sc->p < sc->end && *sc->p == ',') {
			sc->p++;
			scan_ws(sc);
			continue;
		}
		if (sc->p < sc->end && *sc->p == close) {
			sc->p++;
			*count = n;
			return true;
		}
		return false;
	}
}

static bool
scan_value(struct scan *sc, int depth, char *type, bool *esc)
{
	int count;

	*esc = false;
	if (sc->p >= sc->end)
		return false;
	*type = *sc->p;
	switch (*sc->p) {
	case '"':
		return scan_string(sc, esc);
	case '{':
	case '[':
		return scan_compound(sc, depth, NULL, 0, &count);
	case 't':
	case 'f':
	case 'n': {
		const char *word = *sc->p == 't' ? "true" : *sc->p == 'f' ? "false" : "null";
		size_t wl = strlen(word);

		if ((size_t)(sc->end - sc->p) < wl || memcmp(sc->p, word, wl) != 0)
			return false;
		if (*word == 'n')
			*type = '0';
		sc->p += wl;
		return true;
	}
	default:
		*type = 'n';
		return scan_number(sc);
	}
}

/* The top-level object of sc: its member count, or -1 (see rb_json_scan). */
static int
scan_top(struct scan *sc, struct rb_json_member *m, int max)
{
	int count = 0;

	scan_ws(sc);
	if (sc->p >= sc->end || *sc->p != '{' || !scan_compound(sc, 1, m, max, &count))
		return -1;
	scan_ws(sc);
	if (sc->p != sc->end || sc->doubt)
		return -1;
	return count;
}

int
rb_json_scan(const char *s, size_t len, struct rb_json_member *m, int max)
{
	struct scan sc = { s, s + len, false, false };

	return scan_top(&sc, m, max);
}

/* The members of m[0..n) named in want, as a new object in *obj. */
static int
members_of(const struct rb_json_member *m, int n, const char *const *want, json_t **obj,
    char *err, size_t errlen)
{
	json_t *o = json_object();

	for (int i = 0; i < n; i++)
		for (size_t w = 0; want[w] != NULL; w++) {
			json_error_t jerr = { .line = 0 };
			json_t *v;

			if (m[i].klen != strlen(want[w]) || memcmp(m[i].key, want[w], m[i].klen) != 0)
				continue;
			if (m[i].type == 't' || m[i].type == 'f' || m[i].type == '0')
				v = m[i].type == 't' ? json_true() : m[i].type == 'f' ? json_false() : json_null();
			else if (m[i].type == '"' && !m[i].escaped)
				v = json_stringn_nocheck(m[i].val + 1, m[i].vlen - 2);	/* (UTF-8 checked) */
			else
				v = json_loadb(m[i].val, m[i].vlen, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
			if (v == NULL) {
				snprintf(err, errlen, "invalid JSON: %s (field '%s')", jerr.text, want[w]);
				json_decref(o);
				return -1;
			}
			json_object_set_new(o, want[w], v);
			break;
		}
	*obj = o;
	return 0;
}

int
rb_json_members(const char *line, size_t len, const char *const *want, json_t **obj, char *err,
    size_t errlen)
{
	struct rb_json_member m[32];
	json_error_t jerr;
	json_t *v;
	int n;

	*obj = NULL;
	if ((n = rb_json_scan(line, len, m, 32)) >= 0 && n <= 32)
		return members_of(m, n, want, obj, err, errlen);
	v = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (v != NULL) {
		if (!json_is_object(v)) {
			json_decref(v);
			snprintf(err, errlen, "not a JSON object");
			return -1;
		}
		*obj = v;
		return 0;
	}
	if (json_error_code(&jerr) == json_error_numeric_overflow) {
		/* a number jansson cannot hold: no matter where we do not read */
		struct scan sc = { line, line + len, false, true };

		if ((n = scan_top(&sc, m, 32)) >= 0 && n <= 32)
			return members_of(m, n, want, obj, err, errlen);
	}
	snprintf(err, errlen, "invalid JSON: %s", jerr.text);
	return -1;
}
