/* SPDX-License-Identifier: MIT */
/*
 * rb_inspect.h: WAL/HOT diagnostics for rb-pageinspect.  The lifecycle and
 * the sample are slots of the backend (store_int.h; the PostgreSQL backend
 * has them, one that lacks them answers RB_EXIT_UNAVAILABLE); the flags and
 * the delta are pure functions (inspect.c).
 *
 * rb_inspect_lifecycle() runs the life of one delivery in a scratch schema
 * and reads what it left behind with the pageinspect extension: the heap
 * page of the deliveries table, every index, the versions of the lane row
 * and the tuple counters.  rb_inspect_sample() and rb_inspect_delta()
 * read the live counters of a schema for `rb-pageinspect watch`.
 *
 * Conventions as in rb_store.h: 0 on success, -1 with err filled; json_t
 * parameters are borrowed, json_t ** out-parameters receive a new
 * reference.
 */
#ifndef RB_INSPECT_H
#define RB_INSPECT_H

#include <signal.h>
#include <stdbool.h>

#include <jansson.h>

#include "rb_store.h"

/** The handler and event name the lifecycle publishes to. */
#define RB_INSPECT_HANDLER	"inspect"
#define RB_INSPECT_EVENT	"inspect.lifecycle"

struct rb_inspect_opts {
	bool			 baseline;	/* the 0.1.0 row-lease design instead of ours */
	const char		*app;		/* application_name of the connections */
	/* optional: checked between steps; when set, the run stops, drops its
	 * scratch schema and fails with "interrupted" (RB_EXIT_TEMPFAIL) */
	const volatile sig_atomic_t *stop;
};

/**
 * Publish one event with one handler, claim it, complete it (and hand the
 * lane back, as rb-complete does at end of input), each step its own
 * transaction, in a scratch schema created for the run (autovacuum off on
 * its tables; an open snapshot on a second connection keeps every dead
 * version on its page) and dropped at the end, also on error.
 *
 * url: as for rb_store_open (NULL: $RELAYBUS_URL, else PG*).  report
 * receives one object:
 *   {"design": "lane-lease"|"row-lease", "schema", "server_version",
 *    "event_id", "handler", "lane" (null for row-lease),
 *    "heap": {"table", "pages": [{"page", "line_pointers",
 *             "tuples": [{"lp", "state", "xmin", "xmax", "ctid", "infomask",
 *                         "infomask2", "flags": [...]}]}]},
 *    "indexes": [{"name", "entries", "heap_tids": ["(0,1)", ...]}],
 *    "lane_versions": null | {"handler", "lane", "page", "ctid", "versions": [tuple...]},
 *    "counters": {"relaybus_deliveries": {"inserted", "updated", "hot_updated",
 *                 "deleted", "live", "dead"}, ...},
 *    "summary": {"heap_tuples", "index_entries", "non_hot_updates"}}
 * Without the pageinspect extension (and a role that may create it) or
 * without the superuser right its functions need, fails with
 * RB_EXIT_UNAVAILABLE and a message saying what to run.
 */
int	rb_inspect_lifecycle(const char *url, const struct rb_inspect_opts *opts, json_t **report,
	    struct rb_error *err);

/**
 * Read the counters of the store's schema now, in a fresh statistics
 * snapshot: {"at": seconds (server clock), "wal_lsn_bytes",
 * "tables": {"relaybus_deliveries": {"ins", "upd", "hot_upd", "del",
 * "dead", "autovacuum_count"}, ...}}.  RB_EXIT_CONFIG when the schema has
 * no relaybus tables.
 */
int	rb_inspect_sample(struct rb_store *, json_t **sample, struct rb_error *err);

/**
 * The rates between two samples (prev older than cur), a new object:
 * {"seconds", "completed", "completed_per_sec", "wal_bytes",
 *  "wal_bytes_per_delivery" (null when nothing completed), "lane_updates",
 *  "lane_hot_updates", "lane_hot_share" (null when no lane update),
 *  "delivery_updates", "dead_tuples": {table: n}, "autovacuum_runs": {table: n}}.
 */
json_t	*rb_inspect_delta(const json_t *prev, const json_t *cur);

/** The names of the flags set in a heap tuple's t_infomask/t_infomask2, as a new array. */
json_t	*rb_inspect_flags(long infomask, long infomask2);

#endif
