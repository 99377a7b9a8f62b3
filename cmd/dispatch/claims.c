/* SPDX-License-Identifier: MIT */
/*
 * claims.c: how deliveries come in.  A claim (rb_store_claim_start) is
 * answered by CLAIMED, saying how many it took; those that do not come
 * with it are owed, and come in DELIVERED events (the store reads their
 * events while the next claim runs).  Then the first delivery of each key
 * starts and the rest of its chain waits behind it: chain_next starts the
 * next one once the previous one's completion committed (results.c calls
 * it), or hands them all back.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"

/*
 * A claim that brought less than a quarter batch found the lanes nearly
 * bare: what comes free next comes from the deliveries in hand finishing
 * (a key's next one, a lane's room).  The next claim on more_work alone
 * waits until a quarter of those in hand (at most a quarter batch) were
 * applied since, or CLAIM_PACE_MS passed: claims back to back, each
 * reading every held lane for a few deliveries, spent the server's time
 * (a drain whose deliveries all fail once: 224 claims of 99 each, 10 ms
 * apiece, two thirds of the server's time).
 */
#define CLAIM_PACE_MS	20

static int64_t
claim_paced(const struct dispatcher *dp, int64_t now, int low, int in_hand)
{
	int want = in_hand / 4 < low ? in_hand / 4 : low;

	if (dp->last_claimed >= low || in_hand == 0 || dp->applied_since_claim >= (want > 1 ? want : 1))
		return now;
	return dp->last_claim_at + CLAIM_PACE_MS < dp->next_poll ? dp->last_claim_at + CLAIM_PACE_MS :
	    dp->next_poll;
}

/* When the next claim is due (now, or the next --poll); 0: no claim possible. */
int64_t
claim_due(struct dispatcher *dp, int64_t now)
{
	int in_hand = dp->running + (int)dp->nqueue + dp->nwait + dp->owed;
	int free_slots = dp->opt.concurrency - in_hand;
	int low = dp->opt.batch < dp->opt.concurrency ? dp->opt.batch : dp->opt.concurrency;

	low = low / 4 > 1 ? low / 4 : 1;
	if (dp->db_down || dp->claim_out || dp->stop_level > 0 || dp->fatal_code != 0 ||
	    free_slots <= 0 || !rb_store_claim_ready(dp->store) ||
	    (dp->opt.kind->accepting != NULL && !dp->opt.kind->accepting(dp)))
		return 0;
	if (dp->wake || now >= dp->next_poll)
		return now;
	/* (nothing in hand but chains waiting: claim) */
	if (dp->more_work && (free_slots >= low || in_hand == dp->nwait))
		return claim_paced(dp, now, low, in_hand);
	return dp->next_poll;
}

/*
 * Hand a claimed delivery (stolen) to the handler, claimed under owner
 * generation gen; followers (stolen, or NULL) are the rest of its key's
 * chain, started when this one is completed.
 */
static void
start_delivery(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	dp->opt.kind->start(dp, d, gen, followers);
}

/*
 * Start what a claim brought.  The deliveries of one key come in sequence
 * order, each lane's together (--chain): the first is started, the rest
 * wait in a chain behind it.  The next one starts once the one before
 * succeeded on its first attempt (finish_slot), else, and always with
 * --sql, once its completion committed (queue_applied); when one fails,
 * the rest are handed back unrun.
 */
static void
start_chains(struct dispatcher *dp, struct claimed got, unsigned gen)
{
	size_t n = got.n;
	int *head = xcalloc(n > 0 ? n : 1, sizeof *head);
	struct chain **chain = xcalloc(n > 0 ? n : 1, sizeof *chain);

	for (size_t i = 0; i < n; i++) {
		const struct rb_dl *d = got.v[i];

		head[i] = -1;
		for (size_t j = i; d->key != NULL && dp->opt.chain > 1 && j-- > 0;) {
			const struct rb_dl *e = got.v[j];

			if (e->lease.lane != d->lease.lane)
				break;
			if (e->key != NULL && strcmp(e->key, d->key) == 0) {
				head[i] = head[j] >= 0 ? head[j] : (int)j;
				break;
			}
		}
		if (head[i] >= 0) {
			struct chain *c = chain[head[i]];

			if (c == NULL) {
				c = chain[head[i]] = xcalloc(1, sizeof *c);
				c->v = xcalloc((size_t)dp->opt.chain, sizeof *c->v);
			}
			if (c->n == (size_t)dp->opt.chain)	/* (cannot happen: a claim takes at most --chain of a key) */
				c->v = xrealloc(c->v, (c->n + 1) * sizeof *c->v);
			c->v[c->n++] = got.v[i];
			dp->nwait++;
		}
	}
	for (size_t i = 0; i < n; i++)
		if (head[i] < 0)
			start_delivery(dp, got.v[i], gen, chain[i]);
	free(head);
	free(chain);
	free(got.v);
}

/* Free a chain and the deliveries still in it. */
void
chain_free(struct chain *c)
{
	if (c == NULL)
		return;
	for (size_t i = c->at; i < c->n; i++)
		rb_dl_free(c->v[i]);
	free(c->v);
	free(c);
}

static size_t
chain_len(const struct chain *c)
{
	return c != NULL ? c->n - c->at : 0;
}

/* A chain's turn: start its next delivery (go), or hand them all back
 * (see dispatch.h). */
void
chain_next(struct dispatcher *dp, struct chain *followers, unsigned gen, bool go)
{
	size_t n = chain_len(followers);

	if (go && n > 0) {
		struct rb_dl *d = followers->v[followers->at++];

		dp->nwait--;
		if (n == 1) {
			chain_free(followers);
			followers = NULL;
		}
		start_delivery(dp, d, gen, followers);
		return;
	}
	for (size_t i = followers->at; i < followers->n; i++)
		queue_result(dp, followers->v[i], verdict_release(), gen, NULL);
	if (n > 0 && dp->stop_level == 0 && dp->chain_now > 1) {
		dp->chain_now /= 2;
		rb_debug("chain %d: %zu followers handed back unrun", dp->chain_now, n);
	}
	dp->nwait -= (int)n;
	followers->at = followers->n;
	chain_free(followers);
}

/* Start the deliveries a claim brought (stolen), or when stopping hand
 * them back unrun (no attempt charged). */
static void
start_claimed(struct dispatcher *dp, struct claimed got, unsigned gen)
{
	if (dp->stop_level > 0) {
		for (size_t i = 0; i < got.n; i++)
			queue_result(dp, got.v[i], verdict_release(), gen, NULL);
		free(got.v);
	} else
		start_chains(dp, got, gen);
}

void
owed_dropped(struct dispatcher *dp, int n)
{
	dp->owed -= n;
	while (n-- > 0)
		owner_done(dp, dp->claim_gen);
}

/* The deliveries of an event (stolen), to start. */
static void
start_event(struct dispatcher *dp, const struct rb_store_event *ev)
{
	if (ev->n > 0)
		start_claimed(dp, (struct claimed){ .v = ev->v, .n = ev->n }, dp->claim_gen);
	else
		free(ev->v);
	if (dp->opt.kind->flush != NULL)
		dp->opt.kind->flush(dp);
}

/*
 * The claim that was asked for committed: ev->claimed deliveries, ev->n
 * of them here (stolen), the rest owed.  In between, the loop served the
 * handlers while the store worked on the claim.
 */
void
on_claimed(struct dispatcher *dp, const struct rb_store_event *ev)
{
	int n = ev->claimed;
	int64_t now;

	dp->claim_out = false;
	metrics_claimed(dp);
	rb_debug("claimed %d (asked %d%s)", n, dp->claim_asked,
	    dp->claim_searched ? "" : ", held lanes only");
	if (dp->claim_searched)
		dp->lanes_dry = n < dp->claim_asked;
	/* (a completion that went through while the claim was out, beside it,
	 * may have unblocked a key the claim passed over: its "nothing" is
	 * then no reason to wait for the next poll.  And only a claim that
	 * looked at every lane can say there is nothing due, for --drain.) */
	dp->more_work = n > 0 || dp->progress_since_claim;
	dp->idle_seen = n == 0 && !dp->progress_since_claim && dp->claim_searched;
	if (dp->idle_seen && dp->opt.drain && !dp->claim_full) {
		/* (--drain ends on the "nothing" of a claim that read every lane
		 * row and every lane from its start) */
		dp->idle_seen = false;
		dp->want_full = dp->wake = dp->more_work = true;
	}
	/* (a lane another holder leases frees soon, a dead holder's after its
	 * lease was cut: the next look comes then, not a --poll later) */
	now = rb_mono_ms();
	if (ev->retry_ms > 0) {
		int64_t t = now + ev->retry_ms + 5;

		if (dp->retry_at == 0 || t < dp->retry_at)
			dp->retry_at = t;
		if (t < dp->next_poll)
			dp->next_poll = t;
	}
	if (n > 0)
		dp->drain_looks = 0;
	dp->stats.claimed += n;
	dp->last_claimed = n;
	dp->last_claim_at = now;
	dp->owners[dp->claim_gen % NOWNERS].count += n;
	if (n > 0 && dp->next_extend == 0)
		dp->next_extend = now + dp->opt.lease_ms / 3;
	dp->owed += n - (int)ev->n;
	if (n > 0)
		start_event(dp, ev);
	else
		free(ev->v);
}

/* Owed deliveries came (stolen); those whose event is gone are not started. */
void
on_delivered(struct dispatcher *dp, const struct rb_store_event *ev)
{
	dp->owed -= (int)ev->n;
	owed_dropped(dp, ev->dropped);
	start_event(dp, ev);
}

/*
 * The deliveries still running, waiting in a chain or to be completed, whatever their
 * owner generation, into dp->live and dp->live_lanes: the claim need not look them up
 * (rb_claim_opts.live; the owed ones the store knows).  Returns how many.
 */
static size_t
live_ids(struct dispatcher *dp)
{
	size_t n = 0, want = dp->nqueue;

	/* counted, not derived from running, nqueue and nwait: a slip in
	 * those counters must not write past the end */
	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used)
			want += 1 + chain_len(dp->slots[i].followers);
	for (size_t i = 0; i < dp->nqueue; i++)
		want += chain_len(dp->queue[i].followers);
	if (dp->live_cap < want) {
		dp->live_cap = want;
		dp->live = xrealloc(dp->live, want * sizeof *dp->live);
		dp->live_lanes = xrealloc(dp->live_lanes, want * sizeof *dp->live_lanes);
	}
#define LIVE(dl) do { dp->live[n] = (dl)->id; dp->live_lanes[n++] = (dl)->lease.lane; } while (0)
	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used) {
			const struct chain *c = dp->slots[i].followers;

			LIVE(dp->slots[i].d);
			for (size_t k = c != NULL ? c->at : 0; c != NULL && k < c->n; k++)
				LIVE(c->v[k]);
		}
	for (size_t i = 0; i < dp->nqueue; i++) {
		const struct chain *c = dp->queue[i].followers;

		LIVE(dp->queue[i].d);
		for (size_t k = c != NULL ? c->at : 0; c != NULL && k < c->n; k++)
			LIVE(c->v[k]);
	}
	/* (the owed ones the store adds itself) */
#undef LIVE
	return n;
}

void
maybe_claim(struct dispatcher *dp, int64_t now)
{
	int free_slots = dp->opt.concurrency - dp->running - (int)dp->nqueue - dp->nwait - dp->owed;
	struct rb_claim_opts claim;
	struct rb_error err = { 0 };
	int64_t due = claim_due(dp, now);

	if (due == 0 || due > now)
		return;
	claim = (struct rb_claim_opts){ .handler = dp->opt.handler,
	    .owner = dp->owners[dp->cur_gen % NOWNERS].name,
	    .batch = free_slots < dp->opt.batch ? free_slots : dp->opt.batch, .lease_ms = dp->opt.lease_ms,
	    .max_attempts = dp->opt.complete.max_attempts };
	claim.n_live = live_ids(dp);
	claim.chain = dp->chain_now;
	/* followers start early (finish_slot) unless the handler is the
	 * completion (--sql) or --strict-order: the claim's takeover rule
	 * must be the same */
	claim.chain_early = chain_early(dp);
	/* rb-dispatch outlives its claims: its death can be seen at once */
	claim.liveness = true;
	/* ... and keeps its claim cursors between claims */
	claim.cursors = !dp->want_full;
	dp->claim_full = dp->want_full;
	dp->want_full = false;
	/* (never NULL: NULL would mean "unknown", and the claim would take
	 * whatever a lane lists as in flight for running) */
	claim.live = dp->live != NULL ? dp->live : (const int64_t[]){ 0 };
	claim.live_lanes = dp->live_lanes != NULL ? dp->live_lanes : (const int[]){ 0 };
	/* look for more lanes unless the last look found too few and nothing
	 * changed since; a claim with nothing running always looks (its
	 * answer decides --drain and idleness) */
	claim.held_only = dp->lanes_dry && !dp->wake && now < dp->next_poll &&
	    dp->running + (int)dp->nqueue > 0;
	dp->claim_searched = !claim.held_only;
	dp->wake = false;
	dp->next_poll = now + dp->opt.poll_ms;
	if (dp->retry_at > now && dp->retry_at < dp->next_poll)
		dp->next_poll = dp->retry_at;
	else if (dp->retry_at <= now)
		dp->retry_at = 0;
	if (rb_store_claim_start(dp->store, &claim, &err) < 0) {
		db_error(dp, &err, "claim");
		return;
	}
	dp->claim_out = true;
	dp->progress_since_claim = false;
	dp->applied_since_claim = 0;
	dp->claim_gen = dp->cur_gen;
	dp->claim_asked = claim.batch;
}
