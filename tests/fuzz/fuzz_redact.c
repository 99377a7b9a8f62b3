/* SPDX-License-Identifier: MIT */
/*
 * fuzz_redact: rb_pg_url_redact against libpq's own PQconninfoParse.
 * Properties, for the input cut at its first NUL:
 *   - what libpq parses, the redacted text parses too, to the same options
 *     but password and sslpassword, which read "xxxxx" (when set, not empty);
 *   - a password libpq reads (4+ letters g-z, so that no escape, keyword or
 *     other value can spell it by chance) never appears in the redacted text;
 *   - what libpq cannot parse is shown as "(unparsable connection string)",
 *     and rb_pg_conn_error keeps no quoted part of libpq's parse error;
 *   - rb_pg_conn_error masks the password in a connection error;
 *   - the neutral rb_url_redact hides the password of scheme://user:pw@host.
 * (A harness of the PostgreSQL backend: it may use libpq.)
 */
#include "config.h"

#include <stdbool.h>

#include <libpq-fe.h>

#include "rb_util.h"
#include "pg/store_pg_url.h"
#include "fuzz.h"

static bool
secret_kw(const char *k)
{
	return strcmp(k, "password") == 0 || strcmp(k, "sslpassword") == 0;
}

static bool
connstr(const char *s)
{
	return strncmp(s, "postgresql://", 13) == 0 || strncmp(s, "postgres://", 11) == 0 ||
	    strchr(s, '=') != NULL;
}

static bool
foreign(const char *s)
{
	size_t n = 0;

	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
		return false;
	while ((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9') ||
	    s[n] == '+' || s[n] == '-' || s[n] == '.')
		n++;
	return strncmp(s + n, "://", 3) == 0 && strncmp(s, "postgresql://", 13) != 0 &&
	    strncmp(s, "postgres://", 11) != 0;
}

/* Only letters g-z, at least 4: no hex digit, no syntax, no escape can make it. */
static bool
plain_word(const char *s)
{
	size_t n = 0;

	for (; s[n] != '\0'; n++)
		if (!((s[n] >= 'g' && s[n] <= 'z') || (s[n] >= 'G' && s[n] <= 'Z')))
			return false;
	return n >= 4;
}

static void
check_pg(const char *s)
{
	char *err = NULL, *r = rb_pg_url_redact(s);
	PQconninfoOption *o = PQconninfoParse(s, &err), *m;
	char out[400];

	if (*s == '\0') {
		FUZZ_CHECK(strcmp(r, "(environment)") == 0, "empty: '%s'", r);
		goto out;
	}
	if (foreign(s))
		goto out;	/* the neutral redaction, below */
	if (!connstr(s)) {
		FUZZ_CHECK(strcmp(r, s) == 0, "a database name changed: '%s' -> '%s'", s, r);
		goto out;
	}
	if (o == NULL) {
		FUZZ_CHECK(strcmp(r, "(unparsable connection string)") == 0, "unparsable '%s' -> '%s'", s, r);
		FUZZ_CHECK(rb_pg_conn_error(s, err != NULL ? err : "", out, sizeof out), "not flagged: '%s'", s);
		{
			const char *fixed = "missing \"=\" after a keyword";
			const char *q = strchr(out, '"');

			FUZZ_CHECK(q == NULL || strncmp(out, fixed, strlen(fixed)) == 0,
			    "quoted text in the parse error of '%s': '%s'", s, out);
			if (q != NULL)
				FUZZ_CHECK(strchr(out + strlen(fixed), '"') == NULL, "quoted text: '%s'", out);
		}
		goto out;
	}
	/* the redacted text says the same as the original, passwords masked */
	m = PQconninfoParse(r, NULL);
	FUZZ_CHECK(m != NULL, "'%s' -> '%s', which libpq cannot parse", s, r);
	for (size_t i = 0; o[i].keyword != NULL; i++) {
		const char *want = o[i].val;

		FUZZ_CHECK(m[i].keyword != NULL && strcmp(m[i].keyword, o[i].keyword) == 0, "keywords");
		if (secret_kw(o[i].keyword) && want != NULL && *want != '\0')
			want = "xxxxx";
		FUZZ_CHECK((want == NULL) == (m[i].val == NULL) && (want == NULL || strcmp(want, m[i].val) == 0),
		    "'%s' -> '%s': %s is '%s', want '%s'", s, r, o[i].keyword, m[i].val ? m[i].val : "(unset)",
		    want ? want : "(unset)");
	}
	PQconninfoFree(m);
	/* and a password that nothing else can spell is not in it */
	for (size_t i = 0; o[i].keyword != NULL; i++) {
		const char *pw = o[i].val;
		bool elsewhere = false;

		if (!secret_kw(o[i].keyword) || pw == NULL || !plain_word(pw))
			continue;
		for (size_t j = 0; o[j].keyword != NULL; j++)
			if ((o[j].val != NULL && !secret_kw(o[j].keyword) && strstr(o[j].val, pw) != NULL) ||
			    strstr(o[j].keyword, pw) != NULL)
				elsewhere = true;
		if (strstr("postgresql://xxxxx", pw) != NULL)
			elsewhere = true;
		/* spelled twice in the text: by a value libpq does not keep (a
		 * URL's user overridden by ?user=), which stays as written; the
		 * parse above has checked the password itself is masked */
		{
			const char *at = strstr(s, pw);

			if (at != NULL && strstr(at + 1, pw) != NULL)
				elsewhere = true;
		}
		/* a keyword given twice: libpq keeps the last value, and the
		 * text still holds the earlier one, which may spell it */
		for (size_t j = 0; o[j].keyword != NULL && !elsewhere; j++) {
			const char *at = strstr(s, o[j].keyword);

			if (!secret_kw(o[j].keyword) && at != NULL && strstr(at + 1, o[j].keyword) != NULL)
				elsewhere = true;
		}
		FUZZ_CHECK(elsewhere || strstr(r, pw) == NULL, "'%s' -> '%s' shows the password '%s'", s, r, pw);
		/* a connection error that quotes it: masked (unless it is
		 * spelled by the mask itself) */
		if (strstr("xxxxx", pw) == NULL) {
			char msg[600];

			snprintf(msg, sizeof msg, "FATAL: for %s: refused", pw);
			FUZZ_CHECK(!rb_pg_conn_error(s, msg, out, sizeof out), "a parsed string flagged");
			FUZZ_CHECK(strstr(out, pw) == NULL, "conn error '%s' shows '%s'", out, pw);
		}
	}
out:
	PQfreemem(err);
	PQconninfoFree(o);
	free(r);
}

/* scheme://USER:PW@REST built from the input: PW must not survive. */
static void
check_neutral(const uint8_t *data, size_t size)
{
	char user[64] = "", pw[64] = "", rest[128] = "", url[300], *r;
	size_t i = 0, n;

	for (n = 0; i < size && data[i] != ':' && data[i] != '\0' && n < sizeof user - 1; i++)
		user[n++] = (char)data[i];
	user[n] = '\0';
	for (i++, n = 0; i < size && data[i] != '\0' && n < sizeof pw - 1; i++)
		pw[n++] = (char)data[i];
	pw[n] = '\0';
	for (i++, n = 0; i < size && data[i] != '\0' && n < sizeof rest - 1; i++)
		rest[n++] = (char)data[i];
	rest[n] = '\0';
	/* (a password of x's alone can be spelled by a mask beside the text's
	 * own x's: "password = 'v'xxxxx" masks to "password = xxxxxxxxxx") */
	if (!plain_word(pw) || strstr(user, pw) != NULL || strstr(rest, pw) != NULL ||
	    strstr("mongodb://xxxxx", pw) != NULL || strspn(pw, "x") == strlen(pw))
		return;
	snprintf(url, sizeof url, "mongodb://%s:%s@%s", user, pw, rest);
	r = rb_url_redact(url);
	if (strstr(r, pw) != NULL) {
		/* spelled by a mask beside the text's own letters, not by the
		 * password: the same text without the password spells it too
		 * ("password = 'v'xxxt" in the user masks to "xxxxxxxxt") */
		char *r0;

		snprintf(url, sizeof url, "mongodb://%s:@%s", user, rest);
		r0 = rb_url_redact(url);
		FUZZ_CHECK(strstr(r0, pw) != NULL, "neutral '%s' -> '%s'", url, r);
		free(r0);
	}
	free(r);
	free(rb_url_redact((const char *)user));	/* anything: no crash */
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = fuzz_cstr(data, size);

	check_pg(s);
	free(rb_url_redact(s));
	check_neutral(data, size);
	free(s);
	return 0;
}
