/* SPDX-License-Identifier: MIT */
/*
 * store_pg_version.c: schema versions on PostgreSQL, and the parts of the
 * set-up script around schema_pg.sql.
 *
 * A program reads the version once, when it starts (rb_store_require_schema,
 * from rb_cli_open): one query on the happy path, which reads the highest
 * version of relaybus_schema_version and whether deliveries still have the
 * lease_token column of relaybus 0.1.0.  Only when the version table is
 * missing does a second, catalog-only query tell "not set up" from "0.1.0".
 * Nothing here runs per delivery.
 *
 * The set-up script is: the advisory lock; a guard that refuses a schema
 * newer than RB_SCHEMA_VERSION before anything is changed; lane_pg.sql;
 * upgrade_010_pg.sql; schema_pg.sql; upgrade_010_post_pg.sql; a check that
 * the script left the schema at RB_SCHEMA_VERSION (schema_pg.sql writes the
 * number, this file knows it: the check keeps the two together).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

extern const char rb_lane_pg_sql[];
extern const char rb_upgrade_010_pg_sql[];
extern const char rb_upgrade_010_post_pg_sql[];

/* deliveries still have 0.1.0's lease_token column */
#define IS_010_SQL \
	"EXISTS (SELECT 1 FROM pg_catalog.pg_attribute " \
	"WHERE attrelid = to_regclass('@S@.relaybus_deliveries') AND attname = 'lease_token' " \
	"AND NOT attisdropped)"

static const char version_sql[] =
    "SELECT (SELECT max(version) FROM @S@.relaybus_schema_version), " IS_010_SQL;
/* the same, without reading a table that may be missing */
static const char catalog_sql[] =
    "SELECT to_regclass('@S@.relaybus_schema_version') IS NOT NULL, " IS_010_SQL;

/* (not pg_run: a missing table is an answer here, not an error to report) */
static PGresult *
exec_rendered(struct rb_store *s, const char *tmpl)
{
	char *sql = pg_render(tmpl, s->schema);
	PGresult *res = PQexec(pg_be(s)->conn, sql);

	free(sql);
	return res;
}

static bool
missing_relation(const PGresult *res)
{
	const char *st = pg_sqlstate(res);

	/* undefined table; a schema-qualified name in a missing schema */
	return strcmp(st, "42P01") == 0 || strcmp(st, "3F000") == 0;
}

int
pg_schema_info(struct rb_store *s, struct rb_schema_info *info, struct rb_error *err)
{
	PGconn *c = pg_be(s)->conn;
	PGresult *res;
	bool have_table = true, is_010;

	memset(info, 0, sizeof *info);
	info->expected = RB_SCHEMA_VERSION;
	if (c == NULL)
		return rb_seterr(err, RB_EXIT_UNAVAILABLE, "schema version: not connected");
	/* (in a transaction a failed query would abort it: ask the catalog first) */
	res = PQtransactionStatus(c) == PQTRANS_IDLE ? exec_rendered(s, version_sql) : NULL;
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
		if (res != NULL && !missing_relation(res))
			goto fail;
		PQclear(res);
		res = exec_rendered(s, catalog_sql);
		if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
			goto fail;
		have_table = PQgetvalue(res, 0, 0)[0] == 't';
		if (have_table) {
			PQclear(res);
			res = exec_rendered(s, version_sql);
			if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
				goto fail;
		}
	}
	is_010 = PQgetvalue(res, 0, 1)[0] == 't';
	if (have_table && !PQgetisnull(res, 0, 0))
		info->installed = atoi(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (is_010)
		info->state = RB_SCHEMA_010;
	else if (!have_table)
		info->state = RB_SCHEMA_ABSENT;
	else if (info->installed < info->expected)
		info->state = RB_SCHEMA_OLDER;
	else if (info->installed > info->expected)
		info->state = RB_SCHEMA_NEWER;
	else
		info->state = RB_SCHEMA_CURRENT;
	return 0;
fail:
	pg_fail(s, res, "schema version", err);
	PQclear(res);
	return -1;
}

static void
put_rendered(struct rb_sbuf *b, const char *tmpl, const char *schema)
{
	char *sql = pg_render(tmpl, schema);

	rb_sb_puts(b, sql);
	free(sql);
}

/* The version as SQL text. */
static void
put_version(struct rb_sbuf *b)
{
	char v[16];

	snprintf(v, sizeof v, "%d", RB_SCHEMA_VERSION);
	rb_sb_puts(b, v);
}

void
pg_setup_before(struct rb_sbuf *b, const char *schema)
{
	/* RBV01: pg_fail_on (store_pg_exec.c) reports it as RB_EXIT_PROTOCOL */
	put_rendered(b,
	    "-- refuse a schema that a newer relaybus set up, before changing anything\n"
	    "DO $guard$\n"
	    "DECLARE\n"
	    "    v integer;\n"
	    "BEGIN\n"
	    "    IF to_regclass('@S@.relaybus_schema_version') IS NOT NULL THEN\n"
	    "        SELECT max(version) INTO v FROM @S@.relaybus_schema_version;\n"
	    "        IF v > ", schema);
	put_version(b);
	put_rendered(b, " THEN\n"
	    "            RAISE EXCEPTION 'schema % is at version %, this relaybus understands up to %: "
	    "use a newer relaybus', '@S@', v, ", schema);
	put_version(b);
	rb_sb_puts(b, "\n                USING ERRCODE = 'RBV01';\n"
	    "        END IF;\n"
	    "    END IF;\n"
	    "END $guard$;\n");
	put_rendered(b, rb_lane_pg_sql, schema);
	put_rendered(b, rb_upgrade_010_pg_sql, schema);
}

void
pg_setup_after(struct rb_sbuf *b, const char *schema)
{
	put_rendered(b, rb_upgrade_010_post_pg_sql, schema);
	put_rendered(b,
	    "-- the version this relaybus expects is the one the script wrote\n"
	    "DO $verify$\n"
	    "DECLARE\n"
	    "    v integer;\n"
	    "BEGIN\n"
	    "    SELECT max(version) INTO v FROM @S@.relaybus_schema_version;\n"
	    "    IF v IS DISTINCT FROM ", schema);
	put_version(b);
	put_rendered(b, " THEN\n"
	    "        RAISE EXCEPTION 'the set-up left schema % at version %, this relaybus expects %', "
	    "'@S@', v, ", schema);
	put_version(b);
	rb_sb_puts(b, "\n            USING ERRCODE = 'RBV02';\n"
	    "    END IF;\n"
	    "END $verify$;\n");
}
