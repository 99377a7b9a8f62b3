/* SPDX-License-Identifier: MIT */
/*
 * rb_admin.h: looking at and operating the bus (rb-admin): statistics,
 * listings, one event with its deliveries, requeue/bury/cancel, retention
 * purges in bounded batches, lanes and subscriptions.
 *
 * Conventions as in rb_store.h: 0 (or a count) on success, -1 with err
 * filled on error; json_t parameters are borrowed, json_t ** out-parameters
 * receive a new reference.  IDs are strings, times RFC 3339 UTC strings.
 * A delivery's status is "pending", "processing" (its id is in its lane's
 * in_flight list), "dead", or "completed" (only with completion history).
 * Each is a slot of the backend (store_int.h): one that lacks it answers
 * RB_EXIT_UNAVAILABLE, "admin_stats not supported by the X backend".
 * rb_admin_status_valid needs no store.
 */
#ifndef RB_ADMIN_H
#define RB_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "rb_store.h"

/** Which deliveries an operation looks at; NULL / 0 fields do not filter. */
struct rb_admin_filter {
	const char	*status;	/* comma-separated: pending,processing,dead,completed; NULL = the first three */
	const char	*handler;
	const char	*key;
	const char	*event_id;
	int64_t		 limit;		/* at most this many, oldest first; 0 = all */
};

/** True when every word of a comma-separated status list is a known status. */
bool	rb_admin_status_valid(const char *status);

/**
 * Statistics.  stats receives an object:
 *   {"history": bool, "events_without_deliveries": n,
 *    "handlers": [{"handler", "pending", "due", "delayed", "processing", "dead",
 *                  "completed" (null without history), "oldest_pending_age_ms" (null if none)}...],
 *    "total": {same fields, "handler": null}}
 * pending = due + delayed, not counting processing ones.
 */
int	rb_admin_stats(struct rb_store *, json_t **stats, struct rb_error *err);

/**
 * Deliveries matching f, ordered by creation (completions by completion
 * time, after the live ones).  rows receives an array of objects:
 *   {"delivery_id", "event_id", "handler", "name", "key", "status", "attempts",
 *    "last_error", "available_at", "lane", "owner", "lease_expires_at",
 *    "created_at", "updated_at"}
 * owner and lease_expires_at are null unless processing; completed rows
 * carry "completed_at" instead of the lane fields.  RB_EXIT_USAGE for an
 * unknown status, RB_EXIT_CONFIG when "completed" is asked without history.
 */
int	rb_admin_list(struct rb_store *, const struct rb_admin_filter *f, json_t **rows,
	    struct rb_error *err);

/**
 * One event: event receives {"event_id", "name", "key", "payload", "headers",
 * "handlers", "created_at", "deliveries": [list rows, completions included]},
 * or NULL when no such event exists (returns 0 then).  When the event row
 * was purged but deliveries remain, event holds only "event_id" and "deliveries".
 */
int	rb_admin_show(struct rb_store *, const char *event_id, json_t **event, struct rb_error *err);

enum rb_admin_action {
	RB_ADMIN_REQUEUE,	/* dead -> pending: attempts 0, available now, claims + 1 */
	RB_ADMIN_BURY,		/* pending, not in flight -> dead */
	RB_ADMIN_CANCEL,	/* pending, not in flight -> deleted */
};

/**
 * Apply action to targets (array of {"event_id", "handler"}; a missing or
 * null handler means every delivery of the event) in one short
 * transaction that locks the lanes of the deliveries first, so that no
 * claim can take one meanwhile.  outcomes receives one object per
 * delivery found, or per target that matched none, in target order:
 *   {"event_id", "handler", "delivery_id", "outcome", "status"}
 * outcome is "requeued", "buried", "cancelled", "skipped" (status says why:
 * the delivery is "pending", "processing" or "dead") or "missing".
 * reason: last_error of buried deliveries (NULL: "buried by rb-admin").
 * Returns the number of deliveries changed.
 */
int	rb_admin_apply(struct rb_store *, enum rb_admin_action action, const json_t *targets,
	    const char *reason, json_t **outcomes, struct rb_error *err);

enum rb_admin_purge {
	RB_PURGE_DEAD,		/* dead deliveries last updated before the cut-off */
	RB_PURGE_EVENTS,	/* events created before it with no delivery left */
	RB_PURGE_HISTORY,	/* completion history rows completed before it */
	RB_PURGE_COMPLETED,	/* completed deliveries relaybus 0.1.0 left, completed before it */
};

/**
 * Delete at most batch rows of one kind older than older_than_ms, as one
 * statement in its own transaction (rows locked by others are skipped).
 * Returns the number deleted (less than batch: nothing more to do now).
 * RB_PURGE_HISTORY without a history table returns 0.
 */
int	rb_admin_purge(struct rb_store *, enum rb_admin_purge kind, int64_t older_than_ms, int batch,
	    struct rb_error *err);

/**
 * Delete the counters (relaybus_keys) of ordering keys that no pending
 * (in flight or not) or dead delivery has, without letting a later publish
 * of a key run before an earlier one: up to batch counters after *after
 * (NULL: from the first), in key order, in one short READ COMMITTED
 * transaction that first locks them, skipping those a publish in progress
 * holds, and then, with a snapshot taken after the locks, deletes those no
 * such delivery has (relaybus(7), KEY RETENTION).  *after (the caller's,
 * freed with free()) becomes the last key looked at, NULL after the last.
 * Returns the number deleted.
 */
int	rb_admin_purge_keys(struct rb_store *, char **after, int batch, struct rb_error *err);

/**
 * Lane rows, ordered by handler and lane: only those held or with ids in
 * flight unless all.  handler NULL = every handler.  rows receives
 *   [{"handler", "lane", "epoch", "owner", "lease_expires_at", "expired",
 *     "in_flight", "in_flight_ids": [...]}]
 */
int	rb_admin_lanes(struct rb_store *, const char *handler, bool all, json_t **rows,
	    struct rb_error *err);

/** Subscriptions (handler NULL = all): [{"handler", "pattern", "created_at"}]. */
int	rb_admin_subscriptions(struct rb_store *, const char *handler, json_t **rows,
	    struct rb_error *err);

#endif
