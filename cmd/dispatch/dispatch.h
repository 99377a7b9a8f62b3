/* SPDX-License-Identifier: MIT */
/*
 * dispatch.h: rb-dispatch's engine, private to rb-dispatch (the s6
 * pattern for a program that outgrows one file).  cmd/rb-dispatch.c
 * parses the options and calls dispatcher_new/_run/_free; the engine is
 *
 *   loop.c          the poll(2) loop, signals, timeouts, stopping, and what
 *                   the store reports (store_drain)
 *   claims.c        claimed -> delivered -> started, and the chains of a key
 *   results.c       slots done -> queued -> completed, and the outcomes
 *   leases.c        owner generations, renewal, hand-back, reconnects
 *   failures.c      the warnings of failed attempts, rate-limited
 *   handler*.c      the handler kinds (handler.h)
 *
 * All its state is one struct dispatcher; only the signal flags are
 * file-scope (loop.c), since signals belong to the process.  The store is
 * called from claims.c (claim), results.c (complete), leases.c (extend,
 * relinquish, reconnect) and loop.c (listen, poll, service) only.  The
 * engine asks the store for two things without waiting, a claim and a
 * completion (rb_store_claim_start, rb_store_complete_start), and knows
 * no more of it than what it asked for: how the store overlaps them (the
 * PostgreSQL backend's connections) is the store's own business.
 *
 * A delivery's life.  Each step names the function that moves it on, and
 * [what the engine has asked the store for meanwhile]:
 *
 *   idle (due in the store)
 *     |  maybe_claim, when claim_due and rb_store_claim_ready:
 *     |  rb_store_claim_start                          [claim_out]
 *     v
 *   claim out
 *     |  CLAIMED (claimed: how many the claim took; on_claimed): those
 *     |  of them that came with it start at once, the rest are owed
 *     +------------------------------------------+
 *     |                                          |  [owed: taken, the
 *     |                                          |   store still reading
 *     |                                          |   them; the next claim
 *     |                                          |   may go meanwhile]
 *     |                                          v
 *     |                    DELIVERED (on_delivered): they start; one
 *     |                    whose event is gone is dropped
 *     v                                          v
 *   start_claimed -> start_chains: the first of each key's chain starts,
 *     |  the rest wait behind it (chain, nwait); stopping: released unrun
 *     v
 *   running  (a slot: an --exec child or a --pipe co-process's line;
 *     |       --sql takes no slot: its result is ready at once)
 *     |  finish_slot: the handler's verdict, --timeout, abort, a dead
 *     |  co-process; a success starts the next of its chain now (chain_next)
 *     v
 *   queued  (queue[]: the delivery and its verdict)
 *     |  flush_results, after --window (at once: stopping, 1000 queued,
 *     |  --sql), when rb_store_complete_ready: rb_store_complete_start
 *     v                                           [completing]
 *   completion out
 *     |  COMPLETED (on_completed): the outcomes
 *     v
 *   done: queue_applied counts it off its owner; a chain that waited for
 *         it (--sql, or a failure) goes on (chain_next: back to running)
 *         if it completed, else is handed back (released, queued)
 *
 * After every poll store_drain takes what the store reports: CLAIMED,
 * DELIVERED, COMPLETED, WOKEN (a notification: claim at the next chance)
 * and FAILED (what was asked for is not coming; db_error).  A lost
 * connection (db_down) forgets what was asked for: the claim's answer,
 * the owed deliveries (their lanes freed once their owner is retired)
 * and the completion (its results stay queued and go again);
 * try_reconnect starts a new owner generation.
 *
 * The claim's flags:
 *   wake                  claim at the next chance (start, a notification,
 *                         a reconnect); cleared when a claim goes out
 *   more_work             the last claim found work, or a completion
 *                         deleted some: claim again once a quarter of
 *                         --batch is free (or nothing is in flight),
 *                         instead of at the next --poll; after a claim
 *                         that brought less than a quarter batch, once
 *                         a quarter of what is in hand was applied, or
 *                         20 ms later (claim_paced)
 *   lanes_dry             the last look for more lanes found fewer than
 *                         asked: the next claims only fill the lanes held
 *                         (held_only) until woken, the next --poll, or
 *                         nothing running or queued
 *   progress_since_claim  a completion went through while the claim was
 *                         out: its "nothing" may be stale
 *   idle_seen             the last claim looked at every lane, found
 *                         nothing, and nothing completed since: --drain
 *                         ends once nothing is in flight either.  With
 *                         claim cursors a claim looks past what its
 *                         cursors and the last pass say cannot have work;
 *                         --drain's last "nothing" is that of a claim
 *                         without them (want_full, claim_full)
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
 * nothing is asked for (after a fatal error: once nothing runs); then the
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
#include "metrics.h"

/* What the engine is told: rb-dispatch's options, minus the common ones. */
struct dispatch_opts {
	const char		*handler;
	const struct handler_kind *kind;	/* --exec, --pipe or --sql */
	const char		*cmd;		/* --exec or --pipe */
	int			 concurrency;
	int			 batch;
	int			 chain;
	bool			 strict_order;	/* --strict-order: a follower starts once the
						 * one before it is committed */
	int			 procs;
	int64_t			 lease_ms;
	int64_t			 timeout_ms;
	int64_t			 grace_ms;
	int64_t			 poll_ms;
	int64_t			 window_ms;
	int64_t			 stats_ms;
	const char		*owner;		/* NULL: host:pid:random */
	bool			 drain;
	bool			 settle;	/* --settle: drain, retries due at once */
	bool			 fail_exit;	/* --fail-exit: exit 82 when an attempt failed */
	struct rb_complete_opts	 complete;	/* .sql: --sql */
	const char		*metrics_file;	/* --metrics-file (metrics.h) */
	bool			 stats_quiet;	/* stats_ms only for the file and STATUS=: no line */
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
	int64_t	 started;	/* when its handler started (rb_mono_ms, metrics.h) */
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
/* --drain: how many times in a row it looks again when a cut lease ends
 * (rb_store_event.retry_ms) without finding work, before it is over */
#define DRAIN_CUT_LOOKS 3
struct owner {
	char	*name;
	unsigned gen;
	long	 count;		/* deliveries in flight or queued */
};

/* What a handler said of an attempt (finish_slot); error is borrowed. */
struct verdict {
	enum rb_verdict	 v;
	const char	*error;		/* FAIL, DEAD: why (NULL: "handler failed") */
	int64_t		 retry_ms;	/* FAIL: retry after this; < 0: the backoff's */
	bool		 failed;	/* logged as a failed attempt: a FAIL, or a DEAD said
					 * with "ok": false */
};

static inline struct verdict
verdict_ok(void)
{
	return (struct verdict){ .v = RB_VERDICT_OK, .retry_ms = -1 };
}

static inline struct verdict
verdict_fail(const char *error)
{
	return (struct verdict){ .v = RB_VERDICT_FAIL, .error = error, .retry_ms = -1, .failed = true };
}

/* An --exec handler's exit status: it completed the delivery itself, in
 * its own transaction (relaybus_complete), rb-dispatch(1) "Handlers".
 * (Not a sysexits(3) value, nor one of relaybus's own.) */
#define RB_HANDLER_EXIT_COMPLETED	80

/* the handler completed the delivery itself, in its own transaction */
static inline struct verdict
verdict_done(void)
{
	return (struct verdict){ .v = RB_VERDICT_DONE, .retry_ms = -1 };
}

static inline struct verdict
verdict_release(void)
{
	return (struct verdict){ .v = RB_VERDICT_RELEASE, .retry_ms = -1 };
}

/* A result waiting for the next group completion. */
struct queued {
	struct rb_dl	*d;
	enum rb_verdict	 verdict;
	char		*error;		/* (owned) NULL: none */
	int64_t		 retry_ms;
	unsigned	 gen;
	struct chain	*followers;	/* the rest of its key's chain, or NULL */
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
	/* the chain the next claim asks for: opt.chain, halved each time a
	 * key's delivery failed with followers behind it (they go back
	 * unrun and would be claimed again behind each retry), and one more
	 * with each keyed delivery that succeeds at its first attempt */
	int		 chain_now;

	/* the connection */
	bool		 db_down;
	int64_t		 reconnect_at, reconnect_backoff;

	/* the claim (see above for the flags) */
	bool		 wake;
	bool		 more_work;
	bool		 lanes_dry;
	bool		 progress_since_claim;
	bool		 idle_seen;
	bool		 want_full;	/* the next claim is made without claim cursors ... */
	bool		 claim_full;	/* ... as the one out (or the last) was */
	bool		 claim_out;	/* a claim is asked for: the handlers are served meanwhile ... */
	unsigned	 claim_gen;	/* ... for this owner generation (that of everything owed:
					 * a new one comes only after db_down forgot them) ... */
	int		 claim_asked;	/* ... asking for this many ... */
	int		 last_claimed;	/* the last claim brought this many ... */
	int64_t		 last_claim_at;	/* ... then (claim_paced) ... */
	long		 applied_since_claim;	/* ... and results were applied since it went out */
	bool		 claim_searched;	/* ... and looking for more lanes or not */
	int		 owed;		/* deliveries claims took that the store still reads */
	int64_t		*live;		/* the ids still in flight, for the claim (live_ids) ... */
	int		*live_lanes;	/* ... and their lanes ... */
	size_t		 live_cap;	/* ... room for this many */

	/* the completion out */
	bool		 completing;	/* a completion is asked for (flush_results) ... */
	size_t		 ncompleting;	/* ... of the first this many queued results ... */
	struct rb_result *completing_v;	/* ... as these results ... */
	char		**completing_json;	/* ... with these $1 of --sql (or NULL) */

	/* timers (monotonic ms; 0: off) */
	int64_t		 next_poll, next_extend, next_stats;
	/* when a lane another holder leases frees (rb_store_event.retry_ms; 0:
	 * none known): a claim then looks for lanes */
	int64_t		 retry_at;
	/* --drain: looks for a cut lease's lanes since a claim last found
	 * work (bounded by DRAIN_CUT_LOOKS) */
	int		 drain_looks;

	/* stopping */
	int		 stop_level;	/* 0 running, 1 stopping (grace), 2 aborted */
	int64_t		 grace_deadline;
	int		 fatal_code;	/* an error we stop for: the exit code */

	struct {
		long	claimed, completed, rescheduled, buried, released, lost;
		long	by_handler;	/* of completed: by the handler (relaybus_complete) */
		long	completed_at_last_stats;
		long	failed_attempts;	/* failed attempts said (failures.c) */
	} stats;
	struct {			/* failures.c: the warnings' window */
		int64_t	since;		/* when it opened (rb_mono_ms); 0: none open */
		int	shown;		/* warnings said in it */
		long	more;		/* ... and not said */
	} warns;
	struct dispatch_metrics metrics;	/* metrics.c */
};

/* The earlier of two deadlines, 0 being none. */
static inline int64_t
min_deadline(int64_t a, int64_t b)
{
	return a == 0 ? b : (b == 0 || a < b ? a : b);
}

/* loop.c: the engine as rb-dispatch.c sees it */
void	setup_signals(void);
/* a stopping signal came (before dispatcher_run: while it connects) */
bool	dispatch_stopping(void);
struct dispatcher *dispatcher_new(const struct dispatch_opts *);
int	dispatcher_run(struct dispatcher *, struct rb_store *);
void	dispatcher_free(struct dispatcher *);
void	reap(struct dispatcher *);
/* Take everything the store has to report (its events, in order). */
void	store_drain(struct dispatcher *);

/* claims.c */
int64_t	claim_due(struct dispatcher *, int64_t now);
void	maybe_claim(struct dispatcher *, int64_t now);
/* RB_STORE_CLAIMED and RB_STORE_DELIVERED: the deliveries come */
void	on_claimed(struct dispatcher *, const struct rb_store_event *);
void	on_delivered(struct dispatcher *, const struct rb_store_event *);
/* owed deliveries that will not come (their owner's count goes down) */
void	owed_dropped(struct dispatcher *, int n);
/* A chain's turn (from results.c: the one before succeeded, or with --sql
 * its completion committed): start its next delivery (go), or hand them
 * all back.  Starting may finish the new slot at once (finish_slot: a
 * handler that cannot start), but never as a success, so that does not
 * come back here: the recursion is one deep. */
void	chain_next(struct dispatcher *, struct chain *followers, unsigned gen, bool go);
/* Whether a chain's next delivery starts as soon as the one before it
 * succeeded on its first attempt (else: once its completion committed). */
static inline bool
chain_early(const struct dispatcher *dp)
{
	return dp->opt.complete.sql == NULL && !dp->opt.strict_order;
}
void	chain_free(struct chain *);

/* results.c */
void	queue_result(struct dispatcher *, struct rb_dl *d, struct verdict v, unsigned gen,
	    struct chain *followers);
struct slot *slot_take(struct dispatcher *, struct rb_dl *d, unsigned gen, struct chain *followers);
void	finish_slot(struct dispatcher *, struct slot *s, struct verdict v);
bool	flush_results(struct dispatcher *);
/* RB_STORE_COMPLETED: the outcomes */
void	on_completed(struct dispatcher *, const struct rb_store_event *);
/* The completion out will not come back (failed, or forgotten): its
 * results stay queued. */
void	completion_forget(struct dispatcher *);

/* failures.c: a failed attempt's warning (rate-limited); the window's
 * close (tick, from the loop; flush, at exit); when the loop must wake
 * for it (0: no need) */
void	failure_warn(struct dispatcher *, const char *event_id, int lane, int attempt,
	    const char *error);
void	failures_tick(struct dispatcher *, int64_t now);
void	failures_flush(struct dispatcher *);
int64_t	failures_due(const struct dispatcher *);

/* leases.c */
void	new_owner(struct dispatcher *);
void	owner_done(struct dispatcher *, unsigned gen);
void	db_error(struct dispatcher *, const struct rb_error *err, const char *what);
void	try_reconnect(struct dispatcher *, int64_t now);
void	extend_leases(struct dispatcher *, int64_t now);
void	retire_owners(struct dispatcher *);
void	hand_back_lanes(struct dispatcher *);
int	drain_leftovers(struct dispatcher *);

#endif
