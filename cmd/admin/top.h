/* SPDX-License-Identifier: MIT */
/*
 * top.h: rb-admin top, a live view of the bus on a terminal (as top(1)
 * or pg_top): per handler the pending, due, in-flight and dead
 * deliveries, completions per second and the oldest due age; the lane
 * holders with the lanes and deliveries they hold and their leases.
 * Keys: q quits, h picks the next handler (and back to all).  --once
 * prints one frame, plain, for a script.
 */
#ifndef RB_ADMIN_TOP_H
#define RB_ADMIN_TOP_H

#include <stdbool.h>
#include <stdint.h>

struct rb_store;

/* Runs until q or a stop signal (exit status 0); dies on a store error. */
int	admin_top(struct rb_store *, const char *schema, const char *handler, bool once,
	    int64_t interval_ms);

#endif
