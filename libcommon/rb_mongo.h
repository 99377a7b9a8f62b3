/* SPDX-License-Identifier: MIT */
/*
 * rb_mongo.h: for C applications that publish inside their own MongoDB
 * transaction, on their own libmongoc client (the outbox pattern), as
 * <rb_pg.h> does on a libpq connection:
 *
 *	mongoc_client_session_t *cs = mongoc_client_start_session(client, NULL, &e);
 *	mongoc_client_session_start_transaction(cs, NULL, &e);
 *	(the application's writes, with cs)
 *	rb_mongo_publish(cs, db, "public", event, &ack, &err);
 *	mongoc_client_session_commit_transaction(cs, NULL, &e);
 *
 * db is the database that holds the relaybus collections (the database of
 * rb-publish's URL, "relaybus" by default), on the client cs belongs to.
 * The documents it writes are relaybus(7) MONGODB DOCUMENTS.  Built with
 * pkg-config's relaybus-mongo (librelaybus-mongo.a, librelaybus.a,
 * libmongoc); libmongoc's headers need POSIX declarations (-std=gnu11, or
 * -std=c11 -D_POSIX_C_SOURCE=200809L):
 *
 *	cc -D_POSIX_C_SOURCE=200809L app.c $(pkg-config --cflags --libs relaybus-mongo)
 *
 * The relaybus programs do not include this header.
 */
#ifndef RB_MONGO_H
#define RB_MONGO_H

#include <jansson.h>
#include <mongoc/mongoc.h>

#include "rb_store.h"

/**
 * Publish one event (an object as rb-publish reads it) in the transaction
 * that cs is in (64 when it is in none).  ack receives a new reference to
 * {"event_id", "deliveries", "duplicate", "handlers"}.  Returns 0, or -1 +
 * err: 81 the event id exists with another name, key or payload (a
 * conflict); 75 a write conflict or another transient error (abort and run
 * the whole transaction again, as mongoc_client_session_with_transaction
 * does); 78 the schema is not set up; 69 MongoDB unreachable; 65 a bad
 * event.  After an error, abort the transaction: nothing of it is kept.
 */
int	rb_mongo_publish(mongoc_client_session_t *cs, mongoc_database_t *db, const char *schema,
	    const json_t *event, json_t **ack, struct rb_error *err);

/** rb_mongo_complete's error when the delivery's lease does not hold. */
#define RB_EXIT_LOST	RB_EXIT_TEMPFAIL

/**
 * Complete a delivery in the transaction that cs is in: the handler's own
 * writes and the completion commit together or not at all (effectively
 * once; relaybus(7) MONGODB DOCUMENTS, "Completing in the handler's
 * transaction").  delivery is the line the handler was given (rb-dispatch,
 * rb-claim: event_id, handler, lease, delivery_id).  It checks the lease
 * (the lane's epoch, the delivery's claim count, the lane's inFlight list)
 * and deletes the delivery, as rb-complete does; a takeover that charges
 * the delivery writes the same document, so of the two exactly one
 * commits.  Then commit, and answer {"ok": true, "completed": true}.
 * Returns 0, or -1 + err: 75 (RB_EXIT_LOST) the lease does not hold, or a
 * write conflict: abort, and do not answer ok (the delivery runs again
 * elsewhere, or already ran); 78 the schema is not set up; 69 MongoDB
 * unreachable; 65 not a delivery line.  After an error, abort.
 */
int	rb_mongo_complete(mongoc_client_session_t *cs, mongoc_database_t *db, const char *schema,
	    const json_t *delivery, struct rb_error *err);

#endif
