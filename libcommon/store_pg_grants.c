/* SPDX-License-Identifier: MIT */
/*
 * store_pg_grants.c: rb-setup --grant and --revoke.  A grant is a row of
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

#include "rb_exit.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"

static const char *const kinds[] = { "publisher", "worker", "handler", "admin", NULL };

/* A role name as rb-setup takes it: [A-Za-z_][A-Za-z0-9_.-]*, at most 63
 * bytes (NAMEDATALEN - 1), and not a name PostgreSQL reserves.  It is the
 * exact name (quoted, never folded to lower case). */
static bool
role_valid(const char *r)
{
	size_t n;

	if (!((r[0] >= 'a' && r[0] <= 'z') || (r[0] >= 'A' && r[0] <= 'Z') || r[0] == '_'))
		return false;
	for (n = 0; r[n] != '\0'; n++)
		if (!((r[n] >= 'a' && r[n] <= 'z') || (r[n] >= 'A' && r[n] <= 'Z') ||
		    (r[n] >= '0' && r[n] <= '9') || strchr("_.-", r[n]) != NULL))
			return false;
	return n <= 63 && strcmp(r, "public") != 0 && strcmp(r, "none") != 0 && strncmp(r, "pg_", 3) != 0;
}

int
rb_grant_parse(const char *spec, char **buf, const char **kind, const char **role,
    const char **handlers, struct rb_error *err)
{
	size_t len = strlen(spec);
	char *copy, *eq, *colon, *lit, *h;
	bool known = false;

	*buf = NULL;
	*handlers = NULL;
	eq = strchr(spec, '=');
	if (eq == NULL || eq == spec)
		return rb_seterr(err, RB_EXIT_USAGE, "'%s' is not KIND=ROLE[:HANDLER,...]", spec);
	/* the spec, cut at '=' and ':', then the handlers as a text[] literal */
	copy = xmalloc(2 * len + 4);
	memcpy(copy, spec, len + 1);
	eq = copy + (eq - spec);
	*eq = '\0';
	for (int i = 0; kinds[i] != NULL; i++)
		known = known || strcmp(copy, kinds[i]) == 0;
	if (!known) {
		rb_seterr(err, RB_EXIT_USAGE, "'%s': unknown kind '%s' (publisher, worker, handler or admin)",
		    spec, copy);
		goto fail;
	}
	colon = strchr(eq + 1, ':');
	if (colon != NULL)
		*colon = '\0';
	if (!role_valid(eq + 1)) {
		rb_seterr(err, RB_EXIT_USAGE, "'%s': invalid role name ([A-Za-z_][A-Za-z0-9_.-], at most 63; "
		    "not public, none or pg_*)", spec);
		goto fail;
	}
	if (colon != NULL) {
		if (strcmp(copy, "worker") != 0 && strcmp(copy, "handler") != 0) {
			rb_seterr(err, RB_EXIT_USAGE, "'%s': only worker and handler grants name handlers", spec);
			goto fail;
		}
		lit = copy + len + 1;
		lit[0] = '{';
		lit[1] = '\0';
		h = colon + 1;
		for (;;) {
			size_t hn = strcspn(h, ",");
			char save = h[hn];

			h[hn] = '\0';
			if (!rb_handler_valid(h)) {
				rb_seterr(err, RB_EXIT_USAGE, "'%s': invalid handler name '%s' ([A-Za-z0-9_.:-], "
				    "at most 200)", spec, h);
				goto fail;
			}
			/* (no quoting needed: a handler name has no ',', '"', '\\', brace or space) */
			strcat(lit, h);
			h[hn] = save;
			if (save == '\0')
				break;
			strcat(lit, ",");
			h += hn + 1;
		}
		strcat(lit, "}");
		*handlers = lit;
	}
	*buf = copy;
	*kind = copy;
	*role = eq + 1;
	return 0;
fail:
	free(copy);
	return -1;
}

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
rb_pg_grants_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o)
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

/* Run a rendered statement with text parameters; 0, or -1 and err. */
static int
run_grant(struct rb_store *s, const char *tmpl, int n, const char *const *params, struct rb_error *err)
{
	char *sql = rb_pg_render(s, tmpl);
	PGresult *res = PQexecParams(rb_pg_conn(s), sql, n, NULL, params, NULL, NULL, 0);
	int rc = 0;

	free(sql);
	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = rb_pg_fail(s, res, "grant", err);
	PQclear(res);
	return rc;
}

int
rb_pg_grants_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	PGconn *c = rb_pg_conn(s);

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
			PGresult *res = PQexecParams(c, "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1",
			    1, NULL, p1, NULL, NULL, 0);

			if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
				rc = rb_pg_fail(s, res, "grant", err);
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
