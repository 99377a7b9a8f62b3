/* SPDX-License-Identifier: MIT */
/*
 * results.c: how deliveries go out.  A slot is taken when a delivery
 * starts (slot_take) and given back when its handler is done
 * (finish_slot), which queues the result.  flush_results completes the
 * queued results in groups (rb_store_complete_start: the store applies
 * them while the handlers are served, or at once); the outcomes
 * (on_completed) are counted, and the chains behind them go on
 * (claims.c, chain_next) or are handed back.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"

/* Queue the result of d (d and followers stolen, v's error copied) for
 * the next group completion. */
void
queue_result(struct dispatcher *dp, struct rb_dl *d, struct verdict v, unsigned gen,
    struct chain *followers)
{
	struct queued *q;

	if (dp->nqueue == dp->capqueue) {
		dp->capqueue = dp->capqueue == 0 ? 64 : dp->capqueue * 2;
		dp->queue = xrealloc(dp->queue, dp->capqueue * sizeof *dp->queue);
	}
	if (dp->nqueue == 0)
		dp->queue_since = rb_mono_ms();
	q = &dp->queue[dp->nqueue++];
	q->d = d;
	q->verdict = v.v;
	q->error = v.error != NULL ? xstrdup(v.error) : NULL;
	q->retry_ms = v.retry_ms;
	q->gen = gen;
	q->followers = followers;
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
	s->started = rb_mono_ms();
	s->deadline = dp->opt.timeout_ms > 0 ? s->started + dp->opt.timeout_ms : 0;
	metrics_started(dp, d);
	dp->next_deadline = min_deadline(dp->next_deadline, s->deadline);
	dp->running++;
	return s;
}

/* The slot's delivery is done: queue its result and free the slot. */
void
finish_slot(struct dispatcher *dp, struct slot *s, struct verdict v)
{
	struct rb_dl *d = s->d;

	if (v.failed)
		failure_warn(dp, d->event_id, d->lease.lane, d->attempt, v.error);
	struct chain *followers = s->followers;
	unsigned gen = s->gen;
	/* the rest of its chain goes on once it succeeded, when this was its
	 * first attempt; else (and with --sql, where the handler is the
	 * completion, and --strict-order) only once its completion committed,
	 * see queue_applied:
	 * a takeover then knows the followers behind it never ran
	 * (rb_claim_opts.chain_early, set by maybe_claim from the same test) */
	bool go = followers != NULL && chain_early(dp) && d->attempt == 1 &&
	    (v.v == RB_VERDICT_OK || v.v == RB_VERDICT_DONE) && dp->stop_level == 0;

	if (d->key != NULL && d->attempt == 1 && (v.v == RB_VERDICT_OK || v.v == RB_VERDICT_DONE) &&
	    dp->chain_now < dp->opt.chain)
		dp->chain_now++;
	if (v.v != RB_VERDICT_RELEASE)
		metrics_finished(dp, s, rb_mono_ms());
	queue_result(dp, d, v, gen, go ? NULL : followers);
	dp->opt.kind->release(dp, s);
	memset(s, 0, sizeof *s);
	dp->free_slot[dp->nfree_slot++] = (int)(s - dp->slots);
	dp->running--;
	if (go)
		chain_next(dp, followers, gen, true);
}

/*
 * The first n queued results were applied (go[i]: the i-th completed, its
 * chain goes on; again[i] >= 0: it failed and was kept in flight with
 * again[i] attempts, to run again): the queue moves on, the chains behind
 * them go on or are handed back, the kept ones run again with their chains
 * behind them (stopping: handed back with them).
 */
static void
queue_applied(struct dispatcher *dp, size_t n, const bool *go, const int *again, bool progress)
{
	size_t i;
	struct { struct rb_dl *d; struct chain *followers; unsigned gen; } *next;	/* the chains behind them */

	next = xcalloc(n > 0 ? n : 1, sizeof *next);
	for (i = 0; i < n; i++) {
		if (again[i] >= 0)
			next[i].d = dp->queue[i].d;	/* (its owner's count stays: it is still out) */
		else {
			owner_done(dp, dp->queue[i].gen);
			rb_dl_free(dp->queue[i].d);
		}
		free(dp->queue[i].error);
		next[i].followers = dp->queue[i].followers;
		next[i].gen = dp->queue[i].gen;
	}
	memmove(dp->queue, dp->queue + n, (dp->nqueue - n) * sizeof *dp->queue);
	dp->nqueue -= n;
	dp->applied_since_claim += (long)n;
	if (dp->nqueue > 0)
		dp->queue_since = rb_mono_ms();
	for (i = 0; i < n; i++)
		if (next[i].d != NULL) {
			rb_dl_again(next[i].d, again[i]);
			if (dp->stop_level == 0)
				dp->opt.kind->start(dp, next[i].d, next[i].gen, next[i].followers);
			else
				queue_result(dp, next[i].d, verdict_release(), next[i].gen, next[i].followers);
		} else if (next[i].followers != NULL)
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
 * What the outcomes of the first n queued results (v, the completion's
 * input, in queue order) say: the counts, the chains behind them, and
 * the queue moves on.  Frees v's sql errors.
 */
static void
apply_results(struct dispatcher *dp, size_t n, struct rb_result *v)
{
	bool progress = false;
	bool *go = xcalloc(n > 0 ? n : 1, sizeof *go);
	int *again = xcalloc(n > 0 ? n : 1, sizeof *again);

	for (size_t i = 0; i < n; i++) {
		const struct rb_result *r = &v[i];
		const char *ev = r->event_id;

		again[i] = r->kept && r->outcome == RB_OUTCOME_RESCHEDULED ? (r->attempts > 0 ? r->attempts : 1) : -1;

		switch (r->outcome) {
		case RB_OUTCOME_COMPLETED:
			dp->stats.completed++;
			progress = go[i] = true;	/* its chain goes on */
			if (r->by_handler) {
				/* (relaybus_complete in the handler's transaction: said so,
				 * or found gone under the still-held lease after the
				 * handler crashed or failed past its commit) */
				dp->stats.by_handler++;
				if (r->verdict != RB_VERDICT_DONE)
					rb_info("%s: completed by the handler (its delivery is gone, the lease held)",
					    ev);
			}
			break;
		case RB_OUTCOME_RESCHEDULED:
			dp->stats.rescheduled++;
			progress = true;
			break;
		case RB_OUTCOME_BURIED:
			/* (a dead delivery no longer holds its key back: the next
			 * one is due, and so are the followers released with it) */
			dp->stats.buried++;
			progress = true;
			rb_warn("%s: buried after %d attempts: %s", ev, r->attempts > 0 ? r->attempts : 0,
			    r->error != NULL ? r->error : r->sql_error != NULL ? r->sql_error : "handler failed");
			break;
		case RB_OUTCOME_RELEASED:
			dp->stats.released++;
			progress = true;	/* due again: a claim beside it may have missed it */
			break;
		case RB_OUTCOME_LOST:
			dp->stats.lost++;
			if (r->missing)
				rb_debug("%s: already gone (completed before a reconnect)", ev);
			else
				rb_info("%s: lease lost, not applied (it runs again elsewhere)", ev);
			break;
		}
		if (r->sql_error != NULL && (r->outcome == RB_OUTCOME_RESCHEDULED ||
		    r->outcome == RB_OUTCOME_BURIED))
			/* --sql: the statement failed, and so did the attempt */
			failure_warn(dp, ev, r->lease.lane, r->attempts > 0 ? r->attempts : 1, r->sql_error);
		else if (r->sql_error != NULL)
			rb_info("%s: %s", ev, r->sql_error);
		rb_debug("%s: %s%s", ev, rb_outcome_name(r->outcome), r->by_handler ? " (by the handler)" : "");
	}
	for (size_t i = 0; i < n; i++)
		free(v[i].sql_error);
	queue_applied(dp, n, go, again, progress);
	free(go);
	free(again);
}

/*
 * d as the JSON --sql hands its statement ($1): the delivery line as it
 * was written, payload and headers as the store holds them (never parsed
 * and printed again: a number would change, 0.1 into 0.10000000000000001,
 * or not parse at all), with "ok": true spliced in before its last brace.
 */
static char *
sql_json(const struct rb_dl *d)
{
	size_t n = d->tlen;

	if (n > 0 && d->text[n - 1] == '\n')
		n--;
	if (n > 0 && d->text[n - 1] == '}')
		n--;
	return xasprintf("%.*s,\"ok\":true}", (int)n, d->text);
}

/* The first n queued results as a completion's input (their strings
 * borrowed from the queue); with --sql each success's delivery as JSON,
 * the statement's $1, in json[i] (the caller frees them). */
static struct rb_result *
results_of(struct dispatcher *dp, size_t n, char ***json)
{
	struct rb_result *v = xmalloc(n * sizeof *v);

	*json = dp->opt.complete.sql != NULL ? xcalloc(n, sizeof **json) : NULL;
	for (size_t i = 0; i < n; i++) {
		const struct queued *q = &dp->queue[i];

		v[i] = rb_result_of(q->d, q->verdict);
		v[i].error = q->error;
		v[i].retry_ms = q->retry_ms;
		/* a failure due again at once runs again here, under the lane
		 * still held, not claimed again (not with --sql, whose statement
		 * is the completion; not when stopping) */
		v[i].keep = q->verdict == RB_VERDICT_FAIL && dp->opt.complete.sql == NULL && dp->stop_level == 0;
		if (*json != NULL && q->verdict == RB_VERDICT_OK)
			v[i].json = (*json)[i] = sql_json(q->d);
	}
	return v;
}

static void
free_json(char **json, size_t n)
{
	for (size_t i = 0; json != NULL && i < n; i++)
		free(json[i]);
	free(json);
}

void
completion_forget(struct dispatcher *dp)
{
	dp->completing = false;
	free(dp->completing_v);
	dp->completing_v = NULL;
	free_json(dp->completing_json, dp->ncompleting);
	dp->completing_json = NULL;
}

/*
 * Apply the queued results, at most 1000 at a time, while the store takes
 * a completion: one at a time, its outcomes in on_completed, the loop
 * serving the handlers meanwhile.  A completion the store applied at once
 * (failures, --sql) is taken here and the next goes on.  false on a
 * database error.
 */
bool
flush_results(struct dispatcher *dp)
{
	while (dp->nqueue > 0 && !dp->db_down && !dp->completing && rb_store_complete_ready(dp->store)) {
		size_t n = dp->nqueue > 1000 ? 1000 : dp->nqueue;
		struct rb_error err = { 0 };
		char **json;
		struct rb_result *v = results_of(dp, n, &json);

		if (rb_store_complete_start(dp->store, &dp->opt.complete, v, n, &err) < 0) {
			free_json(json, n);
			free(v);
			db_error(dp, &err, "complete");
			return false;
		}
		dp->completing = true;
		dp->ncompleting = n;
		dp->completing_v = v;
		dp->completing_json = json;
		store_drain(dp);
	}
	return !dp->db_down;
}

/* The completion asked for is done: its outcomes. */
void
on_completed(struct dispatcher *dp, const struct rb_store_event *ev)
{
	struct rb_result *v = dp->completing_v;

	if (!dp->completing || ev->results != v)
		return;		/* (cannot happen: one completion at a time) */
	dp->completing_v = NULL;
	apply_results(dp, dp->ncompleting, v);
	free(v);
	completion_forget(dp);
}
