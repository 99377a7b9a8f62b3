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

struct rb_sbuf;

/**
 * rb-setup --grant/--revoke (store_pg_grants.c): record o's grants and
 * revokes and apply every recorded grant (relaybus_apply_grants), in the
 * set-up's transaction.  A granted role that does not exist: RB_EXIT_USAGE.
 */
int	rb_pg_grants_setup(struct rb_store *, const struct rb_setup_opts *o, struct rb_error *err);
/** The same as SQL statements for --print-sql, appended to b (o checked already). */
void	rb_pg_grants_script(struct rb_sbuf *b, const char *schema, const struct rb_setup_opts *o);

#endif
