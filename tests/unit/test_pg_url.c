/* SPDX-License-Identifier: MIT */
/*
 * Unit tests: connection strings redacted as libpq reads them
 * (rb_pg_url_redact), libpq's connection errors made fit for messages
 * (rb_pg_conn_error), and the neutral redaction for other schemes.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_util.h"
#include "pg/store_pg_url.h"
#include "tap.h"

static void
test_pg_redact(void)
{
	static const struct { const char *in, *want; } cases[] = {
		{ "postgresql://app:s3cret@db.example/relay", "postgresql://app:xxxxx@db.example/relay" },
		{ "postgres://app@db/relay", "postgres://app@db/relay" },
		{ "postgresql://app:p%40ss@db:5432/relay?sslmode=require",
		  "postgresql://app:xxxxx@db:5432/relay?sslmode=require" },
		{ "postgresql://db/relay?user=app&password=hunter2&sslmode=disable",
		  "postgresql://db/relay?user=app&password=xxxxx&sslmode=disable" },
		/* the audit's shapes (F4): ? or # in the userinfo ... */
		{ "postgresql://postgres:pa?ss@127.0.0.1:1/x", "postgresql://postgres:xxxxx@127.0.0.1:1/x" },
		{ "postgresql://postgres:pa#ss@127.0.0.1:1/x", "postgresql://postgres:xxxxx@127.0.0.1:1/x" },
		{ "postgresql://h93:df?:\xef@ppassword={e`", "postgresql://h93:xxxxx@ppassword={e`" },
		/* ... a percent-encoded key, sslpassword, and # in a query value */
		{ "postgresql://h/d?pass%77ord=x#y&sslpassword=z", "postgresql://h/d?pass%77ord=xxxxx&sslpassword=xxxxx" },
		{ "postgresql://h/d?password=a&password=b", "postgresql://h/d?password=xxxxx&password=xxxxx" },
		/* the first @ ends the userinfo, as for libpq */
		{ "postgresql://u:a@b@h/d", "postgresql://u:xxxxx@b@h/d" },
		{ "postgresql://u:@h/d", "postgresql://u:@h/d" },
		{ "postgresql://h/d?password=", "postgresql://h/d?password=" },
		/* conninfo: any whitespace separates pairs; quotes and backslashes */
		{ "host=db user=app password=hunter2 dbname=relay", "host=db user=app password=xxxxx dbname=relay" },
		{ "host=h\npassword=NewlineSecret", "host=h\npassword=xxxxx" },
		{ "host=h\r\v\fpassword=s1 sslpassword = 's 2'", "host=h\r\v\fpassword=xxxxx sslpassword = 'xxxxx'" },
		{ "host=db password = 'a b\\' c' dbname=relay", "host=db password = 'xxxxx' dbname=relay" },
		{ "host=h password=a\\ b dbname=d", "host=h password=xxxxx dbname=d" },
		{ "host=h password='x'dbname=d", "host=h password='xxxxx'dbname=d" },
		{ "host=h password=''", "host=h password=''" },
		{ "host=db dbname=relay", "host=db dbname=relay" },
		/* a database name, the environment, what libpq cannot parse */
		{ "shop", "shop" },
		{ "", "(environment)" },
		{ "postgresql://postgres:se%zzret@127.0.0.1:1/x", "(unparsable connection string)" },
		{ "host=h password='unterminated", "(unparsable connection string)" },
		{ "host=h nosuchoption=1 password=p", "(unparsable connection string)" },
		/* other schemes: the neutral masking */
		{ "mongodb://u:p@ss/w@h:27017/db?authSource=admin", "mongodb://u:xxxxx@h:27017/db?authSource=admin" },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *r = rb_pg_url_redact(cases[i].in);

		is_str(r, cases[i].want, "pg redact case %zu", i);
		free(r);
	}
	char *r = rb_pg_url_redact(NULL);
	is_str(r, "(environment)", "NULL is the environment");
	free(r);
	/* masking in place would turn ?a=b into a second query: rebuilt as pairs */
	r = rb_pg_url_redact("postgresql://u:p?q@h/d?sslmode=disable");
	ok(r != NULL && strstr(r, "p?q") == NULL, "password with ? before a query: %s", r);
	free(r);
}

static void
test_conn_error(void)
{
	char out[256];

	ok(rb_pg_conn_error("postgresql://postgres:se%zzret@h/x",
	    "invalid percent-encoded token: \"se%zzret\"\n", out, sizeof out), "parse error is flagged");
	is_str(out, "invalid percent-encoded token (the rest is not shown: it may hold a password)",
	    "percent-escape error without the token");
	ok(rb_pg_conn_error("host=h secret", "missing \"=\" after \"secret\" in connection info string\n",
	    out, sizeof out), "missing = flagged");
	is_str(out, "missing \"=\" after a keyword (the rest is not shown: it may hold a password)",
	    "missing = without the keyword");
	ok(rb_pg_conn_error("postgresql://postgres@h?password=Se%zzcret",
	    "invalid percent-encoded token: \"Se%zzcret\"", out, sizeof out) && strstr(out, "zz") == NULL,
	    "query percent-escape error without the token");
	ok(!rb_pg_conn_error("postgresql://u:TopSecret@h/d",
	    "connection to server at \"h\" failed: FATAL:  role TopSecret\n\tan indented hint\n", out, sizeof out),
	    "a connection error is not a parse error");
	is_str(out, "connection to server at \"h\" failed: FATAL:  role xxxxx", "the password is scrubbed, one line");
	/* a multi-host URL: one line per host, every one shown (not the hints) */
	ok(!rb_pg_conn_error("postgresql://u:TopSecret@h1,h2/d",
	    "connection to server at \"h1\", port 5432 failed: Connection refused\n"
	    "\tIs the server running on that host and accepting TCP/IP connections?\n"
	    "connection to server at \"h2\", port 5432 failed: FATAL:  role TopSecret\n", out, sizeof out),
	    "multi-host: not a parse error");
	is_str(out, "connection to server at \"h1\", port 5432 failed: Connection refused; "
	    "connection to server at \"h2\", port 5432 failed: FATAL:  role xxxxx",
	    "multi-host: every host's line, scrubbed, without the hints");
	ok(!rb_pg_conn_error(NULL, "connection to server on socket failed\n", out, sizeof out), "environment");
	is_str(out, "connection to server on socket failed", "environment: first line");
}

static void
test_neutral(void)
{
	static const struct { const char *in, *want; } cases[] = {
		{ "mongodb://app:s3cret@db.example/relay", "mongodb://app:xxxxx@db.example/relay" },
		{ "mongodb://app:pa?ss@h/d", "mongodb://app:xxxxx@h/d" },
		{ "mongodb://app:pa/ss@h/d", "mongodb://app:xxxxx@h/d" },
		{ "mongodb://h/d?x=1&Password=abc&sslPassword=def", "mongodb://h/d?x=1&Password=xxxxx&sslPassword=xxxxx" },
		{ "x://h?a=1;password=p;b=2", "x://h?a=1;password=xxxxx;b=2" },
		{ "mongodb://h/d", "mongodb://h/d" },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *r = rb_url_redact(cases[i].in);

		is_str(r, cases[i].want, "neutral redact %s", cases[i].in);
		free(r);
	}
}

int
main(void)
{
	test_pg_redact();
	test_conn_error();
	test_neutral();
	return done_testing();
}
