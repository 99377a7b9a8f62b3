/* SPDX-License-Identifier: MIT */
/*
 * store_pg_setup.c: the set-up.  The script is schema_pg.sql (and
 * schema_history_pg.sql) rendered for the schema, under an advisory lock,
 * between what store_pg_version.c puts around it (the version guard, the
 * lane function, the upgrade from relaybus 0.1.0, the version check),
 * plus the subscriptions: rb_store_setup runs it in one transaction with
 * the subscriptions as parameters, rb-setup --print-sql prints it with
 * them as literals; then the grants (store_pg_grants.c).
 */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

extern const char rb_schema_pg_sql[];
extern const char rb_schema_history_pg_sql[];


/* A SQL string literal for --print-sql: an E'' literal, which reads the
 * same whatever standard_conforming_strings says (with a plain '' one, a
 * pattern holding \' would end the literal where it is off). */
static void
sb_literal(struct rb_sbuf *b, const char *v)
{
	rb_sb_puts(b, "E'");
	for (; *v != '\0'; v++) {
		if (*v == '\'' || *v == '\\')
			rb_sb_putn(b, v, 1);
		rb_sb_putn(b, v, 1);
	}
	rb_sb_puts(b, "'");
}

/* glob (* and ?) -> LIKE pattern with \ as escape */
static char *
glob_to_like(const char *g)
{
	struct rb_sbuf b;

	rb_sb_init(&b);
	for (; *g != '\0'; g++) {
		if (*g == '*')
			rb_sb_puts(&b, "%");
		else if (*g == '?')
			rb_sb_puts(&b, "_");
		else if (*g == '%' || *g == '_' || *g == '\\') {
			rb_sb_puts(&b, "\\");
			rb_sb_putn(&b, g, 1);
		} else
			rb_sb_putn(&b, g, 1);
	}
	return b.s;
}

/* What every set-up transaction runs first: relaybus's names only, and
 * one set-up at a time */
static void
preamble(struct rb_sbuf *b)
{
	/* every name the script makes or binds resolves in pg_catalog or is
	 * the schema's, qualified: an operator another role made in public
	 * cannot become the view's && (relaybus(7), SECURITY) */
	rb_sb_puts(b, "SET LOCAL search_path = pg_catalog, pg_temp;\n"
	    "SELECT pg_advisory_xact_lock(" SETUP_LOCK_KEY ");\n");
}

/* The schema's tables, views and functions: what a re-run on a schema this
 * script made already need not run again (pg_setup) */
static void
ddl_script(struct rb_sbuf *b, const char *schema, bool history)
{
	char *sql;

	pg_setup_before(b, schema);
	sql = pg_render(rb_schema_pg_sql, schema);
	rb_sb_puts(b, sql);
	free(sql);
	pg_setup_after(b, schema);
	if (history) {
		sql = pg_render(rb_schema_history_pg_sql, schema);
		rb_sb_puts(b, sql);
		free(sql);
	}
}

/* The whole set-up as one script, for --print-sql */
static void
setup_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o)
{
	preamble(b);
	ddl_script(b, schema, o->completion_history);
	if (o->max_delay_ms > 0) {
		char v[64];
		char *q = pg_render("INSERT INTO @S@.relaybus_settings (name, value) VALUES ('max_delay', ", schema);

		snprintf(v, sizeof v, "%lld milliseconds", (long long)o->max_delay_ms);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, v);
		rb_sb_puts(b, ") ON CONFLICT (name) DO UPDATE SET value = excluded.value;\n");
	}
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf, *like, *q;
		const char *h, *p;

		if (rb_subscription_parse(o->subscribe[i], &buf, &h, &p, NULL) < 0)
			continue;
		like = glob_to_like(p);
		q = pg_render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) VALUES (", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, ", ");
		sb_literal(b, p);
		rb_sb_puts(b, ", ");
		sb_literal(b, like);
		rb_sb_puts(b, ") ON CONFLICT DO NOTHING;\n");
		q = pg_render("SELECT @S@.relaybus_seed_lanes(", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, ");\n");
		free(like);
		free(buf);
	}
	for (size_t i = 0; i < o->n_unsubscribe; i++) {
		char *buf, *q;
		const char *h, *p;

		if (rb_subscription_parse(o->unsubscribe[i], &buf, &h, &p, NULL) < 0)
			continue;
		q = pg_render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = ", schema);
		rb_sb_puts(b, q);
		free(q);
		sb_literal(b, h);
		rb_sb_puts(b, " AND pattern = ");
		sb_literal(b, p);
		rb_sb_puts(b, ";\n");
		free(buf);
	}
	pg_grants_script(b, schema, o);	/* last: it covers every function made above */
}

static int
check_subscriptions(const struct rb_setup_opts *o, struct rb_error *err)
{
	for (size_t i = 0; i < o->n_subscribe + o->n_unsubscribe; i++) {
		const char *spec = i < o->n_subscribe ? o->subscribe[i] : o->unsubscribe[i - o->n_subscribe];
		char *buf;
		const char *h, *p;

		if (rb_subscription_parse(spec, &buf, &h, &p, err) < 0)
			return -1;
		free(buf);
	}
	for (size_t i = 0; i < o->n_grant + o->n_revoke; i++) {
		char *buf;
		const char *k, *r, *h;

		if (rb_grant_parse(i < o->n_grant ? o->grant[i] : o->revoke[i - o->n_grant], &buf, &k, &r, &h,
		    err) < 0)
			return -1;
		free(buf);
	}
	return 0;
}

char *
pg_setup_script(const char *schema, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;

	if (check_subscriptions(o, err) < 0)
		return NULL;
	rb_sb_init(&b);
	if (o->no_transaction)
		rb_sb_puts(&b, "-- relaybus schema set-up, for a migration tool: run it in one transaction\n");
	else
		rb_sb_puts(&b, "-- relaybus schema set-up; apply in one transaction\nBEGIN;\n");
	/* (no NOTICE of CREATE ... IF NOT EXISTS on a second run) */
	rb_sb_puts(&b, "SET LOCAL standard_conforming_strings = on;\n"
	    "SET LOCAL client_min_messages = warning;\n");
	setup_script(&b, schema, o);
	if (!o->no_transaction)
		rb_sb_puts(&b, "COMMIT;\n");
	return b.s;
}

/* The roles other than the owner that can create objects in the schema
 * (not superusers, who can do anything anyway; PUBLIC when every role
 * can): relaybus's own statements and functions resolve names in
 * pg_catalog only, but an application's sessions, a pooled owner session
 * (relaybus(7), SECURITY) and psql do not.  Said once, after the set-up. */
static const char creators_sql[] =
    "SELECT pg_catalog.string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END, "
    "  ', ' ORDER BY a.grantee <> 0, r.rolname) "
    "FROM pg_catalog.pg_namespace n "
    "CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))) a "
    "LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee "
    "WHERE n.nspname = $1 AND a.privilege_type = 'CREATE' "
    "  AND (a.grantee = 0 OR (r.rolname <> current_user AND NOT r.rolsuper "
    "    AND NOT (r.rolname = 'pg_database_owner' AND EXISTS (SELECT FROM pg_catalog.pg_database d "
    "      WHERE d.datname = pg_catalog.current_database() AND d.datdba = "
    "        (SELECT u.oid FROM pg_catalog.pg_roles u WHERE u.rolname = current_user)))))";

static void
warn_creators(struct rb_store *s)
{
	const char *p[1] = { s->schema };
	struct rb_error e = { 0 };
	PGresult *res = pg_run(s, creators_sql, 1, p, PGRES_TUPLES_OK, "set-up", false, &e);

	if (res != NULL && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
		rb_warn("schema %s: roles other than the owner can create objects in it (%s): an operator or "
		    "function they make there can take over unqualified names in the sessions of every role "
		    "that has the schema on its search_path; fix: REVOKE CREATE ON SCHEMA %s FROM %s",
		    s->schema, PQgetvalue(res, 0, 0), s->schema, PQgetvalue(res, 0, 0));
	PQclear(res);
}

/*
 * A re-run (a deploy script's, a new subscription, a grant) on a schema
 * that this very DDL made takes no lock that a claim, a completion or a
 * publish waits for: the DDL is skipped when the schema is at this
 * version and its fingerprint is the script's hash (FNV-1a 64) and a
 * digest of its catalog as the script
 * left it (tables and their columns, defaults and options, indexes,
 * constraints, the view's definition, each function's source and
 * settings), so that a schema changed by hand since, or by another
 * version, is set up again.  A real change locks what its ALTERs and the
 * view's re-creation lock, first and in the order the delivery path takes
 * them (grants, lanes, the view with the events, then deliveries), so that
 * it cannot deadlock with a running dispatcher.
 */
#define CATALOG_DIGEST \
    "(SELECT pg_catalog.md5(coalesce(pg_catalog.string_agg(s.x, E'\\n' ORDER BY s.x), '')) FROM (" \
    "  SELECT c.relname || ' ' || c.relkind::pg_catalog.text || ' ' || coalesce(pg_catalog.array_to_string(c.reloptions, ','), '') " \
    "    || ' ' || coalesce((SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod) " \
    "         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END " \
    "         || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''), ', ' ORDER BY a.attnum) " \
    "       FROM pg_catalog.pg_attribute a LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum " \
    "      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '') " \
    "    || CASE c.relkind WHEN 'v' THEN ' ' || pg_catalog.pg_get_viewdef(c.oid) " \
    "                      WHEN 'i' THEN ' ' || pg_catalog.pg_get_indexdef(c.oid) ELSE '' END " \
    "    FROM pg_catalog.pg_class c WHERE c.relnamespace = '@S@'::pg_catalog.regnamespace " \
    "  UNION ALL " \
    "  SELECT 'f ' || p.oid::pg_catalog.regprocedure::pg_catalog.text || ' ' || pg_catalog.md5(p.prosrc) || ' ' " \
    "         || p.prosecdef::pg_catalog.text || ' ' || coalesce(pg_catalog.array_to_string(p.proconfig, ','), '') " \
    "    FROM pg_catalog.pg_proc p WHERE p.pronamespace = '@S@'::pg_catalog.regnamespace " \
    "  UNION ALL " \
    "  SELECT 'k ' || co.conname || ' ' || pg_catalog.pg_get_constraintdef(co.oid) " \
    "    FROM pg_catalog.pg_constraint co WHERE co.connamespace = '@S@'::pg_catalog.regnamespace) s(x))"
static const char fp_same_sql[] =
    "SELECT coalesce((SELECT s.value FROM @S@.relaybus_settings s WHERE s.name = 'script'), '') = "
    "  $1 || ':' || " CATALOG_DIGEST " "
    "  AND (SELECT max(v.version) FROM @S@.relaybus_schema_version v) = $2::pg_catalog.int4";
static const char fp_write_sql[] =
    "INSERT INTO @S@.relaybus_settings (name, value) SELECT 'script', $1 || ':' || " CATALOG_DIGEST " "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value";

static void
fingerprint(const char *text, char *buf, size_t size)
{
	uint64_t h = 14695981039346656037ULL;

	for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	snprintf(buf, size, "%016llx", (unsigned long long)h);
}

/* 1: the schema is what ddl (fingerprint fp) makes; 0: not (or not set
 * up); -1 + err */
static int
ddl_current(struct rb_store *s, const char *fp, struct rb_error *err)
{
	char name[80], version[16], *q;
	const char *p1[1] = { name }, *p2[2] = { fp, version };
	PGresult *res;
	int same;

	snprintf(name, sizeof name, "\"%s\".relaybus_settings", s->schema);
	res = pg_run(s, "SELECT pg_catalog.to_regclass($1) IS NOT NULL", 1, p1, PGRES_TUPLES_OK, "set-up", false,
	    err);
	if (res == NULL)
		return -1;
	same = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	if (!same)
		return 0;
	snprintf(version, sizeof version, "%d", RB_SCHEMA_VERSION);
	q = pg_render(fp_same_sql, s->schema);
	res = pg_run(s, q, 2, p2, PGRES_TUPLES_OK, "set-up", false, err);
	free(q);
	if (res == NULL)
		return -1;
	same = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return same;
}

/* The DDL, unless the schema is what it makes already: 1 (it ran: fp
 * holds its fingerprint, for write_fingerprint once the grants made the
 * definer functions what they are), 0 (not needed) or -1 + err */
static int
run_ddl(struct rb_store *s, const struct rb_setup_opts *o, char *fp, size_t size, struct rb_error *err)
{
	struct rb_sbuf ddl;
	int rc;

	rb_sb_init(&ddl);
	ddl_script(&ddl, s->schema, o->completion_history);
	fingerprint(ddl.s, fp, size);
	rc = ddl_current(s, fp, err);
	if (rc == 1) {
		rb_debug("schema %s is what this set-up makes already: its tables are not touched", s->schema);
		rc = 0;
	} else if (rc == 0)
		rc = pg_setup_lock_tables(s, o, err) < 0 || pg_run_cmd(s, ddl.s, "set-up", err) < 0 ? -1 : 1;
	free(ddl.s);
	return rc;
}

/* The schema's fingerprint, last in the set-up's transaction: 0 or -1 */
static int
write_fingerprint(struct rb_store *s, const char *fp, struct rb_error *err)
{
	const char *p[1] = { fp };
	char *q = pg_render(fp_write_sql, s->schema);
	int rc = pg_cmd_on(s, pg_be(s)->conn, q, 1, p, "set-up", err);

	free(q);
	return rc;
}

/* rb-setup --max-delay: 0 or -1 */
static int
set_max_delay(struct rb_store *s, int64_t ms, struct rb_error *err)
{
	char v[64], *q;
	const char *p[1] = { v };
	int rc;

	if (ms <= 0)
		return 0;
	snprintf(v, sizeof v, "%lld milliseconds", (long long)ms);
	q = pg_render("INSERT INTO @S@.relaybus_settings (name, value) VALUES ('max_delay', $1) "
	    "ON CONFLICT (name) DO UPDATE SET value = excluded.value", s->schema);
	rc = pg_cmd_on(s, pg_be(s)->conn, q, 1, p, "set-up", err);
	free(q);
	return rc;
}

int
pg_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	struct rb_sbuf b;
	char fp[32];
	int rc = -1, ddl = 0;

	if (check_subscriptions(o, err) < 0)
		return -1;
	rb_sb_init(&b);
	preamble(&b);
	if (pg_run_cmd(s, "BEGIN", "set-up", err) < 0)
		goto out;
	/* quiet the NOTICEs of CREATE ... IF NOT EXISTS on a second run */
	if (pg_run_cmd(s, "SET LOCAL client_min_messages = warning", "set-up", err) < 0 ||
	    /* the long steps of an upgrade say where they are, on a terminal */
	    (rb_log_progress_wanted() && pg_run_cmd(s, "SET LOCAL relaybus.progress = on", "set-up", err) < 0) ||
	    pg_setup_lock(s, o, err) < 0 || pg_run_cmd(s, b.s, "set-up", err) < 0 ||
	    (ddl = run_ddl(s, o, fp, sizeof fp, err)) < 0 || set_max_delay(s, o->max_delay_ms, err) < 0)
		goto fail;
	for (size_t i = 0; i < o->n_subscribe; i++) {
		char *buf, *like, *q1, *q2;
		const char *h, *p;

		rb_subscription_parse(o->subscribe[i], &buf, &h, &p, NULL);
		like = glob_to_like(p);
		const char *params[3] = { h, p, like };
		q1 = pg_render("INSERT INTO @S@.relaybus_subscriptions (handler, pattern, like_pattern) "
		    "VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", s->schema);
		q2 = pg_render("SELECT @S@.relaybus_seed_lanes($1)", s->schema);
		PGresult *r1 = pg_run(s, q1, 3, params, PGRES_COMMAND_OK, "subscribe", false, err);
		PGresult *r2 = r1 != NULL ? pg_run(s, q2, 1, params, PGRES_TUPLES_OK, "subscribe", false, err) : NULL;
		bool ok = r1 != NULL && r2 != NULL;
		PQclear(r1);
		PQclear(r2);
		free(q1);
		free(q2);
		free(like);
		free(buf);
		if (!ok)
			goto fail;
	}
	for (size_t i = 0; i < o->n_unsubscribe; i++) {
		char *buf, *q;
		const char *h, *p;

		rb_subscription_parse(o->unsubscribe[i], &buf, &h, &p, NULL);
		const char *params[2] = { h, p };
		q = pg_render("DELETE FROM @S@.relaybus_subscriptions WHERE handler = $1 AND pattern = $2", s->schema);
		PGresult *r = pg_run(s, q, 2, params, PGRES_COMMAND_OK, "unsubscribe", false, err);
		bool ok = r != NULL;
		PQclear(r);
		free(q);
		free(buf);
		if (!ok)
			goto fail;
	}
	/* last: the privileges of every function made above */
	if (pg_grants_setup(s, o, err) < 0 || (ddl == 1 && write_fingerprint(s, fp, err) < 0))
		goto fail;
	if (pg_run_cmd(s, "COMMIT", "set-up", err) < 0)
		goto out;
	warn_creators(s);
	rc = 0;
	goto out;
fail:
	pg_rollback_quietly(s);
out:
	free(b.s);
	return rc;
}
