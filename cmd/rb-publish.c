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
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-publish [--db URL] [--schema NAME] [--batch N] [--flush DUR] [--output]\n"
"                  [--keep-going] [--rejects FILE] [--max-line BYTES]\n"
"\n"
"Publish events read as JSON lines on stdin, in transactions of --batch lines.\n"
"An event: {\"name\": ..., \"payload\": ..., \"id\", \"key\", \"headers\", \"delay_ms\" or\n"
"\"available_at\", \"handlers\"}.\n"
"\n"
"  -u, --db URL          postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"      --schema NAME     relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
"  -b, --batch N         lines per transaction (default 100)\n"
"      --flush DUR       commit a partial batch when input pauses this long (default 20ms)\n"
"  -o, --output          print one outcome line per event on stdout\n"
"  -k, --keep-going      skip bad lines (reported on stderr; exit 65 at the end)\n"
"      --rejects FILE    append bad lines, verbatim, to FILE\n"
"      --max-line BYTES  longest accepted line (default 1048576)\n"
"  -v, --verbose         more messages (-vv: debug)\n"
"  -q, --quiet           errors only (no summary)\n"
"      --log-format FMT  text (default) or json diagnostics on stderr\n"
"  -h, --help            this help\n"
"  -V, --version         version and libraries\n"
"\n"
"Exit status: 0 ok, 64 usage, 65 a bad input line, 69 database unavailable,\n"
"73 cannot open --rejects, 74 I/O error, 75 connection lost (rerun: ids make it safe),\n"
"78 bad URL or schema not set up.\n";

enum { OPT_FLUSH = RB_OPT_FIRST_PROGRAM, OPT_REJECTS, OPT_MAX_LINE };

static struct options {
	struct rb_common common;
	int		 batch;
	int64_t		 flush_ms;
	bool		 output;
	bool		 keep_going;
	const char	*rejects;
	size_t		 max_line;
} opt = { .batch = 100, .flush_ms = 20 };

static struct counters {
	long	events, deliveries, duplicates, unrouted, rejected;
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

/* The batch in hand: events and their line numbers (and raw text for --rejects). */
struct batch {
	json_t	*events;
	long	*lines;
	char	**raw;		/* only with --keep-going or --rejects: to retry or save */
	size_t	 n;
};

static void
batch_clear(struct batch *b)
{
	json_array_clear(b->events);
	for (size_t i = 0; i < b->n; i++) {
		free(b->raw[i]);
		b->raw[i] = NULL;
	}
	b->n = 0;
}

static int
write_acks(const struct batch *b, const json_t *acks, size_t from)
{
	size_t i;
	json_t *a;

	json_array_foreach(acks, i, a) {
		long line = b->lines[from + i];
		long nd = (long)json_integer_value(json_object_get(a, "deliveries"));

		cnt.events++;
		cnt.deliveries += nd;
		if (json_is_true(json_object_get(a, "duplicate")))
			cnt.duplicates++;
		else if (nd == 0) {
			cnt.unrouted++;
			if (cnt.unrouted <= 10)
				rb_warn("stdin:%ld: event %s (%s) matches no handler: stored without deliveries",
				    line, json_string_value(json_object_get(a, "id")),
				    json_string_value(json_object_get(json_array_get(b->events, from + i), "name")));
		}
		if (opt.output) {
			json_object_set_new(a, "line", json_integer(line));
			if (rb_jsonl_write(stdout, a) < 0)
				return -1;
		}
	}
	if (opt.output && fflush(stdout) != 0)
		return -1;
	return 0;
}

/* Publish one slice of the batch as one transaction. */
static int
publish_slice(struct rb_store *store, struct batch *b, size_t from, size_t n, struct rb_error *err)
{
	json_t *slice = json_array(), *acks = NULL;
	int rc;

	for (size_t i = from; i < from + n; i++)
		json_array_append(slice, json_array_get(b->events, i));
	rc = rb_store_publish(store, slice, &acks, err);
	json_decref(slice);
	if (rc < 0)
		return -1;
	cnt.committed_line = b->lines[from + n - 1];
	if (write_acks(b, acks, from) < 0) {
		json_decref(acks);
		rb_die_errno(RB_EXIT_IOERR, "cannot write to stdout (committed through line %ld)",
		    cnt.committed_line);
	}
	json_decref(acks);
	return 0;
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
	if (publish_slice(store, b, 0, b->n, &err) == 0) {
		batch_clear(b);
		return 0;
	}
	if (err.exit_code != RB_EXIT_DATAERR) {
		rb_error("stdin:%ld: %s; committed through line %ld", b->lines[0], err.msg, cnt.committed_line);
		return err.exit_code;
	}
	if (!opt.keep_going) {
		rb_error("stdin:%ld-%ld: %s (this batch was not committed; committed through line %ld)",
		    b->lines[0], b->lines[b->n - 1], err.msg, cnt.committed_line);
		return RB_EXIT_DATAERR;
	}
	for (size_t i = 0; i < b->n; i++) {
		struct rb_error e1 = { 0 };

		if (publish_slice(store, b, i, 1, &e1) == 0)
			continue;
		if (e1.exit_code != RB_EXIT_DATAERR) {
			rb_error("stdin:%ld: %s; committed through line %ld", b->lines[i], e1.msg,
			    cnt.committed_line);
			return e1.exit_code;
		}
		reject(b->raw[i], b->raw[i] != NULL ? strlen(b->raw[i]) : 0, b->lines[i], e1.msg);
	}
	batch_clear(b);
	return 0;
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
	if (opt.rejects != NULL && (rejects_f = fopen(opt.rejects, "a")) == NULL)
		rb_die_errno(RB_EXIT_CANTCREAT, "--rejects: cannot open %s", opt.rejects);
	progress = isatty(STDERR_FILENO);
	store = rb_cli_open(&opt.common);
	in = rb_jsonl_reader_new(STDIN_FILENO, opt.max_line);
	b.events = json_array();
	b.lines = xcalloc((size_t)opt.batch, sizeof *b.lines);
	b.raw = xcalloc((size_t)opt.batch, sizeof *b.raw);

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
			json_array_append_new(b.events, ev);
			b.lines[b.n] = rb_jsonl_lineno(in);
			if (opt.keep_going || rejects_f != NULL)
				b.raw[b.n] = strndup(line, len);
			b.n++;
		}
		if (b.n == (size_t)opt.batch && (exit_code = flush_batch(store, &b)) != 0)
			break;
		show_progress();
	}
	if (exit_code == RB_EXIT_OK)
		exit_code = flush_batch(store, &b);
	if (exit_code == RB_EXIT_OK && (bad_seen || cnt.rejected > 0))
		exit_code = RB_EXIT_DATAERR;
	summary();
	batch_clear(&b);
	json_decref(b.events);
	free(b.lines);
	free(b.raw);
	rb_jsonl_reader_free(in);
	rb_store_close(store);
	if (rejects_f != NULL && fclose(rejects_f) != 0)
		rb_die_errno(RB_EXIT_IOERR, "cannot write %s", opt.rejects);
	if (fflush(stdout) != 0 || ferror(stdout))
		rb_die(RB_EXIT_IOERR, "cannot write to stdout");
	return exit_code;
}
