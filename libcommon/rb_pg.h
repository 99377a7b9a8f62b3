/* SPDX-License-Identifier: MIT */
/*
 * rb_pg.h: for C applications that publish inside their own transaction
 * on their own libpq connection (the outbox pattern):
 *
 *	PQexec(conn, "BEGIN");
 *	PQexec(conn, "UPDATE orders SET paid = true WHERE id = 42");
 *	rb_pg_publish(conn, "public", event, &ack, &err);
 *	PQexec(conn, "COMMIT");
 *
 * The relaybus programs do not include this header.
 */
#ifndef RB_PG_H
#define RB_PG_H

#include <jansson.h>
#include <libpq-fe.h>

#include "rb_store.h"

/**
 * Publish one event (an object as rb-publish reads it) on conn, inside
 * whatever transaction conn is in.  ack receives a new reference to
 * {"event_id", "deliveries", "duplicate", "handlers"}.  Returns 0 or -1 + err.
 */
int	rb_pg_publish(PGconn *conn, const char *schema, const json_t *event, json_t **ack,
	    struct rb_error *err);

#endif
