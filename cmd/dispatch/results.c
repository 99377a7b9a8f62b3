/* SPDX-License-Identifier: MIT */
/*
 * results.c: how deliveries go out.  A slot is taken when a delivery
 * starts (slot_take) and given back when its handler is done
 * (finish_slot), which queues the result.  flush_results completes the
 * queued results in groups: plain successes in one statement in the
 * background (rb_store_complete_send/_recv), anything else at once
 * (rb_store_complete); the outcomes are counted, and the chains behind
 * them go on (claims.c, chain_next) or are handed back.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"

/* Queue the result of d (d, r and followers stolen; r NULL: d succeeded)
 * for the next group completion. */
void
queue_result(struct dispatcher *dp, struct rb_dl *d, json_t *r, unsigned gen,
    struct chain *followers)
{
	if (dp->nqueue == dp->capqueue) {
		dp->capqueue = dp->capqueue == 0 ? 64 : dp->capqueue * 2;
		dp->queue = xrealloc(dp->queue, dp->capqueue * sizeof *dp->queue);
	}
	if (dp->nqueue == 0)
		dp->queue_since = rb_mono_ms();
	dp->queue[dp->nqueue].d = d;
	dp->queue[dp->nqueue].r = r;
	dp->queue[dp->nqueue].gen = gen;
	dp->queue[dp->nqueue].followers = followers;
	dp->nqueue++;
}

json_t *
result_fail(const struct rb_dl *d, const char *error)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "ok", json_false());
	json_object_set_new(r, "error", json_string(error));
	return r;
}

/* A success as an object: --sql hands it to the statement. */
json_t *
result_ok(const struct rb_dl *d)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "ok", json_true());
	return r;
}

json_t *
result_release(const struct rb_dl *d)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "release", json_true());
	return r;
}

/* A free slot for d (stolen), its deadline set; the kind fills in the rest. */
struct slot *
slot_take(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	struct slot *s;

	if (dp->nfree_slot == 0)	/* cannot happen: we claim at most the free slots */
		rb_die(RB_EXIT_SOFTWARE, "no free slot");
	s = &dp->slots[dp->free_slot[--dp->nfree_slot]];
	s->used = true;
	s->d = d;
	s->followers = followers;
	s->gen = gen;
	s->deadline = dp->opt.timeout_ms > 0 ? rb_mono_ms() + dp->opt.timeout_ms : 0;
	dp->next_deadline = min_deadline(dp->next_deadline, s->deadline);
	dp->running++;
	return s;
}

/* The slot's delivery is done: queue its result (stolen; NULL: it
 * succeeded) and free the slot. */
void
finish_slot(struct dispatcher *dp, struct slot *s, json_t *r)
{
	struct rb_dl *d = s->d;

	if (r != NULL && json_is_false(json_object_get(r, "ok")))
		rb_info("%s: attempt %d failed: %s", d->event_id, d->attempt,
		    json_string_value(json_object_get(r, "error")));
	struct chain *followers = s->followers;
	unsigned gen = s->gen;
	/* the rest of its chain goes on once it succeeded, when this was its
	 * first attempt; else (and with --sql, where the handler is the
	 * completion) only once its completion committed, see queue_applied:
	 * a takeover then knows the followers behind it never ran
	 * (rb_claim_opts.chain_early, set by maybe_claim from the same test) */
	bool go = followers != NULL && dp->opt.complete.sql == NULL && d->attempt == 1 &&
	    (r == NULL || rb_result_completes(r)) && dp->stop_level == 0;

	queue_result(dp, d, r, gen, go ? NULL : followers);
	dp->opt.kind->release(dp, s);
	memset(s, 0, sizeof *s);
	dp->free_slot[dp->nfree_slot++] = (int)(s - dp->slots);
	dp->running--;
	if (go)
		chain_next(dp, followers, gen, true);
}

/*
 * The first n queued results were applied (go[i]: the i-th completed, its
 * chain goes on): the queue moves on, the chains behind them go on or are
 * handed back.
 */
static void
queue_applied(struct dispatcher *dp, size_t n, const bool *go, bool progress)
{
	size_t i;
	struct { struct chain *followers; unsigned gen; } *next;	/* the chains behind them */

	next = xcalloc(n > 0 ? n : 1, sizeof *next);
	for (i = 0; i < n; i++) {
		owner_done(dp, dp->queue[i].gen);
		rb_dl_free(dp->queue[i].d);
		json_decref(dp->queue[i].r);
		next[i].followers = dp->queue[i].followers;
		next[i].gen = dp->queue[i].gen;
	}
	memmove(dp->queue, dp->queue + n, (dp->nqueue - n) * sizeof *dp->queue);
	dp->nqueue -= n;
	if (dp->nqueue > 0)
		dp->queue_since = rb_mono_ms();
	for (i = 0; i < n; i++)
		if (next[i].followers != NULL)
			chain_next(dp, next[i].followers, next[i].gen, go[i] && dp->stop_level == 0);
	free(next);
	if (dp->opt.kind->flush != NULL)
		dp->opt.kind->flush(dp);
	if (progress) {
		/* deletions may have unblocked the next delivery of a key */
		dp->more_work = true;
		dp->idle_seen = false;
		dp->progress_since_claim = true;
	}
}

/*
 * What the outcomes of the first n queued results (arr, the statement's
 * input) say: the counts, the chains behind them, and the queue moves on.
 * Takes arr and outcomes.
 */
static void
apply_outcomes(struct dispatcher *dp, size_t n, json_t *arr, json_t *outcomes)
{
	size_t i;
	json_t *o;
	bool progress = false;
	bool *go = xcalloc(n > 0 ? n : 1, sizeof *go);

	json_array_foreach(outcomes, i, o) {
		const char *oc = json_string_value(json_object_get(o, "outcome"));
		const char *ev = json_string_value(json_object_get(o, "event_id"));

		if (oc == NULL)
			oc = "lost";
		if (strcmp(oc, "completed") == 0) {
			dp->stats.completed++;
			progress = true;
			if (i < n)
				go[i] = true;	/* its chain goes on */
		} else if (strcmp(oc, "rescheduled") == 0) {
			dp->stats.rescheduled++;
			progress = true;
		} else if (strcmp(oc, "buried") == 0) {
			dp->stats.buried++;
			rb_warn("%s: buried after %" JSON_INTEGER_FORMAT " attempts: %s", ev,
			    json_integer_value(json_object_get(o, "attempts")),
			    json_string_value(json_object_get(json_array_get(arr, i), "error")));
		} else if (strcmp(oc, "released") == 0)
			dp->stats.released++;
		else {
			dp->stats.lost++;
			if (json_is_true(json_object_get(o, "missing")))
				rb_debug("%s: already gone (completed before a reconnect)", ev);
			else
				rb_info("%s: lease lost, not applied (it runs again elsewhere)", ev);
		}
		if (json_is_string(json_object_get(o, "error")))
			rb_info("%s: %s", ev, json_string_value(json_object_get(o, "error")));
		rb_debug("%s: %s", ev, oc);
	}
	json_decref(outcomes);
	json_decref(arr);
	queue_applied(dp, n, go, progress);
	free(go);
}

/* The same for the first n queued results completed in one statement
 * (rb_store_complete_send): outcome[i] is RB_DL_*. */
static void
apply_completed(struct dispatcher *dp, size_t n, const unsigned char *outcome)
{
	bool progress = false;
	bool *go = xcalloc(n > 0 ? n : 1, sizeof *go);

	for (size_t i = 0; i < n; i++) {
		const char *ev = dp->queue[i].d->event_id;

		if (outcome[i] == RB_DL_COMPLETED) {
			dp->stats.completed++;
			progress = go[i] = true;
			rb_debug("%s: completed", ev);
			continue;
		}
		dp->stats.lost++;
		if (outcome[i] == RB_DL_MISSING)
			rb_debug("%s: already gone (completed before a reconnect)", ev);
		else
			rb_info("%s: lease lost, not applied (it runs again elsewhere)", ev);
		rb_debug("%s: lost", ev);
	}
	queue_applied(dp, n, go, progress);
	free(go);
}

/*
 * Apply the queued results, at most 1000 per statement.  When they all
 * succeeded (no --sql) the statement goes out in the background, after the
 * claim that is out if any, and complete_collect takes its answer: the
 * loop goes on serving the handlers meanwhile.  Anything else is applied
 * at once.  false on a database error.
 */
bool
flush_results(struct dispatcher *dp)
{
	while (dp->nqueue > 0 && !dp->db_down && !dp->completing) {
		size_t n = dp->nqueue > 1000 ? 1000 : dp->nqueue, i;
		json_t *arr, *outcomes = NULL;
		struct rb_error err = { 0 };
		/* (a --sql statement runs in the completion of every success:
		 * the one-statement completion below cannot run it) */
		bool all_ok = dp->opt.complete.sql == NULL;

		for (i = 0; i < n && all_ok; i++)
			all_ok = dp->queue[i].r == NULL;
		if (all_ok && dp->claiming && !completes_apart(dp))
			return true;	/* sent once the claim's answer is in */
		if (all_ok) {
			struct rb_dl **v = xmalloc(n * sizeof *v);

			for (i = 0; i < n; i++)
				v[i] = dp->queue[i].d;
			if (rb_store_complete_send(dp->store, v, n, completes_apart(dp), &err) < 0) {
				free(v);
				db_error(dp, &err, "complete");
				return false;
			}
			dp->completing = true;
			dp->ncompleting = n;
			dp->completing_v = v;
			return true;
		}
		arr = json_array();
		for (i = 0; i < n; i++)
			json_array_append_new(arr, dp->queue[i].r != NULL ? json_incref(dp->queue[i].r) :
			    result_ok(dp->queue[i].d));
		claim_collect(dp, true);
		if (dp->db_down || rb_store_complete(dp->store, &dp->opt.complete, arr, &outcomes, &err) < 0) {
			json_decref(arr);
			if (!dp->db_down)
				db_error(dp, &err, "complete");
			return false;
		}
		apply_outcomes(dp, n, arr, outcomes);
	}
	return true;
}

/* Take the answer to the completion that is out (flush_results), waiting or only if it is in. */
void
complete_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	unsigned char *outcome;
	int rc;

	if (!dp->completing)
		return;
	outcome = xmalloc(dp->ncompleting > 0 ? dp->ncompleting : 1);
	rc = rb_store_complete_recv(dp->store, wait, outcome, &err);
	if (rc == STORE_PENDING) {
		free(outcome);
		return;
	}
	dp->completing = false;
	free(dp->completing_v);
	dp->completing_v = NULL;
	if (rc < 0) {
		/* the results stay queued: applied again after the reconnect */
		free(outcome);
		db_error(dp, &err, "complete");
		return;
	}
	apply_completed(dp, dp->ncompleting, outcome);
	free(outcome);
}

/* Nothing out on the connection: the next statement may go. */
void
db_settle(struct dispatcher *dp)
{
	claim_collect(dp, true);
	complete_collect(dp, true);
}
