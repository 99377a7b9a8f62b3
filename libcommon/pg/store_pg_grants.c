/* SPDX-License-Identifier: MIT */
/*
 * store_pg_grants.c: rb-setup --grant and --revoke (parsed by rb_grant_parse,
 * records.c).  A grant is a row of
 * relaybus_grants (written by relaybus_grant, removed by relaybus_revoke);
 * relaybus_apply_grants turns the rows into privileges and runs last in
 * every set-up, so that functions created again get them back (all three
 * in schema_pg.sql, "Roles").  Role names go to the server as parameters
 * (or, for --print-sql, as literals of a restricted alphabet) and are
 * quoted there with format('%I').
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

/* Append a SQL string literal of a checked name (no quote, no backslash). */
static void
sb_name(struct rb_sbuf *b, const char *v)
{
	if (v == NULL) {
		rb_sb_puts(b, "NULL");
		return;
	}
	rb_sb_puts(b, "'");
	rb_sb_puts(b, v);
	rb_sb_puts(b, "'");
}

void
pg_grants_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o)
{
	for (size_t i = 0; i < o->n_revoke + o->n_grant; i++) {
		bool rev = i < o->n_revoke;
		char *buf;
		const char *kind, *role, *hs;

		if (rb_grant_parse(rev ? o->revoke[i] : o->grant[i - o->n_revoke], &buf, &kind, &role, &hs,
		    NULL) < 0)
			continue;
		rb_sb_puts(b, "SELECT \"");
		rb_sb_puts(b, schema);
		rb_sb_puts(b, rev ? "\".relaybus_revoke(" : "\".relaybus_grant(");
		sb_name(b, kind);
		rb_sb_puts(b, ", ");
		sb_name(b, role);
		rb_sb_puts(b, ", ");
		sb_name(b, hs);
		rb_sb_puts(b, ");\n");
		free(buf);
	}
	rb_sb_puts(b, "SELECT \"");
	rb_sb_puts(b, schema);
	rb_sb_puts(b, "\".relaybus_apply_grants();\n");
}

/* Run a statement rendered for the schema with text parameters; 0, or -1 and err. */
static int
run_grant(struct rb_store *s, const char *tmpl, int n, const char *const *params, struct rb_error *err)
{
	char *sql = pg_render(tmpl, s->schema);
	PGresult *res = pg_run(s, sql, n, params, PGRES_TUPLES_OK, "grant", false, err);

	free(sql);
	if (res == NULL)
		return -1;
	PQclear(res);
	return 0;
}

int
pg_grants_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	for (size_t i = 0; i < o->n_revoke + o->n_grant; i++) {
		bool rev = i < o->n_revoke;
		const char *spec = rev ? o->revoke[i] : o->grant[i - o->n_revoke];
		char *buf;
		const char *kind, *role, *hs;
		int rc = 0;

		if (rb_grant_parse(spec, &buf, &kind, &role, &hs, err) < 0)
			return -1;
		/* a role that does not exist is the option's fault: say which */
		if (!rev) {
			const char *p1[1] = { role };
			PGresult *res = pg_run(s, "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1", 1, p1,
			    PGRES_TUPLES_OK, "grant", false, err);

			if (res == NULL)
				rc = -1;
			else if (PQntuples(res) == 0)
				rc = rb_seterr(err, RB_EXIT_USAGE, "--grant %s: role \"%s\" does not exist", spec, role);
			PQclear(res);
		}
		if (rc == 0) {
			const char *params[3] = { kind, role, hs };

			rc = run_grant(s, rev ? "SELECT @S@.relaybus_revoke($1, $2, $3::text[])" :
			    "SELECT @S@.relaybus_grant($1, $2, $3::text[])", 3, params, err);
		}
		free(buf);
		if (rc < 0)
			return -1;
	}
	return run_grant(s, "SELECT @S@.relaybus_apply_grants()", 0, NULL, err);
}
