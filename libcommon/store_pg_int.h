/* SPDX-License-Identifier: MIT */
/*
 * store_pg_int.h: PRIVATE to the store library.  What the PostgreSQL
 * backend lends to the other files of the backend (store_pg_admin.c, store_pg_inspect.c):
 * the connection, the statement renderer and the error mapping.  Only
 * backend files include this (it pulls in libpq-fe.h).
 */
#ifndef STORE_PG_INT_H
#define STORE_PG_INT_H

#include <libpq-fe.h>

#include "rb_store.h"

/** The store's connection (borrowed), or NULL if the store is not PostgreSQL or not open. */
PGconn	*rb_pg_conn(struct rb_store *);
/** Render tmpl for the store's schema (@S@ = quoted schema).  New string, caller frees. */
char	*rb_pg_render(const struct rb_store *, const char *tmpl);
/**
 * Map a failed result (res may be NULL) to err, with the same exit codes
 * as the delivery path ("schema not set up" is RB_EXIT_CONFIG, a lost
 * connection RB_EXIT_TEMPFAIL...).  what prefixes the message.  Returns -1.
 */
int	rb_pg_fail(struct rb_store *, PGresult *res, const char *what, struct rb_error *err);
/** Render tmpl for a schema name (rb_pg_render without a store, for --print-sql). */
char	*rb_pg_render_schema(const char *schema, const char *tmpl);

/* store_pg_version.c */
struct rb_sbuf;
/** The schema_info op: the version of the store's schema. */
int	rb_pg_schema_info(struct rb_store *, struct rb_schema_info *, struct rb_error *err);
/** The set-up before schema_pg.sql (after the advisory lock): the version
 * guard (SQLSTATE RBV01: the schema is newer), lane_pg.sql, upgrade_010_pg.sql. */
void	rb_pg_setup_before(struct rb_sbuf *, const char *schema);
/** The set-up after schema_pg.sql: upgrade_010_post_pg.sql and the version check. */
void	rb_pg_setup_after(struct rb_sbuf *, const char *schema);

#endif
