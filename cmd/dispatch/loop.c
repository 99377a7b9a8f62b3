/* SPDX-License-Identifier: MIT */
/*
 * loop.c: rb-dispatch's one thread and one poll(2) loop.  Each turn reaps
 * children, moves the stop level on, fails what timed out, completes what
 * is queued, renews leases, claims, and then waits for the first of: a
 * signal (self-pipe), the store's descriptors (rb_store_pollfds), the
 * handler kind's fds, or the next deadline; after it, what the store has
 * to report (store_drain).  Also the dispatcher's birth and death
 * (dispatcher_new, _run, _free).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch.h"
#include "notify.h"

/* Signals are the process's, not a dispatcher's: the handler sets these. */
static int		 sigpipe_fd[2] = { -1, -1 };
static volatile sig_atomic_t got_stop, got_child;

/* What a pollfd is for: the loop's own are negative, the handler kind's its own numbers. */
enum { REF_SIGNALS = -1, REF_STORE = -2 };

/* (the store's descriptors: rb_store_pollfds takes at most this many) */
#define STORE_FDS	4

static volatile sig_atomic_t stop_sig;	/* the first stop signal, for the log */

/*
 * Every signal whose default action ends the process, except those of a
 * fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS: those
 * are bugs) and SIGPIPE (ignored, rb_cli_init): a supervisor may send any
 * of them, and dying of one would leave the handlers running in their own
 * process groups and the leases held.  SIGQUIT is the fast path (like a
 * second signal: no grace); the others start the graceful stop.
 * rb-dispatch(1) SIGNALS.
 */
static const int stop_signals[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
	SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGIO,
#ifdef SIGPWR
	SIGPWR,
#endif
#ifdef SIGSTKFLT
	SIGSTKFLT,
#endif
};

static void
on_signal(int sig)
{
	int e = errno;
	char c = (char)sig;

	if (sig == SIGCHLD)
		got_child = 1;
	else {
		if (stop_sig == 0)
			stop_sig = sig;
		/* (SIGQUIT: at once, as a second signal does) */
		got_stop += sig == SIGQUIT && got_stop == 0 ? 2 : 1;
	}
	(void)!write(sigpipe_fd[1], &c, 1);
	errno = e;
}

bool
dispatch_stopping(void)
{
	return got_stop > 0;
}

void
setup_signals(void)
{
	struct sigaction sa;

	if (pipe2(sigpipe_fd, O_CLOEXEC | O_NONBLOCK) < 0)
		rb_die_errno(RB_EXIT_OSERR, "pipe");
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, NULL);
	for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
		sigaction(stop_signals[i], &sa, NULL);
#ifdef SIGRTMIN
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		sigaction(sig, &sa, NULL);
#endif
}

void
reap(struct dispatcher *dp)
{
	int status;
	pid_t pid;

	got_child = 0;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		if (!guard_reaped(pid) && dp->opt.kind->exited != NULL)
			dp->opt.kind->exited(dp, pid, status);
}

static void
check_timeouts(struct dispatcher *dp, int64_t now)
{
	/* (every slot looked at only once the earliest deadline may have
	 * come: the loop runs once per wake-up, and slots are thousands) */
	if (dp->next_deadline == 0 || now < dp->next_deadline)
		return;
	dp->next_deadline = 0;
	for (int i = 0; i < dp->opt.concurrency; i++) {
		struct slot *s = &dp->slots[i];

		if (!s->used || s->deadline == 0)
			continue;
		if (now < s->deadline) {
			dp->next_deadline = min_deadline(dp->next_deadline, s->deadline);
			continue;
		}
		s->deadline = 0;
		dp->opt.kind->cancel(dp, s, CANCEL_TIMEOUT);
	}
}

/* Stop now: release what runs (no attempt charged). */
static void
abort_all(struct dispatcher *dp)
{
	dp->stop_level = 2;
	for (int i = 0; i < dp->opt.concurrency; i++) {
		struct slot *s = &dp->slots[i];

		if (!s->used)
			continue;
		dp->opt.kind->cancel(dp, s, CANCEL_ABORT);
	}
}

/* Every --stats-every and at the end: the status line (unless only the
 * metrics asked for the period), the metrics file and STATUS= (metrics.c). */
static void
stats_line(struct dispatcher *dp, int64_t now, int64_t *last)
{
	double secs = (double)(now - *last) / 1000.0;
	double per_sec = secs > 0 ? (double)(dp->stats.completed - dp->stats.completed_at_last_stats) / secs : 0.0;

	metrics_tick(dp, per_sec);
	if (!dp->opt.stats_quiet)
		rb_notice("claimed %ld, completed %ld, failed %ld (dead %ld), released %ld, lost %ld, "
		    "in flight %d, %.1f/s", dp->stats.claimed, dp->stats.completed,
		    dp->stats.rescheduled + dp->stats.buried, dp->stats.buried,
		    dp->stats.released, dp->stats.lost, dp->running + (int)dp->nqueue + dp->nwait + dp->owed,
		    per_sec);
	dp->stats.completed_at_last_stats = dp->stats.completed;
	*last = now;
}

/* What the store says it did, in order. */
static void
store_event(struct dispatcher *dp, const struct rb_store_event *ev)
{
	const char *what = "notification";

	switch (ev->kind) {
	case RB_STORE_CLAIMED:
		on_claimed(dp, ev);
		return;
	case RB_STORE_DELIVERED:
		on_delivered(dp, ev);
		return;
	case RB_STORE_COMPLETED:
		on_completed(dp, ev);
		return;
	case RB_STORE_WOKEN:
		rb_debug("woken by a notification");
		dp->wake = true;
		return;
	case RB_STORE_FAILED:
		break;
	}
	/* what was asked for is not coming */
	switch (ev->failed) {
	case RB_STORE_CLAIMED:
		dp->claim_out = false;
		what = "claim";
		break;
	case RB_STORE_DELIVERED:
		owed_dropped(dp, ev->dropped);
		what = "fetch";
		break;
	case RB_STORE_COMPLETED:
		completion_forget(dp);	/* its results stay queued */
		what = "complete";
		break;
	default:
		break;
	}
	db_error(dp, &ev->err, what);
}

void
store_drain(struct dispatcher *dp)
{
	struct rb_store_event ev;

	while (!dp->db_down && rb_store_service(dp->store, &ev) > 0)
		store_event(dp, &ev);
}

/* One poll: compute the next deadline, wait, serve the ready fds, and take
 * what the store has to report. */
static void
wait_and_serve(struct dispatcher *dp, int64_t now, struct pollfd *pfd, int *ref)
{
	int64_t until = now + 1000;
	int n = 0, timeout, pr, k;

	pfd[n].fd = sigpipe_fd[0];
	pfd[n].events = POLLIN;
	ref[n++] = REF_SIGNALS;
	if (dp->db_down)
		until = min_deadline(until, dp->reconnect_at);
	else {
		/* (while something is asked for, what the store says wakes us) */
		if (dp->nqueue > 0 && !dp->completing && rb_store_complete_ready(dp->store))
			until = min_deadline(until, dp->queue_since + dp->opt.window_ms);
		until = min_deadline(until, claim_due(dp, now));
		if (dp->next_extend > 0)
			until = min_deadline(until, dp->next_extend);
	}
	if (dp->stop_level == 1)
		until = min_deadline(until, dp->grace_deadline);
	if (dp->next_stats > 0)
		until = min_deadline(until, dp->next_stats);
	until = min_deadline(until, dp->next_deadline);
	until = min_deadline(until, notify_watchdog(now));
	until = min_deadline(until, failures_due(dp));
	n += dp->opt.kind->pollfds != NULL ? dp->opt.kind->pollfds(dp, pfd + n, ref + n, &until) : 0;
	timeout = until <= now ? 0 : (int)(until - now);
	if (got_child || got_stop > dp->stop_level)
		timeout = 0;
	if (!dp->db_down) {
		int m = rb_store_pollfds(dp->store, pfd + n, STORE_FDS, &timeout);

		for (k = 0; k < m; k++)
			ref[n + k] = REF_STORE;
		n += m;
	}
	pr = poll(pfd, (nfds_t)n, timeout);
	if (pr < 0 && errno != EINTR)
		rb_die_errno(RB_EXIT_OSERR, "poll");
	for (k = 0; pr > 0 && k < n; k++) {
		if (pfd[k].revents == 0)
			continue;
		if (ref[k] == REF_SIGNALS) {
			char buf[64];

			while (read(sigpipe_fd[0], buf, sizeof buf) > 0)
				;
		} else if (ref[k] >= 0)
			dp->opt.kind->ready(dp, ref[k]);
	}
	/* (whatever woke the poll: an answer libpq read along with another
	 * is in no socket any more) */
	store_drain(dp);
}

static int
run(struct dispatcher *dp)
{
	size_t npfd = (size_t)dp->opt.concurrency + 2 * (size_t)dp->opt.procs + 1 + STORE_FDS;
	struct pollfd *pfd = xcalloc(npfd, sizeof *pfd);
	int *ref = xcalloc(npfd, sizeof *ref);
	int64_t last_stats = rb_mono_ms(), started = last_stats;
	int exit_code = RB_EXIT_OK;
	bool drained = false;
	struct rb_error err = { 0 };

	if (rb_store_listen(dp->store, dp->opt.handler, &err) < 0)
		db_error(dp, &err, "listen");
	notify_journal();
	notify_ready();
	notify_status(metrics_summary(dp, 0.0));
	if (dp->opt.stats_ms > 0)
		dp->next_stats = last_stats + dp->opt.stats_ms;
	if (dp->opt.kind->begin != NULL)
		dp->opt.kind->begin(dp);
	for (;;) {
		int64_t now = rb_mono_ms();

		if (got_child)
			reap(dp);
		if (got_stop > 0 && dp->stop_level == 0) {
			if (got_stop > 1)
				rb_info("stopping on signal %d (%s): at once", (int)stop_sig,
				    strsignal((int)stop_sig));
			else
				rb_info("stopping on signal %d (%s): waiting up to %" PRId64 "ms for %d "
				    "running handlers", (int)stop_sig, strsignal((int)stop_sig),
				    dp->opt.grace_ms, dp->running);
			dp->stop_level = 1;
			dp->grace_deadline = now + dp->opt.grace_ms;
			notify_stopping();
		}
		if (dp->stop_level == 1 && (got_stop > 1 || now >= dp->grace_deadline || dp->fatal_code != 0)) {
			if (dp->running > 0)
				rb_info("releasing %d deliveries still running", dp->running);
			abort_all(dp);
		}
		if (dp->fatal_code != 0 && dp->stop_level == 0) {
			dp->stop_level = 1;
			abort_all(dp);
		}
		check_timeouts(dp, now);
		failures_tick(dp, now);
		if (dp->stop_level == 0 && dp->opt.kind->tick != NULL)
			dp->opt.kind->tick(dp, now);
		if (dp->db_down && now >= dp->reconnect_at)
			try_reconnect(dp, now);
		if (!dp->db_down && dp->nqueue > 0 && (now >= dp->queue_since + dp->opt.window_ms ||
		    dp->stop_level > 0 || dp->nqueue >= 1000 || dp->opt.kind->at_once))
			flush_results(dp);
		if (!dp->db_down && dp->next_extend > 0 && now >= dp->next_extend)
			extend_leases(dp, now);
		if (!dp->db_down)
			retire_owners(dp);
		maybe_claim(dp, now);
		if (!dp->db_down && dp->nqueue > 0 && dp->opt.kind->at_once)
			flush_results(dp);	/* --sql: the results are ready at once */
		if (dp->next_stats > 0 && now >= dp->next_stats) {
			stats_line(dp, now, &last_stats);
			dp->next_stats = now + dp->opt.stats_ms;
		}
		if (dp->running == 0 && dp->nqueue == 0 && !dp->claim_out && dp->owed == 0) {
			if (dp->stop_level > 0)
				break;
			if (dp->opt.drain && dp->idle_seen && !dp->db_down && dp->fatal_code == 0 &&
			    dp->retry_at > now && dp->drain_looks < DRAIN_CUT_LOOKS) {
				/* a dead holder's lanes (its liveness lock free): a
				 * claim cut their lease, which ends at retry_at, within
				 * the grace; they are then taken over, by a claim that
				 * looks at every lane.  (A live holder's lease that
				 * keeps ending that soon is renewed: its lanes stay
				 * its own, and the looks that find nothing end it.) */
				rb_debug("drain: a cut lease ends in %lld ms: looking again then",
				    (long long)(dp->retry_at - now));
				dp->drain_looks++;
				dp->idle_seen = false;
				dp->want_full = true;
			} else if (dp->opt.drain && dp->idle_seen && !dp->db_down && dp->fatal_code == 0) {
				/* never exit 0 with a claim of ours unfinished */
				int left = drain_leftovers(dp);

				if (left == 0) {
					rb_info("drained: nothing due, nothing in flight");
					drained = true;
					break;
				}
				if (left > 0) {
					rb_warn("drain: %d lanes held deliveries claimed here that never ran: "
					    "handed back (no attempt charged), draining on", left);
					dp->idle_seen = false;
					dp->wake = dp->more_work = true;
				}
			}
		}
		/* stopped, handlers done, database gone: give up on what is queued */
		if (dp->stop_level == 2 && dp->running == 0 && dp->db_down && got_stop > 1) {
			rb_error("stopping with %zu results not applied: they run again when the lease ends",
			    dp->nqueue);
			exit_code = RB_EXIT_TEMPFAIL;
			break;
		}
		if (dp->fatal_code != 0 && dp->running == 0)
			break;
		wait_and_serve(dp, rb_mono_ms(), pfd, ref);
	}
	if (dp->stop_level == 0)
		dp->stop_level = 1;		/* no co-process restarts from here on */
	if (dp->opt.kind->stop != NULL)
		dp->opt.kind->stop(dp);
	if (!dp->db_down)
		hand_back_lanes(dp);
	if (dp->opt.stats_ms > 0)
		stats_line(dp, rb_mono_ms(), &last_stats);
	failures_flush(dp);
	if (dp->opt.drain) {
		/* what a --drain run did, at the default verbosity (-q hides it) */
		int64_t ms = rb_mono_ms() - started;
		const struct rb_log_field f[] = {
			{ .key = "handler", .str = dp->opt.handler },
			{ .key = "completed", .num = dp->stats.completed },
			{ .key = "rescheduled", .num = dp->stats.rescheduled },
			{ .key = "dead", .num = dp->stats.buried },
			{ .key = "duration_ms", .num = ms },
		};

		rb_log_fields(RB_LOG_NOTICE, f, sizeof f / sizeof f[0], drained ? "drained" : "drain stopped",
		    "%s: %ld completed, %ld failed and rescheduled, %ld dead, in %.1f s",
		    drained ? "drained" : "drain stopped", dp->stats.completed, dp->stats.rescheduled,
		    dp->stats.buried, (double)ms / 1000.0);
	}
	rb_info("%ld claimed, %ld completed, %ld failed and rescheduled, %ld dead, %ld released, %ld lost, "
	    "%ld completed by the handler", dp->stats.claimed, dp->stats.completed, dp->stats.rescheduled,
	    dp->stats.buried, dp->stats.released, dp->stats.lost, dp->stats.by_handler);
	free(pfd);
	free(ref);
	if (dp->fatal_code != 0)
		return dp->fatal_code;
	if (exit_code == RB_EXIT_OK && dp->opt.fail_exit && dp->opt.drain &&
	    (dp->stats.rescheduled > 0 || dp->stats.buried > 0 || dp->stats.failed_attempts > 0))
		exit_code = RB_EXIT_FAILED;
	return exit_code;
}

/* A dispatcher for these options (copied): its slots and owner name, no store yet. */
struct dispatcher *
dispatcher_new(const struct dispatch_opts *o)
{
	struct dispatcher *dp = xcalloc(1, sizeof *dp);

	dp->opt = *o;
	dp->wake = true;
	dp->chain_now = o->chain > 0 ? o->chain : 1;
	dp->reconnect_backoff = 100;
	dp->metrics.started_ms = rb_wall_ms();
	dp->owner_base = o->owner != NULL ? xstrdup(o->owner) : rb_cli_owner();
	dp->slots = xcalloc((size_t)o->concurrency, sizeof *dp->slots);
	dp->free_slot = xcalloc((size_t)o->concurrency, sizeof *dp->free_slot);
	for (int i = o->concurrency; i-- > 0;)
		dp->free_slot[dp->nfree_slot++] = i;
	return dp;
}

/* Dispatch through store (borrowed) until drained, stopped or failed; the exit code. */
int
dispatcher_run(struct dispatcher *dp, struct rb_store *store)
{
	dp->store = store;
	new_owner(dp);
	rb_info("dispatching %s as %s (concurrency %d, batch %d, chain %d)", dp->opt.handler,
	    dp->owner_base, dp->opt.concurrency, dp->opt.batch, dp->opt.chain);
	return run(dp);
}

void
dispatcher_free(struct dispatcher *dp)
{
	for (int i = 0; i < NOWNERS; i++)
		free(dp->owners[i].name);
	completion_forget(dp);
	for (size_t i = 0; i < dp->nqueue; i++) {
		rb_dl_free(dp->queue[i].d);
		free(dp->queue[i].error);
		chain_free(dp->queue[i].followers);
	}
	free(dp->queue);
	if (dp->opt.kind->fini != NULL)
		dp->opt.kind->fini(dp);
	free(dp->slots);
	free(dp->free_slot);
	free(dp->live);
	free(dp->live_lanes);
	free(dp->owner_base);
	free(dp);
}
