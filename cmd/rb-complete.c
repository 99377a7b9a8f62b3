/* SPDX-License-Identifier: MIT */
/*
 * rb-complete: read delivery results as JSON lines (a delivery line as
 * rb-claim printed it, plus ok, error, retry_ms, dead, release) and apply
 * them: complete (delete, fenced by the lease), reschedule with backoff,
 * bury, or release.  Results that arrive within --window are grouped into
 * one statement.  With --output, one outcome line per input line on stdout:
 * completed, rescheduled, buried, released or lost (the lease was taken
 * over); without it stdout stays empty, so that a cron job mails nothing
 * but errors (rb-publish's -o is opt-in the same way).
 *
 * A line that does not parse or lacks a valid lease is reported
 * (stdin:LINE: ...), never applied, and never costs the other results of
 * its group; the exit status is then 65.  At end of input the lanes seen
 * are handed back when they run nothing, so a cron job of
 * `rb-claim | handler | rb-complete` never waits for a lease to expire.
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
"usage: rb-complete [--max-attempts N] [--backoff BASE[,MAX[,FACTOR]]] [--sql SQL]\n"
"                   [--window DUR] [--batch N] [--no-relinquish] [--output] [--db URL]\n"
"                   [--schema NAME]\n"
"\n"
"Apply delivery results read as JSON lines: complete, reschedule, bury or release,\n"
"as they arrive (a group once it has --batch results or --window passed), not at end\n"
"of input, which hands back the lanes seen (the streaming form: rb-claim(1)).\n"
"A result is a delivery line plus \"ok\" (default true), \"error\", \"retry_ms\",\n"
"\"dead\" (bury now), \"release\" (give back, no attempt charged) or \"completed\"\n"
"(the handler completed it itself with relaybus_complete: checked, not completed again).\n"
"\n"
"  -m, --max-attempts N   a failure that reaches N attempts buries (default 10)\n"
"      --backoff SPEC     retry delay BASE[,MAX[,FACTOR]]: BASE*FACTOR^(attempts-1), at most\n"
"                         MAX (default 1s,5m,2)\n"
"      --sql SQL          run SQL ($1 = the result line as JSON) in the transaction that\n"
"                         completes each ok delivery (effectively-once)\n"
"      --window DUR       group results arriving within DUR (default 2ms)\n"
"      --batch N          at most N results per statement (default 500)\n"
"      --no-relinquish    keep the lanes at end of input\n"
"  -o, --output           print one outcome line per result on stdout (default: none)\n"
RB_COMMON_CONN_HELP
"      --schema NAME      relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
RB_COMMON_LOG_HELP
"\n"
"Exit status: 0 ok (lost leases included), 64 usage, 65 a bad input line, 69\n"
"database unavailable, 74 I/O error, 75 connection lost, 78 bad URL or schema not set up,\n"
"76/79 schema newer than this relaybus / needs an upgrade (rb-setup).\n";

enum { OPT_BACKOFF = RB_OPT_FIRST_PROGRAM, OPT_SQL, OPT_WINDOW, OPT_NO_RELINQUISH };

static struct options {
	struct rb_common	common;
	struct rb_complete_opts	co;
	int64_t			window_ms;
	int			batch;
	bool			relinquish;
	bool			output;	/* -o: outcome lines on stdout */
} opt = { .co = { .max_attempts = RB_DEFAULT_MAX_ATTEMPTS,
		  .backoff = { .base_ms = 1000, .max_ms = 300000, .factor = 2.0 } },
	  .window_ms = 2, .batch = 500, .relinquish = true };

static void
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "max-attempts", required_argument, NULL, 'm' },
		{ "backoff", required_argument, NULL, OPT_BACKOFF },
		{ "sql", required_argument, NULL, OPT_SQL },
		{ "window", required_argument, NULL, OPT_WINDOW },
		{ "batch", required_argument, NULL, 'b' },
		{ "no-relinquish", no_argument, NULL, OPT_NO_RELINQUISH },
		{ "output", no_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "m:b:o", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'm':
			opt.co.max_attempts = rb_cli_int(usage_str, "--max-attempts", optarg, 1, 1000000);
			break;
		case OPT_BACKOFF:
			rb_cli_backoff(usage_str, "--backoff", optarg, &opt.co.backoff);
			break;
		case OPT_SQL:
			if (*optarg == '\0')
				rb_cli_usage_error(usage_str, "--sql: empty statement");
			opt.co.sql = optarg;
			break;
		case OPT_WINDOW:
			opt.window_ms = rb_cli_duration(usage_str, "--window", optarg);
			break;
		case 'b':
			opt.batch = rb_cli_int(usage_str, "--batch", optarg, 1, 100000);
			break;
		case OPT_NO_RELINQUISH:
			opt.relinquish = false;
			break;
		case 'o':
			opt.output = true;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
}

/* The results of one group: each line's parsed object (what the results'
 * strings point into), its result, its line number, and with --sql its
 * text for $1. */
static struct group {
	json_t			*objs;
	struct rb_result	*v;
	long			*line;
	char			**json;
	size_t			 n, cap;
} group;

/*
 * The lanes seen, for the hand-back at the end: one result per
 * (handler, lane, epoch), its handler owned; keyed "handler\tlane\tepoch"
 * in seen_key.
 */
static struct rb_result *seen;
static size_t nseen, capseen;
static json_t *seen_key;

static void
remember_lane(const struct rb_result *r)
{
	char key[300];

	snprintf(key, sizeof key, "%s\t%d\t%lld", r->handler, r->lease.lane, (long long)r->lease.epoch);
	if (json_object_get(seen_key, key) != NULL)
		return;
	json_object_set_new(seen_key, key, json_true());
	if (nseen == capseen) {
		capseen = capseen == 0 ? 16 : capseen * 2;
		seen = xrealloc(seen, capseen * sizeof *seen);
	}
	seen[nseen++] = (struct rb_result){ .handler = xstrdup(r->handler), .lease = r->lease };
}

static void
group_add(json_t *obj, const struct rb_result *r, long line, const char *text, size_t len)
{
	if (group.n == group.cap) {
		group.cap = group.cap == 0 ? 64 : group.cap * 2;
		group.v = xrealloc(group.v, group.cap * sizeof *group.v);
		group.line = xrealloc(group.line, group.cap * sizeof *group.line);
		group.json = xrealloc(group.json, group.cap * sizeof *group.json);
	}
	json_array_append_new(group.objs, obj);
	group.v[group.n] = *r;
	group.line[group.n] = line;
	/* (--sql: the result line, as it came, is the statement's $1) */
	group.json[group.n] = NULL;
	if (opt.co.sql != NULL) {
		group.json[group.n] = xmalloc(len + 1);
		memcpy(group.json[group.n], text, len);
		group.json[group.n][len] = '\0';
	}
	group.v[group.n].json = group.json[group.n];
	group.n++;
}

static void
group_clear(void)
{
	for (size_t i = 0; i < group.n; i++) {
		free(group.json[i]);
		free(group.v[i].sql_error);
	}
	json_array_clear(group.objs);
	group.n = 0;
}

/* What a result line is read for (rb_result_parse): the rest, a payload
 * echoed back, is only checked to be JSON, never interpreted. */
static const char *const result_members[] = { "event_id", "handler", "lease", "delivery_id", "ok",
	"error", "retry_ms", "dead", "release", "completed", "key", "sequence", NULL };

/*
 * The handler contract of rb-claim --follow --chain: once a keyed line
 * failed and was rescheduled, the later lines of its key that came with it
 * (the same lane lease) are answered "release":true until the key comes
 * round again (a line whose sequence is not above the failed one's).
 * order_state: "handler\tkey" -> {lane, epoch, seq, line, event} of the
 * failure that holds the key back.
 */
static json_t *order_state;
static long order_violations;

static void
order_check(const struct rb_result *r, const json_t *obj, long line)
{
	const char *key = json_string_value(json_object_get(obj, "key"));
	const json_t *sq = json_object_get(obj, "sequence");
	char *k;
	size_t klen;
	json_t *st;
	json_int_t seq;

	if (key == NULL || !json_is_integer(sq))
		return;
	seq = json_integer_value(sq);
	klen = strlen(r->handler) + strlen(key) + 2;
	k = xmalloc(klen);
	snprintf(k, klen, "%s\t%s", r->handler, key);
	if ((st = json_object_get(order_state, k)) != NULL) {
		if (seq <= json_integer_value(json_object_get(st, "seq")))
			json_object_del(order_state, k);	/* (its retry) */
		else if (r->verdict != RB_VERDICT_RELEASE &&
		    r->lease.lane == json_integer_value(json_object_get(st, "lane")) &&
		    r->lease.epoch == json_integer_value(json_object_get(st, "epoch"))) {
			order_violations++;
			rb_warn("stdin:%ld: order violation: %s (key %s, sequence %lld) was answered after %s of its "
			    "key failed (line %ld), not with \"release\":true", line, r->event_id, key,
			    (long long)seq, json_string_value(json_object_get(st, "event")),
			    (long)json_integer_value(json_object_get(st, "line")));
		}
	}
	if ((r->verdict == RB_VERDICT_FAIL || r->verdict == RB_VERDICT_DEAD) &&
	    r->outcome == RB_OUTCOME_RESCHEDULED)
		json_object_set_new(order_state, k, json_pack("{sIsIsIsIss}", "lane", (json_int_t)r->lease.lane,
		    "epoch", (json_int_t)r->lease.epoch, "seq", seq, "line", (json_int_t)line,
		    "event", r->event_id));
	free(k);
}

static long counts[RB_NOUTCOMES + 1];	/* by outcome, then bad lines */
static long by_handler;			/* of the completed: by the handler */
#define BAD_LINES	counts[RB_NOUTCOMES]

/* The outcome line of r (input line number line). */
static json_t *
outcome_line(const struct rb_result *r, long line)
{
	json_t *o = json_object();

	json_object_set_new(o, "event_id", json_string(r->event_id));
	json_object_set_new(o, "handler", json_string(r->handler));
	json_object_set_new(o, "outcome", json_string(rb_outcome_name(r->outcome)));
	if (r->attempts >= 0)
		json_object_set_new(o, "attempts", json_integer(r->attempts));
	if (r->missing)
		json_object_set_new(o, "missing", json_true());
	if (r->by_handler)
		json_object_set_new(o, "by", json_string("handler"));
	if (r->sql_error != NULL)
		json_object_set_new(o, "error", json_string(r->sql_error));
	json_object_set_new(o, "line", json_integer(line));
	return o;
}

/* stdout failed after the results through input line `last` were applied */
static void __attribute__((noreturn))
out_failed(long last)
{
	/* a reader that went away (| head): no "Broken pipe", but what was left undone */
	if (errno == EPIPE) {
		rb_warn("stdout closed: applied through line %ld, the rest of the input not read", last);
		exit(RB_EXIT_IOERR);
	}
	rb_die_errno(RB_EXIT_IOERR, "cannot write to stdout");
}

static int
apply(struct rb_store *store)
{
	struct rb_error err = { 0 };

	if (group.n == 0)
		return 0;
	if (rb_store_complete(store, &opt.co, group.v, group.n, &err) < 0) {
		rb_error("stdin:%ld-%ld: %s (these results were not applied)", group.line[0],
		    group.line[group.n - 1], err.msg);
		return err.exit_code != 0 ? err.exit_code : RB_EXIT_SOFTWARE;
	}
	for (size_t i = 0; i < group.n; i++) {
		const struct rb_result *r = &group.v[i];
		long line = group.line[i];
		json_t *o;
		int rc, e;

		counts[r->outcome]++;
		by_handler += r->by_handler;
		order_check(r, json_array_get(group.objs, i), line);
		if (r->missing)
			rb_warn("stdin:%ld: delivery %s of %s does not exist (completed elsewhere, or never "
			    "published): not applied", line, r->event_id, r->handler);
		else if (r->outcome == RB_OUTCOME_LOST)
			rb_info("stdin:%ld: lease lost for %s of %s: not applied", line, r->event_id, r->handler);
		else if (r->sql_error != NULL)
			/* (said by default: the result became a failed attempt) */
			rb_warn("stdin:%ld: %s of %s: attempt %d/%d failed: %.*s (%s)", line, r->event_id,
			    r->handler, r->attempts, opt.co.max_attempts, (int)strcspn(r->sql_error, "\r\n"),
			    r->sql_error, rb_outcome_name(r->outcome));
		if (!opt.output)
			continue;
		o = outcome_line(r, line);
		rc = rb_jsonl_write(stdout, o);
		e = errno;
		json_decref(o);
		errno = e;
		if (rc < 0)
			out_failed(group.line[group.n - 1]);
	}
	if (opt.output && fflush(stdout) != 0)
		out_failed(group.line[group.n - 1]);
	group_clear();
	return 0;
}

int
main(int argc, char **argv)
{
	struct rb_store *store;
	struct rb_jsonl_reader *in;
	const char *line;
	size_t len;
	int st, exit_code = RB_EXIT_OK;
	bool bad = false;
	int64_t group_deadline = 0;

	rb_cli_init("rb-complete", &opt.common);
	parse_args(argc, argv);
	store = rb_cli_open(&opt.common);
	in = rb_jsonl_reader_new(STDIN_FILENO, RB_JSONL_RESULT_MAX);
	group.objs = json_array();
	seen_key = json_object();
	order_state = json_object();
	for (;;) {
		int timeout = -1;

		if (group.n > 0) {
			int64_t left = group_deadline - rb_mono_ms();

			timeout = left > 0 ? (int)left : 0;
		}
		st = rb_jsonl_next(in, timeout, &line, &len);
		if (st == RB_JSONL_AGAIN) {
			if ((exit_code = apply(store)) != 0)
				break;
			continue;
		}
		if (st == RB_JSONL_EOF)
			break;
		if (st == RB_JSONL_ERR) {
			rb_error("cannot read stdin: %s", strerror(errno));
			exit_code = RB_EXIT_IOERR;
			break;
		}
		if (st == RB_JSONL_TOOLONG) {
			rb_error("stdin:%ld: line longer than %d bytes: not applied", rb_jsonl_lineno(in),
			    RB_JSONL_RESULT_MAX);
			BAD_LINES++;
			bad = true;
			continue;
		}
		{
			json_t *obj;
			struct rb_result r;
			char why[256];
			struct rb_error err = { 0 };

			if (rb_json_members(line, len, result_members, &obj, why, sizeof why) < 0 ||
			    (rb_result_parse(obj, &r, &err) < 0 && snprintf(why, sizeof why, "%s", err.msg) >= 0)) {
				json_decref(obj);
				rb_error("stdin:%ld: %s: not applied", rb_jsonl_lineno(in), why);
				BAD_LINES++;
				bad = true;
				continue;
			}
			remember_lane(&r);
			if (group.n == 0)
				group_deadline = rb_mono_ms() + opt.window_ms;
			group_add(obj, &r, rb_jsonl_lineno(in), line, len);
		}
		if (group.n >= (size_t)opt.batch && (exit_code = apply(store)) != 0)
			break;
	}
	if (exit_code == RB_EXIT_OK)
		exit_code = apply(store);
	if (exit_code == RB_EXIT_OK && opt.relinquish && nseen > 0) {
		struct rb_error err = { 0 };
		int n;

		if ((n = rb_store_relinquish_leases(store, seen, nseen, &err)) < 0)
			rb_warn("could not hand back the lanes (they free up when the lease ends): %s", err.msg);
		else
			rb_info("handed back %d lanes", n);
	}
	if (exit_code == RB_EXIT_OK && bad)
		exit_code = RB_EXIT_DATAERR;
	if (order_violations > 0)
		rb_warn("%ld order violations: results of a key after its failure that were not releases "
		    "(rb-claim(1), --chain)", order_violations);
	rb_info("%ld completed (%ld by the handler), %ld rescheduled, %ld buried, %ld released, %ld lost, "
	    "%ld bad lines", counts[RB_OUTCOME_COMPLETED], by_handler, counts[RB_OUTCOME_RESCHEDULED],
	    counts[RB_OUTCOME_BURIED], counts[RB_OUTCOME_RELEASED], counts[RB_OUTCOME_LOST], BAD_LINES);
	group_clear();
	json_decref(group.objs);
	free(group.v);
	free(group.line);
	free(group.json);
	for (size_t i = 0; i < nseen; i++)
		free((char *)seen[i].handler);
	free(seen);
	json_decref(seen_key);
	json_decref(order_state);
	rb_jsonl_reader_free(in);
	rb_store_close(store);
	return exit_code;
}
