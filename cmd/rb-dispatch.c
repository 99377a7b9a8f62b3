/* SPDX-License-Identifier: MIT */
/*
 * rb-dispatch: the long-running worker of one handler.  It claims due
 * deliveries (lane leases), runs each through the handler, renews the
 * leases while they run, and completes the results in groups: everything
 * that finished within --window goes to the store in one call.
 *
 * One thread and one poll(2) loop: the handler's child processes (--exec:
 * one per delivery; --pipe: --procs long-running co-processes speaking
 * JSON lines), a self-pipe for SIGCHLD and the stop signals and the database
 * socket, which carries LISTEN/NOTIFY wake-ups (a latency hint; polling
 * every --poll stays the correctness path).  --sql runs a statement in
 * the transaction that deletes the delivery (effectively-once).
 *
 * Surprises: a lost connection is re-established with backoff and the
 * unapplied results are applied afterwards, under a fresh lease owner
 * name, so that a claim whose answer was lost can never stay in flight
 * under a lease this process keeps renewing.  stdout carries nothing of
 * ours (--exec handlers inherit it).
 *
 * This file is the command line; the engine is in cmd/dispatch/
 * (dispatch.h draws its states).
 */
#include "config.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_env.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

#include "dispatch/dispatch.h"

static const char usage_str[] =
"usage: rb-dispatch --handler H (--exec CMD | --pipe CMD | --sql SQL) [--concurrency N]\n"
"                   [--batch N] [--chain N] [--strict-order] [--procs N] [--connections N]\n"
"                   [--lease DUR]\n"
"                   [--timeout DUR] [--grace DUR] [--max-attempts N]\n"
"                   [--backoff BASE[,MAX[,FACTOR]]]\n"
"                   [--poll DUR] [--window DUR] [--stats-every DUR] [--metrics-file PATH]\n"
"                   [--owner NAME] [--drain]\n"
"                   [--settle] [--fail-exit]\n"
"                   [--db URL] [--schema NAME]\n"
"\n"
"Claim the due deliveries of handler H, run them, renew their leases and complete them.\n"
"\n"
"  -H, --handler H        the handler whose deliveries to run (required)\n"
"      --exec CMD         run /bin/sh -c CMD per delivery, the delivery line on stdin:\n"
"                         exit 0 completes, 80 says the handler completed it itself\n"
"                         (relaybus_complete), 75 retries, anything else fails the attempt\n"
"      --pipe CMD         run CMD as co-processes: delivery lines in, result lines out\n"
"                         (the delivery line plus ok, error, retry_ms, dead, completed),\n"
"                         any order\n"
"      --sql SQL          run SQL ($1 = the delivery as JSON) in the transaction that\n"
"                         completes the delivery (effectively-once)\n"
"  -c, --concurrency N    at most N deliveries in flight (default 3200 with --pipe, else 10)\n"
"  -b, --batch N          claim at most N at a time (default 800 with --pipe, else 100)\n"
"      --chain N          claim up to N deliveries of one key at once, run one after\n"
"                         the other, each once the previous one is completed\n"
"                         (default --concurrency / 8, at least 1 and at most 32\n"
"                         with --pipe, else 8)\n"
"      --strict-order     start a key's next delivery only once the completion of the\n"
"                         one before it committed: a crash never runs a key's earlier\n"
"                         delivery again after a later one (relaybus(7) Guarantees)\n"
"      --procs N          --pipe co-processes (default 1)\n"
"      --connections N    deprecated: RELAYBUS_PG_CONNECTIONS=N for this process (1, 2\n"
"                         or 3 database connections; relaybus(7))\n"
"  -l, --lease DUR        lane lease, renewed every third of it (default 30s)\n"
"  -t, --timeout DUR      kill (--exec) or fail (--pipe) an attempt after DUR (default 5m)\n"
"      --grace DUR        on SIGTERM/SIGINT/SIGHUP, let running handlers finish for DUR\n"
"                         (default 30s; SIGQUIT: none; rb-dispatch(1) SIGNALS)\n"
"  -m, --max-attempts N   a failure that reaches N attempts buries (default 10)\n"
"      --backoff SPEC     retry delay BASE[,MAX[,FACTOR]]: BASE*FACTOR^(attempts-1), at most\n"
"                         MAX (default 1s,5m,2)\n"
"      --poll DUR         look for due work every DUR when idle (default 1s)\n"
"      --window DUR       complete the results finished within DUR together (default 2ms)\n"
"      --stats-every DUR  a status line every DUR (default: off)\n"
"      --metrics-file PATH  write this dispatcher's metrics to PATH for node_exporter's\n"
"                         textfile collector, atomically, every --stats-every (15s\n"
"                         without it) and at exit\n"
"      --owner NAME       lease owner (default host:pid:random)\n"
"      --drain            exit once nothing is due and nothing is in flight\n"
"      --settle           --drain with the retries due at once (no backoff, no retry_ms):\n"
"                         exit once every delivery it ran is completed or dead (tests)\n"
"      --fail-exit        with --drain or --settle: exit 82 when an attempt failed\n"
"                         during the run (rescheduled or dead), for cron and timers\n"
RB_COMMON_CONN_HELP
"      --schema NAME      relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
RB_COMMON_LOG_HELP
"\n"
"Exit status: 0 stopped by a signal or drained, 64 usage, 69 database unavailable at\n"
"start, 70 internal error, 71 cannot start the handler, 75 stopped with results not\n"
"applied (database down), 76 schema newer than this relaybus, 77 permission denied,\n"
"78 bad URL or schema not set up, 79 schema needs an upgrade (run rb-setup),\n"
"82 an attempt failed during a --drain run (--fail-exit).\n";

enum { OPT_EXEC = RB_OPT_FIRST_PROGRAM, OPT_PIPE, OPT_SQL, OPT_PROCS, OPT_GRACE, OPT_BACKOFF,
	OPT_POLL, OPT_WINDOW, OPT_STATS, OPT_OWNER, OPT_DRAIN, OPT_CHAIN, OPT_CONNS,
	OPT_SETTLE, OPT_STRICT, OPT_METRICS, OPT_FAIL_EXIT };

static struct options {
	struct rb_common	common;
	struct dispatch_opts	dispatch;
	int			connections;	/* --connections (deprecated): the store's setting */
} opt = { .dispatch = { .concurrency = 0, .batch = 0, .chain = 0, .procs = 1,
	  .lease_ms = RB_DEFAULT_LEASE_MS, .timeout_ms = 5 * 60 * 1000, .grace_ms = 30000,
	  .poll_ms = 1000, .window_ms = 2,
	  .complete = { .max_attempts = RB_DEFAULT_MAX_ATTEMPTS,
		  .backoff = { .base_ms = 1000, .max_ms = 300000, .factor = 2.0 } } } };

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
		{ "strict-order", no_argument, NULL, OPT_STRICT },
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
		{ "settle", no_argument, NULL, OPT_SETTLE },
		{ "metrics-file", required_argument, NULL, OPT_METRICS },
		{ "fail-exit", no_argument, NULL, OPT_FAIL_EXIT },
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
		case OPT_STRICT:
			o->strict_order = true;
			break;
		case OPT_CONNS:
			opt.connections = rb_cli_int(usage_str, "--connections", optarg, 1, 3);
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
		case OPT_METRICS:
			if (*optarg == '\0')
				rb_cli_usage_error(usage_str, "--metrics-file: give a file name");
			o->metrics_file = optarg;
			break;
		case OPT_OWNER:
			o->owner = rb_cli_owner_arg(usage_str, optarg, 180);
			break;
		case OPT_DRAIN:
			o->drain = true;
			break;
		case OPT_SETTLE:
			o->drain = o->settle = true;
			break;
		case OPT_FAIL_EXIT:
			o->fail_exit = true;
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
	if (o->fail_exit && !o->drain)
		rb_cli_usage_error(usage_str, "--fail-exit: only with --drain or --settle");
	if (o->concurrency == 0)
		o->concurrency = o->kind->concurrency;
	if (o->batch == 0)
		o->batch = o->kind->batch;
	/* a key's chain waits in its slots one delivery at a time: by
	 * default it holds at most an eighth of them, so that a few deep keys
	 * cannot leave the handler idle at a small --concurrency */
	if (o->chain == 0) {
		o->chain = o->concurrency / 8;
		if (o->chain > o->kind->chain)
			o->chain = o->kind->chain;
		if (o->chain < 1)
			o->chain = 1;
	}
	/* the metrics file, and systemctl status (STATUS=), are brought up
	 * to date every --stats-every, without it every 15s, and with no
	 * status line asked for */
	if (o->stats_ms == 0 && (o->metrics_file != NULL || getenv("NOTIFY_SOCKET") != NULL)) {
		o->stats_ms = 15000;
		o->stats_quiet = true;
	}
	if (o->procs > o->concurrency)
		o->procs = o->concurrency;
	/* --settle: a failure is due again at once, whatever --backoff says,
	 * so that the drain goes on until it is completed or buried */
	if (o->settle)
		o->complete.backoff = (struct rb_backoff){ .base_ms = 0, .max_ms = 0, .factor = 1.0 };
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
	struct dispatcher *dp;
	struct rb_store *store;
	char *app_name;
	int exit_code;

	guard_std_fds();
	rb_cli_init("rb-dispatch", &opt.common);
	/* before anything reads or copies them: handlers, and a pipeline's
	 * other programs, run as our uid (rb_env.h) */
	rb_env_hide_secrets();
	parse_args(argc, argv);
	rb_log_set_prefix(opt.dispatch.handler);
	/* pg_stat_activity tells the dispatchers apart (PGAPPNAME still wins) */
	opt.common.app = app_name = xasprintf("rb-dispatch/%s", opt.dispatch.handler);
	dp = dispatcher_new(&opt.dispatch);
	/* handlers that are processes die with rb-dispatch, however it dies */
	if (opt.dispatch.kind != &handler_sql)
		guard_start();
	setup_signals();
	{
		/* a connection lost while it starts is made again, as later */
		const struct rb_cli_again again = { .stop = dispatch_stopping, .level = RB_LOG_WARN };

		if ((store = rb_cli_open_again(&opt.common, &again)) == NULL) {
			guard_stop();
			dispatcher_free(dp);
			free(app_name);
			return RB_EXIT_OK;
		}
	}
	/* --sql runs in the completing PostgreSQL transaction: no such thing elsewhere */
	if (opt.dispatch.kind == &handler_sql && strcmp(rb_store_backend(store), "postgresql") != 0)
		rb_cli_usage_error(usage_str, "--sql: not supported by the %s backend", rb_store_backend(store));
	if (opt.connections > 0)
		rb_store_set_connections(store, opt.connections);
	{
		/* a misspelled -H idles silently: say so (a warning, as a
		 * subscription or a publish naming it may come later) */
		struct rb_error err = { 0 };

		if (rb_admin_handler_check(store, opt.dispatch.handler, &err) < 0) {
			if (err.exit_code == RB_EXIT_CONFIG)
				rb_warn("-H: %s; rb-setup --subscribe %s:PATTERN adds one", err.msg,
				    opt.dispatch.handler);
			else
				rb_debug("-H: cannot check the handler: %s", err.msg);
		}
	}
	exit_code = dispatcher_run(dp, store);
	guard_stop();
	rb_store_close(store);
	dispatcher_free(dp);
	free(app_name);
	return exit_code;
}
