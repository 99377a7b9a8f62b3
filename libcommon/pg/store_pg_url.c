/* SPDX-License-Identifier: MIT */
/*
 * store_pg_url.c: connection strings through libpq's own parser.  What
 * PQconninfoParse reads as password or sslpassword is what is hidden,
 * whatever the spelling (a ? or # in the userinfo, percent-encoded keys,
 * any whitespace between conninfo pairs): the string is masked where it
 * stands, parsed again and compared option by option with the original;
 * if they differ in anything but the masked passwords, it is rebuilt as
 * key=value pairs from the parsed options instead.  A string libpq cannot
 * parse is never shown, and neither is libpq's parse error, which quotes
 * the offending token (the password, for a bad percent-escape).
 */
#include "config.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_util.h"
#include "store_pg_url.h"

#define MASK	"xxxxx"
#define UNPARSABLE "(unparsable connection string)"

static bool
is_secret(const char *keyword)
{
	return strcmp(keyword, "password") == 0 || strcmp(keyword, "sslpassword") == 0;
}

static size_t
uri_prefix(const char *s)
{
	if (strncmp(s, "postgresql://", 13) == 0)
		return 13;
	if (strncmp(s, "postgres://", 11) == 0)
		return 11;
	return 0;
}

/* What libpq's PQconnectdbParams(expand_dbname) takes for a connection
 * string rather than a database name. */
static bool
is_connstr(const char *s)
{
	return uri_prefix(s) != 0 || strchr(s, '=') != NULL;
}

/* scheme:// with a scheme that is not PostgreSQL's */
static bool
foreign_scheme(const char *s)
{
	size_t n = 0;

	if (!isalpha((unsigned char)s[0]))
		return false;
	while (isalnum((unsigned char)s[n]) || s[n] == '+' || s[n] == '-' || s[n] == '.')
		n++;
	return strncmp(s + n, "://", 3) == 0 && uri_prefix(s) == 0;
}

/* libpq's isspace: the C locale's */
static bool
pq_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int
hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Is [s, s+n) percent-encoded text that decodes to a secret keyword? */
static bool
uri_key_is_secret(const char *s, size_t n)
{
	char key[16];
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		char c = s[i];

		if (c == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
			c = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
			i += 2;
		}
		if (k + 1 >= sizeof key)
			return false;
		key[k++] = c;
	}
	key[k] = '\0';
	return is_secret(key);
}

/* Is the keyword [s, s+n) a secret one? */
static bool
key_is_secret(const char *s, size_t n)
{
	char key[16];

	if (n >= sizeof key)
		return false;
	memcpy(key, s, n);
	key[n] = '\0';
	return is_secret(key);
}

/* Append [s, s+n) to b, or the mask when mask is true and n > 0. */
static void
put_span(struct rb_sbuf *b, const char *s, size_t n, bool mask)
{
	if (mask && n > 0)
		rb_sb_puts(b, MASK);
	else
		rb_sb_putn(b, s, n);
}

/* The URI form: mask the password of the userinfo and the values of
 * password and sslpassword in the query, where they stand. */
static char *
mask_uri(const char *url)
{
	struct rb_sbuf b;
	const char *p = url + uri_prefix(url), *q, *at;

	rb_sb_init(&b);
	rb_sb_putn(&b, url, (size_t)(p - url));
	/* libpq: the userinfo ends at the first @ before any / */
	for (at = p; *at != '\0' && *at != '@' && *at != '/'; at++)
		;
	if (*at == '@') {
		const char *colon = memchr(p, ':', (size_t)(at - p));

		if (colon != NULL) {
			rb_sb_putn(&b, p, (size_t)(colon + 1 - p));
			put_span(&b, colon + 1, (size_t)(at - colon - 1), true);
			p = at;
		}
	}
	q = strchr(*at == '@' ? at : p, '?');
	if (q == NULL) {
		rb_sb_puts(&b, p);
		return b.s;
	}
	rb_sb_putn(&b, p, (size_t)(q + 1 - p));
	for (p = q + 1; *p != '\0';) {
		size_t n = strcspn(p, "&"), k = strcspn(p, "=&");

		if (k < n && uri_key_is_secret(p, k)) {
			rb_sb_putn(&b, p, k + 1);
			put_span(&b, p + k + 1, n - k - 1, true);
		} else
			rb_sb_putn(&b, p, n);
		p += n;
		if (*p == '&')
			rb_sb_putn(&b, p++, 1);
	}
	return b.s;
}

/* The key=value form, tokenized as libpq does: mask the values of password
 * and sslpassword (quoted or not) where they stand.  NULL when the text
 * does not tokenize (libpq would have refused it). */
static char *
mask_conninfo(const char *s)
{
	struct rb_sbuf b;
	const char *p = s;

	rb_sb_init(&b);
	while (*p != '\0') {
		const char *name, *val;
		size_t nlen;
		bool secret;

		for (name = p; pq_space(*p); p++)
			;
		rb_sb_putn(&b, name, (size_t)(p - name));
		if (*p == '\0')
			break;
		for (name = p; *p != '\0' && *p != '=' && !pq_space(*p); p++)
			;
		nlen = (size_t)(p - name);
		while (pq_space(*p))
			p++;
		if (*p != '=') {
			free(b.s);
			return NULL;
		}
		p++;
		while (pq_space(*p))
			p++;
		rb_sb_putn(&b, name, (size_t)(p - name));
		secret = key_is_secret(name, nlen);
		val = p;
		if (*p == '\'') {
			for (p++; *p != '\0' && *p != '\''; p++)
				if (*p == '\\' && p[1] != '\0')
					p++;
			if (*p != '\'') {
				free(b.s);
				return NULL;
			}
			p++;
			/* '' is an empty value: nothing to hide; the mask stays
			 * quoted, for a pair that follows without a space */
			if (secret && p - val > 2)
				rb_sb_puts(&b, "'" MASK "'");
			else
				rb_sb_putn(&b, val, (size_t)(p - val));
		} else {
			for (; *p != '\0' && !pq_space(*p); p++)
				if (*p == '\\' && p[1] != '\0')
					p++;
			put_span(&b, val, (size_t)(p - val), secret);
		}
	}
	return b.s;
}

/* Do the options of masked say what orig's do, passwords masked? */
static bool
same_but_masked(const PQconninfoOption *orig, const PQconninfoOption *masked)
{
	for (; orig->keyword != NULL; orig++, masked++) {
		const char *want = orig->val;

		if (masked->keyword == NULL || strcmp(orig->keyword, masked->keyword) != 0)
			return false;
		if (is_secret(orig->keyword) && want != NULL && *want != '\0')
			want = MASK;
		if ((want == NULL) != (masked->val == NULL) ||
		    (want != NULL && strcmp(want, masked->val) != 0))
			return false;
	}
	return masked->keyword == NULL;
}

/* key='value' pairs of every option set, passwords masked. */
static char *
rebuild(const PQconninfoOption *o)
{
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (; o->keyword != NULL; o++) {
		const char *v = o->val;
		bool quote;

		if (v == NULL)
			continue;
		if (is_secret(o->keyword) && *v != '\0')
			v = MASK;
		if (b.len > 0)
			rb_sb_puts(&b, " ");
		rb_sb_puts(&b, o->keyword);
		rb_sb_puts(&b, "=");
		quote = *v == '\0' || strpbrk(v, " \t\n\r\v\f'\\") != NULL;
		if (quote)
			rb_sb_puts(&b, "'");
		for (; *v != '\0'; v++) {
			if (*v == '\'' || *v == '\\')
				rb_sb_puts(&b, "\\");
			rb_sb_putn(&b, v, 1);
		}
		if (quote)
			rb_sb_puts(&b, "'");
	}
	return b.s;
}

static bool
has_secret(const PQconninfoOption *o)
{
	for (; o->keyword != NULL; o++)
		if (is_secret(o->keyword) && o->val != NULL && *o->val != '\0')
			return true;
	return false;
}

char *
rb_pg_url_redact(const char *url)
{
	PQconninfoOption *o, *m = NULL;
	char *errmsg = NULL, *r;

	if (url == NULL || *url == '\0')
		return xstrdup("(environment)");
	if (foreign_scheme(url))
		return rb_url_redact(url);
	if (!is_connstr(url))
		return xstrdup(url);	/* a database name */
	if ((o = PQconninfoParse(url, &errmsg)) == NULL) {
		PQfreemem(errmsg);
		return xstrdup(UNPARSABLE);
	}
	if (!has_secret(o)) {
		PQconninfoFree(o);
		return xstrdup(url);
	}
	r = uri_prefix(url) != 0 ? mask_uri(url) : mask_conninfo(url);
	if (r != NULL && (m = PQconninfoParse(r, &errmsg)) == NULL)
		PQfreemem(errmsg);
	if (m == NULL || !same_but_masked(o, m)) {
		free(r);
		r = rebuild(o);
	}
	PQconninfoFree(m);
	PQconninfoFree(o);
	return r;
}

/* Replace each occurrence of secret (when at least 3 bytes) in s by the
 * mask, cutting the result to size. */
static void
scrub(char *s, size_t size, const char *secret)
{
	size_t n = strlen(secret);
	struct rb_sbuf b;
	const char *p = s, *at;

	if (n < 3 || strstr(s, secret) == NULL)
		return;
	rb_sb_init(&b);
	while ((at = strstr(p, secret)) != NULL) {
		rb_sb_putn(&b, p, (size_t)(at - p));
		rb_sb_puts(&b, MASK);
		p = at + n;
	}
	rb_sb_puts(&b, p);
	snprintf(s, size, "%s", b.s);
	free(b.s);
}

bool
rb_pg_conn_error(const char *url, const char *pqmsg, char *out, size_t size)
{
	PQconninfoOption *o;
	char *errmsg = NULL;

	if (size == 0)
		return false;
	if (url != NULL && *url != '\0' && !foreign_scheme(url) && is_connstr(url)) {
		if ((o = PQconninfoParse(url, &errmsg)) == NULL) {
			/* libpq's reason up to the first quote: what follows the
			 * quote is the input, password and all */
			size_t n = errmsg != NULL ? strcspn(errmsg, "\"\n") : 0;

			while (n > 0 && (errmsg[n - 1] == ' ' || errmsg[n - 1] == ':'))
				n--;
			if (n >= 7 && strncmp(errmsg, "missing", n) == 0)
				snprintf(out, size, "missing \"=\" after a keyword (the rest is not shown: "
				    "it may hold a password)");
			else if (n > 0)
				snprintf(out, size, "%.*s (the rest is not shown: it may hold a password)",
				    (int)n, errmsg);
			else
				snprintf(out, size, "libpq cannot parse it (not shown: it may hold a password)");
			PQfreemem(errmsg);
			return true;
		}
		rb_pg_error_lines(pqmsg, out, size);
		for (const PQconninfoOption *p = o; p->keyword != NULL; p++)
			if (is_secret(p->keyword) && p->val != NULL)
				scrub(out, size, p->val);
		PQconninfoFree(o);
		return false;
	}
	rb_pg_error_lines(pqmsg, out, size);
	return false;
}

void
rb_pg_error_lines(const char *pqmsg, char *out, size_t size)
{
	size_t n = 0;

	if (size == 0)
		return;
	out[0] = '\0';
	for (const char *p = pqmsg; p != NULL && *p != '\0';) {
		size_t len = strcspn(p, "\n");

		if (len > 0 && p[0] != '\t' && p[0] != ' ') {
			int w = snprintf(out + n, size - n, "%s%.*s", n > 0 ? "; " : "", (int)len, p);

			if (w < 0 || (size_t)w >= size - n)
				break;
			n += (size_t)w;
		}
		p += len;
		if (*p == '\n')
			p++;
	}
}
