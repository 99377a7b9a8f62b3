/* SPDX-License-Identifier: MIT */
/* rb_util.c: allocation, parsing, redaction, lane hash and lease tokens. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_util.h"

void *
xmalloc(size_t n)
{
	void *p = malloc(n == 0 ? 1 : n);

	if (p == NULL)
		rb_die(RB_EXIT_OSERR, "out of memory");
	return p;
}

void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);

	if (p == NULL)
		rb_die(RB_EXIT_OSERR, "out of memory");
	return p;
}

void *
xrealloc(void *old, size_t n)
{
	void *p = realloc(old, n == 0 ? 1 : n);

	if (p == NULL)
		rb_die(RB_EXIT_OSERR, "out of memory");
	return p;
}

char *
xstrdup(const char *s)
{
	char *p = strdup(s);

	if (p == NULL)
		rb_die(RB_EXIT_OSERR, "out of memory");
	return p;
}

char *
xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	if (n < 0)
		rb_die(RB_EXIT_OSERR, "out of memory");
	return p;
}

int
rb_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	long long v;

	if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

int
rb_parse_int(const char *s, int min, int max, int *out)
{
	int64_t v;

	if (rb_parse_int64(s, min, max, &v) < 0)
		return -1;
	*out = (int)v;
	return 0;
}

/* The units of a duration, largest first: a compound duration names them in this order. */
static const struct {
	const char	*name;
	int64_t		 ms;
	int		 rank;		/* m and min are one unit */
} duration_units[] = {
	{ "d", 86400000, 0 }, { "h", 3600000, 1 }, { "min", 60000, 2 }, { "m", 60000, 2 },
	{ "s", 1000, 3 }, { "ms", 1, 4 },
};

int
rb_parse_duration_ms(const char *s, int64_t *out_ms)
{
	int64_t total = 0;
	int last_rank = -1;
	const char *p = s;

	if (s == NULL || *s == '\0')
		return RB_DURATION_SYNTAX;
	if (strcmp(s, "0") == 0) {
		*out_ms = 0;
		return 0;
	}
	while (*p != '\0') {
		int64_t whole = 0, frac = 0, scale = 1, mult = 0, v;
		const char *u;
		size_t ulen, i;
		int rank = -1;
		bool fine = true;

		if (!isdigit((unsigned char)*p))
			return RB_DURATION_SYNTAX;
		for (; isdigit((unsigned char)*p); p++) {
			if (whole > (INT64_MAX - (*p - '0')) / 10)
				return RB_DURATION_RANGE;
			whole = whole * 10 + (*p - '0');
		}
		if (*p == '.') {
			int digits = 0;

			p++;
			if (!isdigit((unsigned char)*p))
				return RB_DURATION_SYNTAX;
			for (; isdigit((unsigned char)*p); p++) {
				/* 10 digits tell every whole millisecond of a day
				 * apart; beyond them only zeros may follow */
				if (digits == 10) {
					fine = fine && *p == '0';
					continue;
				}
				frac = frac * 10 + (*p - '0');
				scale *= 10;
				digits++;
			}
		}
		for (u = p; *p >= 'a' && *p <= 'z'; p++)
			;
		ulen = (size_t)(p - u);
		if (ulen == 0)
			return *p == '\0' && u == s + strspn(s, "0123456789.") ?
			    RB_DURATION_BARE : RB_DURATION_SYNTAX;
		for (i = 0; i < sizeof duration_units / sizeof duration_units[0]; i++)
			if (strlen(duration_units[i].name) == ulen &&
			    memcmp(duration_units[i].name, u, ulen) == 0) {
				mult = duration_units[i].ms;
				rank = duration_units[i].rank;
			}
		if (mult == 0 || rank <= last_rank)
			return RB_DURATION_SYNTAX;
		last_rank = rank;
		/* frac < 10^10 and mult <= 86400000: no overflow */
		if (!fine || frac * mult % scale != 0)
			return RB_DURATION_FRACTION;
		v = frac * mult / scale;	/* < mult */
		if (whole > (INT64_MAX - v) / mult)
			return RB_DURATION_RANGE;
		v += whole * mult;
		if (v < 0 || total > INT64_MAX - v)
			return RB_DURATION_RANGE;
		total += v;
	}
	*out_ms = total;
	return 0;
}

/* Replace the bytes [from, to) of a growing copy with "xxxxx". */
static char *
splice_mask(char *s, size_t from, size_t to)
{
	size_t len = strlen(s);
	char *r = xmalloc(len - (to - from) + 6);

	memcpy(r, s, from);
	memcpy(r + from, "xxxxx", 5);
	memcpy(r + from + 5, s + to, len - to + 1);
	free(s);
	return r;
}

/* Is s[i..] a password key (password, sslpassword, any case) that starts a word? */
static size_t
password_key(const char *s, size_t i)
{
	if (i > 0 && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '_'))
		return 0;
	if (strncasecmp(s + i, "password", 8) == 0)
		return 8;
	if (strncasecmp(s + i, "sslpassword", 11) == 0)
		return 11;
	return 0;
}

char *
rb_url_redact(const char *url)
{
	char *s, *p;
	size_t i;

	if (url == NULL || *url == '\0')
		return xstrdup("(environment)");
	s = xstrdup(url);
	p = strstr(s, "://");
	if (p != NULL) {
		/* scheme://user:password@host...: mask from the first ':' to the
		 * last '@' (more than a password, at worst: never less) */
		char *auth = p + 3, *at = strrchr(auth, '@'), *colon = strchr(auth, ':');

		if (at != NULL && colon != NULL && colon < at)
			s = splice_mask(s, (size_t)(colon + 1 - s), (size_t)(at - s));
	}
	/* password=... in a conninfo string or a URL query */
	for (i = 0; s[i] != '\0'; i++) {
		size_t j, k, n = password_key(s, i);

		if (n == 0)
			continue;
		j = i + n;
		while (isspace((unsigned char)s[j]))
			j++;
		if (s[j] != '=')
			continue;
		j++;
		while (isspace((unsigned char)s[j]))
			j++;
		k = j;
		if (s[k] == '\'') {
			k++;
			while (s[k] != '\0' && s[k] != '\'') {
				if (s[k] == '\\' && s[k + 1] != '\0')
					k++;
				k++;
			}
			if (s[k] == '\'')
				k++;
		} else {
			while (s[k] != '\0' && !isspace((unsigned char)s[k]) && s[k] != '&' && s[k] != ';')
				k++;
		}
		s = splice_mask(s, j, k);
		i = j + 4;
	}
	return s;
}

uint32_t
rb_fnv1a32(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 16777619u;
	}
	return h;
}

int
rb_lane_of(const char *key, const char *event_id)
{
	const char *s = key != NULL ? key : event_id;

	return (int)(rb_fnv1a32(s, strlen(s)) % RB_LANES);
}

size_t
rb_fmt_int(char *buf, int64_t v)
{
	char num[24], *p = num + sizeof num;
	uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
	size_t n;

	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u != 0);
	if (v < 0)
		*--p = '-';
	n = (size_t)(num + sizeof num - p);
	memcpy(buf, p, n);
	return n;
}

void
rb_lease_format(const struct rb_lease *l, char *buf, size_t len)
{
	char tmp[3 * 24];
	size_t n = rb_fmt_int(tmp, l->lane);

	tmp[n++] = ':';
	n += rb_fmt_int(tmp + n, l->epoch);
	tmp[n++] = ':';
	n += rb_fmt_int(tmp + n, l->claims);
	if (len == 0)
		return;
	if (n >= len)
		n = len - 1;
	memcpy(buf, tmp, n);
	buf[n] = '\0';
}

/* Parse an unsigned decimal in s up to a stop char; no sign, no spaces. */
static const char *
parse_part(const char *s, char stop, int64_t max, int64_t *out)
{
	int64_t v = 0;
	const char *p = s;

	if (!isdigit((unsigned char)*p))
		return NULL;
	for (; isdigit((unsigned char)*p); p++) {
		int d = *p - '0';
		if (v > (max - d) / 10)
			return NULL;
		v = v * 10 + d;
	}
	if (*p != stop)
		return NULL;
	*out = v;
	return stop == '\0' ? p : p + 1;
}

int
rb_lease_parse(const char *s, struct rb_lease *out)
{
	int64_t lane, epoch, claims;

	if (s == NULL)
		return -1;
	if ((s = parse_part(s, ':', RB_LANES - 1, &lane)) == NULL)
		return -1;
	if ((s = parse_part(s, ':', INT64_MAX, &epoch)) == NULL)
		return -1;
	if (parse_part(s, '\0', INT32_MAX, &claims) == NULL)
		return -1;
	out->lane = (int)lane;
	out->epoch = epoch;
	out->claims = claims;
	return 0;
}

/* (a result line's token, per delivery in rb-dispatch: no copy, no ctype;
 * at most 19 digits a part, which cannot overflow, then the range) */
int
rb_lease_parsen(const char *s, size_t n, struct rb_lease *out)
{
	static const uint64_t max[3] = { RB_LANES - 1, INT64_MAX, INT32_MAX };
	const char *p = s, *end = s + n;
	uint64_t v[3];

	for (int part = 0; part < 3; part++) {
		const char *start = p;
		uint64_t x = 0;

		while (p < end && (unsigned)(*p - '0') < 10 && p - start < 19)
			x = x * 10 + (unsigned)(*p++ - '0');
		if (p == start || x > max[part] || (part < 2 ? p == end || *p++ != ':' : p != end))
			return -1;
		v[part] = x;
	}
	out->lane = (int)v[0];
	out->epoch = (int64_t)v[1];
	out->claims = (int64_t)v[2];
	return 0;
}

bool
rb_ident_valid(const char *s)
{
	size_t n;

	if (s == NULL || !(islower((unsigned char)s[0]) || s[0] == '_'))
		return false;
	for (n = 0; s[n] != '\0'; n++)
		if (!(islower((unsigned char)s[n]) || isdigit((unsigned char)s[n]) || s[n] == '_'))
			return false;
	/* PostgreSQL's own: pg_* is reserved (pg_catalog, pg_temp, pg_toast),
	 * information_schema is the standard's */
	return n <= 50 && strncmp(s, "pg_", 3) != 0 && strcmp(s, "information_schema") != 0;
}

bool
rb_handler_valid(const char *s)
{
	size_t n;

	if (s == NULL || *s == '\0')
		return false;
	for (n = 0; s[n] != '\0'; n++)
		if (!(isalnum((unsigned char)s[n]) || strchr("_.:-", s[n]) != NULL))
			return false;
	return n <= 200;
}

int64_t
rb_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
rb_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
rb_sb_init(struct rb_sbuf *b)
{
	b->cap = 64;
	b->len = 0;
	b->s = xmalloc(b->cap);
	b->s[0] = '\0';
}

void
rb_sb_putn(struct rb_sbuf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		b->cap = (b->len + n + 1) * 2;
		b->s = xrealloc(b->s, b->cap);
	}
	memcpy(b->s + b->len, s, n);
	b->len += n;
	b->s[b->len] = '\0';
}

void
rb_sb_puts(struct rb_sbuf *b, const char *s)
{
	rb_sb_putn(b, s, strlen(s));
}

/* n digits of s as a number; -1: not all digits */
static int
digits(const char *s, int n)
{
	int v = 0;

	for (int i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v;
}

/* The stores' own layout, YYYY-MM-DDTHH:MM:SS[.fff...], of a valid date and
 * time, without sscanf and timegm (250 ns of rb-dispatch's CPU a delivery
 * started, 12 ns here: its latency metric reads each delivery's created_at): days from
 * the civil date (the proleptic Gregorian calendar, as timegm's).  -1: not
 * that; the general parser below decides. */
static int64_t
iso_ms_fast(const char *s)
{
	static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	int y, mo, d, h, mi, sec, ms = 0;
	int64_t era, yoe, doy, doe, days;

	if (strnlen(s, 19) < 19 || (y = digits(s, 4)) < 1970 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':')
		return -1;
	mo = digits(s + 5, 2);
	d = digits(s + 8, 2);
	h = digits(s + 11, 2);
	mi = digits(s + 14, 2);
	sec = digits(s + 17, 2);
	if (mo < 1 || mo > 12 || d < 1 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 59)
		return -1;
	if (d > mdays[mo - 1] + (mo == 2 && y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)))
		return -1;
	if (s[19] == '.')
		for (int i = 0; i < 3 && s[20 + i] >= '0' && s[20 + i] <= '9'; i++)
			ms += (s[20 + i] - '0') * (i == 0 ? 100 : i == 1 ? 10 : 1);
	/* (H. Hinnant's days_from_civil, the year starting in March) */
	if (mo <= 2)
		y--;
	era = y / 400;
	yoe = y - era * 400;
	doy = (153 * (mo > 2 ? mo - 3 : mo + 9) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	days = era * 146097 + doe - 719468;
	return ((days * 24 + h) * 60 + mi) * INT64_C(60000) + sec * 1000 + ms;
}

int64_t
rb_parse_iso_ms(const char *s)
{
	struct tm tm;
	int ms = 0, n = 0;
	char frac[8] = "";
	int64_t fast;

	if (s == NULL)
		return -1;
	if ((fast = iso_ms_fast(s)) >= 0)
		return fast;
	memset(&tm, 0, sizeof tm);
	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
	    &tm.tm_min, &tm.tm_sec, &n) != 6)
		return -1;
	if (s[n] == '.' && sscanf(s + n + 1, "%7[0-9]", frac) == 1) {
		for (int i = 0; i < 3; i++)
			ms = ms * 10 + (frac[i] >= '0' && frac[i] <= '9' ? frac[i] - '0' : 0);
	}
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (int64_t)timegm(&tm) * 1000 + ms;
}
