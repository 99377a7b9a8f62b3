/* SPDX-License-Identifier: MIT */
/*
 * leases.c: the lease owner names and the connection they lease through.
 * Every reconnect starts a new owner generation (owner_base/rN), so that
 * a claim whose answer was lost with the connection never stays in
 * flight under a name this process keeps renewing; an older name is
 * renewed while deliveries it claimed are in flight or queued
 * (owner_done counts them off), then its lanes are handed back.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"

static struct owner *
owner_of(struct dispatcher *dp, unsigned gen)
{
	struct owner *o = &dp->owners[gen % NOWNERS];

	return o->name != NULL && o->gen == gen ? o : NULL;
}

void
new_owner(struct dispatcher *dp)
{
	struct owner *o;

	if (dp->owners[dp->cur_gen % NOWNERS].name != NULL)
		dp->cur_gen++;
	o = &dp->owners[dp->cur_gen % NOWNERS];
	if (o->name != NULL) {
		/* forgotten: its lanes come back when their lease ends */
		rb_warn("too many reconnects: no longer renewing the lanes of %s", o->name);
		free(o->name);
	}
	o->name = dp->cur_gen == 0 ? xstrdup(dp->owner_base) :
	    xasprintf("%s/r%u", dp->owner_base, dp->cur_gen);
	o->gen = dp->cur_gen;
	o->count = 0;
}

void
owner_done(struct dispatcher *dp, unsigned gen)
{
	struct owner *o = owner_of(dp, gen);

	if (o != NULL)
		o->count--;
}

/* The store's message names what failed already ("claim: ..."): what
 * prefixes only a message that does not start with it. */
static const char *
prefix(const char *what, const char *msg)
{
	size_t n = what != NULL ? strlen(what) : 0;

	return n == 0 || (strncmp(msg, what, n) == 0 && msg[n] == ':') ? "" : what;
}

void
db_error(struct dispatcher *dp, const struct rb_error *err, const char *what)
{
	int code = err->exit_code != 0 ? err->exit_code : RB_EXIT_SOFTWARE;
	const char *pre = prefix(what, err->msg);

	if (code == RB_EXIT_TEMPFAIL || code == RB_EXIT_UNAVAILABLE || rb_store_broken(dp->store)) {
		if (!dp->db_down)
			rb_warn("%s%s%s: reconnecting", pre, *pre != '\0' ? ": " : "", err->msg);
		dp->db_down = true;
		/* what was asked for is forgotten with the connection: the
		 * claim's answer, if any; the completion (its results stay queued
		 * and are applied again); the owed deliveries (claimed, never
		 * read: the new owner claims them again once the old one's lanes
		 * are handed back) */
		dp->claim_out = false;
		completion_forget(dp);
		owed_dropped(dp, dp->owed);
		dp->reconnect_at = rb_mono_ms() + (dp->reconnect_backoff > 200 ? 200 : dp->reconnect_backoff);
		return;
	}
	rb_error("%s%s%s", pre, *pre != '\0' ? ": " : "", err->msg);
	if (dp->fatal_code == 0)
		dp->fatal_code = code;
}

void
try_reconnect(struct dispatcher *dp, int64_t now)
{
	struct rb_error err = { 0 };
	char server[300];

	if (rb_store_reconnect(dp->store, &err) < 0 || rb_store_listen(dp->store, dp->opt.handler, &err) < 0) {
		/* (shown with -v; a refused server is said by the store itself) */
		rb_info("reconnect failed: %s", err.msg);
		dp->reconnect_at = now + dp->reconnect_backoff;
		dp->reconnect_backoff = dp->reconnect_backoff * 2 > RB_RECONNECT_MAX_MS ? RB_RECONNECT_MAX_MS :
		    dp->reconnect_backoff * 2;
		return;
	}
	dp->db_down = false;
	dp->reconnect_backoff = 100;
	new_owner(dp);
	rb_store_server(dp->store, server, sizeof server);
	rb_warn("reconnected to %s; now leasing as %s", server, dp->owners[dp->cur_gen % NOWNERS].name);
	dp->wake = true;
	dp->next_extend = now;
}

void
extend_leases(struct dispatcher *dp, int64_t now)
{
	struct rb_error err = { 0 };

	dp->next_extend = now + dp->opt.lease_ms / 3;
	for (int i = 0; i < NOWNERS && !dp->db_down; i++) {
		struct owner *o = &dp->owners[i];
		int n;

		if (o->name == NULL || o->count <= 0)
			continue;
		if ((n = rb_store_extend(dp->store, dp->opt.handler, o->name, dp->opt.lease_ms, &err)) < 0) {
			db_error(dp, &err, "extend");
			return;
		}
		rb_debug("renewed %d lanes of %s", n, o->name);
	}
}

/* Hand back the lanes of older owner names that run nothing any more. */
void
retire_owners(struct dispatcher *dp)
{
	struct rb_error err = { 0 };

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &dp->owners[i];

		if (o->name == NULL || o->gen == dp->cur_gen || o->count > 0)
			continue;
		/* nothing of it runs here any more: what is still in flight under
		 * it came from a claim whose answer was lost; free those lanes now */
		if (rb_store_relinquish_owner(dp->store, dp->opt.handler, o->name, &err) < 0) {
			db_error(dp, &err, "relinquish");
			return;
		}
		free(o->name);
		o->name = NULL;
	}
}

/*
 * --drain found nothing due with nothing running here: hand back every
 * lane, and return how many still listed a pending delivery claimed under
 * one of this process's names (claimed, never run nor completed here: an
 * answer that went missing), now fenced and due again without an attempt
 * charged; the drain is then not over.  -1 on a database error.
 */
int
drain_leftovers(struct dispatcher *dp)
{
	struct rb_error err = { 0 };
	int left = 0;

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &dp->owners[i];
		int n;

		if (o->name == NULL)
			continue;
		if (rb_store_relinquish(dp->store, dp->opt.handler, o->name, &err) < 0 ||
		    (n = rb_store_relinquish_owner(dp->store, dp->opt.handler, o->name, &err)) < 0) {
			db_error(dp, &err, "relinquish");
			return -1;
		}
		left += n;
	}
	return left;
}

void
hand_back_lanes(struct dispatcher *dp)
{
	struct rb_error err = { 0 };

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &dp->owners[i];
		int n;

		if (o->name == NULL)
			continue;
		if ((n = rb_store_relinquish(dp->store, dp->opt.handler, o->name, &err)) < 0) {
			rb_warn("could not hand back the lanes of %s (they free up when the lease ends): %s",
			    o->name, err.msg);
			return;
		}
		rb_info("handed back %d lanes of %s", n, o->name);
	}
}
