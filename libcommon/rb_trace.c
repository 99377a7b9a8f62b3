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

#include "rb_jsonl.h"
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
