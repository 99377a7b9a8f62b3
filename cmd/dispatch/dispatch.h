/* SPDX-License-Identifier: MIT */
/*
 * dispatch.h: rb-dispatch's engine, private to rb-dispatch (the s6
 * pattern for a program that outgrows one file).  cmd/rb-dispatch.c
 * parses the options and calls dispatcher_new/_run/_free; the engine is
 *
 *   loop.c          the poll(2) loop, signals, timeouts, stopping, the
 *                   store's sockets and notifications
 *   claims.c        claim -> fetch -> start, and the chains of a key
 *   results.c       slots done -> queued -> completed, and the outcomes
 *   leases.c        owner generations, renewal, hand-back, reconnects
 *   handler*.c      the handler kinds (handler.h)
 *
 * All its state is one struct dispatcher; only the signal flags are
 * file-scope (loop.c), since signals belong to the process.  The store is
 * called from claims.c (claim, fetch), results.c (complete), leases.c
 * (extend, relinquish, reconnect) and loop.c (listen, sockets,
 * notifications) only.
 *
 * A delivery's life.  Each step names the function that moves it on, and
 * [the flag that is set while the store has the statement, and on which
 * connection]:
 *
 *   idle (due in the store)
 *     |  maybe_claim: rb_store_claim_send             [claiming, conn 1]
 *     v
 *   claim out
 *     |  claim_collect: rb_store_claim_recv (ids and leases)
 *     +-------------------------------------------+
 *     |  fetch_send: rb_store_fetch_send          |  --connections 1:
 *     v                     [fetching, conn 2]    |  the claim read
 *   fetch out  (the next claim's answer waits     |  the events too
 *     |         in fetch_waiting meanwhile)       |
 *     |  fetch_collect: rb_store_fetch_recv       |
 *     |  (key and line; one whose event is gone   |
 *     |  is dropped)                              |
 *     v                                           v
 *   start_claimed -> start_chains: the first of each key's chain starts,
 *     |  the rest wait behind it (chain, nwait); stopping: released unrun
 *     v
 *   running  (a slot: an --exec child or a --pipe co-process's line;
 *     |       --sql takes no slot: its result is ready at once)
 *     |  finish_slot: the handler's verdict, --timeout, abort, a dead
 *     |  co-process; a success starts the next of its chain now (chain_next)
 *     v
 *   queued  (queue[], r NULL for a plain success)
 *     |  flush_results, after --window (at once: stopping, 1000 queued, --sql):
 *     |    all plain successes: rb_store_complete_send
 *     |                               [completing, conn 1; 3 with --connections 3]
 *     |    else rb_store_complete, waited for, then as below
 *     v
 *   completion out
 *     |  complete_collect: rb_store_complete_recv
 *     v
 *   done: queue_applied counts it off its owner; a chain that waited for
 *         it (--sql, or a failure) goes on (chain_next: back to running)
 *         if it completed, else is handed back (released, queued)
 *
 * One statement at a time per connection: while claiming, nothing else
 * goes out on connection 1 (claim_due, flush_results and db_settle wait
 * for or collect the claim first), except a completion on connection 3
 * (--connections 3).  A lost connection (db_down) forgets what was out:
 * the claim's answer, the fetches (their deliveries dropped, their lanes
 * freed once their owner is retired) and the completion (its results
 * stay queued and go again); try_reconnect starts a new owner generation.
 *
 * The claim's flags:
 *   wake                  claim at the next chance (start, a notification,
 *                         a reconnect); cleared when a claim goes out
 *   more_work             the last claim found work, or a completion
 *                         deleted some: claim again once a quarter of
 *                         --batch is free (or nothing is in flight),
 *                         instead of at the next --poll
 *   lanes_dry             the last look for more lanes found fewer than
 *                         asked: the next claims only fill the lanes held
 *                         (no_search) until woken, the next --poll, or
 *                         nothing running or queued
 *   progress_since_claim  a completion went through while the claim was
 *                         out: its "nothing" may be stale
 *   idle_seen             the last claim looked at every lane, found
 *                         nothing, and nothing completed since: --drain
 *                         ends once nothing is in flight either
 *
 * Stop levels (stop_level):
 *   0  running
 *   1  stopping (SIGTERM/SIGINT): no more claims or co-process
 *      restarts; what a claim brings and the chains behind the running
 *      ones are handed back unrun; running handlers get --grace to finish
 *   2  aborted (a second signal, --grace over, or a fatal error, which
 *      goes straight here): running attempts are released (no attempt
 *      charged), --exec children killed; with the database also gone and
 *      a second signal, the queued results are given up (exit 75)
 * The loop ends at level 1 or 2 once nothing runs, nothing is queued and
 * nothing is out (after a fatal error: once nothing runs); then the
 * handler's processes are stopped and the lanes of every owner name are
 * handed back.
 */
#ifndef RB_DISPATCH_H
#define RB_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "rb_store.h"
#include "handler.h"

/* What the store's two-step receives (claim, fetch and completion alike)
 * return while the answer is not in yet. */
#define STORE_PENDING RB_CLAIM_PENDING

/* What the engine is told: rb-dispatch's options, minus the common ones. */
struct dispatch_opts {
	const char		*handler;
	const struct handler_kind *kind;	/* --exec, --pipe or --sql */
	const char		*cmd;		/* --exec or --pipe */
	int			 concurrency;
	int			 batch;
	int			 chain;
	int			 procs;
	int			 conns;		/* 2: claims read apart (rb_store_fetch_send);
					 * 3: completions sent apart too */
	int64_t			 lease_ms;
	int64_t			 timeout_ms;
	int64_t			 grace_ms;
	int64_t			 poll_ms;
	int64_t			 window_ms;
	int64_t			 stats_ms;
	const char		*owner;		/* NULL: host:pid:random */
	bool			 drain;
	bool			 settle;	/* --settle: drain, retries due at once */
	struct rb_complete_opts	 complete;	/* .sql: --sql */
};

/* The deliveries of one key behind the one that runs: v[at], v[at + 1], ... v[n - 1]. */
struct chain {
	struct rb_dl	**v;
	size_t		 n, at;
};

/* The deliveries one claim took (an array of n, the array and them owned). */
struct claimed {
	struct rb_dl	**v;
	size_t		 n;
};

/* A delivery in flight, and what its handler kind keeps of it (set by
 * the kind's start; the slot is zeroed when done). */
struct slot {
	bool	 used;
	struct rb_dl *d;	/* the claimed delivery */
	unsigned gen;		/* lease owner generation that claimed it */
	int64_t	 deadline;	/* --timeout; 0: none (any more) */
	struct chain *followers;	/* the rest of its key's chain, or NULL */
	union {
		struct exec_slot exec;
		struct pipe_slot pipe;
	} h;
};

/*
 * Lease owner names.  Every reconnect starts a new generation (a new
 * name); an older one is renewed while deliveries it claimed are in
 * flight or waiting to be applied, then handed back.
 */
#define NOWNERS 8
struct owner {
	char	*name;
	unsigned gen;
	long	 count;		/* deliveries in flight or queued */
};

/* A result waiting for the next group completion. */
struct queued {
	struct rb_dl *d;
	json_t	*r;		/* the result to apply; NULL: d succeeded (no --sql) */
	unsigned gen;
	struct chain *followers;	/* the rest of its key's chain, or NULL */
};

struct dispatcher {
	struct dispatch_opts	 opt;
	struct rb_store		*store;
	void			*kind_state;	/* the handler kind's own (handler_pipe.c) */

	/* the slots: deliveries the handler runs */
	struct slot	*slots;		/* opt.concurrency of them */
	int		 running;	/* used slots */
	int		*free_slot;	/* the free slots' indexes (a stack) ... */
	int		 nfree_slot;	/* ... this many */
	int64_t		 next_deadline;	/* no slot's deadline is earlier (0: none) */

	/* lease owner generations */
	struct owner	 owners[NOWNERS];
	unsigned	 cur_gen;
	char		*owner_base;

	/* the results waiting for a completion */
	struct queued	*queue;
	size_t		 nqueue, capqueue;
	int64_t		 queue_since;	/* when the first of them was queued */
	int		 nwait;		/* chain followers waiting for their turn */

	/* the connection */
	bool		 db_down;
	int64_t		 reconnect_at, reconnect_backoff;

	/* the claim (see above for the flags) */
	bool		 wake;
	bool		 more_work;
	bool		 lanes_dry;
	bool		 progress_since_claim;
	bool		 idle_seen;
	bool		 claiming;	/* a claim is out: the handlers are served meanwhile ... */
	unsigned	 claim_gen;	/* ... sent for this owner generation ... */
	int		 claim_asked;	/* ... asking for this many ... */
	bool		 claim_searched;	/* ... and looking for more lanes or not */
	int64_t		*live;		/* the ids still in flight, for the claim (live_ids) ... */
	int		*live_lanes;	/* ... and their lanes ... */
	size_t		 live_cap;	/* ... room for this many */

	/* reading what a claim took (--connections 2 and 3) */
	bool		 fetching;	/* a fetch is out ... */
	struct claimed	 fetch_out;	/* ... of these claimed ... */
	unsigned	 fetch_gen;	/* ... for this owner generation */
	struct claimed	 fetch_waiting;	/* a claim's answer waiting for the fetch out */
	unsigned	 fetch_waiting_gen;
	int		 nfetch;	/* deliveries in fetch_out and fetch_waiting */

	/* the completion out */
	bool		 completing;	/* a completion is out (flush_results) ... */
	size_t		 ncompleting;	/* ... of the first this many queued results ... */
	struct rb_dl	**completing_v;	/* ... sent as this array (theirs) */

	/* timers (monotonic ms; 0: off) */
	int64_t		 next_poll, next_extend, next_stats;

	/* stopping */
	int		 stop_level;	/* 0 running, 1 stopping (grace), 2 aborted */
	int64_t		 grace_deadline;
	int		 fatal_code;	/* an error we stop for: the exit code */

	struct {
		long	claimed, completed, rescheduled, buried, released, lost;
		long	completed_at_last_stats;
	} stats;
};

/*
 * Which statements run beside which (--connections).  The store should
 * decide this one day (architecture review, rec. 2); until then these two
 * are the only places the engine asks.
 */
static inline bool
reads_apart(const struct dispatcher *dp)	/* fetch on a second connection */
{
	return dp->opt.conns >= 2;
}

static inline bool
completes_apart(const struct dispatcher *dp)	/* complete on a third, beside the claims */
{
	return dp->opt.conns == 3;
}

/* The earlier of two deadlines, 0 being none. */
static inline int64_t
min_deadline(int64_t a, int64_t b)
{
	return a == 0 ? b : (b == 0 || a < b ? a : b);
}

/* loop.c: the engine as rb-dispatch.c sees it */
void	setup_signals(void);
struct dispatcher *dispatcher_new(const struct dispatch_opts *);
int	dispatcher_run(struct dispatcher *, struct rb_store *);
void	dispatcher_free(struct dispatcher *);
void	reap(struct dispatcher *);

/* claims.c */
int64_t	claim_due(struct dispatcher *, int64_t now);
void	maybe_claim(struct dispatcher *, int64_t now);
void	claim_collect(struct dispatcher *, bool wait);
void	fetch_collect(struct dispatcher *, bool wait);
void	fetch_drop(struct dispatcher *, struct claimed *got, unsigned gen);
/* A chain's turn (from results.c: the one before succeeded, or with --sql
 * its completion committed): start its next delivery (go), or hand them
 * all back.  Starting may finish the new slot at once (finish_slot: a
 * handler that cannot start), but never as a success, so that does not
 * come back here: the recursion is one deep. */
void	chain_next(struct dispatcher *, struct chain *followers, unsigned gen, bool go);
void	chain_free(struct chain *);

/* results.c */
json_t	*result_ok(const struct rb_dl *);
json_t	*result_fail(const struct rb_dl *, const char *error);
json_t	*result_release(const struct rb_dl *);
void	queue_result(struct dispatcher *, struct rb_dl *d, json_t *r, unsigned gen,
	    struct chain *followers);
struct slot *slot_take(struct dispatcher *, struct rb_dl *d, unsigned gen, struct chain *followers);
void	finish_slot(struct dispatcher *, struct slot *s, json_t *r);
bool	flush_results(struct dispatcher *);
void	complete_collect(struct dispatcher *, bool wait);
void	db_settle(struct dispatcher *);

/* leases.c */
void	new_owner(struct dispatcher *);
void	owner_done(struct dispatcher *, unsigned gen);
void	db_error(struct dispatcher *, const struct rb_error *err, const char *what);
void	try_reconnect(struct dispatcher *, int64_t now);
void	extend_leases(struct dispatcher *, int64_t now);
void	retire_owners(struct dispatcher *);
void	hand_back_lanes(struct dispatcher *);

#endif
