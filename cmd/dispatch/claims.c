/* SPDX-License-Identifier: MIT */
/*
 * claims.c: how deliveries come in.  A claim (rb_store_claim_send/_recv)
 * answers with ids and leases; with --connections 2 or 3 their events
 * are read on the store's second connection (rb_store_fetch_send/_recv)
 * while the next claim runs.  Then the first delivery of each key starts
 * and the rest of its chain waits behind it: chain_next starts the next
 * one once the previous one's completion committed (results.c calls it),
 * or hands them all back.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"

/* When the next claim is due (now, or the next --poll); 0: no claim possible. */
int64_t
claim_due(struct dispatcher *dp, int64_t now)
{
	int free_slots = dp->opt.concurrency - dp->running - (int)dp->nqueue - dp->nwait - dp->nfetch;
	int low = dp->opt.batch < dp->opt.concurrency ? dp->opt.batch : dp->opt.concurrency;

	low = low / 4 > 1 ? low / 4 : 1;
	if (dp->db_down || dp->claiming || (dp->completing && !completes_apart(dp)) ||
	    dp->fetch_waiting.v != NULL || dp->stop_level > 0 || dp->fatal_code != 0 ||
	    free_slots <= 0 ||
	    (dp->opt.kind->accepting != NULL && !dp->opt.kind->accepting(dp)))
		return 0;
	if (dp->wake || now >= dp->next_poll ||
	    (dp->more_work && (free_slots >= low || dp->running + (int)dp->nqueue + dp->nfetch == 0)))
		return now;
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

			if (e->lane != d->lane)
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
		queue_result(dp, followers->v[i], result_release(followers->v[i]), gen, NULL);
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
			queue_result(dp, got.v[i], result_release(got.v[i]), gen, NULL);
		free(got.v);
	} else
		start_chains(dp, got, gen);
}

/* Forget claimed deliveries that will not be read (their owner's count
 * goes down: an owner with none left is retired, its lanes handed back). */
void
fetch_drop(struct dispatcher *dp, struct claimed *got, unsigned gen)
{
	dp->nfetch -= (int)got->n;
	for (size_t i = 0; i < got->n; i++) {
		owner_done(dp, gen);
		rb_dl_free(got->v[i]);
	}
	free(got->v);
	got->v = NULL;
	got->n = 0;
}

/* Read what a claim took (got stolen). */
static void
fetch_send(struct dispatcher *dp, struct claimed got, unsigned gen)
{
	struct rb_error err = { 0 };

	dp->fetch_out = got;
	dp->fetch_gen = gen;
	if (rb_store_fetch_send(dp->store, dp->fetch_out.v, dp->fetch_out.n, dp->opt.kind->line_text,
	    &err) < 0) {
		fetch_drop(dp, &dp->fetch_out, dp->fetch_gen);
		db_error(dp, &err, "fetch");
		return;
	}
	dp->fetching = true;
}

/*
 * Take the answer to the claim that is out, waiting for it or only if it
 * has arrived.  Every other database call collects it first (one
 * statement at a time on the connection); in between, the loop serves
 * the handlers while the database works on the claim.
 */
void
claim_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	struct claimed got = { 0 };
	int n;

	if (!dp->claiming)
		return;
	n = rb_store_claim_recv(dp->store, wait, &got.v, &err);
	if (n == STORE_PENDING)
		return;
	dp->claiming = false;
	if (n < 0) {
		db_error(dp, &err, "claim");
		return;
	}
	got.n = (size_t)n;
	rb_debug("claimed %d (asked %d%s)", n, dp->claim_asked,
	    dp->claim_searched ? "" : ", held lanes only");
	if (dp->claim_searched)
		dp->lanes_dry = n < dp->claim_asked;
	/* (a completion that went through while the claim was out, beside it
	 * on a third connection, may have unblocked a key the claim passed
	 * over: its "nothing" is then no reason to wait for the next poll.
	 * And only a claim that looked at every lane can say there is nothing
	 * due, for --drain.) */
	dp->more_work = n > 0 || dp->progress_since_claim;
	dp->idle_seen = n == 0 && !dp->progress_since_claim && dp->claim_searched;
	dp->stats.claimed += n;
	dp->owners[dp->claim_gen % NOWNERS].count += n;
	if (n > 0 && dp->next_extend == 0)
		dp->next_extend = rb_mono_ms() + dp->opt.lease_ms / 3;
	if (n == 0) {
		free(got.v);
		return;
	}
	if (!reads_apart(dp)) {
		start_claimed(dp, got, dp->claim_gen);
		if (dp->opt.kind->flush != NULL)
			dp->opt.kind->flush(dp);
		return;
	}
	dp->nfetch += n;
	if (dp->fetching) {
		dp->fetch_waiting = got;	/* claim_due waits for it to go */
		dp->fetch_waiting_gen = dp->claim_gen;
	} else
		fetch_send(dp, got, dp->claim_gen);
}

/* Take the events of the fetch that is out, and start its deliveries. */
void
fetch_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	struct claimed got;
	size_t k = 0;
	int n;

	if (!dp->fetching)
		return;
	n = rb_store_fetch_recv(dp->store, wait, &err);
	if (n == STORE_PENDING)
		return;
	dp->fetching = false;
	if (n < 0) {
		fetch_drop(dp, &dp->fetch_out, dp->fetch_gen);
		db_error(dp, &err, "fetch");
		return;
	}
	/* (those whose event is gone are not started: their count goes) */
	got = dp->fetch_out;
	dp->nfetch -= (int)got.n;
	for (size_t i = 0; i < got.n; i++) {
		if (got.v[i]->fetched)
			got.v[k++] = got.v[i];
		else {
			owner_done(dp, dp->fetch_gen);
			rb_dl_free(got.v[i]);
		}
	}
	got.n = k;
	dp->fetch_out = (struct claimed){ 0 };
	start_claimed(dp, got, dp->fetch_gen);
	if (dp->fetch_waiting.v != NULL && !dp->db_down) {
		struct claimed next = dp->fetch_waiting;

		dp->fetch_waiting = (struct claimed){ 0 };
		fetch_send(dp, next, dp->fetch_waiting_gen);
	}
	if (dp->opt.kind->flush != NULL)
		dp->opt.kind->flush(dp);
}

/*
 * The deliveries still running, waiting in a chain or to be completed, whatever their
 * owner generation, into dp->live and dp->live_lanes: the claim need not look them up
 * (rb_claim_opts.live).  Returns how many.
 */
static size_t
live_ids(struct dispatcher *dp)
{
	size_t n = 0, want = dp->nqueue + dp->fetch_out.n + dp->fetch_waiting.n;

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
#define LIVE(dl) do { dp->live[n] = (dl)->id; dp->live_lanes[n++] = (dl)->lane; } while (0)
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
	/* claimed, being read */
	for (size_t i = 0; i < dp->fetch_out.n; i++)
		LIVE(dp->fetch_out.v[i]);
	for (size_t i = 0; i < dp->fetch_waiting.n; i++)
		LIVE(dp->fetch_waiting.v[i]);
#undef LIVE
	return n;
}

void
maybe_claim(struct dispatcher *dp, int64_t now)
{
	int free_slots = dp->opt.concurrency - dp->running - (int)dp->nqueue - dp->nwait - dp->nfetch;
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
	claim.chain = dp->opt.chain;
	/* followers start early (finish_slot) unless the handler is the
	 * completion (--sql): the claim's takeover rule must be the same */
	claim.chain_early = dp->opt.complete.sql == NULL;
	claim.line_text = dp->opt.kind->line_text;
	/* (never NULL: NULL would mean "unknown", and the claim would take
	 * whatever a lane lists as in flight for running) */
	claim.live = dp->live != NULL ? dp->live : (const int64_t[]){ 0 };
	claim.live_lanes = dp->live_lanes != NULL ? dp->live_lanes : (const int[]){ 0 };
	claim.apart = reads_apart(dp);
	/* look for more lanes unless the last look found too few and nothing
	 * changed since; a claim with nothing running always looks (its
	 * answer decides --drain and idleness) */
	claim.no_search = dp->lanes_dry && !dp->wake && now < dp->next_poll &&
	    dp->running + (int)dp->nqueue > 0;
	dp->claim_searched = !claim.no_search;
	dp->wake = false;
	dp->next_poll = now + dp->opt.poll_ms;
	if (rb_store_claim_send(dp->store, &claim, &err) < 0) {
		db_error(dp, &err, "claim");
		return;
	}
	dp->claiming = true;
	dp->progress_since_claim = false;
	dp->claim_gen = dp->cur_gen;
	dp->claim_asked = claim.batch;
}
