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

enum mode { MODE_NONE, MODE_EXEC, MODE_PIPE, MODE_SQL };

static struct options {
	struct rb_common	common;
	const char		*handler;
	enum mode		 mode;
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
	struct rb_complete_opts	 co;
} opt = { .concurrency = 0, .batch = 0, .chain = 0, .procs = 1, .conns = 2,
	  .lease_ms = RB_DEFAULT_LEASE_MS, .timeout_ms = 5 * 60 * 1000, .grace_ms = 30000,
	  .poll_ms = 1000, .window_ms = 2,
	  .co = { .max_attempts = RB_DEFAULT_MAX_ATTEMPTS,
		  .backoff = { .base_ms = 1000, .max_ms = 300000, .factor = 2.0 } } };

/* The deliveries of one key behind the one that runs: v[at], v[at + 1], ... v[n - 1]. */
struct chain {
	struct rb_dl	**v;
	size_t		 n, at;
};

/* Claimed deliveries (an array of n, the array and them owned). */
struct dlv {
	struct rb_dl	**v;
	size_t		 n;
};

/*
 * A delivery in flight.  Exec: its child, and the line still to write to
 * the child's stdin.  Pipe: the co-process it was handed to.
 */
struct slot {
	bool	 used;
	bool	 timed_out;	/* exec: killed at --timeout */
	bool	 aborted;	/* exec: killed at shutdown: release */
	struct rb_dl *d;	/* the claimed delivery */
	unsigned gen;		/* lease owner generation that claimed it */
	int64_t	 deadline;	/* --timeout; 0: none (any more) */
	pid_t	 pid;
	int	 in_fd;
	char	*wbuf;
	size_t	 wlen, woff;
	int	 proc;
	struct chain *followers;	/* the rest of its key's chain, or NULL */
	uint32_t hash;		/* --pipe: of its event_id and lease (slot_index) */
};

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
struct pending {
	struct rb_dl *d;
	json_t	*r;		/* the result to apply; NULL: d succeeded (no --sql) */
	unsigned gen;
	struct chain *followers;	/* the rest of its key's chain, or NULL */
};

static struct rb_store	*store;
/*
 * --pipe: the slots handed to a co-process, by event_id and lease, for
 * the results that come back (a scan of every slot was a tenth of our
 * CPU at 800 in flight).  Open addressing with linear probing and
 * deletion by backward shift; entries are slot numbers + 1, 0 is empty.
 */
static int		*sidx;
static size_t		 sidx_mask;
static struct slot	*slots;
static int		 running;	/* used slots */
static int		*free_slot;	/* the free slots' indexes (a stack) ... */
static int		 nfree_slot;	/* ... this many */
static int64_t		 next_deadline;	/* no slot's deadline is earlier (0: none) */
static struct coproc	*procs;
static struct owner	 owners[NOWNERS];
static unsigned		 cur_gen;
static char		*owner_base;
static struct pending	*queue;
static size_t		 nqueue, capqueue;
static int		 nwait;		/* chain followers waiting for their turn */
static int64_t		 queue_since;

static int		 sigpipe_fd[2] = { -1, -1 };
static volatile sig_atomic_t got_stop, got_child;

static bool	db_down;
static int64_t	reconnect_at, reconnect_backoff = 100;
static bool	wake = true;		/* claim at the next chance */
static bool	more_work;		/* the last claim found work: claim again when slots free */
static bool	claiming;		/* a claim is out: the handlers are served meanwhile */
static bool	completing;		/* a completion is out (flush_results) ... */
static size_t	ncompleting;		/* ... of the first this many queued results ... */
static struct rb_dl **completing_v;	/* ... sent as this array (theirs) */
static unsigned	claim_gen;		/* the owner generation it was sent for */
/* A claim answers with ids; the delivery lines are read on the store's
 * second connection (rb_store_fetch_send) while the next claim runs. */
static bool	fetching;		/* a fetch is out ... */
static struct dlv fetch_cur;		/* ... of these claimed ... */
static unsigned	fetch_gen;		/* ... for this owner generation */
static struct dlv fetch_next;		/* a claim's answer waiting for the fetch out */
static unsigned	fetch_next_gen;
static int	nfetch;			/* deliveries in fetch_cur and fetch_next */
static int	claim_asked;
static bool	claim_searched;		/* ... and whether it looked for more lanes */
static bool	lanes_dry;		/* a look for more lanes found too few: do not look again until woken or polling */
static void	claim_collect(bool wait);
static void	complete_collect(bool wait);
static void	fetch_collect(bool wait);
static void	fetch_send(struct dlv got, unsigned gen);
static void	start_chains(struct dlv got, unsigned gen);
static void	slot_unindex(struct slot *s);
static void	start_claimed(struct dlv got, unsigned gen);
static void	fetch_drop(struct dlv *got, unsigned gen);
static void	db_settle(void);
static void	start_delivery(struct rb_dl *d, unsigned gen, struct chain *followers);
static void	chain_next(struct chain *followers, unsigned gen, bool go);
static void	proc_write(struct coproc *c);
static int64_t	min_deadline(int64_t a, int64_t b);
static bool	idle_seen;		/* the last claim found nothing, and nothing completed since */
static bool	progress_since_claim;	/* a completion went through after the claim out was sent */
static int64_t	next_poll, next_extend, next_stats;
static int	stop_level;		/* 0 running, 1 stopping (grace), 2 aborted */
static int64_t	grace_deadline;
static int	fatal_code;

static struct {
	long	claimed, completed, rescheduled, buried, released, lost;
	long	completed_at_last_stats;
} st;

/* ---- options ------------------------------------------------------------- */

static void
set_mode(enum mode m, const char *arg)
{
	if (opt.mode != MODE_NONE)
		rb_cli_usage_error(usage_str, "give one of --exec, --pipe and --sql");
	if (*arg == '\0')
		rb_cli_usage_error(usage_str, "%s: empty", m == MODE_SQL ? "--sql" :
		    m == MODE_EXEC ? "--exec" : "--pipe");
	opt.mode = m;
	if (m == MODE_SQL)
		opt.co.sql = arg;
	else
		opt.cmd = arg;
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
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "H:c:b:l:t:m:", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'H':
			opt.handler = rb_cli_handler(usage_str, optarg);
			break;
		case OPT_EXEC:
			set_mode(MODE_EXEC, optarg);
			break;
		case OPT_PIPE:
			set_mode(MODE_PIPE, optarg);
			break;
		case OPT_SQL:
			set_mode(MODE_SQL, optarg);
			break;
		case 'c':
			opt.concurrency = rb_cli_int(usage_str, "--concurrency", optarg, 1, 10000);
			break;
		case 'b':
			opt.batch = rb_cli_int(usage_str, "--batch", optarg, 1, 10000);
			break;
		case OPT_CHAIN:
			opt.chain = rb_cli_int(usage_str, "--chain", optarg, 1, 1000);
			break;
		case OPT_CONNS:
			opt.conns = rb_cli_int(usage_str, "--connections", optarg, 1, 3);
			break;
		case OPT_PROCS:
			opt.procs = rb_cli_int(usage_str, "--procs", optarg, 1, 1000);
			break;
		case 'l':
			opt.lease_ms = rb_cli_lease(usage_str, optarg, 300);
			break;
		case 't':
			opt.timeout_ms = rb_cli_duration(usage_str, "--timeout", optarg);
			if (opt.timeout_ms < 1)
				rb_cli_usage_error(usage_str, "--timeout: at least 1ms");
			break;
		case OPT_GRACE:
			opt.grace_ms = rb_cli_duration(usage_str, "--grace", optarg);
			break;
		case 'm':
			opt.co.max_attempts = rb_cli_int(usage_str, "--max-attempts", optarg, 1, 1000000);
			break;
		case OPT_BACKOFF:
			rb_cli_backoff(usage_str, "--backoff", optarg, &opt.co.backoff);
			break;
		case OPT_POLL:
			opt.poll_ms = rb_cli_duration(usage_str, "--poll", optarg);
			if (opt.poll_ms < 10)
				rb_cli_usage_error(usage_str, "--poll: at least 10ms");
			break;
		case OPT_WINDOW:
			opt.window_ms = rb_cli_duration(usage_str, "--window", optarg);
			break;
		case OPT_STATS:
			opt.stats_ms = rb_cli_duration(usage_str, "--stats-every", optarg);
			break;
		case OPT_OWNER:
			opt.owner = rb_cli_owner_arg(usage_str, optarg, 180);
			break;
		case OPT_DRAIN:
			opt.drain = true;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
	if (opt.handler == NULL)
		rb_cli_usage_error(usage_str, "--handler is required");
	if (opt.mode == MODE_NONE)
		rb_cli_usage_error(usage_str, "a handler is required: --exec, --pipe or --sql");
	/* co-processes take many deliveries at once at no cost; processes and
	 * SQL transactions do not (bench/README.md: --pipe drains 4x faster
	 * with 200 in flight than with 10) */
	/* --pipe: 3200 in flight, claimed 800 at a time: one claim's worth
	 * running, one being read (rb_store_fetch_send) while the next claim
	 * is made, and the results of a fourth waiting for their completion.
	 * A claim costs about a millisecond whatever it takes: a 50,000 backlog
	 * drained 1.25x faster than with 800 claimed 200 at a time, with 16%
	 * less CPU a delivery (two dispatchers: 1.11x, 10%); 1600 or 6400 in
	 * flight did worse. */
	if (opt.concurrency == 0)
		opt.concurrency = opt.mode == MODE_PIPE ? 3200 : 10;
	if (opt.batch == 0)
		opt.batch = opt.mode == MODE_PIPE ? 800 : RB_DEFAULT_BATCH;
	/* --pipe: chains of 32, so that the last keys of a backlog do not
	 * trickle out 8 per claim (a mixed 50,000 backlog drained 14% faster) */
	if (opt.chain == 0)
		opt.chain = opt.mode == MODE_PIPE ? 32 : 8;
	if (opt.procs > opt.concurrency)
		opt.procs = opt.concurrency;
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
owner_of(unsigned gen)
{
	struct owner *o = &owners[gen % NOWNERS];

	return o->name != NULL && o->gen == gen ? o : NULL;
}

static void
new_owner(void)
{
	struct owner *o;

	if (owners[cur_gen % NOWNERS].name != NULL)
		cur_gen++;
	o = &owners[cur_gen % NOWNERS];
	if (o->name != NULL) {
		/* forgotten: its lanes come back when their lease ends */
		rb_warn("too many reconnects: no longer renewing the lanes of %s", o->name);
		free(o->name);
	}
	o->name = cur_gen == 0 ? xstrdup(owner_base) : xasprintf("%s/r%u", owner_base, cur_gen);
	o->gen = cur_gen;
	o->count = 0;
}

static void
owner_done(unsigned gen)
{
	struct owner *o = owner_of(gen);

	if (o != NULL)
		o->count--;
}

/* ---- database errors --------------------------------------------------------- */

static void
db_error(const struct rb_error *err, const char *what)
{
	int code = err->exit_code != 0 ? err->exit_code : RB_EXIT_SOFTWARE;

	if (code == RB_EXIT_TEMPFAIL || code == RB_EXIT_UNAVAILABLE || rb_store_broken(store)) {
		if (!db_down)
			rb_warn("%s: %s: reconnecting", what, err->msg);
		db_down = true;
		claiming = false;	/* its answer, if any, is lost with the connection */
		completing = false;	/* its results stay queued and are applied again */
		free(completing_v);
		completing_v = NULL;
		/* claimed, never read: the new owner claims them again once the
		 * old one's lanes are handed back */
		fetching = false;
		fetch_drop(&fetch_cur, fetch_gen);
		fetch_drop(&fetch_next, fetch_next_gen);
		reconnect_at = rb_mono_ms() + (reconnect_backoff > 200 ? 200 : reconnect_backoff);
		return;
	}
	rb_error("%s: %s", what, err->msg);
	if (fatal_code == 0)
		fatal_code = code;
}

static void
try_reconnect(int64_t now)
{
	struct rb_error err = { 0 };

	if (rb_store_reconnect(store, &err) < 0 || rb_store_listen(store, &err) < 0) {
		rb_debug("reconnect: %s", err.msg);
		reconnect_at = now + reconnect_backoff;
		reconnect_backoff = reconnect_backoff * 2 > 5000 ? 5000 : reconnect_backoff * 2;
		return;
	}
	db_down = false;
	reconnect_backoff = 100;
	new_owner();
	rb_warn("reconnected to %s; now leasing as %s", rb_store_url_redacted(store),
	    owners[cur_gen % NOWNERS].name);
	wake = true;
	next_extend = now;
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
queue_result(struct rb_dl *d, json_t *r, unsigned gen, struct chain *followers)
{
	if (nqueue == capqueue) {
		capqueue = capqueue == 0 ? 64 : capqueue * 2;
		queue = xrealloc(queue, capqueue * sizeof *queue);
	}
	if (nqueue == 0)
		queue_since = rb_mono_ms();
	queue[nqueue].d = d;
	queue[nqueue].r = r;
	queue[nqueue].gen = gen;
	queue[nqueue].followers = followers;
	nqueue++;
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

/* The slot's delivery is done: queue its result (stolen; NULL: it
 * succeeded) and free the slot. */
static void
finish_slot(struct slot *s, json_t *r)
{
	struct rb_dl *d = s->d;

	if (r != NULL && json_is_false(json_object_get(r, "ok")))
		rb_info("%s: attempt %d failed: %s", d->event_id, d->attempt,
		    json_string_value(json_object_get(r, "error")));
	struct chain *followers = s->followers;
	unsigned gen = s->gen;
	/* the rest of its chain goes on once it succeeded, when this was its
	 * first attempt; else (and with --sql, where the handler is the
	 * completion) only once its completion committed, see flush_results:
	 * a takeover then knows the followers behind it never ran
	 * (rb_claim_opts.chain_early) */
	bool go = followers != NULL && opt.mode != MODE_SQL && d->attempt == 1 &&
	    (r == NULL || rb_result_completes(r)) && stop_level == 0;

	queue_result(d, r, gen, go ? NULL : followers);
	if (opt.mode == MODE_PIPE && s->proc >= 0) {
		procs[s->proc].inflight--;
		slot_unindex(s);
	}
	if (s->in_fd >= 0)
		close(s->in_fd);
	free(s->wbuf);
	memset(s, 0, sizeof *s);
	s->in_fd = -1;
	s->proc = -1;
	free_slot[nfree_slot++] = (int)(s - slots);
	running--;
	if (go)
		chain_next(followers, gen, true);
}

/*
 * The first n queued results were applied (go[i]: the i-th completed, its
 * chain goes on): the queue moves on, the chains behind them go on or are
 * handed back.
 */
static void
queue_applied(size_t n, const bool *go, bool progress)
{
	size_t i;
	struct { struct chain *followers; unsigned gen; } *next;	/* the chains behind them */

	next = xcalloc(n > 0 ? n : 1, sizeof *next);
	for (i = 0; i < n; i++) {
		owner_done(queue[i].gen);
		rb_dl_free(queue[i].d);
		json_decref(queue[i].r);
		next[i].followers = queue[i].followers;
		next[i].gen = queue[i].gen;
	}
	memmove(queue, queue + n, (nqueue - n) * sizeof *queue);
	nqueue -= n;
	if (nqueue > 0)
		queue_since = rb_mono_ms();
	for (i = 0; i < n; i++)
		if (next[i].followers != NULL)
			chain_next(next[i].followers, next[i].gen, go[i] && stop_level == 0);
	free(next);
	for (int k = 0; opt.mode == MODE_PIPE && k < opt.procs; k++)
		proc_write(&procs[k]);
	if (progress) {
		/* deletions may have unblocked the next delivery of a key */
		more_work = true;
		idle_seen = false;
		progress_since_claim = true;
	}
}

/*
 * What the outcomes of the first n queued results (arr, the statement's
 * input) say: the counts, the chains behind them, and the queue moves on.
 * Takes arr and outcomes.
 */
static void
apply_outcomes(size_t n, json_t *arr, json_t *outcomes)
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
			st.completed++;
			progress = true;
			if (i < n)
				go[i] = true;	/* its chain goes on */
		} else if (strcmp(oc, "rescheduled") == 0) {
			st.rescheduled++;
			progress = true;
		} else if (strcmp(oc, "buried") == 0) {
			st.buried++;
			rb_warn("%s: buried after %" JSON_INTEGER_FORMAT " attempts: %s", ev,
			    json_integer_value(json_object_get(o, "attempts")),
			    json_string_value(json_object_get(json_array_get(arr, i), "error")));
		} else if (strcmp(oc, "released") == 0)
			st.released++;
		else {
			st.lost++;
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
	queue_applied(n, go, progress);
	free(go);
}

/* The same for the first n queued results completed in one statement
 * (rb_store_complete_send): outcome[i] is RB_DL_*. */
static void
apply_completed(size_t n, const unsigned char *outcome)
{
	bool progress = false;
	bool *go = xcalloc(n > 0 ? n : 1, sizeof *go);

	for (size_t i = 0; i < n; i++) {
		const char *ev = queue[i].d->event_id;

		if (outcome[i] == RB_DL_COMPLETED) {
			st.completed++;
			progress = go[i] = true;
			rb_debug("%s: completed", ev);
			continue;
		}
		st.lost++;
		if (outcome[i] == RB_DL_MISSING)
			rb_debug("%s: already gone (completed before a reconnect)", ev);
		else
			rb_info("%s: lease lost, not applied (it runs again elsewhere)", ev);
		rb_debug("%s: lost", ev);
	}
	queue_applied(n, go, progress);
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
flush_results(void)
{
	while (nqueue > 0 && !db_down && !completing) {
		size_t n = nqueue > 1000 ? 1000 : nqueue, i;
		json_t *arr, *outcomes = NULL;
		struct rb_error err = { 0 };
		bool all_ok = opt.mode != MODE_SQL;

		for (i = 0; i < n && all_ok; i++)
			all_ok = queue[i].r == NULL;
		if (all_ok && claiming && opt.conns < 3)
			return true;	/* sent once the claim's answer is in */
		if (all_ok) {
			struct rb_dl **v = xmalloc(n * sizeof *v);

			for (i = 0; i < n; i++)
				v[i] = queue[i].d;
			if (rb_store_complete_send(store, v, n, opt.conns == 3, &err) < 0) {
				free(v);
				db_error(&err, "complete");
				return false;
			}
			completing = true;
			ncompleting = n;
			completing_v = v;
			return true;
		}
		arr = json_array();
		for (i = 0; i < n; i++)
			json_array_append_new(arr, queue[i].r != NULL ? json_incref(queue[i].r) : result_ok(queue[i].d));
		claim_collect(true);
		if (db_down || rb_store_complete(store, &opt.co, arr, &outcomes, &err) < 0) {
			json_decref(arr);
			if (!db_down)
				db_error(&err, "complete");
			return false;
		}
		apply_outcomes(n, arr, outcomes);
	}
	return true;
}

/* Take the answer to the completion that is out (flush_results), waiting or only if it is in. */
static void
complete_collect(bool wait)
{
	struct rb_error err = { 0 };
	unsigned char *outcome;
	int rc;

	if (!completing)
		return;
	outcome = xmalloc(ncompleting > 0 ? ncompleting : 1);
	rc = rb_store_complete_recv(store, wait, outcome, &err);
	if (rc == RB_CLAIM_PENDING) {
		free(outcome);
		return;
	}
	completing = false;
	free(completing_v);
	completing_v = NULL;
	if (rc < 0) {
		/* the results stay queued: applied again after the reconnect */
		free(outcome);
		db_error(&err, "complete");
		return;
	}
	apply_completed(ncompleting, outcome);
	free(outcome);
}

/* Nothing out on the connection: the next statement may go. */
static void
db_settle(void)
{
	claim_collect(true);
	complete_collect(true);
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

/* Write what we can of the line to an exec child; close its stdin when done. */
static void
exec_write(struct slot *s)
{
	while (s->in_fd >= 0 && s->woff < s->wlen) {
		ssize_t n = write(s->in_fd, s->wbuf + s->woff, s->wlen - s->woff);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			/* EPIPE: the handler did not read its input; its exit status decides */
			break;
		}
		s->woff += (size_t)n;
	}
	if (s->in_fd >= 0) {
		close(s->in_fd);
		s->in_fd = -1;
	}
	free(s->wbuf);
	s->wbuf = NULL;
}

static void
exec_start(struct slot *s)
{
	int p[2] = { -1, -1 };

	if (pipe2(p, O_CLOEXEC) < 0 || (s->pid = spawn(opt.cmd, p[0], -1)) < 0) {
		char msg[200];

		snprintf(msg, sizeof msg, "cannot start the handler: %s", strerror(errno));
		rb_error("%s", msg);
		if (p[0] >= 0) {
			close(p[0]);
			close(p[1]);
		}
		finish_slot(s, result_fail(s->d, msg));
		return;
	}
	close(p[0]);
	s->in_fd = p[1];
	set_nonblock(s->in_fd);
	s->wbuf = line_text(s->d, &s->wlen);
	s->woff = 0;
	exec_write(s);
}

static void
exec_exited(struct slot *s, int status)
{
	char msg[200];

	if (s->aborted) {
		finish_slot(s, result_release(s->d));
		return;
	}
	if (s->timed_out) {
		snprintf(msg, sizeof msg, "timed out after %" PRId64 "ms", opt.timeout_ms);
		finish_slot(s, result_fail(s->d, msg));
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		finish_slot(s, NULL);
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == RB_EXIT_TEMPFAIL)
		snprintf(msg, sizeof msg, "exit %d: retry later", RB_EXIT_TEMPFAIL);
	else if (WIFEXITED(status))
		snprintf(msg, sizeof msg, "exit %d", WEXITSTATUS(status));
	else
		snprintf(msg, sizeof msg, "killed by signal %d", WTERMSIG(status));
	finish_slot(s, result_fail(s->d, msg));
}

static void
proc_start(int i)
{
	struct coproc *c = &procs[i];
	int in[2] = { -1, -1 }, out[2] = { -1, -1 };

	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 ||
	    (c->pid = spawn(opt.cmd, in[0], out[1])) < 0) {
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

/* The slot of a pipe result: same event_id and lease. */
static uint32_t
slot_hash(const char *ev, size_t evlen, const char *lease, size_t leaselen)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < evlen; i++)
		h = (h ^ (unsigned char)ev[i]) * 16777619u;
	h = (h ^ 0xffu) * 16777619u;
	for (size_t i = 0; i < leaselen; i++)
		h = (h ^ (unsigned char)lease[i]) * 16777619u;
	return h;
}

/* Index slot s (its delivery in place). */
static void
slot_index(struct slot *s)
{
	size_t p;

	s->hash = slot_hash(s->d->event_id, strlen(s->d->event_id), s->d->lease, strlen(s->d->lease));
	for (p = s->hash & sidx_mask; sidx[p] != 0; p = (p + 1) & sidx_mask)
		;
	sidx[p] = (int)(s - slots) + 1;
}

static void
slot_unindex(struct slot *s)
{
	int want = (int)(s - slots) + 1;
	size_t p = s->hash & sidx_mask, j;

	while (sidx[p] != want) {
		if (sidx[p] == 0)
			return;		/* not indexed */
		p = (p + 1) & sidx_mask;
	}
	/* backward shift: move up every later entry of the run that may sit
	 * at p, so that no probe stops early at the hole */
	for (j = p;;) {
		size_t home;

		j = (j + 1) & sidx_mask;
		if (sidx[j] == 0)
			break;
		home = slots[sidx[j] - 1].hash & sidx_mask;
		if (j > p ? (home <= p || home > j) : (home <= p && home > j)) {
			sidx[p] = sidx[j];
			p = j;
		}
	}
	sidx[p] = 0;
}

static bool
same(const char *s, const char *t, size_t tlen)
{
	return strncmp(s, t, tlen) == 0 && s[tlen] == '\0';
}

static struct slot *
find_slot(const char *ev, size_t evlen, const char *lease, size_t leaselen)
{
	uint32_t h = slot_hash(ev, evlen, lease, leaselen);

	for (size_t p = h & sidx_mask; sidx[p] != 0; p = (p + 1) & sidx_mask) {
		struct slot *s = &slots[sidx[p] - 1];

		if (s->hash == h && same(s->d->event_id, ev, evlen) && same(s->d->lease, lease, leaselen))
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
plain_success(const char *text, size_t len)
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
	return find_slot(at[RW_EVENT_ID]->val + 1, at[RW_EVENT_ID]->vlen - 2,
	    at[RW_LEASE]->val + 1, at[RW_LEASE]->vlen - 2);
}

static void
proc_result(int i, const char *text, size_t len)
{
	json_t *in, *r;
	const json_t *ev, *lease, *v;
	struct slot *s;
	char why[256];
	struct rb_error err = { 0 };

	if ((s = plain_success(text, len)) != NULL) {
		procs[i].backoff_ms = 0;	/* it works: a later crash restarts it at once */
		finish_slot(s, NULL);
		return;
	}
	if ((in = result_fields(text, len, why, sizeof why)) == NULL) {
		rb_warn("co-process %d: line %ld: %s: ignored", i, rb_jsonl_lineno(procs[i].rd), why);
		return;
	}
	ev = json_object_get(in, "event_id");
	lease = json_object_get(in, "lease");
	if (!json_is_string(ev) || !json_is_string(lease)) {
		rb_warn("co-process %d: line %ld: no event_id and lease: ignored", i,
		    rb_jsonl_lineno(procs[i].rd));
		goto out;
	}
	s = find_slot(json_string_value(ev), json_string_length(ev), json_string_value(lease),
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
		    rb_jsonl_lineno(procs[i].rd), err.msg);
		json_decref(r);
		r = result_fail(s->d, err.msg);
	} else if (!json_is_false(json_object_get(r, "ok")) && !json_is_true(json_object_get(r, "dead"))) {
		json_decref(r);		/* a success */
		r = NULL;
	} else if (!json_is_string(json_object_get(r, "error"))) {
		json_object_set_new(r, "error", json_string("handler failed"));
	}
	procs[i].backoff_ms = 0;	/* it works: a later crash restarts it at once */
	finish_slot(s, r);
out:
	json_decref(in);
}

/* Read the results a co-process has written. */
static void
proc_read(int i)
{
	struct coproc *c = &procs[i];
	const char *line;
	size_t len;

	while (c->out_fd >= 0) {
		int rc = rb_jsonl_next(c->rd, 0, &line, &len);

		if (rc == RB_JSONL_LINE)
			proc_result(i, line, len);
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
proc_exited(int i, int status)
{
	struct coproc *c = &procs[i];
	int64_t now = rb_mono_ms();
	char msg[200];

	if (c->out_fd >= 0)
		proc_read(i);	/* results written just before the end */
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
	for (int k = 0; k < opt.concurrency; k++)
		if (slots[k].used && slots[k].proc == i)
			finish_slot(&slots[k], stop_level > 0 ? result_release(slots[k].d) :
			    result_fail(slots[k].d, msg));
	c->inflight = 0;
	if (stop_level > 0)
		return;
	if (now - c->started > 10000)
		c->backoff_ms = 0;
	c->backoff_ms = c->backoff_ms == 0 ? 100 : (c->backoff_ms * 2 > 10000 ? 10000 : c->backoff_ms * 2);
	c->restart_at = now + c->backoff_ms;
	rb_warn("co-process %d: %s; restarting in %" PRId64 "ms", i, msg, c->backoff_ms);
}

static void
reap(void)
{
	int status;
	pid_t pid;

	got_child = 0;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		if (opt.mode == MODE_EXEC) {
			for (int i = 0; i < opt.concurrency; i++)
				if (slots[i].used && slots[i].pid == pid) {
					exec_exited(&slots[i], status);
					break;
				}
		} else if (opt.mode == MODE_PIPE) {
			for (int i = 0; i < opt.procs; i++)
				if (procs[i].pid == pid) {
					proc_exited(i, status);
					break;
				}
		}
	}
}

/*
 * Hand a claimed delivery (stolen) to the handler, claimed under owner
 * generation gen; followers (stolen, or NULL) are the rest of its key's
 * chain, started when this one is completed.
 */
static void
start_delivery(struct rb_dl *d, unsigned gen, struct chain *followers)
{
	struct slot *s = NULL;
	int best = -1;

	if (opt.mode == MODE_SQL) {
		queue_result(d, result_ok(d), gen, followers);
		return;
	}
	if (nfree_slot == 0)	/* cannot happen: we claim at most the free slots */
		rb_die(RB_EXIT_SOFTWARE, "no free slot");
	s = &slots[free_slot[--nfree_slot]];
	s->used = true;
	s->d = d;
	s->followers = followers;
	s->gen = gen;
	s->pid = 0;
	s->in_fd = -1;
	s->proc = -1;
	s->deadline = opt.timeout_ms > 0 ? rb_mono_ms() + opt.timeout_ms : 0;
	next_deadline = min_deadline(next_deadline, s->deadline);
	running++;
	if (opt.mode == MODE_EXEC) {
		exec_start(s);
		return;
	}
	for (int i = 0; i < opt.procs; i++)
		if (procs[i].pid > 0 && procs[i].in_fd >= 0 &&
		    (best < 0 || procs[i].inflight < procs[best].inflight))
			best = i;
	if (best < 0) {
		finish_slot(s, result_release(d));
		return;
	}
	s->proc = best;
	procs[best].inflight++;
	slot_index(s);
	proc_send(&procs[best], d);
}

static bool
proc_alive(void)
{
	for (int i = 0; i < opt.procs; i++)
		if (procs[i].pid > 0 && procs[i].in_fd >= 0)
			return true;
	return false;
}

/* ---- the delivery loop ------------------------------------------------------------------- */

/* When the next claim is due (now, or the next --poll); 0: no claim possible. */
static int64_t
claim_due(int64_t now)
{
	int free_slots = opt.concurrency - running - (int)nqueue - nwait - nfetch;
	int low = opt.batch < opt.concurrency ? opt.batch : opt.concurrency;

	low = low / 4 > 1 ? low / 4 : 1;
	if (db_down || claiming || (completing && opt.conns < 3) || fetch_next.v != NULL || stop_level > 0 ||
	    fatal_code != 0 ||
	    free_slots <= 0 ||
	    (opt.mode == MODE_PIPE && !proc_alive()))
		return 0;
	if (wake || now >= next_poll || (more_work && (free_slots >= low || running + (int)nqueue + nfetch == 0)))
		return now;
	return next_poll;
}

/*
 * Start what a claim brought.  The deliveries of one key come in sequence
 * order, each lane's together (--chain): the first is started, the rest
 * wait in a chain behind it (the next one starts when the previous one
 * succeeded on its first attempt, else once its completion committed).
 */
static void
start_chains(struct dlv got, unsigned gen)
{
	size_t n = got.n;
	int *head = xcalloc(n > 0 ? n : 1, sizeof *head);
	struct chain **chain = xcalloc(n > 0 ? n : 1, sizeof *chain);

	for (size_t i = 0; i < n; i++) {
		const struct rb_dl *d = got.v[i];

		head[i] = -1;
		for (size_t j = i; d->key != NULL && opt.chain > 1 && j-- > 0;) {
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
				c->v = xcalloc((size_t)opt.chain, sizeof *c->v);
			}
			if (c->n == (size_t)opt.chain)	/* (cannot happen: a claim takes at most --chain of a key) */
				c->v = xrealloc(c->v, (c->n + 1) * sizeof *c->v);
			c->v[c->n++] = got.v[i];
			nwait++;
		}
	}
	for (size_t i = 0; i < n; i++)
		if (head[i] < 0)
			start_delivery(got.v[i], gen, chain[i]);
	free(head);
	free(chain);
	free(got.v);
}

/* A chain's turn: start its next delivery (go), or hand them all back. */
static void
chain_next(struct chain *followers, unsigned gen, bool go)
{
	size_t n = chain_len(followers);

	if (go && n > 0) {
		struct rb_dl *d = followers->v[followers->at++];

		nwait--;
		if (n == 1) {
			chain_free(followers);
			followers = NULL;
		}
		start_delivery(d, gen, followers);
		return;
	}
	for (size_t i = followers->at; i < followers->n; i++)
		queue_result(followers->v[i], result_release(followers->v[i]), gen, NULL);
	nwait -= (int)n;
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
claim_collect(bool wait)
{
	struct rb_error err = { 0 };
	struct dlv got = { 0 };
	int n;

	if (!claiming)
		return;
	n = rb_store_claim_recv(store, wait, &got.v, &err);
	if (n == RB_CLAIM_PENDING)
		return;
	claiming = false;
	if (n < 0) {
		db_error(&err, "claim");
		return;
	}
	got.n = (size_t)n;
	rb_debug("claimed %d (asked %d%s)", n, claim_asked, claim_searched ? "" : ", held lanes only");
	if (claim_searched)
		lanes_dry = n < claim_asked;
	/* (a completion that went through while the claim was out, beside it
	 * on a third connection, may have unblocked a key the claim passed
	 * over: its "nothing" is then no reason to wait for the next poll.
	 * And only a claim that looked at every lane can say there is nothing
	 * due, for --drain.) */
	more_work = n > 0 || progress_since_claim;
	idle_seen = n == 0 && !progress_since_claim && claim_searched;
	st.claimed += n;
	owners[claim_gen % NOWNERS].count += n;
	if (n > 0 && next_extend == 0)
		next_extend = rb_mono_ms() + opt.lease_ms / 3;
	if (n == 0) {
		free(got.v);
		return;
	}
	if (opt.conns == 1) {
		start_claimed(got, claim_gen);
		for (int i = 0; opt.mode == MODE_PIPE && i < opt.procs; i++)
			proc_write(&procs[i]);
		return;
	}
	nfetch += n;
	if (fetching) {
		fetch_next = got;	/* claim_due waits for it to go */
		fetch_next_gen = claim_gen;
	} else
		fetch_send(got, claim_gen);
}

/* Start the deliveries a claim brought (stolen), or when stopping hand
 * them back unrun (no attempt charged). */
static void
start_claimed(struct dlv got, unsigned gen)
{
	if (stop_level > 0) {
		for (size_t i = 0; i < got.n; i++)
			queue_result(got.v[i], result_release(got.v[i]), gen, NULL);
		free(got.v);
	} else
		start_chains(got, gen);
}

/* Forget claimed deliveries that will not be read (their owner's count
 * goes down: an owner with none left is retired, its lanes handed back). */
static void
fetch_drop(struct dlv *got, unsigned gen)
{
	nfetch -= (int)got->n;
	for (size_t i = 0; i < got->n; i++) {
		owner_done(gen);
		rb_dl_free(got->v[i]);
	}
	free(got->v);
	got->v = NULL;
	got->n = 0;
}

/* Read what a claim took (got stolen). */
static void
fetch_send(struct dlv got, unsigned gen)
{
	struct rb_error err = { 0 };

	fetch_cur = got;
	fetch_gen = gen;
	if (rb_store_fetch_send(store, fetch_cur.v, fetch_cur.n, opt.mode != MODE_SQL, &err) < 0) {
		fetch_drop(&fetch_cur, fetch_gen);
		db_error(&err, "fetch");
		return;
	}
	fetching = true;
}

/* Take the events of the fetch that is out, and start its deliveries. */
static void
fetch_collect(bool wait)
{
	struct rb_error err = { 0 };
	struct dlv got;
	size_t k = 0;
	int n;

	if (!fetching)
		return;
	n = rb_store_fetch_recv(store, wait, &err);
	if (n == RB_CLAIM_PENDING)
		return;
	fetching = false;
	if (n < 0) {
		fetch_drop(&fetch_cur, fetch_gen);
		db_error(&err, "fetch");
		return;
	}
	/* (those whose event is gone are not started: their count goes) */
	got = fetch_cur;
	nfetch -= (int)got.n;
	for (size_t i = 0; i < got.n; i++) {
		if (got.v[i]->fetched)
			got.v[k++] = got.v[i];
		else {
			owner_done(fetch_gen);
			rb_dl_free(got.v[i]);
		}
	}
	got.n = k;
	fetch_cur = (struct dlv){ 0 };
	start_claimed(got, fetch_gen);
	if (fetch_next.v != NULL && !db_down) {
		struct dlv next = fetch_next;

		fetch_next = (struct dlv){ 0 };
		fetch_send(next, fetch_next_gen);
	}
	for (int i = 0; opt.mode == MODE_PIPE && i < opt.procs; i++)
		proc_write(&procs[i]);
}

/*
 * The deliveries still running, waiting in a chain or to be completed, whatever their
 * owner generation: the claim need not look them up (rb_claim_opts.live).
 */
static size_t
live_ids(int64_t **ids, int **lanes, size_t *cap)
{
	size_t n = 0, want = nqueue + fetch_cur.n + fetch_next.n;

	/* counted, not derived from running, nqueue and nwait: a slip in
	 * those counters must not write past the end */
	for (int i = 0; i < opt.concurrency; i++)
		if (slots[i].used)
			want += 1 + chain_len(slots[i].followers);
	for (size_t i = 0; i < nqueue; i++)
		want += chain_len(queue[i].followers);
	if (*cap < want) {
		*cap = want;
		*ids = xrealloc(*ids, want * sizeof **ids);
		*lanes = xrealloc(*lanes, want * sizeof **lanes);
	}
#define LIVE(dl) do { (*ids)[n] = (dl)->id; (*lanes)[n++] = (dl)->lane; } while (0)
	for (int i = 0; i < opt.concurrency; i++)
		if (slots[i].used) {
			const struct chain *c = slots[i].followers;

			LIVE(slots[i].d);
			for (size_t k = c != NULL ? c->at : 0; c != NULL && k < c->n; k++)
				LIVE(c->v[k]);
		}
	for (size_t i = 0; i < nqueue; i++) {
		const struct chain *c = queue[i].followers;

		LIVE(queue[i].d);
		for (size_t k = c != NULL ? c->at : 0; c != NULL && k < c->n; k++)
			LIVE(c->v[k]);
	}
	/* claimed, being read */
	for (size_t i = 0; i < fetch_cur.n; i++)
		LIVE(fetch_cur.v[i]);
	for (size_t i = 0; i < fetch_next.n; i++)
		LIVE(fetch_next.v[i]);
#undef LIVE
	return n;
}

static void
maybe_claim(int64_t now)
{
	static int64_t *live;
	static int *live_lanes;
	static size_t live_cap;
	int free_slots = opt.concurrency - running - (int)nqueue - nwait - nfetch;
	struct rb_claim_opts co;
	struct rb_error err = { 0 };
	int64_t due = claim_due(now);

	if (due == 0 || due > now)
		return;
	co = (struct rb_claim_opts){ .handler = opt.handler, .owner = owners[cur_gen % NOWNERS].name,
	    .batch = free_slots < opt.batch ? free_slots : opt.batch, .lease_ms = opt.lease_ms,
	    .max_attempts = opt.co.max_attempts };
	co.n_live = live_ids(&live, &live_lanes, &live_cap);
	co.chain = opt.chain;
	co.chain_early = opt.mode != MODE_SQL;
	co.line_text = opt.mode != MODE_SQL;	/* --sql hands the statement the parsed line */
	/* (never NULL: NULL would mean "unknown", and the claim would take
	 * whatever a lane lists as in flight for running) */
	co.live = live != NULL ? live : (const int64_t[]){ 0 };
	co.live_lanes = live_lanes != NULL ? live_lanes : (const int[]){ 0 };
	co.apart = opt.conns >= 2;
	/* look for more lanes unless the last look found too few and nothing
	 * changed since; a claim with nothing running always looks (its
	 * answer decides --drain and idleness) */
	co.no_search = lanes_dry && !wake && now < next_poll && running + (int)nqueue > 0;
	claim_searched = !co.no_search;
	wake = false;
	next_poll = now + opt.poll_ms;
	if (rb_store_claim_send(store, &co, &err) < 0) {
		db_error(&err, "claim");
		return;
	}
	claiming = true;
	progress_since_claim = false;
	claim_gen = cur_gen;
	claim_asked = co.batch;
}

static void
extend_leases(int64_t now)
{
	struct rb_error err = { 0 };

	next_extend = now + opt.lease_ms / 3;
	db_settle();
	for (int i = 0; i < NOWNERS && !db_down; i++) {
		struct owner *o = &owners[i];
		int n;

		if (o->name == NULL || o->count <= 0)
			continue;
		if ((n = rb_store_extend(store, opt.handler, o->name, opt.lease_ms, &err)) < 0) {
			db_error(&err, "extend");
			return;
		}
		rb_debug("renewed %d lanes of %s", n, o->name);
	}
}

/* Hand back the lanes of older owner names that run nothing any more. */
static void
retire_owners(void)
{
	struct rb_error err = { 0 };

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &owners[i];

		if (o->name == NULL || o->gen == cur_gen || o->count > 0)
			continue;
		db_settle();
		if (db_down)
			return;
		/* nothing of it runs here any more: what is still in flight under
		 * it came from a claim whose answer was lost; free those lanes now */
		if (rb_store_relinquish_owner(store, opt.handler, o->name, &err) < 0) {
			db_error(&err, "relinquish");
			return;
		}
		free(o->name);
		o->name = NULL;
	}
}

static void
check_timeouts(int64_t now)
{
	char msg[100];

	/* (every slot looked at only once the earliest deadline may have
	 * come: the loop runs once per wake-up, and slots are thousands) */
	if (next_deadline == 0 || now < next_deadline)
		return;
	next_deadline = 0;
	for (int i = 0; i < opt.concurrency; i++) {
		struct slot *s = &slots[i];

		if (!s->used || s->deadline == 0)
			continue;
		if (now < s->deadline) {
			next_deadline = min_deadline(next_deadline, s->deadline);
			continue;
		}
		s->deadline = 0;
		if (opt.mode == MODE_EXEC) {
			rb_info("%s: timed out: killing pid %d", s->d->event_id, (int)s->pid);
			s->timed_out = true;
			kill(-s->pid, SIGKILL);
		} else {
			snprintf(msg, sizeof msg, "timed out after %" PRId64 "ms", opt.timeout_ms);
			finish_slot(s, result_fail(s->d, msg));
		}
	}
}

/* Stop now: release what runs (no attempt charged). */
static void
abort_all(void)
{
	stop_level = 2;
	for (int i = 0; i < opt.concurrency; i++) {
		struct slot *s = &slots[i];

		if (!s->used)
			continue;
		if (opt.mode == MODE_EXEC) {
			s->aborted = true;
			kill(-s->pid, SIGKILL);
		} else
			finish_slot(s, result_release(s->d));
	}
}

static void
stats_line(int64_t now, int64_t *last)
{
	double secs = (double)(now - *last) / 1000.0;

	rb_notice("claimed %ld, completed %ld, failed %ld (buried %ld), released %ld, lost %ld, "
	    "in flight %d, %.1f/s", st.claimed, st.completed, st.rescheduled + st.buried, st.buried,
	    st.released, st.lost, running + (int)nqueue + nwait + nfetch,
	    secs > 0 ? (double)(st.completed - st.completed_at_last_stats) / secs : 0.0);
	st.completed_at_last_stats = st.completed;
	*last = now;
}

static int64_t
min_deadline(int64_t a, int64_t b)
{
	return a == 0 ? b : (b == 0 || a < b ? a : b);
}

/* One poll: compute the next deadline, wait, and serve the ready fds. */
static void
wait_and_serve(int64_t now, struct pollfd *pfd, int *ref)
{
	int64_t until = now + 1000;
	int n = 0, timeout, dbfd = -1, pr;

	/* libpq may hold the claim's answer already (read along with a
	 * notification): the socket would not wake us for it */
	if (!db_down) {
		claim_collect(false);
		complete_collect(false);
		fetch_collect(false);
	}
	pfd[n].fd = sigpipe_fd[0];
	pfd[n].events = POLLIN;
	ref[n++] = -1;
	if (!db_down && (dbfd = rb_store_socket(store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = -2;
	}
	if (!db_down && (dbfd = rb_store_fetch_socket(store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = -3;
	}
	if (!db_down && (dbfd = rb_store_complete_socket(store)) >= 0) {
		pfd[n].fd = dbfd;
		pfd[n].events = POLLIN;
		ref[n++] = -4;
	}
	if (db_down)
		until = min_deadline(until, reconnect_at);
	else {
		/* (while a statement is out, its answer on the socket wakes us) */
		if (nqueue > 0 && !completing && (!claiming || opt.conns == 3))
			until = min_deadline(until, queue_since + opt.window_ms);
		until = min_deadline(until, claim_due(now));
		if (next_extend > 0)
			until = min_deadline(until, next_extend);
	}
	if (stop_level == 1)
		until = min_deadline(until, grace_deadline);
	if (next_stats > 0)
		until = min_deadline(until, next_stats);
	until = min_deadline(until, next_deadline);
	for (int i = 0; opt.mode == MODE_EXEC && i < opt.concurrency; i++) {
		struct slot *s = &slots[i];

		if (!s->used)
			continue;
		if (s->in_fd >= 0) {
			pfd[n].fd = s->in_fd;
			pfd[n].events = POLLOUT;
			ref[n++] = i;
		}
	}
	for (int i = 0; opt.mode == MODE_PIPE && i < opt.procs; i++) {
		struct coproc *c = &procs[i];

		if (c->out_fd >= 0) {
			pfd[n].fd = c->out_fd;
			pfd[n].events = POLLIN;
			ref[n++] = 100000 + i;
		}
		if (c->in_fd >= 0 && c->wlen > c->woff) {
			pfd[n].fd = c->in_fd;
			pfd[n].events = POLLOUT;
			ref[n++] = 200000 + i;
		}
		if (c->pid == 0 && c->restart_at > 0)
			until = min_deadline(until, c->restart_at);
	}
	timeout = until <= now ? 0 : (int)(until - now);
	if (got_child || got_stop > stop_level)
		timeout = 0;
	pr = poll(pfd, (nfds_t)n, timeout);
	if (pr < 0 && errno != EINTR)
		rb_die_errno(RB_EXIT_OSERR, "poll");
	for (int k = 0; pr > 0 && k < n; k++) {
		if (pfd[k].revents == 0)
			continue;
		if (ref[k] == -3) {
			if (!db_down)
				fetch_collect(false);
		} else if (ref[k] == -4) {
			if (!db_down)
				complete_collect(false);
		} else if (ref[k] == -1) {
			char buf[64];

			while (read(sigpipe_fd[0], buf, sizeof buf) > 0)
				;
		} else if (ref[k] == -2) {
			struct rb_error err = { 0 };
			int hit;

			claim_collect(false);	/* first: the answer may be all that came before a break */
			complete_collect(false);
			if (db_down)
				continue;
			hit = rb_store_notified(store, opt.handler, 0, &err);

			if (hit < 0)
				db_error(&err, "notification");
			else if (hit > 0) {
				rb_debug("woken by a notification");
				wake = true;
			}
			claim_collect(false);	/* and what the notification read brought along */
			complete_collect(false);
		} else if (ref[k] >= 200000)
			proc_write(&procs[ref[k] - 200000]);
		else if (ref[k] >= 100000)
			proc_read(ref[k] - 100000);
		else if (slots[ref[k]].used)
			exec_write(&slots[ref[k]]);
	}
}

static void
stop_procs(void)
{
	int64_t until;

	if (opt.mode != MODE_PIPE)
		return;
	for (int i = 0; i < opt.procs; i++)
		if (procs[i].in_fd >= 0) {
			close(procs[i].in_fd);	/* EOF: the polite way to end a filter */
			procs[i].in_fd = -1;
		}
	until = rb_mono_ms() + 2000;
	for (;;) {
		bool any = false;

		reap();
		for (int i = 0; i < opt.procs; i++)
			any = any || procs[i].pid > 0;
		if (!any)
			break;
		if (rb_mono_ms() >= until) {
			for (int i = 0; i < opt.procs; i++)
				if (procs[i].pid > 0)
					kill(-procs[i].pid, SIGKILL);
			until = rb_mono_ms() + 60000;
		}
		usleep(10000);
	}
}

static void
hand_back_lanes(void)
{
	struct rb_error err = { 0 };

	db_settle();
	if (db_down)
		return;

	for (int i = 0; i < NOWNERS; i++) {
		struct owner *o = &owners[i];
		int n;

		if (o->name == NULL)
			continue;
		if ((n = rb_store_relinquish(store, opt.handler, o->name, &err)) < 0) {
			rb_warn("could not hand back the lanes of %s (they free up when the lease ends): %s",
			    o->name, err.msg);
			return;
		}
		rb_info("handed back %d lanes of %s", n, o->name);
	}
}

static int
run(void)
{
	size_t npfd = (size_t)opt.concurrency + 2 * (size_t)opt.procs + 4;
	struct pollfd *pfd = xcalloc(npfd, sizeof *pfd);
	int *ref = xcalloc(npfd, sizeof *ref);
	int64_t last_stats = rb_mono_ms();
	int exit_code = RB_EXIT_OK;
	struct rb_error err = { 0 };

	if (rb_store_listen(store, &err) < 0)
		db_error(&err, "listen");
	if (opt.stats_ms > 0)
		next_stats = last_stats + opt.stats_ms;
	for (int i = 0; opt.mode == MODE_PIPE && i < opt.procs; i++)
		proc_start(i);
	for (;;) {
		int64_t now = rb_mono_ms();

		if (got_child)
			reap();
		if (got_stop > 0 && stop_level == 0) {
			rb_info("stopping: waiting up to %" PRId64 "ms for %d running handlers",
			    opt.grace_ms, running);
			stop_level = 1;
			grace_deadline = now + opt.grace_ms;
		}
		if (stop_level == 1 && (got_stop > 1 || now >= grace_deadline || fatal_code != 0)) {
			if (running > 0)
				rb_info("releasing %d deliveries still running", running);
			abort_all();
		}
		if (fatal_code != 0 && stop_level == 0) {
			stop_level = 1;
			abort_all();
		}
		check_timeouts(now);
		for (int i = 0; opt.mode == MODE_PIPE && stop_level == 0 && i < opt.procs; i++)
			if (procs[i].pid == 0 && procs[i].restart_at > 0 && now >= procs[i].restart_at)
				proc_start(i);
		if (db_down && now >= reconnect_at)
			try_reconnect(now);
		if (!db_down && nqueue > 0 && (now >= queue_since + opt.window_ms || stop_level > 0 ||
		    nqueue >= 1000 || opt.mode == MODE_SQL))
			flush_results();
		if (!db_down && next_extend > 0 && now >= next_extend)
			extend_leases(now);
		if (!db_down)
			retire_owners();
		maybe_claim(now);
		if (!db_down && nqueue > 0 && opt.mode == MODE_SQL)
			flush_results();	/* --sql: the results are ready at once */
		if (!db_down) {
			/* notifications that came in during our statements */
			struct rb_error nerr = { 0 };
			int hit = rb_store_notified(store, opt.handler, 0, &nerr);

			if (hit < 0)
				db_error(&nerr, "notification");
			else if (hit > 0)
				wake = true;
		}
		if (next_stats > 0 && now >= next_stats) {
			stats_line(now, &last_stats);
			next_stats = now + opt.stats_ms;
		}
		if (running == 0 && nqueue == 0 && !claiming && !fetching && fetch_next.v == NULL) {
			if (stop_level > 0)
				break;
			if (opt.drain && idle_seen && !db_down && fatal_code == 0) {
				rb_info("drained: nothing due, nothing in flight");
				break;
			}
		}
		/* stopped, handlers done, database gone: give up on what is queued */
		if (stop_level == 2 && running == 0 && db_down && got_stop > 1) {
			rb_error("stopping with %zu results not applied: they run again when the lease ends",
			    nqueue);
			exit_code = RB_EXIT_TEMPFAIL;
			break;
		}
		if (fatal_code != 0 && running == 0)
			break;
		wait_and_serve(rb_mono_ms(), pfd, ref);
	}
	if (stop_level == 0)
		stop_level = 1;		/* no co-process restarts from here on */
	stop_procs();
	if (!db_down)
		hand_back_lanes();
	if (opt.stats_ms > 0)
		stats_line(rb_mono_ms(), &last_stats);
	rb_info("%ld claimed, %ld completed, %ld rescheduled, %ld buried, %ld released, %ld lost",
	    st.claimed, st.completed, st.rescheduled, st.buried, st.released, st.lost);
	free(pfd);
	free(ref);
	if (fatal_code != 0)
		return fatal_code;
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

int
main(int argc, char **argv)
{
	int exit_code;

	guard_std_fds();
	rb_cli_init("rb-dispatch", &opt.common);
	parse_args(argc, argv);
	rb_log_set_prefix(opt.handler);
	owner_base = opt.owner != NULL ? xstrdup(opt.owner) : rb_cli_owner();
	setup_signals();
	slots = xcalloc((size_t)opt.concurrency, sizeof *slots);
	free_slot = xcalloc((size_t)opt.concurrency, sizeof *free_slot);
	for (int i = opt.concurrency; i-- > 0;)
		free_slot[nfree_slot++] = i;
	for (sidx_mask = 1; sidx_mask < 2 * (size_t)opt.concurrency; sidx_mask <<= 1)
		;
	sidx = xcalloc(sidx_mask, sizeof *sidx);
	sidx_mask--;
	for (int i = 0; i < opt.concurrency; i++) {
		slots[i].in_fd = -1;
		slots[i].proc = -1;
	}
	if (opt.mode == MODE_PIPE) {
		procs = xcalloc((size_t)opt.procs, sizeof *procs);
		for (int i = 0; i < opt.procs; i++)
			procs[i].in_fd = procs[i].out_fd = -1;
	}
	store = rb_cli_open(&opt.common);
	new_owner();
	rb_info("dispatching %s as %s (concurrency %d, batch %d, chain %d)", opt.handler, owner_base,
	    opt.concurrency, opt.batch, opt.chain);
	exit_code = run();
	rb_store_close(store);
	for (int i = 0; i < NOWNERS; i++)
		free(owners[i].name);
	for (size_t i = 0; i < nqueue; i++) {
		rb_dl_free(queue[i].d);
		json_decref(queue[i].r);
		chain_free(queue[i].followers);
	}
	free(queue);
	for (int i = 0; opt.mode == MODE_PIPE && i < opt.procs; i++) {
		rb_jsonl_reader_free(procs[i].rd);
		free(procs[i].wbuf);
	}
	free(procs);
	free(slots);
	free(free_slot);
	free(sidx);
	free(owner_base);
	return exit_code;
}
