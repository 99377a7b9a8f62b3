/* SPDX-License-Identifier: MIT */
/* rb_trace.c: W3C traceparent in event headers (rb_trace.h). */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_trace.h"
#include "rb_util.h"

/* n lower-case hex digits; *zero: all of them '0' */
static bool
hex(const char *s, size_t n, bool *zero)
{
	*zero = true;
	for (size_t i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*zero = false;
	}
	return true;
}

bool
rb_traceparent_valid(const char *s)
{
	size_t len = strlen(s);
	bool zero;

	if (len < RB_TRACEPARENT_LEN || !hex(s, 2, &zero) || strncmp(s, "ff", 2) == 0 || s[2] != '-' ||
	    !hex(s + 3, 32, &zero) || zero || s[35] != '-' || !hex(s + 36, 16, &zero) || zero ||
	    s[52] != '-' || !hex(s + 53, 2, &zero))
		return false;
	/* version 00 is exactly this; a later one may go on after a '-' */
	if (strncmp(s, "00", 2) == 0)
		return len == RB_TRACEPARENT_LEN;
	return len == RB_TRACEPARENT_LEN || s[RB_TRACEPARENT_LEN] == '-';
}

static void
random_bytes(unsigned char *b, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom(b + got, n - got, 0);

		if (r <= 0)
			break;
		got += (size_t)r;
	}
	if (got < n) {	/* (no getrandom: never on Linux 3.17 and later) */
		uint64_t x = (uint64_t)rb_wall_ms() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock();

		for (size_t i = got; i < n; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			b[i] = (unsigned char)x;
		}
	}
}

void
rb_traceparent_new(char out[RB_TRACEPARENT_LEN + 1])
{
	unsigned char b[24];
	char *p = out;
	bool zero;

	do {
		random_bytes(b, sizeof b);
		p = out;
		p += sprintf(p, "00-");
		for (int i = 0; i < 16; i++)
			p += sprintf(p, "%02x", b[i]);
		*p++ = '-';
		for (int i = 16; i < 24; i++)
			p += sprintf(p, "%02x", b[i]);
		sprintf(p, "-01");
	} while ((hex(out + 3, 32, &zero), zero) || (hex(out + 36, 16, &zero), zero));
}

bool
rb_trace_of_line(const char *line, size_t len, char tp[RB_TRACEPARENT_LEN + 1],
    char ts[RB_TRACESTATE_MAX + 1])
{
	static const char *const want[] = { "headers", NULL };
	json_t *o = NULL, *h, *v;
	const char *k;
	char err[64];
	bool found = false;

	tp[0] = ts[0] = '\0';
	if (rb_json_members(line, len, want, &o, err, sizeof err) < 0)
		return false;
	h = json_object_get(o, "headers");
	json_object_foreach(h, k, v) {
		const char *s = json_string_value(v);

		if (s == NULL)
			continue;
		if (strcasecmp(k, "traceparent") == 0 && strlen(s) <= 128 && rb_traceparent_valid(s)) {
			/* (a later version's fields after the first 55 bytes are not passed on) */
			memcpy(tp, s, RB_TRACEPARENT_LEN);
			tp[RB_TRACEPARENT_LEN] = '\0';
			found = true;
		} else if (strcasecmp(k, "tracestate") == 0 && strlen(s) <= RB_TRACESTATE_MAX) {
			const char *c = s;

			while (*c >= 0x20 && *c < 0x7f)
				c++;
			if (*c == '\0')
				snprintf(ts, RB_TRACESTATE_MAX + 1, "%s", s);
		}
	}
	json_decref(o);
	if (!found)
		ts[0] = '\0';
	return found;
}

/* (a "headers" member is added after the brace, or its value replaced) */
char *
rb_trace_line_with_new(const json_t *ev, const char *line, size_t len)
{
	const json_t *h = json_object_get(ev, "headers");
	char tp[RB_TRACEPARENT_LEN + 1];
	struct rb_json_member m[64];
	struct rb_sbuf b;
	json_t *nh;
	const char *k, *brace;
	json_t *v;
	int n;

	json_object_foreach((json_t *)h, k, v)
		if (strcasecmp(k, "traceparent") == 0)
			return NULL;
	rb_traceparent_new(tp);
	nh = json_is_object(h) ? json_deep_copy(h) : json_object();
	json_object_set_new(nh, "traceparent", json_string(tp));
	rb_sb_init(&b);
	n = rb_json_scan(line, len, m, 64);
	for (int i = 0; i < n && i < 64; i++)
		if (m[i].klen == 7 && memcmp(m[i].key, "headers", 7) == 0 && !m[i].escaped) {
			rb_sb_putn(&b, line, (size_t)(m[i].val - line));
			rb_json_sb_dump(&b, nh);
			rb_sb_putn(&b, m[i].val + m[i].vlen, len - (size_t)(m[i].val + m[i].vlen - line));
			json_decref(nh);
			return b.s;
		}
	if (n < 0 || n > 64 || json_object_get(ev, "headers") != NULL || (brace = memchr(line, '{', len)) == NULL) {
		/* (a line rb_json_scan is in doubt about: printed again whole) */
		json_t *e = json_deep_copy(ev);
		char *t;

		json_object_set_new(e, "headers", nh);
		t = json_dumps(e, JSON_COMPACT | JSON_ENCODE_ANY);
		json_decref(e);
		free(b.s);
		if (t == NULL)
			rb_die(RB_EXIT_SOFTWARE, "--trace: cannot print the event again");
		return t;
	}
	rb_sb_putn(&b, line, (size_t)(brace + 1 - line));
	rb_sb_puts(&b, "\"headers\":");
	rb_json_sb_dump(&b, nh);
	rb_sb_puts(&b, ",");
	rb_sb_putn(&b, brace + 1, len - (size_t)(brace + 1 - line));
	json_decref(nh);
	return b.s;
}
