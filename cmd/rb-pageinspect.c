/* SPDX-License-Identifier: MIT */
/*
 * rb-pageinspect: WAL and HOT diagnostics, PostgreSQL only.
 *
 * `lifecycle` publishes, claims and completes one delivery in a scratch
 * schema (created and dropped by the run, also on error and on SIGINT) and
 * prints what it left on the heap page and in every index of the
 * deliveries table, the versions of the lane row, and the tuple counters,
 * in the layout of the seed's pageinspect-before/after; `--baseline` does
 * the same for the 0.1.0 row-lease table.  `watch` prints, per interval,
 * the live rates of the configured schema: completions per second, WAL
 * bytes per delivery, the HOT share of lane updates, dead tuples.
 * Reads nothing on stdin; --json prints one JSON object per report line.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_inspect.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-pageinspect lifecycle [--baseline | --side-by-side] [--json] [--db URL]\n"
"       rb-pageinspect watch [--interval DUR] [--count N] [--json] [--db URL] [--schema NAME]\n"
"\n"
"Show what the delivery path writes: on the pages (lifecycle) or live (watch).\n"
"\n"
"  lifecycle              publish, claim and complete one delivery in a scratch schema\n"
"                         and print its heap page, index entries, lane row versions and\n"
"                         tuple counters (needs the pageinspect extension and a superuser)\n"
"  watch                  per interval: completions/s, WAL bytes per delivery, HOT share of\n"
"                         lane updates, delivery updates, dead tuples, autovacuum runs\n"
"\n"
"  -b, --baseline         lifecycle of the 0.1.0 row-lease design instead\n"
"  -s, --side-by-side     lifecycle of both designs, in two columns\n"
"  -j, --json             one JSON object per report instead of text\n"
"  -i, --interval DUR     watch: time between lines (default 5s)\n"
"  -c, --count N          watch: stop after N lines (default: until interrupted)\n"
RB_COMMON_CONN_HELP
"      --schema NAME      watch: relaybus schema (default: $RELAYBUS_SCHEMA or public)\n"
RB_COMMON_LOG_HELP
"\n"
"Exit status: 0 ok, 64 usage, 69 database unavailable or pageinspect missing,\n"
"70 internal error, 74 stdout failed, 75 temporary failure or interrupted,\n"
"78 bad URL or schema not set up, 76/79 (watch) schema newer than this relaybus /\n"
"needs an upgrade (rb-setup).\n";

static struct options {
	struct rb_common common;
	bool		 baseline;
	bool		 side_by_side;
	bool		 json;
	int64_t		 interval_ms;
	int		 count;		/* 0: until interrupted */
	bool		 interval_set, count_set;
} opt = { .interval_ms = 5000 };

static volatile sig_atomic_t stop;

static void
on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static int cmd_lifecycle(void);
static int cmd_watch(void);

static const struct inspect_cmd {
	const char	*name;
	int		(*run)(void);
} inspect_cmds[] = {
	{ "lifecycle", cmd_lifecycle },
	{ "watch", cmd_watch },
	{ NULL, NULL }
};

static const struct inspect_cmd *
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "baseline", no_argument, NULL, 'b' },
		{ "side-by-side", no_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "interval", required_argument, NULL, 'i' },
		{ "count", required_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 }
	};
	const struct inspect_cmd *cmd;
	int c;

	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "bsji:c:", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 'b':
			opt.baseline = true;
			break;
		case 's':
			opt.side_by_side = true;
			break;
		case 'j':
			opt.json = true;
			break;
		case 'i':
			opt.interval_ms = rb_cli_duration(usage_str, "--interval", optarg);
			if (opt.interval_ms < 100)
				rb_cli_usage_error(usage_str, "--interval: at least 100ms");
			opt.interval_set = true;
			break;
		case 'c':
			opt.count = rb_cli_int(usage_str, "--count", optarg, 1, 100000000);
			opt.count_set = true;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind >= argc)
		rb_cli_usage_error(usage_str, "a command is required: lifecycle or watch");
	for (cmd = inspect_cmds; cmd->name != NULL; cmd++)
		if (strcmp(cmd->name, argv[optind]) == 0)
			break;
	if (cmd->name == NULL)
		rb_cli_usage_error(usage_str, "unknown command '%s': use lifecycle or watch", argv[optind]);
	if (optind + 1 < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind + 1]);
	if (cmd->run == cmd_lifecycle && (opt.interval_set || opt.count_set))
		rb_cli_usage_error(usage_str, "--interval and --count go with watch");
	if (cmd->run == cmd_watch && (opt.baseline || opt.side_by_side))
		rb_cli_usage_error(usage_str, "--baseline and --side-by-side go with lifecycle");
	if (opt.baseline && opt.side_by_side)
		rb_cli_usage_error(usage_str, "--baseline and --side-by-side exclude each other");
	return cmd;
}

/* ---- lifecycle: the seed's text blocks ------------------------------------- */

static json_int_t
iget(const json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static const char *
sget(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s != NULL ? s : "";
}

static void
print_flags(FILE *f, const json_t *flags)
{
	size_t i;
	json_t *v;

	if (json_array_size(flags) == 0) {
		fputs("-", f);
		return;
	}
	json_array_foreach(flags, i, v)
		fprintf(f, "%s%s", i > 0 ? "|" : "", json_string_value(v));
}

static void
print_tuples(FILE *f, const json_t *tuples)
{
	size_t i;
	json_t *t;

	fprintf(f, "  %4s %8s %8s %-9s %s\n", "lp", "xmin", "xmax", "ctid", "flags");
	json_array_foreach(tuples, i, t) {
		const char *state = sget(t, "state");

		if (strcmp(state, "normal") == 0) {
			fprintf(f, "  %4lld %8lld %8lld %-9s ", (long long)iget(t, "lp"),
			    (long long)iget(t, "xmin"), (long long)iget(t, "xmax"), sget(t, "ctid"));
			print_flags(f, json_object_get(t, "flags"));
			fputc('\n', f);
		} else if (strcmp(state, "redirect") == 0) {
			fprintf(f, "  %4lld %8s %8s %-9s REDIRECT -> %lld\n", (long long)iget(t, "lp"),
			    "", "", "", (long long)iget(t, "redirect_to"));
		} else {
			fprintf(f, "  %4lld %8s %8s %-9s %s\n", (long long)iget(t, "lp"), "", "", "",
			    strcmp(state, "dead") == 0 ? "DEAD" : "UNUSED");
		}
	}
}

static void
print_lifecycle(FILE *f, const json_t *r)
{
	const json_t *heap = json_object_get(r, "heap"), *idx = json_object_get(r, "indexes");
	const json_t *lv = json_object_get(r, "lane_versions"), *cnt = json_object_get(r, "counters");
	const json_t *sum = json_object_get(r, "summary"), *v;
	bool lanes = strcmp(sget(r, "design"), "lane-lease") == 0;
	size_t i, holding = 0, w = 0;
	const char *name;

	fprintf(f, "%s: one event, one handler: %s\n",
	    lanes ? "lane leases (relaybus)" : "row leases (0.1.0)",
	    lanes ? "publish, claim, complete, relinquish" : "publish, claim, complete");
	fprintf(f, "scratch schema %s, PostgreSQL %.*s, autovacuum off\n\n", sget(r, "schema"),
	    (int)strcspn(sget(r, "server_version"), " "), sget(r, "server_version"));
	json_array_foreach(json_object_get(heap, "pages"), i, v) {
		fprintf(f, "heap page %lld of %s (%lld line pointers)\n", (long long)iget(v, "page"),
		    sget(heap, "table"), (long long)iget(v, "line_pointers"));
		print_tuples(f, json_object_get(v, "tuples"));
		fputc('\n', f);
	}
	json_array_foreach(idx, i, v) {
		if (iget(v, "entries") > 0)
			holding++;
		if (strlen(sget(v, "name")) > w)
			w = strlen(sget(v, "name"));
	}
	fprintf(f, "indexes of %s: %zu -- %zu hold the row, %lld entries in all\n",
	    sget(heap, "table"), json_array_size(idx), holding, (long long)iget(sum, "index_entries"));
	json_array_foreach(idx, i, v) {
		size_t j;
		json_t *t;

		fprintf(f, "  %-*s entries=%lld", (int)w, sget(v, "name"), (long long)iget(v, "entries"));
		if (json_array_size(json_object_get(v, "heap_tids")) > 0)
			fputs(" -> heap tids", f);
		json_array_foreach(json_object_get(v, "heap_tids"), j, t)
			fprintf(f, " %s", json_string_value(t));
		fputc('\n', f);
	}
	fputc('\n', f);
	if (json_is_object(lv)) {
		fprintf(f, "lane %lld of %s: the lane row the claim touched, its versions only\n",
		    (long long)iget(lv, "lane"), sget(lv, "handler"));
		print_tuples(f, json_object_get(lv, "versions"));
		fputc('\n', f);
	}
	fputs("tuple counters:\n", f);
	json_object_foreach((json_t *)cnt, name, v)
		fprintf(f, "  %-20s inserted=%lld updated=%lld hot_updated=%lld deleted=%lld\n", name,
		    (long long)iget(v, "inserted"), (long long)iget(v, "updated"),
		    (long long)iget(v, "hot_updated"), (long long)iget(v, "deleted"));
	fprintf(f, "\nin short: %lld heap tuple%s, %lld index entr%s, %lld update%s of the delivery "
	    "that %s not HOT\n", (long long)iget(sum, "heap_tuples"),
	    iget(sum, "heap_tuples") == 1 ? "" : "s", (long long)iget(sum, "index_entries"),
	    iget(sum, "index_entries") == 1 ? "y" : "ies", (long long)iget(sum, "non_hot_updates"),
	    iget(sum, "non_hot_updates") == 1 ? "" : "s",
	    iget(sum, "non_hot_updates") == 1 ? "was" : "were");
}

/* The columns out has: $COLUMNS when it is a number, else a terminal's
 * width, else 0 (a file or pipe: no limit). */
static size_t
out_columns(FILE *out)
{
	const char *c = getenv("COLUMNS");
	struct winsize ws;
	char *end;

	if (c != NULL && *c != '\0') {
		long v = strtol(c, &end, 10);

		if (*end == '\0' && v > 0)
			return (size_t)v;
	}
	if (isatty(fileno(out)) && ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	return 0;
}

/* the longest line of text */
static size_t
widest(const char *text)
{
	size_t w = 0;

	for (const char *p = text; *p != '\0';) {
		size_t n = strcspn(p, "\n");

		if (n > w)
			w = n;
		p += n + (p[n] != '\0');
	}
	return w;
}

/* Print two reports in two columns, or one after the other when the two
 * columns are wider than the terminal ($COLUMNS). */
static int
print_side_by_side(FILE *out, const json_t *left, const json_t *right)
{
	char *lb = NULL, *rb = NULL;
	size_t ll = 0, rl = 0, w = 0, cols = out_columns(out);
	FILE *lf = open_memstream(&lb, &ll), *rf = open_memstream(&rb, &rl);

	if (lf == NULL || rf == NULL)
		rb_die_errno(RB_EXIT_OSERR, "open_memstream");
	print_lifecycle(lf, left);
	print_lifecycle(rf, right);
	fclose(lf);
	fclose(rf);
	w = widest(lb);
	if (cols > 0 && w + 3 + widest(rb) > cols) {
		fprintf(out, "%s\n%s", lb, rb);
		free(lb);
		free(rb);
		return 0;
	}
	for (char *p = lb, *q = rb; *p != '\0' || *q != '\0';) {
		size_t n = strcspn(p, "\n"), m = strcspn(q, "\n");

		if (m > 0)
			fprintf(out, "%-*.*s | %.*s\n", (int)w, (int)n, p, (int)m, q);
		else
			fprintf(out, "%.*s\n", (int)n, p);
		p += n + (p[n] != '\0');
		q += m + (q[m] != '\0');
	}
	free(lb);
	free(rb);
	return 0;
}

static int
write_out(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		if (errno != EPIPE || rb_log_level() >= RB_LOG_INFO)
			rb_error("cannot write to stdout: %s", strerror(errno));
		return RB_EXIT_IOERR;
	}
	return RB_EXIT_OK;
}

static int
cmd_lifecycle(void)
{
	struct rb_inspect_opts io = { .baseline = opt.baseline, .app = "rb-pageinspect",
	    .stop = &stop };
	struct rb_error err = { 0 };
	json_t *rep = NULL, *base = NULL;
	int rc;

	if (rb_inspect_lifecycle(opt.common.db, &io, &rep, &err) < 0)
		goto fail;
	if (opt.side_by_side) {
		io.baseline = true;
		if (rb_inspect_lifecycle(opt.common.db, &io, &base, &err) < 0)
			goto fail;
	}
	if (opt.json && base != NULL) {
		json_t *both = json_pack("{s:O, s:O}", "lane_lease", rep, "row_lease", base);

		rb_jsonl_write(stdout, both);
		json_decref(both);
	} else if (opt.json) {
		rb_jsonl_write(stdout, rep);
	} else if (base != NULL) {
		print_side_by_side(stdout, rep, base);
	} else {
		print_lifecycle(stdout, rep);
	}
	rc = write_out();
	json_decref(rep);
	json_decref(base);
	return rc;
fail:
	json_decref(rep);
	rb_error("%s", err.msg);
	return err.exit_code != 0 ? err.exit_code : RB_EXIT_SOFTWARE;
}

/* ---- watch ----------------------------------------------------------------- */

/* Sleep ms, or less when a signal asks to stop. */
static void
nap(int64_t ms)
{
	int64_t end = rb_mono_ms() + ms;

	while (!stop) {
		int64_t left = end - rb_mono_ms();
		struct timespec ts;

		if (left <= 0)
			break;
		if (left > 100)
			left = 100;
		ts.tv_sec = 0;
		ts.tv_nsec = (long)left * 1000000L;
		nanosleep(&ts, NULL);
	}
}

static void
print_watch_line(const json_t *d, int n)
{
	const json_t *dead = json_object_get(d, "dead_tuples"), *av = json_object_get(d, "autovacuum_runs");
	const json_t *wal = json_object_get(d, "wal_bytes_per_delivery");
	const json_t *hot = json_object_get(d, "lane_hot_share"), *v;
	char walbuf[32], hotbuf[32], now[16];
	json_int_t runs = 0;
	const char *name;
	time_t t = time(NULL);

	if (n % 20 == 0)
		printf("%-8s %11s %11s %8s %10s %11s %10s %11s %8s\n", "time", "completed/s",
		    "WAL B/deliv", "lane HOT", "deliv upd", "dead deliv", "dead lanes", "dead events",
		    "autovac");
	json_object_foreach((json_t *)av, name, v)
		runs += json_integer_value(v);
	if (json_is_number(wal))
		snprintf(walbuf, sizeof walbuf, "%.0f", json_number_value(wal));
	else
		snprintf(walbuf, sizeof walbuf, "-");
	if (json_is_number(hot))
		snprintf(hotbuf, sizeof hotbuf, "%.0f%%", 100 * json_number_value(hot));
	else
		snprintf(hotbuf, sizeof hotbuf, "-");
	strftime(now, sizeof now, "%H:%M:%S", localtime(&t));
	printf("%-8s %11.1f %11s %8s %10lld %11lld %10lld %11lld %8lld\n", now,
	    json_number_value(json_object_get(d, "completed_per_sec")), walbuf, hotbuf,
	    (long long)iget(d, "delivery_updates"), (long long)iget(dead, "relaybus_deliveries"),
	    (long long)iget(dead, "relaybus_lanes"), (long long)iget(dead, "relaybus_events"),
	    (long long)runs);
}

static int
cmd_watch(void)
{
	struct rb_store *store = rb_cli_open(&opt.common);
	struct rb_error err = { 0 };
	json_t *prev = NULL, *cur = NULL;
	int rc = RB_EXIT_OK;

	if (rb_inspect_sample(store, &prev, &err) < 0)
		goto fail;
	for (int n = 0; (opt.count == 0 || n < opt.count) && !stop; n++) {
		json_t *d;

		nap(opt.interval_ms);
		if (stop)
			break;
		if (rb_inspect_sample(store, &cur, &err) < 0)
			goto fail;
		d = rb_inspect_delta(prev, cur);
		if (opt.json) {
			char at[32];

			/* ISO 8601 in UTC with milliseconds, as every program prints a time */
			rb_fmt_iso_ms((int64_t)(json_real_value(json_object_get(cur, "at")) * 1000), at);
			json_object_set_new(d, "at", json_string(at));
			rb_jsonl_write(stdout, d);
		} else {
			print_watch_line(d, n);
		}
		json_decref(d);
		json_decref(prev);
		prev = cur;
		cur = NULL;
		if ((rc = write_out()) != RB_EXIT_OK)
			goto out;
	}
	goto out;
fail:
	rb_error("%s", err.msg);
	rc = err.exit_code != 0 ? err.exit_code : RB_EXIT_SOFTWARE;
out:
	json_decref(prev);
	json_decref(cur);
	rb_store_close(store);
	return rc;
}

int
main(int argc, char **argv)
{
	const struct inspect_cmd *cmd;
	struct sigaction sa;

	rb_cli_init("rb-pageinspect", &opt.common);
	cmd = parse_args(argc, argv);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;	/* no SA_RESTART: a sleep ends at once */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	return cmd->run();
}
