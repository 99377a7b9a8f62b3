/* SPDX-License-Identifier: MIT */
/*
 * rb_records.h: PRIVATE to the store library.  The backend-neutral pieces
 * every backend builds on, so that two backends report the same errors,
 * accept the same records and print byte-identical delivery lines:
 *
 *   rb_seterr                     fill a struct rb_error
 *   struct rb_delivery_fields     one claimed delivery, as text columns
 *   rb_delivery_line/_object      the one place a delivery line is spelled
 *   rb_dl_new, rb_dl_fill         a claimed delivery as struct rb_dl
 *   rb_outcome_name/_of           the one name table of the outcomes
 *   struct rb_evq                 what a store has to report (rb_store_service)
 *   rb_admin_status_flags         the status words of rb_admin.h
 *
 * The public record functions (rb_event_validate, rb_result_validate,
 * rb_result_parse, rb_subscription_parse, rb_grant_parse, rb_publish_acks_*, rb_dl_free,
 * rb_result_of, rb_outcome_*, rb_admin_status_valid) are declared in rb_store.h
 * and rb_admin.h and defined in records.c and delivery.c.  Nothing here
 * knows a store or a backend.  Allocation dies on out-of-memory
 * (rb_util.h).
 */
#ifndef RB_RECORDS_H
#define RB_RECORDS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "rb_store.h"
#include "rb_util.h"

/** Fill err (NULL: nothing) with code and one line of text (cut at the first newline); returns -1. */
int	rb_seterr(struct rb_error *, int code, const char *fmt, ...)
	    __attribute__((format(printf, 3, 4)));

/*
 * One claimed delivery as a backend reads it: text as it comes from the
 * store (NULL: absent).  payload and headers are JSON text (compacted when
 * written into a line, never parsed for it); sequence is a decimal
 * integer; the rest are plain strings.  Borrowed: nothing here is freed.
 */
struct rb_delivery_fields {
	const char	*id, *event_id, *handler, *name, *key, *sequence, *payload, *headers, *created_at;
	int		 lane, attempts;	/* attempts so far (the line says attempts + 1) */
	int64_t		 epoch, claims;
	uint64_t	 addr;		/* the row's address in the store, as the claim read it
					 * (the backend's own; 0: none), never in the line */
};

/**
 * The delivery line (DESIGN.md "delivery out"), newline-terminated, into
 * b (reset first): event_id, handler, name, key, payload, headers,
 * attempt, lease (token), created_at, delivery_id, lane, sequence.
 */
void	rb_delivery_line(const struct rb_delivery_fields *, const char *token, struct rb_sbuf *b);
/**
 * The delivery as a new JSON object.  With text, only the members a caller
 * works with, plus the whole line (rb_delivery_line) under
 * RB_LINE_TEXT_KEY instead of payload and headers.  b: scratch.
 */
json_t	*rb_delivery_object(const struct rb_delivery_fields *, bool text, struct rb_sbuf *b);
/** A claimed delivery without its event yet (fetched false): one allocation, free with rb_dl_free. */
struct rb_dl *rb_dl_new(const struct rb_delivery_fields *);
/**
 * Its event's part (f: the claim's fields and the event's): the key and
 * the line; sets fetched.  b: scratch.
 */
void	rb_dl_fill(struct rb_dl *, const struct rb_delivery_fields *f, struct rb_sbuf *b);

/*
 * The events a store has to report, in order (struct rb_store's evq: the
 * front's, which a backend pushes onto).  Events are copied in and out;
 * the deliveries of a CLAIMED or DELIVERED event are the queue's until
 * popped.
 */
struct rb_evq {
	struct rb_store_event	*v;
	size_t			 head, n, cap;	/* v[head .. head + n) */
};
void	rb_evq_push(struct rb_evq *, const struct rb_store_event *);
/** The first event into ev: true, or false when there is none. */
bool	rb_evq_pop(struct rb_evq *, struct rb_store_event *ev);
/** The last event of kind into ev (taken out): true, or false. */
bool	rb_evq_take_last(struct rb_evq *, enum rb_store_event_kind kind, struct rb_store_event *ev);
/** Forget every event (their deliveries freed); the queue stays usable. */
void	rb_evq_clear(struct rb_evq *);
void	rb_evq_free(struct rb_evq *);
/** A FAILED event of what, err, dropped deliveries. */
void	rb_evq_failed(struct rb_evq *, enum rb_store_event_kind what, int dropped, const struct rb_error *err);

/** The statuses of rb_admin.h, in the order of rb_admin_status_flags' flags. */
#define RB_ADMIN_NSTATUS	4
extern const char *const rb_admin_statuses[RB_ADMIN_NSTATUS];	/* pending, processing, dead, completed */
/** Parse "a,b" into flags (NULL: the first three); -1 on an unknown word. */
int	rb_admin_status_flags(const char *status, bool flags[RB_ADMIN_NSTATUS]);

#endif
