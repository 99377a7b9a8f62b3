/* SPDX-License-Identifier: MIT */
/*
 * rb-publish: read events as JSON lines on stdin and publish them, in
 * transactions of --batch lines, each all or nothing.  Each event fans out
 * to one delivery per subscribed handler (or per handler it names); an
 * event id that exists already adds deliveries only for handlers it never
 * had (inbox dedup), so replaying input is safe.
 *
 * Memory stays constant: only the current batch is held.  A partial batch
 * is committed when input pauses for --flush (a broker consumer trickling
 * events must not wait for a full batch).  A bad line stops the run (exit
 * 65) without committing its batch; --keep-going skips it instead.
 * --reconnect DUR rides through a restart or failover of the server: the
 * batch that was not acknowledged is sent again (event ids make that safe)
 * once a server answers, and the run ends only when none has for DUR.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_trace.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-publish [--db URL] [--schema NAME] [--batch N] [--flush DUR] [--output]\n"
"                  [--keep-going] [--rejects FILE] [--max-line BYTES] [--reconnect DUR]\n"
"                  [--trace]\n"
"\n"
"Publish events read as JSON lines on stdin, in transactions of --batch lines.\n"
"An event: {\"name\": ..., \"payload\": ..., \"id\", \"key\", \"headers\", \"delay_ms\" or\n"
"\"available_at\", \"handlers\"}.\n"
"\n"
"  -u, --db URL          postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"  -h, --host HOST       server host or socket folder (PGHOST)\n"
"  -p, --port PORT       server port (PGPORT)\n"
"  -U, --username USER   database user (PGUSER)\n"
"  -d, --dbname NAME     database name (PGDATABASE), or a URL as --db\n"
"  -W, --password        ask for the password on the terminal\n"
"      --schema NAME     relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
"  -b, --batch N         lines per transaction (default 100)\n"
"      --flush DUR       commit a partial batch when input pauses this long (default 20ms)\n"
"  -o, --output          print one outcome line per event on stdout\n"
"  -k, --keep-going      skip bad lines (reported on stderr; exit 65 at the end)\n"
"      --rejects FILE    append bad lines, verbatim, to FILE (created 0600; not a\n"
"                        symbolic link)\n"
"      --max-line BYTES  longest accepted line (default 1048576)\n"
"      --reconnect DUR   when the connection is lost, reconnect (with backoff) and send\n"
"                        again what was not acknowledged; exit only when no server\n"
"                        has answered for DUR (default 0: exit at once)\n"
"      --trace           give an event without a W3C traceparent in its headers a new\n"
"                        one (a new trace, sampled): its handlers join it\n"
"  -v, --verbose         more messages (-vv: debug)\n"
"  -q, --quiet           errors only (no summary)\n"
"      --log-format FMT  text (default) or json diagnostics on stderr\n"
"      --help            this help\n"
"  -V, --version         version and libraries\n"
"\n"
"Exit status: 0 ok, 64 usage, 65 a bad input line, 69 database unavailable,\n"
"81 an event id that exists with another name, key or payload (a conflict),\n"
"73 cannot open --rejects, 74 I/O error, 75 connection lost (rerun: ids make it safe;\n"
"or --reconnect),\n"
"76/79 schema newer than this relaybus / needs an upgrade (rb-setup),\n"
"78 bad URL or schema not set up.\n";

enum { OPT_FLUSH = RB_OPT_FIRST_PROGRAM, OPT_REJECTS, OPT_MAX_LINE, OPT_RECONNECT, OPT_TRACE };

static struct options {
	struct rb_common common;
	int		 batch;
	int64_t		 flush_ms;
	bool		 output;
	bool		 keep_going;
	const char	*rejects;
	size_t		 max_line;
	int64_t		 reconnect_ms;
	const char	*reconnect_arg;
	bool		 trace;		/* --trace */
} opt = { .batch = 100, .flush_ms = 20 };

static struct counters {
	long	events, deliveries, duplicates, unrouted, rejected;
	long	conflicts;		/* of the rejected: ids that exist with other data */
	long	committed_line;		/* the last input line whose batch committed */
} cnt;

static FILE *rejects_f;
static bool progress;		/* stderr is a terminal */
static int64_t last_progress_ms;

static void
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "batch", required_argument, NULL, 'b' },
		{ "flush", required_argument, NULL, OPT_FLUSH },
		{ "output", no_argument, NULL, 'o' },
		{ "keep-going", no_argument, NULL, 'k' },
		{ "rejects", required_argument, NULL, OPT_REJECTS },
		{ "max-line", required_argument, NULL, OPT_MAX_LINE },
		{ "reconnect", required_argument, NULL, OPT_RECONNECT },
		{ "trace", no_argument, NULL, OPT_TRACE },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	opt.max_line = RB_JSONL_DEFAULT_MAX;
	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "b:ok", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'b':
			opt.batch = rb_cli_int(usage_str, "--batch", optarg, 1, 100000);
			break;
		case OPT_TRACE:
			opt.trace = true;
			break;
		case OPT_FLUSH:
			opt.flush_ms = rb_cli_duration(usage_str, "--flush", optarg);
			break;
		case 'o':
			opt.output = true;
			break;
		case 'k':
			opt.keep_going = true;
			break;
		case OPT_REJECTS:
			opt.rejects = optarg;
			break;
		case OPT_MAX_LINE:
			opt.max_line = (size_t)rb_cli_int(usage_str, "--max-line", optarg, 16, 256 * 1024 * 1024);
			break;
		case OPT_RECONNECT:
			opt.reconnect_ms = rb_cli_duration(usage_str, "--reconnect", optarg);
			opt.reconnect_arg = optarg;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
}

static void
summary(void)
{
	if (progress && last_progress_ms != 0)
		fputc('\n', stderr);
	rb_notice("%ld events, %ld deliveries, %ld duplicates, %ld without handlers, %ld rejected; "
	    "committed through line %ld", cnt.events, cnt.deliveries, cnt.duplicates, cnt.unrouted,
	    cnt.rejected, cnt.committed_line);
}

static void
show_progress(void)
{
	int64_t now = rb_mono_ms();

	if (!progress || now - last_progress_ms < 1000)
		return;
	if (last_progress_ms == 0 && cnt.events < 10000)
		return;	/* small inputs stay quiet */
	last_progress_ms = now;
	fprintf(stderr, "\r%s: %ld events, %ld deliveries...", rb_log_prog(), cnt.events, cnt.deliveries);
	fflush(stderr);
}

/*
 * --rejects FILE: appended to, created 0600 (rejected lines are payloads),
 * never through a symbolic link (one planted in a shared folder would
 * send publishers' lines into another file).
 */
static FILE *
open_rejects(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	FILE *f;

	if (fd < 0 && errno == ELOOP)
		rb_die(RB_EXIT_CANTCREAT, "--rejects: cannot open %s: it is a symbolic link", path);
	if (fd < 0 || (f = fdopen(fd, "a")) == NULL)
		rb_die_errno(RB_EXIT_CANTCREAT, "--rejects: cannot open %s", path);
	return f;
}

/* Report a bad line; save it to --rejects.  Returns the exit code to end with. */
static void
reject(const char *line, size_t len, long lineno, const char *why)
{
	rb_error("stdin:%ld: %s", lineno, why);
	cnt.rejected++;
	if (rejects_f != NULL && line != NULL) {
		if (fwrite(line, 1, len, rejects_f) != len || putc('\n', rejects_f) == EOF ||
		    fflush(rejects_f) != 0)
			rb_die_errno(RB_EXIT_IOERR, "cannot write %s", opt.rejects);
	}
}

/*
 * The batch in hand, as the text the store receives: the validated input
 * lines joined into a JSON array ("[" line "," line ...; the closing "]"
 * is added when it is sent), so no event is printed again after parsing.
 * off/len locate each line in it (for --rejects and one-by-one retries).
 */
struct batch {
	struct rb_sbuf	 text;
	size_t		*off, *len;
	long		*lines;
	size_t		 n;
};

static void
batch_add(struct batch *b, const char *line, size_t len, long lineno)
{
	rb_sb_putn(&b->text, b->n == 0 ? "[" : ",", 1);
	b->off[b->n] = b->text.len;
	b->len[b->n] = len;
	b->lines[b->n] = lineno;
	rb_sb_putn(&b->text, line, len);
	b->n++;
}

static void
batch_clear(struct batch *b)
{
	b->text.len = 0;
	b->n = 0;
}

/* The name of event i, for a warning (parsed again: rare). */
static char *
event_name(const struct batch *b, size_t i)
{
	json_t *e = json_loadb(b->text.s + b->off[i], b->len[i], 0, NULL);
	char *name = xstrdup(e != NULL && json_is_string(json_object_get(e, "name")) ?
	    json_string_value(json_object_get(e, "name")) : "?");

	json_decref(e);
	return name;
}

static int
write_acks(const struct batch *b, const struct rb_publish_acks *acks, size_t from)
{
	for (size_t i = 0; i < acks->n; i++) {
		const struct rb_publish_ack *a = &acks->v[i];
		long line = b->lines[from + i];

		cnt.events++;
		cnt.deliveries += a->deliveries;
		if (a->duplicate)
			cnt.duplicates++;
		else if (a->deliveries == 0) {
			cnt.unrouted++;
			if (cnt.unrouted <= 10) {
				char *name = event_name(b, from + i);

				rb_warn("stdin:%ld: event %s (%s) matches no handler: stored without deliveries",
				    line, a->id, name);
				free(name);
			}
		}
		/* the ack as jansson would print it: {"event_id","deliveries","duplicate","handlers","line"} */
		if (opt.output && (fputs("{\"event_id\":", stdout) == EOF || rb_jsonl_put_string(stdout, a->id) < 0 ||
		    printf(",\"deliveries\":%d,\"duplicate\":%s,\"handlers\":%s,\"line\":%ld}\n",
		    a->deliveries, a->duplicate ? "true" : "false", a->handlers, line) < 0))
			return -1;
	}
	if (opt.output && fflush(stdout) != 0)
		return -1;
	return 0;
}

/* Publish one slice of the batch as one transaction. */
static int
publish_slice(struct rb_store *store, struct batch *b, size_t from, size_t n, struct rb_error *err)
{
	struct rb_publish_acks acks;
	char *one = NULL;
	const char *text;
	int rc;

	if (from == 0 && n == b->n) {
		rb_sb_putn(&b->text, "]", 1);
		text = b->text.s;
	} else {
		/* a retry of one event (--keep-going) */
		one = xasprintf("[%.*s]", (int)b->len[from], b->text.s + b->off[from]);
		text = one;
	}
	rc = rb_store_publish_text(store, text, n, &acks, err);
	if (one == NULL)	/* take the "]" back: the batch may be retried event by event */
		b->text.s[--b->text.len] = '\0';
	free(one);
	if (rc < 0)
		return -1;
	cnt.committed_line = b->lines[from + n - 1];
	if (write_acks(b, &acks, from) < 0) {
		int e = errno;

		rb_publish_acks_clear(&acks);
		/* a reader that went away (| head): no "Broken pipe", but what was left undone */
		if (e == EPIPE) {
			rb_warn("stdout closed: committed through line %ld, the rest not published",
			    cnt.committed_line);
			exit(RB_EXIT_IOERR);
		}
		errno = e;
		rb_die_errno(RB_EXIT_IOERR, "cannot write to stdout (committed through line %ld)",
		    cnt.committed_line);
	}
	rb_publish_acks_clear(&acks);
	return 0;
}

/* A failure that a reconnect may cure: the connection, or no server. */
static bool
lost(struct rb_store *store, const struct rb_error *err)
{
	return err->exit_code == RB_EXIT_TEMPFAIL || err->exit_code == RB_EXIT_UNAVAILABLE ||
	    rb_store_broken(store);
}

/*
 * --reconnect: after err (from the batch at line), reconnect with backoff
 * (100 ms doubling to RB_RECONNECT_MAX_MS) until a server answers: 0; -1 with err set to
 * the last failure when none has for --reconnect.  Failed attempts are
 * shown with -v.
 */
static int
ride_through(struct rb_store *store, long line, struct rb_error *err)
{
	int64_t since = rb_mono_ms(), backoff = 100;

	rb_warn("stdin:%ld: %s; reconnecting (for up to %s)", line, err->msg, opt.reconnect_arg);
	for (;;) {
		int64_t left = since + opt.reconnect_ms - rb_mono_ms();
		struct rb_error e = { 0 };
		char server[300];

		if (left <= 0) {
			rb_error("no server answered for %s (--reconnect)", opt.reconnect_arg);
			return -1;
		}
		poll(NULL, 0, (int)(backoff < left ? backoff : left));
		backoff = backoff * 2 > RB_RECONNECT_MAX_MS ? RB_RECONNECT_MAX_MS : backoff * 2;
		if (rb_store_reconnect(store, &e) < 0) {
			rb_info("reconnect failed: %s", e.msg);
			*err = e;
			continue;
		}
		rb_store_server(store, server, sizeof server);
		rb_warn("reconnected to %s; sending again from line %ld", server, line);
		return 0;
	}
}

/* rb_cli_open, with --reconnect through a server that is not there yet. */
static struct rb_store *
open_riding(void)
{
	const struct rb_cli_again again = { .for_ms = opt.reconnect_ms, .unavailable = true,
		.level = RB_LOG_INFO };

	if (opt.reconnect_ms == 0)
		return rb_cli_open(&opt.common);
	return rb_cli_open_again(&opt.common, &again);
}

/* publish_slice, through reconnects with --reconnect. */
static int
publish_riding(struct rb_store *store, struct batch *b, size_t from, size_t n, struct rb_error *err)
{
	for (;;) {
		memset(err, 0, sizeof *err);
		if (publish_slice(store, b, from, n, err) == 0)
			return 0;
		if (opt.reconnect_ms == 0 || !lost(store, err) || ride_through(store, b->lines[from], err) < 0)
			return -1;
	}
}

/* An error of one event, not of the run: data the database refuses (an
 * impossible date, a delay past --max-delay), or an id that exists with
 * another name, key or payload (a conflict). */
static bool
event_error(const struct rb_error *err)
{
	return err->exit_code == RB_EXIT_DATAERR || err->exit_code == RB_EXIT_CONFLICT;
}

/*
 * Commit the batch.  A data error the database finds (say an impossible
 * date) fails the whole transaction: fail fast reports the batch's lines;
 * --keep-going retries the events one by one so only the bad one is
 * rejected.  Returns 0, or an exit code to stop with.
 */
static int
flush_batch(struct rb_store *store, struct batch *b)
{
	struct rb_error err = { 0 };

	if (b->n == 0)
		return 0;
	if (publish_riding(store, b, 0, b->n, &err) == 0) {
		batch_clear(b);
		return 0;
	}
	if (!event_error(&err)) {
		rb_error("stdin:%ld: %s; committed through line %ld", b->lines[0], err.msg, cnt.committed_line);
		return err.exit_code;
	}
	if (!opt.keep_going) {
		rb_error("stdin:%ld-%ld: %s (this batch was not committed; committed through line %ld)",
		    b->lines[0], b->lines[b->n - 1], err.msg, cnt.committed_line);
		return err.exit_code;
	}
	for (size_t i = 0; i < b->n; i++) {
		struct rb_error e1 = { 0 };

		if (publish_riding(store, b, i, 1, &e1) == 0)
			continue;
		if (!event_error(&e1)) {
			rb_error("stdin:%ld: %s; committed through line %ld", b->lines[i], e1.msg,
			    cnt.committed_line);
			return e1.exit_code;
		}
		if (e1.exit_code == RB_EXIT_CONFLICT)
			cnt.conflicts++;
		reject(b->text.s + b->off[i], b->len[i], b->lines[i], e1.msg);
	}
	batch_clear(b);
	return 0;
}

/*
 * A handler named in "handlers" that has no subscription and no
 * deliveries is most likely misspelled: a warning, once per name and run
 * (its dispatcher may legitimately come later, so the event is stored).
 */
static json_t *seen;

static void
check_handlers(struct rb_store *store, const json_t *ev, long line)
{
	const json_t *h;
	size_t i;

	if (seen == NULL)
		seen = json_object();
	json_array_foreach(json_object_get(ev, "handlers"), i, h) {
		const char *name = json_string_value(h);
		struct rb_error err = { 0 };

		if (name == NULL || json_object_get(seen, name) != NULL)
			continue;
		json_object_set_new(seen, name, json_true());
		if (rb_admin_handler_check(store, name, &err) < 0) {
			if (err.exit_code == RB_EXIT_CONFIG)
				rb_warn("stdin:%ld: %s: stored anyway (its deliveries wait for rb-dispatch -H %s)",
				    line, err.msg, name);
			else
				rb_debug("stdin:%ld: cannot check handler '%s': %s", line, name, err.msg);
		}
	}
}

int
main(int argc, char **argv)
{
	struct rb_store *store;
	struct rb_jsonl_reader *in;
	struct batch b = { 0 };
	const char *line;
	size_t len;
	int exit_code = RB_EXIT_OK, st;
	bool bad_seen = false;

	rb_cli_init("rb-publish", &opt.common);
	parse_args(argc, argv);
	if (opt.rejects != NULL)
		rejects_f = open_rejects(opt.rejects);
	progress = isatty(STDERR_FILENO);
	store = open_riding();
	in = rb_jsonl_reader_new(STDIN_FILENO, opt.max_line);
	b.off = xcalloc((size_t)opt.batch, sizeof *b.off);
	b.len = xcalloc((size_t)opt.batch, sizeof *b.len);
	b.lines = xcalloc((size_t)opt.batch, sizeof *b.lines);

	for (;;) {
		st = rb_jsonl_next(in, b.n > 0 ? (int)opt.flush_ms : -1, &line, &len);
		if (st == RB_JSONL_AGAIN) {
			/* input paused: commit what we have */
			if ((exit_code = flush_batch(store, &b)) != 0)
				break;
			continue;
		}
		if (st == RB_JSONL_EOF)
			break;
		if (st == RB_JSONL_ERR) {
			rb_error("cannot read stdin: %s; committed through line %ld", strerror(errno),
			    cnt.committed_line);
			exit_code = RB_EXIT_IOERR;
			break;
		}
		if (st == RB_JSONL_TOOLONG) {
			char why[96];

			snprintf(why, sizeof why, "line longer than %zu bytes", opt.max_line);
			reject(NULL, 0, rb_jsonl_lineno(in), why);
			bad_seen = true;
			if (!opt.keep_going) {
				exit_code = RB_EXIT_DATAERR;
				break;
			}
			continue;
		}
		{
			json_t *ev;
			char why[256];
			struct rb_error err = { 0 };
			char *traced = NULL;

			if (rb_jsonl_parse(line, len, &ev, why, sizeof why) < 0 ||
			    (rb_event_validate(ev, &err) < 0 && snprintf(why, sizeof why, "%s", err.msg) >= 0)) {
				json_decref(ev);
				reject(line, len, rb_jsonl_lineno(in), why);
				bad_seen = true;
				if (!opt.keep_going) {
					exit_code = RB_EXIT_DATAERR;
					break;
				}
				continue;
			}
			check_handlers(store, ev, rb_jsonl_lineno(in));
			if (opt.trace && (traced = rb_trace_line_with_new(ev, line, len)) != NULL) {
				line = traced;
				len = strlen(traced);
			}
			if (json_object_get(ev, "event_id") != NULL && json_object_get(ev, "id") == NULL) {
				/* the alias: the store reads "id", so the line gets one in
				 * front, the rest sent as written (numbers keep their spelling) */
				char *id = json_dumps(json_object_get(ev, "event_id"), JSON_ENCODE_ANY);
				const char *brace = memchr(line, '{', len);
				char *t = xasprintf("{\"id\":%s,%.*s", id, (int)(len - (size_t)(brace + 1 - line)),
				    brace + 1);

				batch_add(&b, t, strlen(t), rb_jsonl_lineno(in));
				free(t);
				free(id);
			} else
				batch_add(&b, line, len, rb_jsonl_lineno(in));
			json_decref(ev);
			free(traced);
		}
		if (b.n == (size_t)opt.batch && (exit_code = flush_batch(store, &b)) != 0)
			break;
		show_progress();
	}
	if (exit_code == RB_EXIT_OK)
		exit_code = flush_batch(store, &b);
	if (exit_code == RB_EXIT_OK && (bad_seen || cnt.rejected > cnt.conflicts))
		exit_code = RB_EXIT_DATAERR;
	else if (exit_code == RB_EXIT_OK && cnt.conflicts > 0)
		exit_code = RB_EXIT_CONFLICT;
	summary();
	free(b.text.s);
	free(b.off);
	free(b.len);
	free(b.lines);
	json_decref(seen);
	rb_jsonl_reader_free(in);
	rb_store_close(store);
	if (rejects_f != NULL && fclose(rejects_f) != 0)
		rb_die_errno(RB_EXIT_IOERR, "cannot write %s", opt.rejects);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		if (errno == EPIPE) {	/* everything is committed: a reader that went away, said with -v */
			rb_info("stdout closed");
			return RB_EXIT_IOERR;
		}
		rb_die(RB_EXIT_IOERR, "cannot write to stdout");
	}
	return exit_code;
}
