/* SPDX-License-Identifier: MIT */
/*
 * rb-claim: lease lanes of one handler and print its due deliveries as
 * JSON lines, each with its lease token (lane:epoch:claims).  A claim
 * writes lane rows only.  The deliveries stay in flight until rb-complete
 * (or rb-dispatch) completes, reschedules or releases them, or until the
 * lease expires and another claimer takes the lane over.
 *
 * Exit 1 means the documented "nothing was due" (after --wait, if given).
 * If stdout breaks after the claim, the claimed deliveries are released
 * (no attempt charged) and the lanes handed back.  Into a pipe, a line goes
 * once the reader has taken the one before it out of the pipe: a reader
 * that stops early (head -1) leaves the rest unread, and they are released
 * too, not left in flight to be charged when the lease ends.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_env.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-claim --handler H [--batch N] [--lease DUR] [--owner NAME] [--wait DUR]\n"
"                [--poll DUR] [--max-attempts N] [--db URL] [--schema NAME]\n"
"       rb-claim --handler H --follow [--max-in-flight N] [--drain] [--chain N] [--batch N]\n"
"                [--lease DUR] [--owner NAME] [--poll DUR] [--max-attempts N] [--db URL]\n"
"                [--schema NAME]\n"
"\n"
"Lease lanes of handler H and print its due deliveries as JSON lines.\n"
"\n"
"  -H, --handler H        the handler whose deliveries to claim (required)\n"
"  -b, --batch N          at most N deliveries (default 100)\n"
"  -l, --lease DUR        lease duration (default 30s): complete before it ends\n"
"      --owner NAME       lease owner (default host:pid:random)\n"
"  -w, --wait DUR         when nothing is due, wait up to DUR for work (LISTEN/NOTIFY)\n"
"      --poll DUR         while waiting, also look every DUR (default 1s)\n"
"      --max-attempts N   a takeover buries a delivery whose attempts reach N (default 10)\n"
"  -f, --follow           keep claiming as work arrives (LISTEN/NOTIFY, and every --poll),\n"
"                         write lines as stdout takes them, renew the leases of what is\n"
"                         downstream; SIGTERM/SIGINT or a reader that left: release what\n"
"                         was not written, and exit\n"
"      --max-in-flight N  --follow: at most N deliveries claimed and not yet completed\n"
"                         (default 1000)\n"
"      --drain            --follow: exit once nothing is due and nothing written is still\n"
"                         in flight\n"
"      --chain N          --follow: up to N deliveries of one key at once, in sequence\n"
"                         order (default 1: only each key's first).  The handler must\n"
"                         handle a key's lines in order and, once one fails, answer the\n"
"                         later ones of its key with \"release\":true (rb-claim(1))\n"
RB_COMMON_CONN_HELP
"      --schema NAME      relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
RB_COMMON_LOG_HELP
"\n"
"Exit status: 0 deliveries printed (--follow: stopped by SIGTERM/SIGINT, or drained),\n"
"1 nothing was due, 64 usage, 69 database unavailable, 74 stdout failed or its reader\n"
"left before taking them all (the rest released), 75 temporary failure, connection lost or\n"
"interrupted, 76/79 schema newer than this relaybus / needs an upgrade (rb-setup), 78 bad\n"
"URL or schema not set up.\n";

enum { OPT_OWNER = RB_OPT_FIRST_PROGRAM, OPT_POLL, OPT_MAX_ATTEMPTS, OPT_MAX_IN_FLIGHT, OPT_DRAIN,
	OPT_CHAIN };

static struct options {
	struct rb_common common;
	const char	*handler;
	int		 batch;
	int64_t		 lease_ms;
	const char	*owner;
	int64_t		 wait_ms;
	int64_t		 poll_ms;
	int		 max_attempts;
	bool		 follow;
	int		 max_in_flight;	/* 0: not given */
	bool		 drain;
	int		 chain;		/* 0: not given */
} opt = { .batch = RB_DEFAULT_BATCH, .lease_ms = RB_DEFAULT_LEASE_MS, .poll_ms = 1000,
	  .max_attempts = RB_DEFAULT_MAX_ATTEMPTS };

#define FOLLOW_MAX_IN_FLIGHT	1000

static volatile sig_atomic_t stop;

static void
on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "handler", required_argument, NULL, 'H' },
		{ "batch", required_argument, NULL, 'b' },
		{ "lease", required_argument, NULL, 'l' },
		{ "owner", required_argument, NULL, OPT_OWNER },
		{ "wait", required_argument, NULL, 'w' },
		{ "poll", required_argument, NULL, OPT_POLL },
		{ "max-attempts", required_argument, NULL, OPT_MAX_ATTEMPTS },
		{ "follow", no_argument, NULL, 'f' },
		{ "max-in-flight", required_argument, NULL, OPT_MAX_IN_FLIGHT },
		{ "drain", no_argument, NULL, OPT_DRAIN },
		{ "chain", required_argument, NULL, OPT_CHAIN },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "H:b:l:w:f", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'H':
			opt.handler = rb_cli_handler(usage_str, optarg);
			break;
		case 'b':
			opt.batch = rb_cli_int(usage_str, "--batch", optarg, 1, 10000);
			break;
		case 'l':
			opt.lease_ms = rb_cli_lease(usage_str, optarg, 100);
			break;
		case OPT_OWNER:
			opt.owner = rb_cli_owner_arg(usage_str, optarg, 200);
			break;
		case 'w':
			opt.wait_ms = rb_cli_duration(usage_str, "--wait", optarg);
			break;
		case OPT_POLL:
			opt.poll_ms = rb_cli_duration(usage_str, "--poll", optarg);
			if (opt.poll_ms < 10)
				rb_cli_usage_error(usage_str, "--poll: at least 10ms");
			break;
		case OPT_MAX_ATTEMPTS:
			opt.max_attempts = rb_cli_int(usage_str, "--max-attempts", optarg, 1, 1000000);
			break;
		case 'f':
			opt.follow = true;
			break;
		case OPT_MAX_IN_FLIGHT:
			opt.max_in_flight = rb_cli_int(usage_str, "--max-in-flight", optarg, 1, 1000000);
			break;
		case OPT_DRAIN:
			opt.drain = true;
			break;
		case OPT_CHAIN:
			opt.chain = rb_cli_int(usage_str, "--chain", optarg, 1, 1000);
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
	if (opt.handler == NULL)
		rb_cli_usage_error(usage_str, "--handler is required");
	if (!opt.follow && opt.max_in_flight > 0)
		rb_cli_usage_error(usage_str, "--max-in-flight: only with --follow");
	if (!opt.follow && opt.drain)
		rb_cli_usage_error(usage_str, "--drain: only with --follow");
	if (!opt.follow && opt.chain > 0)
		rb_cli_usage_error(usage_str, "--chain: only with --follow");
	if (opt.follow && opt.wait_ms > 0)
		rb_cli_usage_error(usage_str, "--wait: not with --follow (it waits for work anyway)");
	if (opt.max_in_flight == 0)
		opt.max_in_flight = FOLLOW_MAX_IN_FLIGHT;
}

/*
 * How lines are known to be handed on when stdout is a pipe: 0 not a pipe
 * (a line written is handed on); 1 the pipe was cut down to one page
 * (F_SETPIPE_SZ), so that it is writable (POLLOUT) only once it is empty;
 * 2 FIONREAD says how much is still unread, looked at every few ms.
 */
static int pipe_mode;

static void
pipe_setup(void)
{
	struct stat st;

	if (fstat(STDOUT_FILENO, &st) < 0 || !S_ISFIFO(st.st_mode))
		return;
#ifdef F_SETPIPE_SZ
	if (fcntl(STDOUT_FILENO, F_SETPIPE_SZ, 4096) >= 0) {
		pipe_mode = 1;
		return;
	}
#endif
#ifdef FIONREAD
	pipe_mode = 2;
#endif
}

/*
 * Wait until the reader has taken everything written to the pipe so far:
 * 1 it has (or this cannot be told), 0 it went away without, -1 a signal
 * came (SIGINT, SIGTERM) while it had not.
 */
static int
wait_handed_on(void)
{
	long nap_ms = 1;

	for (;;) {
		struct pollfd p = { .fd = STDOUT_FILENO, .events = POLLOUT };
		int rc, unread = 0;

		if (pipe_mode == 1) {
			rc = poll(&p, 1, -1);
			if (rc < 0 && errno == EINTR) {
				if (stop)
					return -1;
				continue;
			}
			if (rc < 0 || (p.revents & POLLOUT) != 0)
				return 1;
			if ((p.revents & (POLLERR | POLLHUP)) != 0)
				return 0;
			if ((p.revents & POLLNVAL) != 0)
				return 1;
			continue;
		}
#ifdef FIONREAD
		if (ioctl(STDOUT_FILENO, FIONREAD, &unread) < 0)
			return 1;
#endif
		if (unread == 0)
			return 1;
		if (poll(&p, 1, 0) > 0 && (p.revents & (POLLERR | POLLHUP)) != 0)
			return 0;
		struct timespec ts = { 0, nap_ms * 1000000L };
		if (nanosleep(&ts, NULL) < 0 && errno == EINTR && stop)
			return -1;
		if (nap_ms < 20)
			nap_ms *= 2;
	}
}

/* Give back what we claimed but could not hand on: v[from .. n-1]. */
static void
give_back(struct rb_store *store, struct rb_dl **v, size_t from, size_t n, const char *owner)
{
	struct rb_complete_opts co = { .max_attempts = opt.max_attempts,
	    .backoff = { .base_ms = 1000, .max_ms = 1000, .factor = 1 } };
	struct rb_error err = { 0 };
	struct rb_result *rel = xcalloc(n - from, sizeof *rel);

	for (size_t i = from; i < n; i++)
		rel[i - from] = rb_result_of(v[i], RB_VERDICT_RELEASE);
	if (rb_store_complete(store, &co, rel, n - from, &err) < 0 ||
	    rb_store_relinquish(store, opt.handler, owner, &err) < 0)
		rb_warn("could not release the claimed deliveries (they return when the lease ends): %s",
		    err.msg);
	free(rel);
}

static void
free_claimed(struct rb_dl **v, int n)
{
	for (int i = 0; i < n; i++)
		rb_dl_free(v[i]);
	free(v);
}

/* ---- --follow: the streaming form ------------------------------------------ */

/*
 * A long-running claimer.  It claims as work comes (LISTEN wake-ups, and a
 * claim every --poll; at once again after a full batch), writes lines as
 * stdout takes them (a pipe in non-blocking mode: a full pipe is the
 * back-pressure), keeps at most --max-in-flight deliveries claimed and not
 * yet completed (a line written is counted off once the store no longer
 * has its delivery in flight under its lease, rb_store_in_flight: completed,
 * failed or released by rb-complete), and renews its lanes' leases every
 * third of --lease while any delivery is out.  At a stop (SIGTERM, SIGINT),
 * when the reader left (EPIPE), or at --drain's end, it releases what it
 * had not written (no attempt charged) and hands back its idle lanes.
 *
 * While it runs, its lanes are held as rb-dispatch holds them, under the
 * liveness lock (rb_claim_opts.liveness): a kill -9 has them taken over
 * about 1.5 s after, not when the lease ends.  The lines written are
 * completed by another process, rb-complete, maybe after rb-claim exited:
 * so before any exit (a stop, the reader gone, --drain's end, a failure,
 * after a reconnect when the connection was lost) their lanes go back to
 * the plain lease, renewed from then (f_plain), and stay leased until
 * their lines are completed or the lease ends.
 */
struct follow {
	struct rb_store		*store;
	const char		*owner;
	struct rb_dl		**q;		/* claimed, not written in full: q[qh .. qn - 1] */
	size_t			 qh, qn, qcap;
	size_t			 woff;		/* bytes of q[qh] written */
	struct rb_dl		**out;		/* written in full, maybe still in flight */
	size_t			 nout, capout;
	size_t			 keyed;		/* of out, those with a key (approximately: see f_check) */
	bool			 pipe;		/* stdout is a pipe, made O_NONBLOCK */
	int			 fl;		/* stdout's flags before */
	bool			 woken, more;	/* a wake-up came; the last claim was full */
	bool			 dry;		/* the last claim found nothing */
	bool			 held_back;	/* ... while deliveries were out */
	int64_t			 free_in;	/* the last claim said another holder's cut lease ends in (ms; 0 none) */
	int64_t			 retry_at;	/* the soonest such end said, not yet passed (0 none) */
	int64_t			 next_claim, next_extend, next_check, next_key_claim;
	int64_t			 check_ms, key_ms;	/* their intervals now (backing off) */
};

/* What is out is counted every FOLLOW_CHECK_MS while that bounds the claims
 * (or, with --drain, until it is all done), backing off to FOLLOW_IDLE_MS
 * while nothing comes back (a slow handler costs a few queries a second) */
#define FOLLOW_CHECK_MS		5
#define FOLLOW_IDLE_MS		200
#define FOLLOW_FINISH_MS	2000	/* at a stop, how long a half-written line may take to finish */
/* While deliveries of a key are out, claim every FOLLOW_KEY_MS (backing off
 * to FOLLOW_IDLE_MS while such claims find nothing): the next delivery of a
 * key becomes due when the one before it is completed, and a completion
 * (by rb-complete) wakes no one */
#define FOLLOW_KEY_MS		10

static int64_t
earliest(int64_t a, int64_t b)
{
	return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

static int64_t
backoff(int64_t ms, bool found, int64_t base)
{
	return found ? base : ms * 2 > FOLLOW_IDLE_MS ? FOLLOW_IDLE_MS : ms * 2;
}

static size_t
f_queued(const struct follow *f)
{
	return f->qn - f->qh;
}

/* Room for a claim: the cap less what is claimed and not known completed. */
static int
f_room(const struct follow *f)
{
	size_t used = f_queued(f) + f->nout;

	return used >= (size_t)opt.max_in_flight ? 0 : opt.max_in_flight - (int)used;
}

/* Whether a claim is worth making: room for half a batch (or the cap). */
static bool
f_claim_room(const struct follow *f)
{
	int full = opt.batch < opt.max_in_flight ? opt.batch : opt.max_in_flight;

	return f_room(f) >= (full + 1) / 2;
}

/*
 * --chain: a key's followers go downstream only while every one before
 * them in the claim is on its first attempt (the rule by which a takeover
 * charges them, rb_claim_opts.chain_early); the rest are released at once
 * (no attempt charged) and come again behind the ones before them.
 * Returns how many of v are kept (moved to its front, in order).
 */
static int
f_trim_chains(struct follow *f, struct rb_dl **v, int n)
{
	bool *ok = xcalloc((size_t)n + 1, sizeof *ok);
	struct rb_result *rel = xcalloc((size_t)n + 1, sizeof *rel);
	struct rb_dl **gone = xcalloc((size_t)n + 1, sizeof *gone);
	int k = 0, nrel = 0;

	for (int i = 0; i < n; i++) {
		int j = i;

		ok[i] = true;
		/* (a claim returns each lane's together, a key's in sequence
		 * order: the one before it is in the run of its lane) */
		while (v[i]->key != NULL && j-- > 0 && v[j]->lease.lane == v[i]->lease.lane)
			if (v[j]->key != NULL && strcmp(v[j]->key, v[i]->key) == 0 &&
			    strcmp(v[j]->handler, v[i]->handler) == 0) {
				ok[i] = ok[j] && v[j]->attempt == 1;
				break;
			}
	}
	for (int i = 0; i < n; i++) {
		if (ok[i])
			v[k++] = v[i];
		else {
			rel[nrel] = rb_result_of(v[i], RB_VERDICT_RELEASE);
			gone[nrel++] = v[i];
		}
	}
	if (nrel > 0) {
		struct rb_complete_opts co = { .max_attempts = opt.max_attempts,
		    .backoff = { .base_ms = 1000, .max_ms = 1000, .factor = 1 } };
		struct rb_error err = { 0 };

		if (rb_store_complete(f->store, &co, rel, (size_t)nrel, &err) < 0)
			rb_warn("could not release %d deliveries behind a retry (they return when the lease "
			    "ends): %s", nrel, err.msg);
		else
			rb_debug("released %d deliveries behind a retry of their key", nrel);
	}
	for (int i = 0; i < nrel; i++)
		rb_dl_free(gone[i]);
	free(ok);
	free(rel);
	free(gone);
	return k;
}

static int
f_claim(struct follow *f, struct rb_error *err)
{
	/* (a long-lived claimer: claim cursors, relaybus(7)) */
	struct rb_claim_opts co = { .handler = opt.handler, .owner = f->owner, .lease_ms = opt.lease_ms,
	    .max_attempts = opt.max_attempts, .cursors = true, .liveness = true, .retry_ms = &f->free_in };
	struct rb_dl **v = NULL;
	int want = f_room(f), n;
	int64_t t0 = rb_mono_ms();

	co.batch = want < opt.batch ? want : opt.batch;
	/* a key's next deliveries with its head (--chain): the handler runs each
	 * as soon as the one before it succeeded, before that completion
	 * commits, so a takeover is to charge them as rb-dispatch's */
	co.chain = opt.chain;
	co.chain_early = opt.chain > 1;
	/* what is out (a superset of what is still in flight: harmless), so
	 * that the claim need not look it up */
	int64_t *live = xcalloc(f->nout + 1, sizeof *live);
	int *lanes = xcalloc(f->nout + 1, sizeof *lanes);

	for (size_t i = 0; i < f->nout; i++) {
		live[i] = f->out[i]->id;
		lanes[i] = f->out[i]->lease.lane;
	}
	co.live = live;
	co.live_lanes = lanes;
	co.n_live = f->nout;
	n = rb_store_claim(f->store, &co, &v, err);
	free(live);
	free(lanes);
	if (n < 0)
		return -1;
	if (opt.chain > 1)
		n = f_trim_chains(f, v, n);
	if (f->qh == f->qn)
		f->qh = f->qn = 0;
	if (f->qn + (size_t)n > f->qcap) {
		f->qcap = (f->qn + (size_t)n) * 2;
		f->q = xrealloc(f->q, f->qcap * sizeof *f->q);
	}
	for (int i = 0; i < n; i++)
		f->q[f->qn++] = v[i];
	free(v);
	/* a claim that found some may have left more: lanes give at most 32
	 * a pass, so a backlog left in a few lanes comes a claim at a time
	 * (waiting --poll after a short claim left 1 s gaps at a drain's end) */
	f->more = n > 0;
	f->dry = n == 0;
	/* nothing found while deliveries are out: what they hold back (a key's
	 * next delivery, a lane's room) comes once they are completed, which
	 * wakes no one: look again on the key claims' schedule */
	f->held_back = n == 0 && f->nout > 0;
	f->woken = false;
	char cut[48] = "";

	/* (only a claim that read every lane row says: kept until it passed) */
	if (f->free_in > 0) {
		snprintf(cut, sizeof cut, "; a cut lease ends in %lld ms", (long long)f->free_in);
		f->retry_at = earliest(f->retry_at, rb_mono_ms() + f->free_in + 5);
	}
	rb_debug("claimed %d deliveries in %lld ms (%zu out%s)", n, (long long)(rb_mono_ms() - t0), f->nout, cut);
	return n;
}

/* Write what stdout takes: 0 (maybe nothing), 1 the reader left, -1 another error (errno). */
static int
f_write(struct follow *f)
{
	while (f_queued(f) > 0) {
		struct iovec iov[64];
		int n = 0;
		ssize_t w;

		for (size_t i = f->qh; i < f->qn && n < 64; i++, n++) {
			size_t off = i == f->qh ? f->woff : 0;

			iov[n].iov_base = (char *)f->q[i]->text + off;
			iov[n].iov_len = f->q[i]->tlen - off;
		}
		w = writev(STDOUT_FILENO, iov, n);
		if (w < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return errno == EPIPE ? 1 : -1;
		}
		while (w > 0) {
			size_t rest = f->q[f->qh]->tlen - f->woff;

			if ((size_t)w < rest) {
				f->woff += (size_t)w;
				break;
			}
			w -= (ssize_t)rest;
			f->woff = 0;
			if (f->nout == f->capout) {
				f->capout = f->capout == 0 ? 256 : f->capout * 2;
				f->out = xrealloc(f->out, f->capout * sizeof *f->out);
			}
			f->keyed += f->q[f->qh]->key != NULL;
			f->out[f->nout++] = f->q[f->qh++];
		}
		if (f->pipe && f_queued(f) > 0 && f->woff > 0)
			return 0;	/* (the pipe is full) */
	}
	return 0;
}

/*
 * Count off the lines written whose deliveries are no longer in flight:
 * the oldest `limit` of them (0: all).  Lines are mostly completed in the
 * order written, so the room for a claim is looked for among the oldest
 * (a look costs about as much a line as claiming it: asking for all 1000
 * out, half of them just written, made the look the largest part of the
 * streaming pipeline's server time).
 */
static int
f_check(struct follow *f, size_t limit, struct rb_error *err)
{
	struct rb_result *r;
	bool *live;
	size_t k = 0, m = limit == 0 || limit > f->nout ? f->nout : limit, before = f->nout;
	int64_t t0 = rb_mono_ms();

	if (f->nout == 0)
		return 0;
	r = xcalloc(m, sizeof *r);
	live = xcalloc(m, sizeof *live);
	for (size_t i = 0; i < m; i++)
		r[i] = rb_result_of(f->out[i], RB_VERDICT_OK);
	if (rb_store_in_flight(f->store, r, m, live, err) < 0) {
		free(r);
		free(live);
		return -1;
	}
	f->keyed = 0;
	for (size_t i = 0; i < f->nout; i++) {
		if (i >= m || live[i]) {
			f->keyed += f->out[i]->key != NULL;
			f->out[k++] = f->out[i];
		} else
			rb_dl_free(f->out[i]);
	}
	rb_debug("%zu of %zu written still in flight (%zu looked at, %lld ms)", k, before, m,
	    (long long)(rb_mono_ms() - t0));
	f->nout = k;
	free(r);
	free(live);
	return 0;
}

/* At a stop: finish a half-written line, if the reader takes it soon. */
static void
f_finish_line(struct follow *f)
{
	int64_t end = rb_mono_ms() + FOLLOW_FINISH_MS;

	while (f->woff > 0 && rb_mono_ms() < end) {
		struct pollfd p = { .fd = STDOUT_FILENO, .events = POLLOUT };
		const struct rb_dl *d = f->q[f->qh];
		ssize_t w;

		if (poll(&p, 1, 100) <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
			if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0)
				return;
			continue;
		}
		w = write(STDOUT_FILENO, d->text + f->woff, d->tlen - f->woff);
		if (w < 0 && errno != EINTR && errno != EAGAIN)
			return;
		if (w > 0 && (f->woff += (size_t)w) == d->tlen) {
			f->woff = 0;
			if (f->nout == f->capout) {
				f->capout = f->capout == 0 ? 256 : f->capout * 2;
				f->out = xrealloc(f->out, f->capout * sizeof *f->out);
			}
			f->out[f->nout++] = f->q[f->qh++];
		}
	}
}

/*
 * Release what was not handed on: every line not written in full, and
 * (gone: the reader left) the lines still unread in the pipe, which no one
 * will read.  Returns how many.
 */
static int
f_release(struct follow *f, bool gone)
{
	size_t nq = f_queued(f), tail = 0, n;
	struct rb_dl **v;

	if (gone && f->pipe) {
		int unread = 0;

#ifdef FIONREAD
		if (ioctl(STDOUT_FILENO, FIONREAD, &unread) < 0)
			unread = 0;
#endif
		/* (the last bytes written: the half-written line's, then whole ones) */
		if ((size_t)unread >= f->woff) {
			size_t u = (size_t)unread - f->woff;

			while (tail < f->nout && f->out[f->nout - 1 - tail]->tlen <= u)
				u -= f->out[f->nout - 1 - tail++]->tlen;
		}
	}
	n = nq + tail;
	if (n == 0) {
		struct rb_error err = { 0 };

		if (rb_store_relinquish(f->store, opt.handler, f->owner, &err) < 0)
			rb_warn("could not hand back the idle lanes (they free up when the lease ends): %s",
			    err.msg);
		return 0;
	}
	v = xcalloc(n, sizeof *v);
	for (size_t i = 0; i < tail; i++)
		v[i] = f->out[f->nout - tail + i];
	for (size_t i = 0; i < nq; i++)
		v[tail + i] = f->q[f->qh + i];
	give_back(f->store, v, 0, n, f->owner);
	free(v);
	return (int)n;
}

/*
 * Before any exit: the lanes of what is still downstream (the lines
 * written, which rb-complete may complete after this process is gone)
 * get a plain lease of --lease from now, no longer the liveness lock's
 * (f_release handed back the idle ones first).  A store whose connection
 * was lost is connected again for it once: the lock went with the old
 * session, and the lanes would be taken over 1.5 s later.
 */
static void
f_plain(struct follow *f)
{
	struct rb_error err = { 0 };
	int n;

	if (f->nout == 0 && f_queued(f) == 0)
		return;
	if (rb_store_broken(f->store)) {
		if (rb_store_reconnect(f->store, &err) < 0) {
			rb_warn("could not reconnect to keep the lanes of the %zu lines written: another claimer "
			    "may take them over, and rb-complete then reports them lost: %s", f->nout, err.msg);
			return;
		}
		rb_debug("reconnected to keep the lanes of the lines written");
		if (f_queued(f) > 0)
			(void)f_release(f, false);
	}
	if ((n = rb_store_extend_plain(f->store, opt.handler, f->owner, opt.lease_ms, &err)) < 0)
		rb_warn("could not keep the lanes of the %zu lines written: another claimer may take them "
		    "over, and rb-complete then reports them lost: %s", f->nout, err.msg);
	else
		rb_debug("%d lanes of the %zu lines written keep a plain lease", n, f->nout);
}

static void
f_free(struct follow *f)
{
	for (size_t i = f->qh; i < f->qn; i++)
		rb_dl_free(f->q[i]);
	for (size_t i = 0; i < f->nout; i++)
		rb_dl_free(f->out[i]);
	free(f->q);
	free(f->out);
}

static void
f_stdout_setup(struct follow *f)
{
	struct stat st;

	if (fstat(STDOUT_FILENO, &st) < 0 || !S_ISFIFO(st.st_mode))
		return;
	if ((f->fl = fcntl(STDOUT_FILENO, F_GETFL)) < 0 ||
	    fcntl(STDOUT_FILENO, F_SETFL, f->fl | O_NONBLOCK) < 0)
		return;
	f->pipe = true;
}

static int
follow_run(struct rb_store *store, const char *owner)
{
	struct follow f = { .store = store, .owner = owner };
	struct rb_error err = { 0 };
	sigset_t block, orig;
	int exit_code = RB_EXIT_OK, rc, released;
	enum { RUNNING, STOPPED, GONE, DRAINED, FAILED, OUTERR } state = RUNNING;
	int out_errno = 0;
	int64_t now;

	/* the stop signals come only while waiting (ppoll), never inside a
	 * call to the store */
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &orig);
	f_stdout_setup(&f);
	if (rb_admin_handler_check(store, opt.handler, &err) < 0) {
		if (err.exit_code != RB_EXIT_CONFIG) {
			state = FAILED;
			goto done;
		}
		rb_warn("-H: %s; waiting for one (rb-setup --subscribe %s:PATTERN)", err.msg, opt.handler);
	}
	if (rb_store_listen(store, opt.handler, &err) < 0) {
		state = FAILED;
		goto done;
	}
	now = rb_mono_ms();
	f.next_claim = now;
	f.next_extend = now + opt.lease_ms / 3;
	f.check_ms = FOLLOW_CHECK_MS;
	f.key_ms = FOLLOW_KEY_MS;
	while (state == RUNNING) {
		struct pollfd pfd[5];
		struct rb_store_event ev;
		struct timespec ts, *tsp = NULL;
		int64_t wake = 0;
		int np, nstore, timeout = -1, asked;
		bool cut;

		if (stop) {
			state = STOPPED;
			break;
		}
		now = rb_mono_ms();
		/* renew the leases of what is out (a claim renews only the lanes it took from) */
		if (f_queued(&f) + f.nout > 0 && now >= f.next_extend) {
			if (f_check(&f, 0, &err) < 0 ||
			    (f_queued(&f) + f.nout > 0 && rb_store_extend(store, opt.handler, owner, opt.lease_ms, &err) < 0)) {
				state = FAILED;
				break;
			}
			f.next_extend = now + opt.lease_ms / 3;
		}
		/* count off what was completed, when that is what holds back a claim
		 * (or, with --drain, the end) */
		if (f_queued(&f) == 0 && f.nout > 0 && (!f_claim_room(&f) || (opt.drain && f.dry)) &&
		    now >= f.next_check) {
			size_t before = f.nout;
			/* (for room: a batch's worth of the oldest) */
			size_t limit = f_claim_room(&f) ? 0 : (size_t)(opt.batch < opt.max_in_flight ?
			    opt.batch : opt.max_in_flight);

			if (f_check(&f, limit, &err) < 0) {
				state = FAILED;
				break;
			}
			f.check_ms = backoff(f.check_ms, f.nout < before, FOLLOW_CHECK_MS);
			f.next_check = now + f.check_ms;
			/* --drain: all done; one more claim says whether it is over */
			if (opt.drain && before > 0 && f.nout == 0)
				f.more = true;
		}
		if (f_queued(&f) == 0 && f_claim_room(&f) && (f.woken || f.more || now >= f.next_claim ||
		    ((f.keyed > 0 || f.held_back) && now >= f.next_key_claim))) {
			/* after a claim that found nothing, count off what is done
			 * first: a lane's room is reckoned from what is out */
			if (f.held_back && f_check(&f, 0, &err) < 0) {
				state = FAILED;
				break;
			}
			if ((rc = f_claim(&f, &err)) < 0) {
				state = FAILED;
				break;
			}
			f.next_claim = now + opt.poll_ms;
			/* a dead holder's lanes, cut by this claim or one before,
			 * are free when the cut lease ends: look again then, not a
			 * --poll later (as rb-dispatch does) */
			if (f.retry_at != 0 && f.retry_at <= now)
				f.retry_at = 0;
			if (f.retry_at != 0)
				f.next_claim = earliest(f.next_claim, f.retry_at);
			f.key_ms = backoff(f.key_ms, rc > 0, FOLLOW_KEY_MS);
			f.next_key_claim = now + f.key_ms;
			if (rc == 0 && opt.drain && f.nout == 0) {
				state = DRAINED;
				break;
			}
		}
		if (f_queued(&f) > 0) {
			if ((rc = f_write(&f)) != 0) {
				out_errno = errno;
				state = rc > 0 ? GONE : OUTERR;
				break;
			}
		}
		/* wait: for stdout to take more, a wake-up, or the next thing due */
		np = 0;
		pfd[np++] = (struct pollfd){ .fd = f.pipe ? STDOUT_FILENO : -1,
		    .events = f_queued(&f) > 0 ? POLLOUT : 0 };
		if (f_queued(&f) > 0 && !f.pipe)
			timeout = 0;	/* (a file or terminal: the write waited already) */
		if (f_queued(&f) == 0 && f_claim_room(&f))
			wake = earliest(wake, f.woken || f.more ? now :
			    f.keyed > 0 || f.held_back ? earliest(f.next_claim, f.next_key_claim) : f.next_claim);
		if (f_queued(&f) + f.nout > 0)
			wake = earliest(wake, f.next_extend);
		if (f_queued(&f) == 0 && f.nout > 0 && (!f_claim_room(&f) || (opt.drain && f.dry)))
			wake = earliest(wake, f.next_check > now ? f.next_check : now + f.check_ms);
		if (wake != 0 && timeout != 0)
			timeout = wake <= now ? 0 : (int)(wake - now);
		asked = timeout;
		nstore = rb_store_pollfds(store, pfd + np, 4, &timeout);
		np += nstore;
		/* a store without descriptors has no wake-ups (MongoDB): it cuts the
		 * wait short, after which it is to be asked again */
		cut = nstore == 0 && timeout >= 0 && (asked < 0 || timeout < asked);
		if (timeout >= 0) {
			ts.tv_sec = timeout / 1000;
			ts.tv_nsec = (long)(timeout % 1000) * 1000000L;
			tsp = &ts;
		}
		if ((rc = ppoll(pfd, (nfds_t)np, tsp, &orig)) < 0 && errno != EINTR) {
			err.exit_code = RB_EXIT_OSERR;
			snprintf(err.msg, sizeof err.msg, "poll: %s", strerror(errno));
			state = FAILED;
			break;
		}
		if (rc == 0 && cut)
			f.woken = true;
		if (f.pipe && (pfd[0].revents & (POLLERR | POLLHUP)) != 0) {
			out_errno = EPIPE;
			state = GONE;
			break;
		}
		/* (not past a failure: a lost connection is reported again at
		 * every call, and a loop that took them all never ended) */
		while (state == RUNNING && rb_store_service(store, &ev) > 0) {
			if (ev.kind == RB_STORE_WOKEN)
				f.woken = true;
			else if (ev.kind == RB_STORE_FAILED) {
				err = ev.err;
				state = FAILED;
			}
			for (size_t i = 0; i < ev.n; i++)
				rb_dl_free(ev.v[i]);
			free(ev.v);
		}
	}
done:
	switch (state) {
	case STOPPED:
		f_finish_line(&f);
		released = f_release(&f, false);
		rb_info("stopped: %d deliveries released, %zu written may still be in flight", released, f.nout);
		break;
	case GONE:
		released = f_release(&f, true);
		rb_info("stdout closed: %d deliveries released", released);
		exit_code = RB_EXIT_IOERR;
		break;
	case OUTERR:
		released = f_release(&f, false);
		rb_error("cannot write to stdout: %s (%d deliveries released)", strerror(out_errno), released);
		exit_code = RB_EXIT_IOERR;
		break;
	case DRAINED:
		released = f_release(&f, false);
		rb_info("drained: nothing due, nothing in flight");
		break;
	case FAILED:
	default:
		exit_code = err.exit_code != 0 ? err.exit_code : RB_EXIT_SOFTWARE;
		rb_error("%s", err.msg);
		if (f_queued(&f) > 0 && !rb_store_broken(store))
			(void)f_release(&f, false);
		break;
	}
	f_plain(&f);
	if (f.pipe)
		(void)fcntl(STDOUT_FILENO, F_SETFL, f.fl);
	f_free(&f);
	sigprocmask(SIG_SETMASK, &orig, NULL);
	return exit_code;
}

int
main(int argc, char **argv)
{
	struct rb_store *store;
	struct rb_claim_opts co;
	struct rb_error err = { 0 };
	struct rb_dl **deliveries = NULL;
	char *owner;
	int n = 0, exit_code = RB_EXIT_OK;
	int64_t deadline;
	bool listening = false, checked = false;

	rb_cli_init("rb-claim", &opt.common);
	/* before anything reads or copies them: handlers, and a pipeline's
	 * other programs, run as our uid (rb_env.h) */
	rb_env_hide_secrets();
	parse_args(argc, argv);
	owner = opt.owner != NULL ? xstrdup(opt.owner) : rb_cli_owner();
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	store = rb_cli_open(&opt.common);
	if (opt.follow) {
		exit_code = follow_run(store, owner);
		goto out;
	}
	co = (struct rb_claim_opts){ .handler = opt.handler, .owner = owner, .batch = opt.batch,
	    .lease_ms = opt.lease_ms, .max_attempts = opt.max_attempts };
	deadline = rb_mono_ms() + opt.wait_ms;
	for (;;) {
		if ((n = rb_store_claim(store, &co, &deliveries, &err)) < 0)
			goto fail;
		/* nothing due: a misspelled -H would be silent (exit 1).  An
		 * error, or with --wait a warning (a publish naming the handler
		 * may come while we wait) */
		if (n == 0 && !checked) {
			checked = true;
			if (rb_admin_handler_check(store, opt.handler, &err) < 0) {
				if (err.exit_code != RB_EXIT_CONFIG)
					goto fail;
				if (opt.wait_ms > 0) {
					rb_warn("-H: %s; waiting for one (rb-setup --subscribe %s:PATTERN)",
					    err.msg, opt.handler);
				} else {
					rb_error("-H: %s; rb-setup --subscribe %s:PATTERN adds one", err.msg,
					    opt.handler);
					exit_code = RB_EXIT_CONFIG;
					goto out;
				}
			}
		}
		if (n > 0 || stop || rb_mono_ms() >= deadline)
			break;
		free_claimed(deliveries, n);
		deliveries = NULL;
		if (!listening) {
			if (rb_store_listen(store, opt.handler, &err) < 0)
				goto fail;
			listening = true;
			continue;	/* claim once more: an event may have come before LISTEN */
		}
		int64_t left = deadline - rb_mono_ms();
		int wait = (int)(left < opt.poll_ms ? left : opt.poll_ms);
		if (wait > 0 && rb_store_notified(store, wait, &err) < 0)
			goto fail;
	}
	if (n == 0) {
		rb_info("nothing due for %s", opt.handler);
		exit_code = RB_EXIT_EMPTY;
		goto out;
	}
	pipe_setup();
	for (size_t i = 0; i < (size_t)n; i++) {
		/* the line as the store made it from the columns: the payload as stored */
		const struct rb_dl *d = deliveries[i];
		int handed = 1;

		if (fwrite(d->text, 1, d->tlen, stdout) != d->tlen || fflush(stdout) != 0) {
			int e = errno;

			give_back(store, deliveries, i, (size_t)n, owner);
			/* a reader that went away (EPIPE) is normal in a pipeline: say it only with -v */
			if (e == EPIPE)
				rb_info("stdout closed: %d deliveries released", n - (int)i);
			else
				rb_error("cannot write to stdout: %s (%d deliveries released)", strerror(e),
				    n - (int)i);
			exit_code = RB_EXIT_IOERR;
			goto out;
		}
		if (pipe_mode != 0)
			handed = wait_handed_on();
		if (handed == 0) {
			/* the reader left with this line unread */
			give_back(store, deliveries, i, (size_t)n, owner);
			rb_info("stdout closed: %d deliveries released", n - (int)i);
			exit_code = RB_EXIT_IOERR;
			goto out;
		}
		if (handed < 0) {
			/* this line may still be read (and run): it stays in flight */
			give_back(store, deliveries, i + 1, (size_t)n, owner);
			rb_warn("interrupted: %d deliveries released", n - (int)i - 1);
			exit_code = RB_EXIT_TEMPFAIL;
			goto out;
		}
	}
	rb_info("claimed %d deliveries of %s as %s", n, opt.handler, owner);
	goto out;
fail:
	exit_code = err.exit_code != 0 ? err.exit_code : RB_EXIT_SOFTWARE;
	rb_error("%s", err.msg);
out:
	if (deliveries != NULL)
		free_claimed(deliveries, n);
	rb_store_close(store);
	free(owner);
	return exit_code;
}
