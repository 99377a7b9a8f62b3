/* SPDX-License-Identifier: MIT */
/*
 * store_pg_int.h: PRIVATE to the store library.  Lets the other
 * PostgreSQL-only parts of libcommon (diagnostics such as
 * store_pg_inspect.c) reach the connection of a store opened on a
 * postgres:// URL.  Programs never include this header.
 */
#ifndef STORE_PG_INT_H
#define STORE_PG_INT_H

#include <libpq-fe.h>

struct rb_store;

/** The store's libpq connection (borrowed; the store owns and closes it). */
PGconn	*rb_pg_conn(struct rb_store *s);

#endif
