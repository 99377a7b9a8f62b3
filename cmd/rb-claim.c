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
#include <time.h>
#include <unistd.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-claim --handler H [--batch N] [--lease DUR] [--owner NAME] [--wait DUR]\n"
"                [--poll DUR] [--max-attempts N] [--db URL] [--schema NAME]\n"
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
"  -u, --db URL           postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"  -h, --host HOST        server host or socket folder (PGHOST)\n"
"  -p, --port PORT        server port (PGPORT)\n"
"  -U, --username USER    database user (PGUSER)\n"
"  -d, --dbname NAME      database name (PGDATABASE), or a URL as --db\n"
"      --schema NAME      relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
"  -v, --verbose          more messages (-vv: debug)\n"
"  -q, --quiet            errors only\n"
"      --log-format FMT   text (default) or json diagnostics on stderr\n"
"      --help             this help\n"
"  -V, --version          version and libraries\n"
"\n"
"Exit status: 0 deliveries printed, 1 nothing was due, 64 usage, 69 database\n"
"unavailable, 74 stdout failed or its reader left before taking them all (the rest\n"
"released), 75 temporary failure or interrupted, 76/79 schema newer than this\n"
"relaybus / needs an upgrade (rb-setup), 78 bad URL or schema not set up.\n";

enum { OPT_OWNER = RB_OPT_FIRST_PROGRAM, OPT_POLL, OPT_MAX_ATTEMPTS };

static struct options {
	struct rb_common common;
	const char	*handler;
	int		 batch;
	int64_t		 lease_ms;
	const char	*owner;
	int64_t		 wait_ms;
	int64_t		 poll_ms;
	int		 max_attempts;
} opt = { .batch = RB_DEFAULT_BATCH, .lease_ms = RB_DEFAULT_LEASE_MS, .poll_ms = 1000,
	  .max_attempts = RB_DEFAULT_MAX_ATTEMPTS };

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
		{ NULL, 0, NULL, 0 }
	};
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "H:b:l:w:", longopts, NULL)) != -1) {
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
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
	if (opt.handler == NULL)
		rb_cli_usage_error(usage_str, "--handler is required");
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

/* Give back what we claimed but could not hand on. */
static void
give_back(struct rb_store *store, json_t *deliveries, size_t from, const char *owner)
{
	struct rb_complete_opts co = { .max_attempts = opt.max_attempts,
	    .backoff = { .base_ms = 1000, .max_ms = 1000, .factor = 1 } };
	struct rb_error err = { 0 };
	json_t *rel = json_array(), *out = NULL;

	for (size_t i = from; i < json_array_size(deliveries); i++) {
		json_t *d = json_deep_copy(json_array_get(deliveries, i));

		json_object_del(d, RB_LINE_TEXT_KEY);
		json_object_set_new(d, "release", json_true());
		json_array_append_new(rel, d);
	}
	if (rb_store_complete(store, &co, rel, &out, &err) < 0 ||
	    rb_store_relinquish(store, opt.handler, owner, &err) < 0)
		rb_warn("could not release the claimed deliveries (they return when the lease ends): %s",
		    err.msg);
	json_decref(out);
	json_decref(rel);
}

int
main(int argc, char **argv)
{
	struct rb_store *store;
	struct rb_claim_opts co;
	struct rb_error err = { 0 };
	json_t *deliveries = NULL;
	char *owner;
	int n, exit_code = RB_EXIT_OK;
	int64_t deadline;
	bool listening = false;

	rb_cli_init("rb-claim", &opt.common);
	parse_args(argc, argv);
	owner = opt.owner != NULL ? xstrdup(opt.owner) : rb_cli_owner();
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	store = rb_cli_open(&opt.common);
	co = (struct rb_claim_opts){ .handler = opt.handler, .owner = owner, .batch = opt.batch,
	    .lease_ms = opt.lease_ms, .max_attempts = opt.max_attempts, .line_text = true };
	deadline = rb_mono_ms() + opt.wait_ms;
	for (;;) {
		if ((n = rb_store_claim(store, &co, &deliveries, &err)) < 0)
			goto fail;
		if (n > 0 || stop || rb_mono_ms() >= deadline)
			break;
		json_decref(deliveries);
		deliveries = NULL;
		if (!listening) {
			if (rb_store_listen(store, &err) < 0)
				goto fail;
			listening = true;
			continue;	/* claim once more: an event may have come before LISTEN */
		}
		int64_t left = deadline - rb_mono_ms();
		int wait = (int)(left < opt.poll_ms ? left : opt.poll_ms);
		if (wait > 0 && rb_store_notified(store, opt.handler, wait, &err) < 0)
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
		const json_t *line = json_object_get(json_array_get(deliveries, i), RB_LINE_TEXT_KEY);
		int handed = 1;

		if (fwrite(json_string_value(line), 1, json_string_length(line), stdout) != json_string_length(line) ||
		    fflush(stdout) != 0) {
			int e = errno;

			give_back(store, deliveries, i, owner);
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
			give_back(store, deliveries, i, owner);
			rb_info("stdout closed: %d deliveries released", n - (int)i);
			exit_code = RB_EXIT_IOERR;
			goto out;
		}
		if (handed < 0) {
			/* this line may still be read (and run): it stays in flight */
			give_back(store, deliveries, i + 1, owner);
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
	json_decref(deliveries);
	rb_store_close(store);
	free(owner);
	return exit_code;
}
