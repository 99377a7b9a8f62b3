/* SPDX-License-Identifier: MIT */
/*
 * fuzz_parse: the number, duration, lease-token and name parsers of
 * rb_util.c against references written another way (__int128 arithmetic,
 * a grammar check before any arithmetic, explicit character classes).
 * The input, cut at its first NUL, is given to every parser; its first
 * bytes also pick the bounds of rb_parse_int64.
 */
#include "config.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>

#include "rb_util.h"
#include "fuzz.h"

typedef __int128 i128;

/* ---- durations --------------------------------------------------------------- */

static const struct { const char *u; int rank; int64_t ms; } units[] = {
	{ "ms", 4, 1 }, { "s", 3, 1000 }, { "min", 2, 60000 }, { "m", 2, 60000 },
	{ "h", 1, 3600000 }, { "d", 0, 86400000 },
};

/* 0 and *ms, or the code the grammar alone gives: -1 syntax, -2 bare, -5
 * "fine grammar, the arithmetic decides" (then *ms is the exact value or
 * -3 fraction / -4 range in *code). */
static int
ref_duration(const char *s, int64_t *ms, int *code)
{
	const char *p = s;
	int last = -1;
	i128 total = 0;
	bool big = false, fine = true;

	*code = 0;
	if (*s == '\0')
		return -1;
	if (strcmp(s, "0") == 0) {
		*ms = 0;
		return 0;
	}
	/* a number alone */
	if (strspn(s, "0123456789") == strlen(s))
		return -2;
	{
		size_t a = strspn(s, "0123456789");

		if (a > 0 && s[a] == '.' && isdigit((unsigned char)s[a + 1]) &&
		    strspn(s + a + 1, "0123456789") == strlen(s + a + 1))
			return -2;
	}
	while (*p != '\0') {
		const char *ip = p, *fp = NULL, *u;
		size_t il, fl = 0, ul;
		int k = -1;

		il = strspn(p, "0123456789");
		if (il == 0)
			return -1;
		p += il;
		if (*p == '.') {
			fp = p + 1;
			fl = strspn(fp, "0123456789");
			if (fl == 0)
				return -1;
			p = fp + fl;
		}
		u = p;
		while (*p >= 'a' && *p <= 'z')
			p++;
		ul = (size_t)(p - u);
		for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
			if (strlen(units[i].u) == ul && strncmp(units[i].u, u, ul) == 0)
				k = (int)i;
		if (k < 0 || units[k].rank <= last)
			return -1;
		last = units[k].rank;
		/* the value of this term: whole * ms + frac * ms / 10^fl */
		{
			i128 whole = 0, frac = 0, scale = 1;

			for (size_t i = 0; i < il; i++) {
				whole = whole * 10 + (ip[i] - '0');
				if (whole > (i128)1 << 100) {
					big = true;
					whole = (i128)1 << 100;
				}
			}
			/* trailing zeros of the fraction change nothing */
			while (fl > 0 && fp[fl - 1] == '0')
				fl--;
			if (fl > 25)
				fine = false;	/* (beyond 10 digits nothing is whole) */
			else {
				for (size_t i = 0; i < fl; i++) {
					frac = frac * 10 + (fp[i] - '0');
					scale *= 10;
				}
				if (frac * units[k].ms % scale != 0)
					fine = false;
				total += whole * units[k].ms + frac * units[k].ms / scale;
			}
		}
	}
	if (!fine)
		*code = -3;
	else if (big || total > INT64_MAX)
		*code = -4;
	else
		*ms = (int64_t)total;
	return -5;
}

static void
check_duration(const char *s)
{
	int64_t got = -1, want = -1;
	int code, rc = rb_parse_duration_ms(s, &got), r = ref_duration(s, &want, &code);

	if (r == 0) {
		FUZZ_CHECK(rc == 0 && got == want, "duration '%s': %d %" PRId64 ", want %" PRId64, s, rc, got, want);
		return;
	}
	if (r == -1) {
		/* (an earlier term's fraction or range may be told first) */
		FUZZ_CHECK(rc < 0 && rc != RB_DURATION_BARE, "duration '%s': %d, want a syntax error", s, rc);
		return;
	}
	if (r == -2) {
		/* a huge bare number may be refused as out of range first */
		FUZZ_CHECK(rc == RB_DURATION_BARE || rc == RB_DURATION_RANGE,
		    "duration '%s': %d, want bare", s, rc);
		return;
	}
	/* the grammar is fine */
	if (code == 0)
		FUZZ_CHECK(rc == 0 && got == want, "duration '%s': %d %" PRId64 ", want %" PRId64, s, rc, got, want);
	else
		FUZZ_CHECK(rc == RB_DURATION_FRACTION || rc == RB_DURATION_RANGE,
		    "duration '%s': %d, want %d", s, rc, code);
}

/* ---- numbers ------------------------------------------------------------------ */

static void
check_int64(const char *s, int64_t min, int64_t max)
{
	int64_t got = 0;
	int rc = rb_parse_int64(s, min, max, &got);
	const char *p = s;
	bool neg = false, good = true;
	i128 v = 0;

	if (*p == '+' || *p == '-')
		neg = *p++ == '-';
	if (*p == '\0')
		good = false;
	for (; *p != '\0' && good; p++) {
		if (!isdigit((unsigned char)*p))
			good = false;
		else if (v < (i128)1 << 70)
			v = v * 10 + (*p - '0');
	}
	if (neg)
		v = -v;
	good = good && v >= min && v <= max;
	FUZZ_CHECK((rc == 0) == good, "int64 '%s' in [%" PRId64 ", %" PRId64 "]: rc %d", s, min, max, rc);
	if (good)
		FUZZ_CHECK(got == (int64_t)v, "int64 '%s': got %" PRId64, s, got);
}

static void
check_fmt_int(const uint8_t *data, size_t size)
{
	int64_t v = 0;
	char buf[32], want[32];

	memcpy(&v, data, size < sizeof v ? size : sizeof v);
	buf[rb_fmt_int(buf, v)] = '\0';
	snprintf(want, sizeof want, "%" PRId64, v);
	FUZZ_CHECK(strcmp(buf, want) == 0, "rb_fmt_int %s: %s", want, buf);
}

/* ---- lease tokens and names ------------------------------------------------------------ */

static void
check_lease(const char *s)
{
	struct rb_lease l;
	int rc = rb_lease_parse(s, &l);
	i128 part[3] = { 0, 0, 0 };
	const i128 max[3] = { 255, INT64_MAX, INT32_MAX };
	const char *p = s;
	bool good = true;

	for (int i = 0; i < 3 && good; i++) {
		size_t n = strspn(p, "0123456789");

		if (n == 0)
			good = false;
		for (size_t j = 0; j < n; j++)
			if (part[i] <= max[i])
				part[i] = part[i] * 10 + (p[j] - '0');
		p += n;
		good = good && part[i] <= max[i] && *p == (i < 2 ? ':' : '\0');
		p++;
	}
	FUZZ_CHECK((rc == 0) == good, "lease '%s': rc %d", s, rc);
	if (good) {
		char buf[64];
		struct rb_lease back;

		FUZZ_CHECK(l.lane == part[0] && l.epoch == part[1] && l.claims == part[2], "lease '%s' values", s);
		rb_lease_format(&l, buf, sizeof buf);
		FUZZ_CHECK(rb_lease_parse(buf, &back) == 0 && back.lane == l.lane && back.epoch == l.epoch &&
		    back.claims == l.claims, "lease '%s' round trip '%s'", s, buf);
	}
}

static void
check_names(const char *s)
{
	size_t n = strlen(s);
	bool ident = n >= 1 && n <= 50 && ((s[0] >= 'a' && s[0] <= 'z') || s[0] == '_'),
	    handler = n >= 1 && n <= 200;

	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool lower = c >= 'a' && c <= 'z', digit = c >= '0' && c <= '9';

		if (!(lower || digit || c == '_'))
			ident = false;
		if (!(lower || digit || (c >= 'A' && c <= 'Z') || c == '_' || c == '.' || c == ':' || c == '-'))
			handler = false;
	}
	/* PostgreSQL reserves pg_*; information_schema is the standard's */
	if (strncmp(s, "pg_", 3) == 0 || strcmp(s, "information_schema") == 0)
		ident = false;
	FUZZ_CHECK(rb_ident_valid(s) == ident, "ident '%s'", s);
	FUZZ_CHECK(rb_handler_valid(s) == handler, "handler '%s'", s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = fuzz_cstr(data, size);
	int64_t bounds[] = { INT64_MIN, -1000, -1, 0, 1, 100, 10000, INT32_MAX, INT64_MAX };
	size_t nb = sizeof bounds / sizeof bounds[0];
	int64_t lo = bounds[(size > 0 ? data[0] : 0) % nb], hi = bounds[(size > 1 ? data[1] : 8) % nb];

	check_duration(s);
	check_int64(s, lo <= hi ? lo : hi, lo <= hi ? hi : lo);
	check_int64(s, INT64_MIN, INT64_MAX);
	check_fmt_int(data, size);
	check_lease(s);
	check_names(s);
	free(s);
	return 0;
}
