/* SPDX-License-Identifier: MIT */
/*
 * rb-dispatch: the long-running worker of one handler.  It claims due
 * deliveries (lane leases), runs each through the handler, renews the
 * leases while they run, and completes the results in groups: everything
 * that finished within --window goes to the store in one call.
 *
 * One thread and one poll(2) loop: the handler's child processes (--exec:
 * one per delivery; --pipe: --procs long-running co-processes speaking
 * JSON lines), a self-pipe for SIGCHLD/SIGTERM/SIGINT and the database
 * socket, which carries LISTEN/NOTIFY wake-ups (a latency hint; polling
 * every --poll stays the correctness path).  --sql runs a statement in
 * the transaction that deletes the delivery (effectively-once).
 *
 * Surprises: a lost connection is re-established with backoff and the
 * unapplied results are applied afterwards, under a fresh lease owner
 * name, so that a claim whose answer was lost can never stay in flight
 * under a lease this process keeps renewing.  stdout carries nothing of
 * ours (--exec handlers inherit it).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

extern char **environ;

static const char usage_str[] =
"usage: rb-dispatch --handler H (--exec CMD | --pipe CMD | --sql SQL) [--concurrency N]\n"
"                   [--batch N] [--chain N] [--procs N] [--connections N] [--lease DUR]\n"
"                   [--timeout DUR] [--grace DUR] [--max-attempts N]\n"
"                   [--backoff BASE[,MAX[,FACTOR]]]\n"
"                   [--poll DUR] [--window DUR] [--stats-every DUR] [--owner NAME] [--drain]\n"
"                   [--db URL] [--schema NAME]\n"
"\n"
"Claim the due deliveries of handler H, run them, renew their leases and complete them.\n"
"\n"
"  -H, --handler H        the handler whose deliveries to run (required)\n"
"      --exec CMD         run /bin/sh -c CMD per delivery, the delivery line on stdin:\n"
"                         exit 0 completes, 75 retries, anything else fails the attempt\n"
"      --pipe CMD         run CMD as co-processes: delivery lines in, result lines out\n"
"                         (the delivery line plus ok, error, retry_ms, dead), any order\n"
"      --sql SQL          run SQL ($1 = the delivery as JSON) in the transaction that\n"
"                         completes the delivery (effectively-once)\n"
"  -c, --concurrency N    at most N deliveries in flight (default 3200 with --pipe, else 10)\n"
"  -b, --batch N          claim at most N at a time (default 800 with --pipe, else 100)\n"
"      --chain N          claim up to N deliveries of one key at once, run one after\n"
"                         the other, each once the previous one is completed\n"
"                         (default 32 with --pipe, else 8)\n"
"      --procs N          --pipe co-processes (default 1)\n"
"      --connections N    2: read the events of what a claim took on a second database\n"
"                         connection while the next claim runs (default); 3: and\n"
"                         complete on a third, beside the claims; 1: one connection,\n"
"                         less CPU in all\n"
"  -l, --lease DUR        lane lease, renewed every third of it (default 30s)\n"
"  -t, --timeout DUR      kill (--exec) or fail (--pipe) an attempt after DUR (default 5m)\n"
"      --grace DUR        on SIGTERM/SIGINT, let running handlers finish for DUR (default 30s)\n"
"  -m, --max-attempts N   a failure that reaches N attempts buries (default 10)\n"
"      --backoff SPEC     retry delay BASE[,MAX[,FACTOR]]: BASE*FACTOR^(attempts-1), at most\n"
"                         MAX (default 1s,5m,2)\n"
"      --poll DUR         look for due work every DUR when idle (default 1s)\n"
"      --window DUR       complete the results finished within DUR together (default 2ms)\n"
"      --stats-every DUR  a status line every DUR (default: off)\n"
"      --owner NAME       lease owner (default host:pid:random)\n"
"      --drain            exit once nothing is due and nothing is in flight\n"
"  -u, --db URL           postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"      --schema NAME      relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
"  -v, --verbose          more messages (-vv: debug)\n"
"  -q, --quiet            errors only\n"
"      --log-format FMT   text (default) or json diagnostics on stderr\n"
"  -h, --help             this help\n"
"  -V, --version          version and libraries\n"
"\n"
"Exit status: 0 stopped by a signal or drained, 64 usage, 69 database unavailable at\n"
"start, 70 internal error, 71 cannot start the handler, 75 stopped with results not\n"
"applied (database down), 77 permission denied, 78 bad URL or schema not set up.\n";

enum { OPT_EXEC = RB_OPT_FIRST_PROGRAM, OPT_PIPE, OPT_SQL, OPT_PROCS, OPT_GRACE, OPT_BACKOFF,
	OPT_POLL, OPT_WINDOW, OPT_STATS, OPT_OWNER, OPT_DRAIN, OPT_CHAIN, OPT_CONNS };

/* What the engine is told (rb-dispatch's options, minus the common ones). */
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
	const char		*owner;
	bool			 drain;
	struct rb_complete_opts	 complete;
};

static struct options {
	struct rb_common	common;
	struct dispatch_opts	dispatch;
} opt = { .dispatch = { .concurrency = 0, .batch = 0, .chain = 0, .procs = 1, .conns = 2,
	  .lease_ms = RB_DEFAULT_LEASE_MS, .timeout_ms = 5 * 60 * 1000, .grace_ms = 30000,
	  .poll_ms = 1000, .window_ms = 2,
	  .complete = { .max_attempts = RB_DEFAULT_MAX_ATTEMPTS,
		  .backoff = { .base_ms = 1000, .max_ms = 300000, .factor = 2.0 } } } };

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

/*
 * A delivery in flight: what every kind needs, and what its handler kind
 * keeps of it (set by the kind's start; the slot is zeroed when done).
 */
struct slot {
	bool	 used;
	struct rb_dl *d;	/* the claimed delivery */
	unsigned gen;		/* lease owner generation that claimed it */
	int64_t	 deadline;	/* --timeout; 0: none (any more) */
	struct chain *followers;	/* the rest of its key's chain, or NULL */
	union {
		struct {	/* --exec: its child, and the line still to write to the child's stdin */
			pid_t	 pid;
			int	 in_fd;		/* -1: written (or never opened) */
			char	*wbuf;
			size_t	 wlen, woff;
			bool	 timed_out;	/* killed at --timeout */
			bool	 aborted;	/* killed at shutdown: release */
		} exec;
		struct {	/* --pipe: the co-process it was handed to */
			int	 proc;		/* -1: none */
			uint32_t hash;		/* of its event_id and lease (slot_index) */
		} pipe;
	} h;
};

/*
 * A handler kind: how deliveries are run (--exec, --pipe, --sql).  The
 * loop, the claims and the results know only this; a NULL hook has
 * nothing to do for the kind.
 */
enum cancel { CANCEL_TIMEOUT, CANCEL_ABORT };
struct dispatcher;
struct handler_kind {
	const char	*option;	/* "--exec": for messages */
	/* the defaults of --concurrency, --batch and --chain */
	int		 concurrency, batch, chain;
	/* the handler takes each delivery's line as text (rb_claim_opts.line_text);
	 * --sql hands its statement the parsed line instead */
	bool		 line_text;
	/* a delivery's result is ready as soon as it starts (--sql: the
	 * statement runs in its completion): complete without --window */
	bool		 at_once;
	/* the loop begins: start the handler's processes */
	void	(*begin)(struct dispatcher *);
	/* hand over a claimed delivery (stolen), claimed under owner
	 * generation gen; followers (stolen or NULL) are the rest of its key's
	 * chain.  Takes a slot (slot_take) or queues its result. */
	void	(*start)(struct dispatcher *, struct rb_dl *d, unsigned gen, struct chain *followers);
	/* the slot's delivery is done (finish_slot): free what the kind kept of it */
	void	(*release)(struct dispatcher *, struct slot *s);
	/* end the slot's attempt: at --timeout (a failure), or at shutdown
	 * (released, no attempt charged); now or once its process is gone */
	void	(*cancel)(struct dispatcher *, struct slot *s, enum cancel why);
	/* a child process ended (waitpid) */
	void	(*exited)(struct dispatcher *, pid_t pid, int status);
	/* write out what start queued for the handler (after a batch of starts) */
	void	(*flush)(struct dispatcher *);
	/* whether the handler can take deliveries now (else no claim) */
	bool	(*accepting)(const struct dispatcher *);
	/* once per loop while running: restarts that are due */
	void	(*tick)(struct dispatcher *, int64_t now);
	/* its fds to poll (ref[i]: its own number, >= 0), lowering *until
	 * for its own timers; returns how many */
	int	(*pollfds)(struct dispatcher *, struct pollfd *pfd, int *ref, int64_t *until);
	/* the fd it gave ref for is ready */
	void	(*ready)(struct dispatcher *, int ref);
	/* the loop is over: end the handler's processes */
	void	(*stop)(struct dispatcher *);
	/* free the kind's state at exit */
	void	(*fini)(struct dispatcher *);
};
static const struct handler_kind handler_exec, handler_pipe, handler_sql;

/* A --pipe co-process. */
struct coproc {
	pid_t			 pid;		/* 0: not running */
	int			 in_fd, out_fd;
	struct rb_jsonl_reader	*rd;
	char			*wbuf;
	size_t			 wlen, woff, wcap;
	int			 inflight;
	int64_t			 started, restart_at, backoff_ms;
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

/* --pipe's own state (dispatcher.kind_state). */
struct pipe_state {
	struct coproc	*procs;		/* --procs of them */
	/*
	 * The slots handed to a co-process, by event_id and lease, for the
	 * results that come back (a scan of every slot was a tenth of our
	 * CPU at 800 in flight).  Open addressing with linear probing and
	 * deletion by backward shift; entries are slot numbers + 1, 0 is empty.
	 */
	int		*sidx;
	size_t		 sidx_mask;
};

struct dispatcher {
	struct dispatch_opts	 opt;
	struct rb_store		*store;
	void			*kind_state;	/* the handler kind's own (struct pipe_state) */

	/* the slots: deliveries being run by the handler */
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
	int64_t		 queue_since;
	int		 nwait;		/* chain followers waiting for their turn */

	/* the connection */
	bool		 db_down;
	int64_t		 reconnect_at, reconnect_backoff;

	/* the claim pipeline */
	bool		 wake;		/* claim at the next chance */
	bool		 more_work;	/* the last claim found work: claim again when slots free */
	bool		 claiming;	/* a claim is out: the handlers are served meanwhile */
	unsigned	 claim_gen;	/* the owner generation it was sent for */
	int		 claim_asked;	/* ... how many it asked for ... */
	bool		 claim_searched;	/* ... and whether it looked for more lanes */
	bool		 lanes_dry;	/* a look for more lanes found too few: do not look again until woken or polling */
	bool		 idle_seen;	/* the last claim found nothing, and nothing completed since */
	bool		 progress_since_claim;	/* a completion went through after the claim out was sent */
	/* A claim answers with ids; the delivery lines are read on the store's
	 * second connection (rb_store_fetch_send) while the next claim runs. */
	bool		 fetching;	/* a fetch is out ... */
	struct claimed	 fetch_out;	/* ... of these claimed ... */
	unsigned	 fetch_gen;	/* ... for this owner generation */
	struct claimed	 fetch_waiting;	/* a claim's answer waiting for the fetch out */
	unsigned	 fetch_waiting_gen;
	int		 nfetch;	/* deliveries in fetch_out and fetch_waiting */
	int64_t		*live;		/* the claim's live ids (live_ids) ... */
	int		*live_lanes;	/* ... and their lanes ... */
	size_t		 live_cap;	/* ... room for this many */

	/* the completion out */
	bool		 completing;	/* a completion is out (flush_results) ... */
	size_t		 ncompleting;	/* ... of the first this many queued results ... */
	struct rb_dl	**completing_v;	/* ... sent as this array (theirs) */

	/* timers */
	int64_t		 next_poll, next_extend, next_stats;

	/* stopping */
	int		 stop_level;	/* 0 running, 1 stopping (grace), 2 aborted */
	int64_t		 grace_deadline;
	int		 fatal_code;

	struct {
		long	claimed, completed, rescheduled, buried, released, lost;
		long	completed_at_last_stats;
	} stats;
};

/* Signals are the process's, not a dispatcher's: the handler sets these. */
static int		 sigpipe_fd[2] = { -1, -1 };
static volatile sig_atomic_t got_stop, got_child;

static void	claim_collect(struct dispatcher *dp, bool wait);
static void	complete_collect(struct dispatcher *dp, bool wait);
static void	fetch_collect(struct dispatcher *dp, bool wait);
static void	fetch_send(struct dispatcher *dp, struct claimed got, unsigned gen);
static void	start_chains(struct dispatcher *dp, struct claimed got, unsigned gen);
static void	slot_unindex(struct dispatcher *dp, struct slot *s);
static struct slot *slot_take(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers);
static void	finish_slot(struct dispatcher *dp, struct slot *s, json_t *r);
static json_t	*result_release(const struct rb_dl *d);
static json_t	*result_ok(const struct rb_dl *d);
static void	reap(struct dispatcher *dp);
static void	start_claimed(struct dispatcher *dp, struct claimed got, unsigned gen);
static void	fetch_drop(struct dispatcher *dp, struct claimed *got, unsigned gen);
static void	db_settle(struct dispatcher *dp);
static void	start_delivery(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers);
static void	chain_next(struct dispatcher *dp, struct chain *followers, unsigned gen, bool go);
static void	proc_write(struct coproc *c);
static int64_t	min_deadline(int64_t a, int64_t b);

/* ---- options ------------------------------------------------------------- */

static void
set_kind(const struct handler_kind *k, const char *arg)
{
	struct dispatch_opts *o = &opt.dispatch;

	if (o->kind != NULL)
		rb_cli_usage_error(usage_str, "give one of --exec, --pipe and --sql");
	if (*arg == '\0')
		rb_cli_usage_error(usage_str, "%s: empty", k->option);
	o->kind = k;
}

static void
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "handler", required_argument, NULL, 'H' },
		{ "exec", required_argument, NULL, OPT_EXEC },
		{ "pipe", required_argument, NULL, OPT_PIPE },
		{ "sql", required_argument, NULL, OPT_SQL },
		{ "concurrency", required_argument, NULL, 'c' },
		{ "batch", required_argument, NULL, 'b' },
		{ "chain", required_argument, NULL, OPT_CHAIN },
		{ "connections", required_argument, NULL, OPT_CONNS },
		{ "procs", required_argument, NULL, OPT_PROCS },
		{ "lease", required_argument, NULL, 'l' },
		{ "timeout", required_argument, NULL, 't' },
		{ "grace", required_argument, NULL, OPT_GRACE },
		{ "max-attempts", required_argument, NULL, 'm' },
		{ "backoff", required_argument, NULL, OPT_BACKOFF },
		{ "poll", required_argument, NULL, OPT_POLL },
		{ "window", required_argument, NULL, OPT_WINDOW },
		{ "stats-every", required_argument, NULL, OPT_STATS },
		{ "owner", required_argument, NULL, OPT_OWNER },
		{ "drain", no_argument, NULL, OPT_DRAIN },
		{ NULL, 0, NULL, 0 }
	};
	struct dispatch_opts *o = &opt.dispatch;
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "H:c:b:l:t:m:", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'H':
			o->handler = rb_cli_handler(usage_str, optarg);
			break;
		case OPT_EXEC:
			set_kind(&handler_exec, optarg);
			o->cmd = optarg;
			break;
		case OPT_PIPE:
			set_kind(&handler_pipe, optarg);
			o->cmd = optarg;
			break;
		case OPT_SQL:
			set_kind(&handler_sql, optarg);
			o->complete.sql = optarg;
			break;
		case 'c':
			o->concurrency = rb_cli_int(usage_str, "--concurrency", optarg, 1, 10000);
			break;
		case 'b':
			o->batch = rb_cli_int(usage_str, "--batch", optarg, 1, 10000);
			break;
		case OPT_CHAIN:
			o->chain = rb_cli_int(usage_str, "--chain", optarg, 1, 1000);
			break;
		case OPT_CONNS:
			o->conns = rb_cli_int(usage_str, "--connections", optarg, 1, 3);
			break;
		case OPT_PROCS:
			o->procs = rb_cli_int(usage_str, "--procs", optarg, 1, 1000);
			break;
		case 'l':
			o->lease_ms = rb_cli_lease(usage_str, optarg, 300);
			break;
		case 't':
			o->timeout_ms = rb_cli_duration(usage_str, "--timeout", optarg);
			if (o->timeout_ms < 1)
				rb_cli_usage_error(usage_str, "--timeout: at least 1ms");
			break;
		case OPT_GRACE:
			o->grace_ms = rb_cli_duration(usage_str, "--grace", optarg);
			break;
		case 'm':
			o->complete.max_attempts = rb_cli_int(usage_str, "--max-attempts", optarg, 1, 1000000);
			break;
		case OPT_BACKOFF:
			rb_cli_backoff(usage_str, "--backoff", optarg, &o->complete.backoff);
			break;
		case OPT_POLL:
			o->poll_ms = rb_cli_duration(usage_str, "--poll", optarg);
			if (o->poll_ms < 10)
				rb_cli_usage_error(usage_str, "--poll: at least 10ms");
			break;
		case OPT_WINDOW:
			o->window_ms = rb_cli_duration(usage_str, "--window", optarg);
			break;
		case OPT_STATS:
			o->stats_ms = rb_cli_duration(usage_str, "--stats-every", optarg);
			break;
		case OPT_OWNER:
			o->owner = rb_cli_owner_arg(usage_str, optarg, 180);
			break;
		case OPT_DRAIN:
			o->drain = true;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
	if (o->handler == NULL)
		rb_cli_usage_error(usage_str, "--handler is required");
	if (o->kind == NULL)
		rb_cli_usage_error(usage_str, "a handler is required: --exec, --pipe or --sql");
	if (o->concurrency == 0)
		o->concurrency = o->kind->concurrency;
	if (o->batch == 0)
		o->batch = o->kind->batch;
	if (o->chain == 0)
		o->chain = o->kind->chain;
	if (o->procs > o->concurrency)
		o->procs = o->concurrency;
}

/* ---- signals and child processes ------------------------------------------ */

static void
on_signal(int sig)
{
	int e = errno;
	char c = (char)sig;

	if (sig == SIGCHLD)
		got_child = 1;
	else
		got_stop++;
	(void)!write(sigpipe_fd[1], &c, 1);
	errno = e;
}

static void
set_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static void
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
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}

/*
 * Start /bin/sh -c cmd in its own process group (so that a ^C at the
 * terminal reaches only us, and a timeout kills the whole group) with
 * stdin from in_fd and, when out_fd >= 0, stdout to out_fd.
 */
static pid_t
spawn(const char *cmd, int in_fd, int out_fd)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, def;
	char *argv[] = { "/bin/sh", "-c", (char *)cmd, NULL };
	pid_t pid;
	int rc;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in_fd, STDIN_FILENO);
	if (out_fd >= 0)
		posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	sigaddset(&def, SIGCHLD);
	sigaddset(&def, SIGTERM);
	sigaddset(&def, SIGINT);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
	    POSIX_SPAWN_SETSIGMASK);
	rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	return pid;
}

/* ---- owners ---------------------------------------------------------------- */

static struct owner *
owner_of(struct dispatcher *dp, unsigned gen)
{
	struct owner *o = &dp->owners[gen % NOWNERS];

	return o->name != NULL && o->gen == gen ? o : NULL;
}

static void
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
	o->name = dp->cur_gen == 0 ? xstrdup(dp->owner_base) : xasprintf("%s/r%u", dp->owner_base, dp->cur_gen);
	o->gen = dp->cur_gen;
	o->count = 0;
}

static void
owner_done(struct dispatcher *dp, unsigned gen)
{
	struct owner *o = owner_of(dp, gen);

	if (o != NULL)
		o->count--;
}

/* ---- database errors --------------------------------------------------------- */

static void
db_error(struct dispatcher *dp, const struct rb_error *err, const char *what)
{
	int code = err->exit_code != 0 ? err->exit_code : RB_EXIT_SOFTWARE;

	if (code == RB_EXIT_TEMPFAIL || code == RB_EXIT_UNAVAILABLE || rb_store_broken(dp->store)) {
		if (!dp->db_down)
			rb_warn("%s: %s: reconnecting", what, err->msg);
		dp->db_down = true;
		dp->claiming = false;	/* its answer, if any, is lost with the connection */
		dp->completing = false;	/* its results stay queued and are applied again */
		free(dp->completing_v);
		dp->completing_v = NULL;
		/* claimed, never read: the new owner claims them again once the
		 * old one's lanes are handed back */
		dp->fetching = false;
		fetch_drop(dp, &dp->fetch_out, dp->fetch_gen);
		fetch_drop(dp, &dp->fetch_waiting, dp->fetch_waiting_gen);
		dp->reconnect_at = rb_mono_ms() + (dp->reconnect_backoff > 200 ? 200 : dp->reconnect_backoff);
		return;
	}
	rb_error("%s: %s", what, err->msg);
	if (dp->fatal_code == 0)
		dp->fatal_code = code;
}

static void
try_reconnect(struct dispatcher *dp, int64_t now)
{
	struct rb_error err = { 0 };

	if (rb_store_reconnect(dp->store, &err) < 0 || rb_store_listen(dp->store, &err) < 0) {
		rb_debug("reconnect: %s", err.msg);
		dp->reconnect_at = now + dp->reconnect_backoff;
		dp->reconnect_backoff = dp->reconnect_backoff * 2 > 5000 ? 5000 : dp->reconnect_backoff * 2;
		return;
	}
	dp->db_down = false;
	dp->reconnect_backoff = 100;
	new_owner(dp);
	rb_warn("reconnected to %s; now leasing as %s", rb_store_url_redacted(dp->store),
	    dp->owners[dp->cur_gen % NOWNERS].name);
	dp->wake = true;
	dp->next_extend = now;
}

/* ---- results ------------------------------------------------------------------- */

/* Free a chain and the deliveries still in it. */
static void
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

/* Queue the result of d (d, r and followers stolen; r NULL: d succeeded)
 * for the next group completion. */
static void
queue_result(struct dispatcher *dp, struct rb_dl *d, json_t *r, unsigned gen, struct chain *followers)
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

static json_t *
result_fail(const struct rb_dl *d, const char *error)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "ok", json_false());
	json_object_set_new(r, "error", json_string(error));
	return r;
}

/* A success as an object: --sql hands it to the statement. */
static json_t *
result_ok(const struct rb_dl *d)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "ok", json_true());
	return r;
}

static json_t *
result_release(const struct rb_dl *d)
{
	json_t *r = rb_dl_result(d);

	json_object_set_new(r, "release", json_true());
	return r;
}

/* A free slot for d (stolen), its deadline set; the kind fills in the rest. */
static struct slot *
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
static void
finish_slot(struct dispatcher *dp, struct slot *s, json_t *r)
{
	struct rb_dl *d = s->d;

	if (r != NULL && json_is_false(json_object_get(r, "ok")))
		rb_info("%s: attempt %d failed: %s", d->event_id, d->attempt,
		    json_string_value(json_object_get(r, "error")));
	struct chain *followers = s->followers;
	unsigned gen = s->gen;
	/* the rest of its chain goes on once it succeeded; with --sql only
	 * once that committed (the handler is the completion), see flush_results */
	bool go = followers != NULL && dp->opt.complete.sql == NULL && (r == NULL || rb_result_completes(r)) &&
	    dp->stop_level == 0;

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
static bool
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
		if (all_ok && dp->claiming && dp->opt.conns < 3)
			return true;	/* sent once the claim's answer is in */
		if (all_ok) {
			struct rb_dl **v = xmalloc(n * sizeof *v);

			for (i = 0; i < n; i++)
				v[i] = dp->queue[i].d;
			if (rb_store_complete_send(dp->store, v, n, dp->opt.conns == 3, &err) < 0) {
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
			json_array_append_new(arr, dp->queue[i].r != NULL ? json_incref(dp->queue[i].r) : result_ok(dp->queue[i].d));
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
static void
complete_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	unsigned char *outcome;
	int rc;

	if (!dp->completing)
		return;
	outcome = xmalloc(dp->ncompleting > 0 ? dp->ncompleting : 1);
	rc = rb_store_complete_recv(dp->store, wait, outcome, &err);
	if (rc == RB_CLAIM_PENDING) {
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
static void
db_settle(struct dispatcher *dp)
{
	claim_collect(dp, true);
	complete_collect(dp, true);
}

/* ---- handlers ---------------------------------------------------------------------- */

/* The delivery's line, to hand the handler (a copy: *len bytes, newline-ended). */
static char *
line_text(const struct rb_dl *d, size_t *len)
{
	struct rb_sbuf b;

	rb_sb_init(&b);
	if (d->text != NULL)	/* made from the claim's columns (rb_claim_opts.line_text) */
		rb_sb_putn(&b, d->text, d->tlen);
	else {
		rb_json_sb_dump(&b, d->line);
		rb_sb_putn(&b, "\n", 1);
	}
	*len = b.len;
	return b.s;
}

/* ---- --exec: one process per delivery ---- */

/* Write what we can of the line to an exec child; close its stdin when done. */
static void
exec_write(struct slot *s)
{
	while (s->h.exec.in_fd >= 0 && s->h.exec.woff < s->h.exec.wlen) {
		ssize_t n = write(s->h.exec.in_fd, s->h.exec.wbuf + s->h.exec.woff,
		    s->h.exec.wlen - s->h.exec.woff);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			/* EPIPE: the handler did not read its input; its exit status decides */
			break;
		}
		s->h.exec.woff += (size_t)n;
	}
	if (s->h.exec.in_fd >= 0) {
		close(s->h.exec.in_fd);
		s->h.exec.in_fd = -1;
	}
	free(s->h.exec.wbuf);
	s->h.exec.wbuf = NULL;
}

static void
exec_start(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	struct slot *s = slot_take(dp, d, gen, followers);
	int p[2] = { -1, -1 };

	s->h.exec.in_fd = -1;
	if (pipe2(p, O_CLOEXEC) < 0 || (s->h.exec.pid = spawn(dp->opt.cmd, p[0], -1)) < 0) {
		char msg[200];

		snprintf(msg, sizeof msg, "cannot start the handler: %s", strerror(errno));
		rb_error("%s", msg);
		if (p[0] >= 0) {
			close(p[0]);
			close(p[1]);
		}
		finish_slot(dp, s, result_fail(s->d, msg));
		return;
	}
	close(p[0]);
	s->h.exec.in_fd = p[1];
	set_nonblock(s->h.exec.in_fd);
	s->h.exec.wbuf = line_text(s->d, &s->h.exec.wlen);
	s->h.exec.woff = 0;
	exec_write(s);
}

static void
exec_release(struct dispatcher *dp, struct slot *s)
{
	if (s->h.exec.in_fd >= 0)
		close(s->h.exec.in_fd);
	free(s->h.exec.wbuf);
}

/* Kill the child's process group; its exit (exec_exited) says what to queue. */
static void
exec_cancel(struct dispatcher *dp, struct slot *s, enum cancel why)
{
	if (why == CANCEL_TIMEOUT) {
		rb_info("%s: timed out: killing pid %d", s->d->event_id, (int)s->h.exec.pid);
		s->h.exec.timed_out = true;
	} else
		s->h.exec.aborted = true;
	kill(-s->h.exec.pid, SIGKILL);
}

static void
exec_child_exited(struct dispatcher *dp, struct slot *s, int status)
{
	char msg[200];

	if (s->h.exec.aborted) {
		finish_slot(dp, s, result_release(s->d));
		return;
	}
	if (s->h.exec.timed_out) {
		snprintf(msg, sizeof msg, "timed out after %" PRId64 "ms", dp->opt.timeout_ms);
		finish_slot(dp, s, result_fail(s->d, msg));
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		finish_slot(dp, s, NULL);
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == RB_EXIT_TEMPFAIL)
		snprintf(msg, sizeof msg, "exit %d: retry later", RB_EXIT_TEMPFAIL);
	else if (WIFEXITED(status))
		snprintf(msg, sizeof msg, "exit %d", WEXITSTATUS(status));
	else
		snprintf(msg, sizeof msg, "killed by signal %d", WTERMSIG(status));
	finish_slot(dp, s, result_fail(s->d, msg));
}

static void
exec_exited(struct dispatcher *dp, pid_t pid, int status)
{
	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used && dp->slots[i].h.exec.pid == pid) {
			exec_child_exited(dp, &dp->slots[i], status);
			break;
		}
}

/* The stdin of every child whose line is not all written yet (ref: the slot). */
static int
exec_pollfds(struct dispatcher *dp, struct pollfd *pfd, int *ref, int64_t *until)
{
	int n = 0;

	(void)until;
	for (int i = 0; i < dp->opt.concurrency; i++) {
		struct slot *s = &dp->slots[i];

		if (!s->used)
			continue;
		if (s->h.exec.in_fd >= 0) {
			pfd[n].fd = s->h.exec.in_fd;
			pfd[n].events = POLLOUT;
			ref[n++] = i;
		}
	}
	return n;
}

static void
exec_ready(struct dispatcher *dp, int ref)
{
	if (dp->slots[ref].used)
		exec_write(&dp->slots[ref]);
}

static const struct handler_kind handler_exec = {
	.option = "--exec",
	.concurrency = 10, .batch = RB_DEFAULT_BATCH, .chain = 8,
	.line_text = true,
	.start = exec_start,
	.release = exec_release,
	.cancel = exec_cancel,
	.exited = exec_exited,
	.pollfds = exec_pollfds,
	.ready = exec_ready,
};

/* ---- --pipe: long-running co-processes ---- */

static void
proc_start(struct dispatcher *dp, int i)
{
	struct pipe_state *ps = dp->kind_state;
	struct coproc *c = &ps->procs[i];
	int in[2] = { -1, -1 }, out[2] = { -1, -1 };

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 ||
	    (c->pid = spawn(dp->opt.cmd, in[0], out[1])) < 0) {
		rb_error("cannot start the handler: %s", strerror(errno));
		for (int k = 0; k < 2; k++) {
			if (in[k] >= 0)
				close(in[k]);
			if (out[k] >= 0)
				close(out[k]);
		}
		c->pid = 0;
		c->backoff_ms = c->backoff_ms == 0 ? 100 : (c->backoff_ms * 2 > 10000 ? 10000 : c->backoff_ms * 2);
		c->restart_at = rb_mono_ms() + c->backoff_ms;
		return;
	}
	close(in[0]);
	close(out[1]);
	c->in_fd = in[1];
	c->out_fd = out[0];
	set_nonblock(c->in_fd);
	set_nonblock(c->out_fd);
	c->rd = rb_jsonl_reader_new(c->out_fd, 0);
	c->wlen = c->woff = 0;
	c->started = rb_mono_ms();
	c->restart_at = 0;
	rb_debug("co-process %d started: pid %d", i, (int)c->pid);
}

static void
proc_write(struct coproc *c)
{
	while (c->in_fd >= 0 && c->woff < c->wlen) {
		ssize_t n = write(c->in_fd, c->wbuf + c->woff, c->wlen - c->woff);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {	/* EPIPE: it is dying; the reap fails its deliveries */
			close(c->in_fd);
			c->in_fd = -1;
			c->wlen = c->woff = 0;
			return;
		}
		c->woff += (size_t)n;
	}
	c->wlen = c->woff = 0;
}

static void
proc_send(struct coproc *c, const struct rb_dl *d)
{
	size_t len = d->tlen;
	char *dump = d->text == NULL ? line_text(d, &len) : NULL;
	const char *text = dump != NULL ? dump : d->text;

	if (c->woff > 0 && c->woff == c->wlen)
		c->wlen = c->woff = 0;
	if (c->wlen + len > c->wcap) {
		if (c->woff > 0) {
			memmove(c->wbuf, c->wbuf + c->woff, c->wlen - c->woff);
			c->wlen -= c->woff;
			c->woff = 0;
		}
		if (c->wlen + len > c->wcap) {
			c->wcap = (c->wlen + len) * 2;
			c->wbuf = xrealloc(c->wbuf, c->wcap);
		}
	}
	memcpy(c->wbuf + c->wlen, text, len);
	c->wlen += len;
	free(dump);
	/* written by the caller once the whole claim is queued: one write,
	 * not one per line (each would wake the co-process) */
}

/* The slot of a pipe result: same event_id and lease (the two hashes
 * combined, so that "ab" "c" and "a" "bc" differ). */
static uint32_t
slot_hash(const char *ev, size_t evlen, const char *lease, size_t leaselen)
{
	return rb_fnv1a32(ev, evlen) * 16777619u ^ rb_fnv1a32(lease, leaselen);
}

/* Index slot s (its delivery in place). */
static void
slot_index(struct dispatcher *dp, struct slot *s)
{
	struct pipe_state *ps = dp->kind_state;
	size_t p;

	s->h.pipe.hash = slot_hash(s->d->event_id, strlen(s->d->event_id), s->d->lease, strlen(s->d->lease));
	for (p = s->h.pipe.hash & ps->sidx_mask; ps->sidx[p] != 0; p = (p + 1) & ps->sidx_mask)
		;
	ps->sidx[p] = (int)(s - dp->slots) + 1;
}

static void
slot_unindex(struct dispatcher *dp, struct slot *s)
{
	struct pipe_state *ps = dp->kind_state;
	int want = (int)(s - dp->slots) + 1;
	size_t p = s->h.pipe.hash & ps->sidx_mask, j;

	while (ps->sidx[p] != want) {
		if (ps->sidx[p] == 0)
			return;		/* not indexed */
		p = (p + 1) & ps->sidx_mask;
	}
	/* backward shift: move up every later entry of the run that may sit
	 * at p, so that no probe stops early at the hole */
	for (j = p;;) {
		size_t home;

		j = (j + 1) & ps->sidx_mask;
		if (ps->sidx[j] == 0)
			break;
		home = dp->slots[ps->sidx[j] - 1].h.pipe.hash & ps->sidx_mask;
		if (j > p ? (home <= p || home > j) : (home <= p && home > j)) {
			ps->sidx[p] = ps->sidx[j];
			p = j;
		}
	}
	ps->sidx[p] = 0;
}

static bool
same(const char *s, const char *t, size_t tlen)
{
	return strncmp(s, t, tlen) == 0 && s[tlen] == '\0';
}

static struct slot *
find_slot(struct dispatcher *dp, const char *ev, size_t evlen, const char *lease, size_t leaselen)
{
	struct pipe_state *ps = dp->kind_state;
	uint32_t h = slot_hash(ev, evlen, lease, leaselen);

	for (size_t p = h & ps->sidx_mask; ps->sidx[p] != 0; p = (p + 1) & ps->sidx_mask) {
		struct slot *s = &dp->slots[ps->sidx[p] - 1];

		if (s->h.pipe.hash == h && same(s->d->event_id, ev, evlen) && same(s->d->lease, lease, leaselen))
			return s;
	}
	return NULL;
}
/* The members of a result line that the dispatcher reads. */
static const char *const result_want[] = { "event_id", "lease", "ok", "error", "retry_ms", "dead" };
enum { RW_EVENT_ID, RW_LEASE, RW_OK, RW_ERROR, RW_RETRY_MS, RW_DEAD, RW_N };

/*
 * The members of a result line that matter, as an object: picked from the
 * text when rb_json_scan vouches for it, else parsed in full.  NULL (why
 * says why) when the line is not a JSON object.
 */
static json_t *
result_fields(const char *text, size_t len, char *why, size_t whylen)
{
	struct rb_json_member m[32];
	int n = rb_json_scan(text, len, m, 32);
	json_t *in;

	if (n < 0 || n > 32)
		return rb_jsonl_parse(text, len, &in, why, whylen) < 0 ? NULL : in;
	in = json_object();
	for (int i = 0; i < n; i++)
		for (size_t w = 0; w < RW_N; w++) {
			json_t *v;

			if (m[i].klen != strlen(result_want[w]) || memcmp(m[i].key, result_want[w], m[i].klen) != 0)
				continue;
			if (m[i].type == 't' || m[i].type == 'f' || m[i].type == '0')
				v = m[i].type == 't' ? json_true() : m[i].type == 'f' ? json_false() : json_null();
			else if (m[i].type == '"' && !m[i].escaped)
				v = json_stringn_nocheck(m[i].val + 1, m[i].vlen - 2);
			else
				v = json_loadb(m[i].val, m[i].vlen, JSON_DECODE_ANY, NULL);
			if (v != NULL)
				json_object_set_new(in, result_want[w], v);
		}
	return in;
}

/*
 * A plain success, told from the text alone (a co-process echoes the
 * whole delivery line: parsing it, or even building an object of the
 * members that matter, was most of our CPU): event_id and lease plain
 * strings, "ok" true or missing, no "error", "retry_ms" or "dead".  Its
 * slot, or NULL when the line needs a closer look (result_fields).
 */
static struct slot *
plain_success(struct dispatcher *dp, const char *text, size_t len)
{
	struct rb_json_member m[32];
	const struct rb_json_member *at[RW_N] = { 0 };
	int n = rb_json_scan(text, len, m, 32);

	if (n < 0 || n > 32)
		return NULL;
	for (int i = 0; i < n; i++) {
		/* (every member is looked at: the wanted ones are spread over a
		 * line of a dozen) */
		if (m[i].klen < 2 || m[i].klen > 8)
			continue;
		for (size_t w = 0; w < RW_N; w++)
			if (m[i].klen == strlen(result_want[w]) && memcmp(m[i].key, result_want[w], m[i].klen) == 0) {
				at[w] = &m[i];
				break;
			}
	}
	if (at[RW_EVENT_ID] == NULL || at[RW_EVENT_ID]->type != '"' || at[RW_EVENT_ID]->escaped ||
	    at[RW_LEASE] == NULL || at[RW_LEASE]->type != '"' || at[RW_LEASE]->escaped ||
	    (at[RW_OK] != NULL && at[RW_OK]->type != 't') ||
	    at[RW_ERROR] != NULL || at[RW_RETRY_MS] != NULL || at[RW_DEAD] != NULL)
		return NULL;
	return find_slot(dp, at[RW_EVENT_ID]->val + 1, at[RW_EVENT_ID]->vlen - 2,
	    at[RW_LEASE]->val + 1, at[RW_LEASE]->vlen - 2);
}

static void
proc_result(struct dispatcher *dp, int i, const char *text, size_t len)
{
	struct pipe_state *ps = dp->kind_state;
	json_t *in, *r;
	const json_t *ev, *lease, *v;
	struct slot *s;
	char why[256];
	struct rb_error err = { 0 };

	if ((s = plain_success(dp, text, len)) != NULL) {
		ps->procs[i].backoff_ms = 0;	/* it works: a later crash restarts it at once */
		finish_slot(dp, s, NULL);
		return;
	}
	if ((in = result_fields(text, len, why, sizeof why)) == NULL) {
		rb_warn("co-process %d: line %ld: %s: ignored", i, rb_jsonl_lineno(ps->procs[i].rd), why);
		return;
	}
	ev = json_object_get(in, "event_id");
	lease = json_object_get(in, "lease");
	if (!json_is_string(ev) || !json_is_string(lease)) {
		rb_warn("co-process %d: line %ld: no event_id and lease: ignored", i,
		    rb_jsonl_lineno(ps->procs[i].rd));
		goto out;
	}
	s = find_slot(dp, json_string_value(ev), json_string_length(ev), json_string_value(lease),
	    json_string_length(lease));
	if (s == NULL) {
		rb_info("co-process %d: result for %s (lease %s) not in flight (timed out?): ignored",
		    i, json_string_value(ev), json_string_value(lease));
		goto out;
	}
	/* the result is our delivery plus the handler's verdict */
	r = rb_dl_result(s->d);
	if ((v = json_object_get(in, "ok")) != NULL)
		json_object_set(r, "ok", (json_t *)v);
	if ((v = json_object_get(in, "error")) != NULL)
		json_object_set(r, "error", (json_t *)v);
	if ((v = json_object_get(in, "retry_ms")) != NULL)
		json_object_set(r, "retry_ms", (json_t *)v);
	if ((v = json_object_get(in, "dead")) != NULL)
		json_object_set(r, "dead", (json_t *)v);
	if (rb_result_validate(r, &err) < 0) {
		rb_warn("co-process %d: line %ld: %s: counted as a failure", i,
		    rb_jsonl_lineno(ps->procs[i].rd), err.msg);
		json_decref(r);
		r = result_fail(s->d, err.msg);
	} else if (!json_is_false(json_object_get(r, "ok")) && !json_is_true(json_object_get(r, "dead"))) {
		json_decref(r);		/* a success */
		r = NULL;
	} else if (!json_is_string(json_object_get(r, "error"))) {
		json_object_set_new(r, "error", json_string("handler failed"));
	}
	ps->procs[i].backoff_ms = 0;	/* it works: a later crash restarts it at once */
	finish_slot(dp, s, r);
out:
	json_decref(in);
}

/* Read the results a co-process has written. */
static void
proc_read(struct dispatcher *dp, int i)
{
	struct pipe_state *ps = dp->kind_state;
	struct coproc *c = &ps->procs[i];
	const char *line;
	size_t len;

	while (c->out_fd >= 0) {
		int rc = rb_jsonl_next(c->rd, 0, &line, &len);

		if (rc == RB_JSONL_LINE)
			proc_result(dp, i, line, len);
		else if (rc == RB_JSONL_TOOLONG)
			rb_warn("co-process %d: line %ld too long: ignored", i, rb_jsonl_lineno(c->rd));
		else if (rc == RB_JSONL_AGAIN)
			return;
		else {	/* EOF or error: it is going away */
			close(c->out_fd);
			c->out_fd = -1;
			if (c->in_fd >= 0) {
				close(c->in_fd);
				c->in_fd = -1;
			}
			if (c->pid > 0)
				kill(-c->pid, SIGTERM);
		}
	}
}

/* A co-process ended: fail what it had in flight, restart it with backoff. */
static void
proc_exited(struct dispatcher *dp, int i, int status)
{
	struct pipe_state *ps = dp->kind_state;
	struct coproc *c = &ps->procs[i];
	int64_t now = rb_mono_ms();
	char msg[200];

	if (c->out_fd >= 0)
		proc_read(dp, i);	/* results written just before the end */
	if (c->out_fd >= 0)
		close(c->out_fd);
	if (c->in_fd >= 0)
		close(c->in_fd);
	c->in_fd = c->out_fd = -1;
	rb_jsonl_reader_free(c->rd);
	c->rd = NULL;
	c->pid = 0;
	c->wlen = c->woff = 0;
	if (WIFEXITED(status))
		snprintf(msg, sizeof msg, "handler process exited with status %d", WEXITSTATUS(status));
	else
		snprintf(msg, sizeof msg, "handler process killed by signal %d", WTERMSIG(status));
	for (int k = 0; k < dp->opt.concurrency; k++)
		if (dp->slots[k].used && dp->slots[k].h.pipe.proc == i)
			finish_slot(dp, &dp->slots[k], dp->stop_level > 0 ? result_release(dp->slots[k].d) :
			    result_fail(dp->slots[k].d, msg));
	c->inflight = 0;
	if (dp->stop_level > 0)
		return;
	if (now - c->started > 10000)
		c->backoff_ms = 0;
	c->backoff_ms = c->backoff_ms == 0 ? 100 : (c->backoff_ms * 2 > 10000 ? 10000 : c->backoff_ms * 2);
	c->restart_at = now + c->backoff_ms;
	rb_warn("co-process %d: %s; restarting in %" PRId64 "ms", i, msg, c->backoff_ms);
}

/* The co-processes and the slot index, then the co-processes started. */
static void
pipe_begin(struct dispatcher *dp)
{
	struct pipe_state *ps = xcalloc(1, sizeof *ps);

	dp->kind_state = ps;
	ps->procs = xcalloc((size_t)dp->opt.procs, sizeof *ps->procs);
	for (int i = 0; i < dp->opt.procs; i++)
		ps->procs[i].in_fd = ps->procs[i].out_fd = -1;
	for (ps->sidx_mask = 1; ps->sidx_mask < 2 * (size_t)dp->opt.concurrency; ps->sidx_mask <<= 1)
		;
	ps->sidx = xcalloc(ps->sidx_mask, sizeof *ps->sidx);
	ps->sidx_mask--;
	for (int i = 0; i < dp->opt.procs; i++)
		proc_start(dp, i);
}

/* To the co-process with the fewest in flight; none running: released. */
static void
pipe_start(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	struct pipe_state *ps = dp->kind_state;
	struct slot *s = slot_take(dp, d, gen, followers);
	int best = -1;

	s->h.pipe.proc = -1;
	for (int i = 0; i < dp->opt.procs; i++)
		if (ps->procs[i].pid > 0 && ps->procs[i].in_fd >= 0 &&
		    (best < 0 || ps->procs[i].inflight < ps->procs[best].inflight))
			best = i;
	if (best < 0) {
		finish_slot(dp, s, result_release(d));
		return;
	}
	s->h.pipe.proc = best;
	ps->procs[best].inflight++;
	slot_index(dp, s);
	proc_send(&ps->procs[best], d);
}

static void
pipe_release(struct dispatcher *dp, struct slot *s)
{
	struct pipe_state *ps = dp->kind_state;

	if (s->h.pipe.proc >= 0) {
		ps->procs[s->h.pipe.proc].inflight--;
		slot_unindex(dp, s);
	}
}

/* The co-process goes on; a late result for the slot is ignored. */
static void
pipe_cancel(struct dispatcher *dp, struct slot *s, enum cancel why)
{
	char msg[100];

	if (why == CANCEL_ABORT) {
		finish_slot(dp, s, result_release(s->d));
		return;
	}
	snprintf(msg, sizeof msg, "timed out after %" PRId64 "ms", dp->opt.timeout_ms);
	finish_slot(dp, s, result_fail(s->d, msg));
}

static void
pipe_exited(struct dispatcher *dp, pid_t pid, int status)
{
	struct pipe_state *ps = dp->kind_state;

	for (int i = 0; i < dp->opt.procs; i++)
		if (ps->procs[i].pid == pid) {
			proc_exited(dp, i, status);
			break;
		}
}

static void
pipe_flush(struct dispatcher *dp)
{
	struct pipe_state *ps = dp->kind_state;

	for (int i = 0; i < dp->opt.procs; i++)
		proc_write(&ps->procs[i]);
}

static bool
pipe_accepting(const struct dispatcher *dp)
{
	const struct pipe_state *ps = dp->kind_state;

	for (int i = 0; i < dp->opt.procs; i++)
		if (ps->procs[i].pid > 0 && ps->procs[i].in_fd >= 0)
			return true;
	return false;
}

static void
pipe_tick(struct dispatcher *dp, int64_t now)
{
	struct pipe_state *ps = dp->kind_state;

	for (int i = 0; i < dp->opt.procs; i++)
		if (ps->procs[i].pid == 0 && ps->procs[i].restart_at > 0 && now >= ps->procs[i].restart_at)
			proc_start(dp, i);
}

/* Each co-process's stdout (ref 2i), its stdin while a write is pending
 * (ref 2i + 1), and its restart time. */
static int
pipe_pollfds(struct dispatcher *dp, struct pollfd *pfd, int *ref, int64_t *until)
{
	struct pipe_state *ps = dp->kind_state;
	int n = 0;

	for (int i = 0; i < dp->opt.procs; i++) {
		struct coproc *c = &ps->procs[i];

		if (c->out_fd >= 0) {
			pfd[n].fd = c->out_fd;
			pfd[n].events = POLLIN;
			ref[n++] = 2 * i;
		}
		if (c->in_fd >= 0 && c->wlen > c->woff) {
			pfd[n].fd = c->in_fd;
			pfd[n].events = POLLOUT;
			ref[n++] = 2 * i + 1;
		}
		if (c->pid == 0 && c->restart_at > 0)
			*until = min_deadline(*until, c->restart_at);
	}
	return n;
}

static void
pipe_ready(struct dispatcher *dp, int ref)
{
	struct pipe_state *ps = dp->kind_state;

	if (ref % 2 == 1)
		proc_write(&ps->procs[ref / 2]);
	else
		proc_read(dp, ref / 2);
}

/* EOF on their stdin, the polite way to end a filter; SIGKILL after 2s. */
static void
pipe_stop(struct dispatcher *dp)
{
	struct pipe_state *ps = dp->kind_state;
	int64_t until;

	for (int i = 0; i < dp->opt.procs; i++)
		if (ps->procs[i].in_fd >= 0) {
			close(ps->procs[i].in_fd);
			ps->procs[i].in_fd = -1;
		}
	until = rb_mono_ms() + 2000;
	for (;;) {
		bool any = false;

		reap(dp);
		for (int i = 0; i < dp->opt.procs; i++)
			any = any || ps->procs[i].pid > 0;
		if (!any)
			break;
		if (rb_mono_ms() >= until) {
			for (int i = 0; i < dp->opt.procs; i++)
				if (ps->procs[i].pid > 0)
					kill(-ps->procs[i].pid, SIGKILL);
			until = rb_mono_ms() + 60000;
		}
		usleep(10000);
	}
}

static void
pipe_fini(struct dispatcher *dp)
{
	struct pipe_state *ps = dp->kind_state;

	if (ps == NULL)
		return;
	for (int i = 0; i < dp->opt.procs; i++) {
		rb_jsonl_reader_free(ps->procs[i].rd);
		free(ps->procs[i].wbuf);
	}
	free(ps->procs);
	free(ps->sidx);
	free(ps);
}

/*
 * Co-processes take many deliveries at once at no cost; processes and
 * SQL transactions do not (bench/README.md: --pipe drains 4x faster with
 * 200 in flight than with 10).  3200 in flight, claimed 800 at a time:
 * one claim's worth running, one being read (rb_store_fetch_send) while
 * the next claim is made, and the results of a fourth waiting for their
 * completion.  A claim costs about a millisecond whatever it takes: a
 * 50,000 backlog drained 1.25x faster than with 800 claimed 200 at a
 * time, with 16% less CPU a delivery (two dispatchers: 1.11x, 10%); 1600
 * or 6400 in flight did worse.  Chains of 32, so that the last keys of a
 * backlog do not trickle out 8 per claim (a mixed 50,000 backlog drained
 * 14% faster).
 */
static const struct handler_kind handler_pipe = {
	.option = "--pipe",
	.concurrency = 3200, .batch = 800, .chain = 32,
	.line_text = true,
	.begin = pipe_begin,
	.start = pipe_start,
	.release = pipe_release,
	.cancel = pipe_cancel,
	.exited = pipe_exited,
	.flush = pipe_flush,
	.accepting = pipe_accepting,
	.tick = pipe_tick,
	.pollfds = pipe_pollfds,
	.ready = pipe_ready,
	.stop = pipe_stop,
	.fini = pipe_fini,
};

/* ---- --sql: the statement runs in the completion ---- */

/* Its result is a success at once: the statement runs, and commits or
 * fails, in the transaction that completes it (flush_results). */
static void
sql_start(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	queue_result(dp, d, result_ok(d), gen, followers);
}

static const struct handler_kind handler_sql = {
	.option = "--sql",
	.concurrency = 10, .batch = RB_DEFAULT_BATCH, .chain = 8,
	.line_text = false,
	.at_once = true,
	.start = sql_start,
};

static void
reap(struct dispatcher *dp)
{
	int status;
	pid_t pid;

	got_child = 0;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		if (dp->opt.kind->exited != NULL)
			dp->opt.kind->exited(dp, pid, status);
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

/* ---- the delivery loop ------------------------------------------------------------------- */

/* When the next claim is due (now, or the next --poll); 0: no claim possible. */
static int64_t
claim_due(struct dispatcher *dp, int64_t now)
{
	int free_slots = dp->opt.concurrency - dp->running - (int)dp->nqueue - dp->nwait - dp->nfetch;
	int low = dp->opt.batch < dp->opt.concurrency ? dp->opt.batch : dp->opt.concurrency;

	low = low / 4 > 1 ? low / 4 : 1;
	if (dp->db_down || dp->claiming || (dp->completing && dp->opt.conns < 3) || dp->fetch_waiting.v != NULL || dp->stop_level > 0 ||
	    dp->fatal_code != 0 ||
	    free_slots <= 0 ||
	    (dp->opt.kind->accepting != NULL && !dp->opt.kind->accepting(dp)))
		return 0;
	if (dp->wake || now >= dp->next_poll || (dp->more_work && (free_slots >= low || dp->running + (int)dp->nqueue + dp->nfetch == 0)))
		return now;
	return dp->next_poll;
}

/*
 * Start what a claim brought.  The deliveries of one key come in sequence
 * order, each lane's together (--chain): the first is started, the rest
 * wait in a chain behind it (flush_results starts the next one once the
 * previous one's completion committed).
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

/* A chain's turn: start its next delivery (go), or hand them all back. */
static void
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

/*
 * Take the answer to the claim that is out, waiting for it or only if it
 * has arrived.  Every other database call collects it first (one
 * statement at a time on the connection); in between, the loop serves
 * the handlers while the database works on the claim.
 */
static void
claim_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	struct claimed got = { 0 };
	int n;

	if (!dp->claiming)
		return;
	n = rb_store_claim_recv(dp->store, wait, &got.v, &err);
	if (n == RB_CLAIM_PENDING)
		return;
	dp->claiming = false;
	if (n < 0) {
		db_error(dp, &err, "claim");
		return;
	}
	got.n = (size_t)n;
	rb_debug("claimed %d (asked %d%s)", n, dp->claim_asked, dp->claim_searched ? "" : ", held lanes only");
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
	if (dp->opt.conns == 1) {
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
static void
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
	if (rb_store_fetch_send(dp->store, dp->fetch_out.v, dp->fetch_out.n, dp->opt.kind->line_text, &err) < 0) {
		fetch_drop(dp, &dp->fetch_out, dp->fetch_gen);
		db_error(dp, &err, "fetch");
		return;
	}
	dp->fetching = true;
}

/* Take the events of the fetch that is out, and start its deliveries. */
static void
fetch_collect(struct dispatcher *dp, bool wait)
{
	struct rb_error err = { 0 };
	struct claimed got;
	size_t k = 0;
	int n;

	if (!dp->fetching)
		return;
	n = rb_store_fetch_recv(dp->store, wait, &err);
	if (n == RB_CLAIM_PENDING)
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
 * owner generation: the claim need not look them up (rb_claim_opts.live).
 */
static size_t
live_ids(struct dispatcher *dp, int64_t **ids, int **lanes, size_t *cap)
{
	size_t n = 0, want = dp->nqueue + dp->fetch_out.n + dp->fetch_waiting.n;

	/* counted, not derived from running, nqueue and nwait: a slip in
	 * those counters must not write past the end */
	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used)
			want += 1 + chain_len(dp->slots[i].followers);
	for (size_t i = 0; i < dp->nqueue; i++)
		want += chain_len(dp->queue[i].followers);
	if (*cap < want) {
		*cap = want;
		*ids = xrealloc(*ids, want * sizeof **ids);
		*lanes = xrealloc(*lanes, want * sizeof **lanes);
	}
#define LIVE(dl) do { (*ids)[n] = (dl)->id; (*lanes)[n++] = (dl)->lane; } while (0)
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

static void
maybe_claim(struct dispatcher *dp, int64_t now)
{
	int free_slots = dp->opt.concurrency - dp->running - (int)dp->nqueue - dp->nwait - dp->nfetch;
	struct rb_claim_opts claim;
	struct rb_error err = { 0 };
	int64_t due = claim_due(dp, now);

	if (due == 0 || due > now)
		return;
	claim = (struct rb_claim_opts){ .handler = dp->opt.handler, .owner = dp->owners[dp->cur_gen % NOWNERS].name,
	    .batch = free_slots < dp->opt.batch ? free_slots : dp->opt.batch, .lease_ms = dp->opt.lease_ms,
	    .max_attempts = dp->opt.complete.max_attempts };
	claim.n_live = live_ids(dp, &dp->live, &dp->live_lanes, &dp->live_cap);
	claim.chain = dp->opt.chain;
	claim.line_text = dp->opt.kind->line_text;
	/* (never NULL: NULL would mean "unknown", and the claim would take
	 * whatever a lane lists as in flight for running) */
	claim.live = dp->live != NULL ? dp->live : (const int64_t[]){ 0 };
	claim.live_lanes = dp->live_lanes != NULL ? dp->live_lanes : (const int[]){ 0 };
	claim.apart = dp->opt.conns >= 2;
	/* look for more lanes unless the last look found too few and nothing
	 * changed since; a claim with nothing running always looks (its
	 * answer decides --drain and idleness) */
	claim.no_search = dp->lanes_dry && !dp->wake && now < dp->next_poll && dp->running + (int)dp->nqueue > 0;
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

static void
extend_leases(struct dispatcher *dp, int64_t now)
{
	struct rb_error err = { 0 };

	dp->next_extend = now + dp->opt.lease_ms / 3;
	db_settle(dp);
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
static void
retire_owners(struct dispatcher *dp)
{
	struct rb_error err = { 0 };

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &dp->owners[i];

		if (o->name == NULL || o->gen == dp->cur_gen || o->count > 0)
			continue;
		db_settle(dp);
		if (dp->db_down)
			return;
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

static void
stats_line(struct dispatcher *dp, int64_t now, int64_t *last)
{
	double secs = (double)(now - *last) / 1000.0;

	rb_notice("claimed %ld, completed %ld, failed %ld (buried %ld), released %ld, lost %ld, "
	    "in flight %d, %.1f/s", dp->stats.claimed, dp->stats.completed, dp->stats.rescheduled + dp->stats.buried, dp->stats.buried,
	    dp->stats.released, dp->stats.lost, dp->running + (int)dp->nqueue + dp->nwait + dp->nfetch,
	    secs > 0 ? (double)(dp->stats.completed - dp->stats.completed_at_last_stats) / secs : 0.0);
	dp->stats.completed_at_last_stats = dp->stats.completed;
	*last = now;
}

static int64_t
min_deadline(int64_t a, int64_t b)
{
	return a == 0 ? b : (b == 0 || a < b ? a : b);
}

/* What a pollfd is for: the loop's own are negative, the handler kind's its own numbers. */
enum { REF_SIGNALS = -1, REF_DB = -2, REF_FETCH = -3, REF_COMPLETE = -4 };

/* One poll: compute the next deadline, wait, and serve the ready fds. */
static void
wait_and_serve(struct dispatcher *dp, int64_t now, struct pollfd *pfd, int *ref)
{
	int64_t until = now + 1000;
	int n = 0, timeout, dbfd = -1, pr;

	/* libpq may hold the claim's answer already (read along with a
	 * notification): the socket would not wake us for it */
	if (!dp->db_down) {
		claim_collect(dp, false);
		complete_collect(dp, false);
		fetch_collect(dp, false);
	}
	pfd[n].fd = sigpipe_fd[0];
	pfd[n].events = POLLIN;
	ref[n++] = REF_SIGNALS;
	if (!dp->db_down && (dbfd = rb_store_socket(dp->store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = REF_DB;
	}
	if (!dp->db_down && (dbfd = rb_store_fetch_socket(dp->store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = REF_FETCH;
	}
	if (!dp->db_down && (dbfd = rb_store_complete_socket(dp->store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = REF_COMPLETE;
	}
	if (dp->db_down)
		until = min_deadline(until, dp->reconnect_at);
	else {
		/* (while a statement is out, its answer on the socket wakes us) */
		if (dp->nqueue > 0 && !dp->completing && (!dp->claiming || dp->opt.conns == 3))
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
	n += dp->opt.kind->pollfds != NULL ? dp->opt.kind->pollfds(dp, pfd + n, ref + n, &until) : 0;
	timeout = until <= now ? 0 : (int)(until - now);
	if (got_child || got_stop > dp->stop_level)
		timeout = 0;
	pr = poll(pfd, (nfds_t)n, timeout);
	if (pr < 0 && errno != EINTR)
		rb_die_errno(RB_EXIT_OSERR, "poll");
	for (int k = 0; pr > 0 && k < n; k++) {
		if (pfd[k].revents == 0)
			continue;
		if (ref[k] == REF_FETCH) {
			if (!dp->db_down)
				fetch_collect(dp, false);
		} else if (ref[k] == REF_COMPLETE) {
			if (!dp->db_down)
				complete_collect(dp, false);
		} else if (ref[k] == REF_SIGNALS) {
			char buf[64];

			while (read(sigpipe_fd[0], buf, sizeof buf) > 0)
				;
		} else if (ref[k] == REF_DB) {
			struct rb_error err = { 0 };
			int hit;

			claim_collect(dp, false);	/* first: the answer may be all that came before a break */
			complete_collect(dp, false);
			if (dp->db_down)
				continue;
			hit = rb_store_notified(dp->store, dp->opt.handler, 0, &err);

			if (hit < 0)
				db_error(dp, &err, "notification");
			else if (hit > 0) {
				rb_debug("woken by a notification");
				dp->wake = true;
			}
			claim_collect(dp, false);	/* and what the notification read brought along */
			complete_collect(dp, false);
		} else
			dp->opt.kind->ready(dp, ref[k]);
	}
}

static void
hand_back_lanes(struct dispatcher *dp)
{
	struct rb_error err = { 0 };

	db_settle(dp);
	if (dp->db_down)
		return;

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

static int
run(struct dispatcher *dp)
{
	size_t npfd = (size_t)dp->opt.concurrency + 2 * (size_t)dp->opt.procs + 4;
	struct pollfd *pfd = xcalloc(npfd, sizeof *pfd);
	int *ref = xcalloc(npfd, sizeof *ref);
	int64_t last_stats = rb_mono_ms();
	int exit_code = RB_EXIT_OK;
	struct rb_error err = { 0 };

	if (rb_store_listen(dp->store, &err) < 0)
		db_error(dp, &err, "listen");
	if (dp->opt.stats_ms > 0)
		dp->next_stats = last_stats + dp->opt.stats_ms;
	if (dp->opt.kind->begin != NULL)
		dp->opt.kind->begin(dp);
	for (;;) {
		int64_t now = rb_mono_ms();

		if (got_child)
			reap(dp);
		if (got_stop > 0 && dp->stop_level == 0) {
			rb_info("stopping: waiting up to %" PRId64 "ms for %d running handlers",
			    dp->opt.grace_ms, dp->running);
			dp->stop_level = 1;
			dp->grace_deadline = now + dp->opt.grace_ms;
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
		if (dp->stop_level == 0 && dp->opt.kind->tick != NULL)
			dp->opt.kind->tick(dp, now);
		if (dp->db_down && now >= dp->reconnect_at)
			try_reconnect(dp, now);
		if (!dp->db_down && dp->nqueue > 0 && (now >= dp->queue_since + dp->opt.window_ms || dp->stop_level > 0 ||
		    dp->nqueue >= 1000 || dp->opt.kind->at_once))
			flush_results(dp);
		if (!dp->db_down && dp->next_extend > 0 && now >= dp->next_extend)
			extend_leases(dp, now);
		if (!dp->db_down)
			retire_owners(dp);
		maybe_claim(dp, now);
		if (!dp->db_down && dp->nqueue > 0 && dp->opt.kind->at_once)
			flush_results(dp);	/* --sql: the results are ready at once */
		if (!dp->db_down) {
			/* notifications that came in during our statements */
			struct rb_error nerr = { 0 };
			int hit = rb_store_notified(dp->store, dp->opt.handler, 0, &nerr);

			if (hit < 0)
				db_error(dp, &nerr, "notification");
			else if (hit > 0)
				dp->wake = true;
		}
		if (dp->next_stats > 0 && now >= dp->next_stats) {
			stats_line(dp, now, &last_stats);
			dp->next_stats = now + dp->opt.stats_ms;
		}
		if (dp->running == 0 && dp->nqueue == 0 && !dp->claiming && !dp->fetching && dp->fetch_waiting.v == NULL) {
			if (dp->stop_level > 0)
				break;
			if (dp->opt.drain && dp->idle_seen && !dp->db_down && dp->fatal_code == 0) {
				rb_info("drained: nothing due, nothing in flight");
				break;
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
	rb_info("%ld claimed, %ld completed, %ld rescheduled, %ld buried, %ld released, %ld lost",
	    dp->stats.claimed, dp->stats.completed, dp->stats.rescheduled, dp->stats.buried, dp->stats.released, dp->stats.lost);
	free(pfd);
	free(ref);
	if (dp->fatal_code != 0)
		return dp->fatal_code;
	return exit_code;
}

/* Keep fds 0-2 open so that pipes never land on them. */
static void
guard_std_fds(void)
{
	int fd;

	while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= 2)
		;
	if (fd > 2)
		close(fd);
}

/* A dispatcher for these options (copied): its slots and owner name, no store yet. */
static struct dispatcher *
dispatcher_new(const struct dispatch_opts *o)
{
	struct dispatcher *dp = xcalloc(1, sizeof *dp);

	dp->opt = *o;
	dp->wake = true;
	dp->reconnect_backoff = 100;
	dp->owner_base = o->owner != NULL ? xstrdup(o->owner) : rb_cli_owner();
	dp->slots = xcalloc((size_t)o->concurrency, sizeof *dp->slots);
	dp->free_slot = xcalloc((size_t)o->concurrency, sizeof *dp->free_slot);
	for (int i = o->concurrency; i-- > 0;)
		dp->free_slot[dp->nfree_slot++] = i;
	return dp;
}

/* Dispatch through store (borrowed) until drained, stopped or failed; the exit code. */
static int
dispatcher_run(struct dispatcher *dp, struct rb_store *store)
{
	dp->store = store;
	new_owner(dp);
	rb_info("dispatching %s as %s (concurrency %d, batch %d, chain %d)", dp->opt.handler,
	    dp->owner_base, dp->opt.concurrency, dp->opt.batch, dp->opt.chain);
	return run(dp);
}

static void
dispatcher_free(struct dispatcher *dp)
{
	for (int i = 0; i < NOWNERS; i++)
		free(dp->owners[i].name);
	for (size_t i = 0; i < dp->nqueue; i++) {
		rb_dl_free(dp->queue[i].d);
		json_decref(dp->queue[i].r);
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

int
main(int argc, char **argv)
{
	struct dispatcher *dp;
	struct rb_store *store;
	int exit_code;

	guard_std_fds();
	rb_cli_init("rb-dispatch", &opt.common);
	parse_args(argc, argv);
	rb_log_set_prefix(opt.dispatch.handler);
	dp = dispatcher_new(&opt.dispatch);
	setup_signals();
	store = rb_cli_open(&opt.common);
	exit_code = dispatcher_run(dp, store);
	rb_store_close(store);
	dispatcher_free(dp);
	return exit_code;
}
