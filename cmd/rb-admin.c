/* SPDX-License-Identifier: MIT */
/*
 * rb-admin: see and operate the bus from a shell.  One subcommand per run
 * (stats, list, show, requeue, bury, cancel, purge, lanes, subscriptions),
 * dispatched from admin_cmds[].  Records go to stdout as JSON lines when
 * stdout is not a terminal (or --json), as an aligned table when it is
 * (or --table); diagnostics and purge progress go to stderr.
 *
 * requeue, bury and cancel act on event ids given as arguments, on the
 * lines of stdin (the JSON lines `list` prints, or bare event ids), or
 * with --all/--key/--event/--limit on every matching delivery; they never
 * touch a delivery in flight.  purge deletes in batches, one short
 * transaction each, and stops after the current batch on SIGINT/SIGTERM.
 */
#include "config.h"

#include <ctype.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"
#include "admin/prom.h"
#include "admin/table.h"
#include "admin/top.h"

static const char usage_str[] =
"usage: rb-admin [--db URL] [--schema NAME] [--json | --table] COMMAND [options] [args]\n"
"\n"
"See and operate the relaybus bus.\n"
"\n"
"Commands:\n"
"  stats [--handler NAME] [--prometheus] [--output FILE]\n"
"        counts per handler and in total: pending (due, delayed), processing,\n"
"        dead, completed (with history), oldest pending age, events without deliveries\n"
"  list [--status STATUS[,STATUS]] [--handler NAME] [--key KEY] [--event ID] [--limit N]\n"
"        deliveries, oldest first (status: pending, processing, dead, completed)\n"
"  show EVENT_ID...\n"
"        an event, its payload and every delivery\n"
"  requeue [--handler NAME] [EVENT_ID...]   dead deliveries back to pending\n"
"  requeue --all|--key KEY|--event ID|--limit N [--handler NAME]\n"
"  bury [--reason TEXT] (same selection)     pending deliveries to dead\n"
"  cancel (same selection)                   delete pending deliveries\n"
"        without ids or --all/--key/--event/--limit: event ids or `list` lines on stdin\n"
"  purge [--dead-older-than DUR] [--completed-older-than DUR]\n"
"        [--history-older-than DUR] [--keys] [--batch N]\n"
"        retention: dead deliveries, events without deliveries, completion history,\n"
"        key counters no delivery needs\n"
"  lanes [--handler NAME] [--all]\n"
"        held lanes (or with ids in flight; --all: every lane): owner, epoch, lease\n"
"  subscriptions [--handler NAME]\n"
"        which handler receives which event names\n"
"  top [--handler NAME] [--once] [--interval DUR]\n"
"        a live view on the terminal: per handler pending, due, in flight, dead,\n"
"        completions/s, oldest age; the lane holders (keys: q quit, h next handler)\n"
"\n"
"Options:\n"
"  -u, --db URL                 postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"  -h, --host HOST              server host or socket folder (PGHOST)\n"
"  -p, --port PORT              server port (PGPORT)\n"
"  -U, --username USER          database user (PGUSER)\n"
"  -d, --dbname NAME            database name (PGDATABASE), or a URL as --db\n"
"  -W, --password               ask for the password on the terminal\n"
"      --schema NAME            schema of the tables (default: $RELAYBUS_SCHEMA or public)\n"
"      --json                   JSON lines (the default when stdout is not a terminal)\n"
"      --table                  an aligned table (the default on a terminal)\n"
"      --status STATUS          list: pending, processing, dead, completed; comma-separated\n"
"  -H, --handler NAME           only this handler\n"
"      --key KEY                only deliveries of this ordering key\n"
"      --event ID               only deliveries of this event\n"
"  -n, --limit N                at most N deliveries, oldest first\n"
"  -a, --all                    requeue/bury/cancel: every matching delivery; lanes: every lane\n"
"      --reason TEXT            bury: the last_error to record (default: buried by rb-admin)\n"
"      --prometheus             stats: Prometheus text exposition format (relaybus_up 0\n"
"                               when the bus cannot be read, with the exit status)\n"
"      --output FILE            stats: write FILE atomically (a temporary file beside\n"
"                               it, renamed), mode 0644: node_exporter's textfile collector\n"
"      --dead-older-than DUR    purge dead deliveries last changed before DUR ago (7d, 12h)\n"
"      --completed-older-than DUR  purge events older than DUR with no delivery left\n"
"                               (and deliveries relaybus 0.1.0 completed before DUR ago)\n"
"      --history-older-than DUR    purge completion history older than DUR\n"
"      --keys                   purge the counters of ordering keys that no pending,\n"
"                               in-flight or dead delivery has (their sequences restart)\n"
"      --batch N                rows per purge transaction (default 1000)\n"
"      --once                   top: print one frame, plain, and exit\n"
"      --interval DUR           top: refresh every DUR (default 1s)\n"
"  -v, --verbose                more messages (-vv: debug)\n"
"  -q, --quiet                  errors only\n"
"      --log-format FORMAT      text (default) or json diagnostics on stderr\n"
"      --help                   this help\n"
"  -V, --version                version and libraries\n"
"\n"
"Exit status: 0 ok, 64 usage, 65 an id or input line that matches nothing or\n"
"does not parse (the rest is still processed), 69 database unavailable,\n"
"70 internal error, 74 output error, 75 temporary failure or purge interrupted,\n"
"76 schema newer than this relaybus, 77 permission denied, 78 bad URL or schema,\n"
"or no completion history, 79 schema needs an upgrade (run rb-setup).\n";

#define APPLY_CHUNK	1000

enum {
	OPT_JSON = RB_OPT_FIRST_PROGRAM, OPT_TABLE, OPT_STATUS, OPT_KEY, OPT_EVENT,
	OPT_REASON, OPT_PROMETHEUS, OPT_DEAD_OLDER, OPT_COMPLETED_OLDER, OPT_HISTORY_OLDER,
	OPT_BATCH, OPT_KEYS, OPT_OUTPUT, OPT_ONCE, OPT_INTERVAL
};

/* which options a command takes */
enum {
	F_STATUS = 1 << 0, F_HANDLER = 1 << 1, F_KEY = 1 << 2, F_EVENT = 1 << 3, F_LIMIT = 1 << 4,
	F_ALL = 1 << 5, F_REASON = 1 << 6, F_PROMETHEUS = 1 << 7, F_PURGE = 1 << 8,
	F_OUTPUT = 1 << 9, F_TOP = 1 << 10,
};

static struct options {
	struct rb_common	 common;
	int			 table;		/* -1 by terminal, 0 JSON, 1 table */
	const char		*status, *handler, *key, *event, *reason, *output;
	int64_t			 limit;
	bool			 all, prometheus, keys;
	int64_t			 dead_older, completed_older, history_older;	/* ms; -1 unset */
	int			 batch;
	bool			 once;		/* top --once */
	int64_t			 interval;	/* top --interval, ms */
	unsigned		 seen;		/* F_* given */
	const char		*seen_name[16];
} opt;

static int	cmd_stats(struct rb_store *, int, char **);
static int	cmd_list(struct rb_store *, int, char **);
static int	cmd_show(struct rb_store *, int, char **);
static int	cmd_requeue(struct rb_store *, int, char **);
static int	cmd_bury(struct rb_store *, int, char **);
static int	cmd_cancel(struct rb_store *, int, char **);
static int	cmd_purge(struct rb_store *, int, char **);
static int	cmd_lanes(struct rb_store *, int, char **);
static int	cmd_subscriptions(struct rb_store *, int, char **);
static int	cmd_top(struct rb_store *, int, char **);

#define F_SELECT (F_HANDLER | F_KEY | F_EVENT | F_LIMIT | F_ALL)

static const struct admin_cmd {
	const char	*name, *usage;
	unsigned	 opts;		/* F_* accepted */
	int		 min_args, max_args;
	int		(*run)(struct rb_store *, int, char **);
} admin_cmds[] = {
	{ "stats", "stats [--handler NAME] [--prometheus] [--output FILE]", F_HANDLER | F_PROMETHEUS |
	    F_OUTPUT, 0, 0, cmd_stats },
	{ "list", "list [--status STATUS] [--handler NAME] [--key KEY] [--event ID] [--limit N]",
	    F_STATUS | F_HANDLER | F_KEY | F_EVENT | F_LIMIT, 0, 0, cmd_list },
	{ "show", "show EVENT_ID...", 0, 1, INT_MAX, cmd_show },
	{ "requeue", "requeue [--all|--key KEY|--event ID|--limit N] [--handler NAME] [EVENT_ID...]",
	    F_SELECT, 0, INT_MAX, cmd_requeue },
	{ "bury", "bury [--all|--key KEY|--event ID|--limit N] [--handler NAME] [--reason TEXT] [EVENT_ID...]",
	    F_SELECT | F_REASON, 0, INT_MAX, cmd_bury },
	{ "cancel", "cancel [--all|--key KEY|--event ID|--limit N] [--handler NAME] [EVENT_ID...]",
	    F_SELECT, 0, INT_MAX, cmd_cancel },
	{ "purge", "purge [--dead-older-than DUR] [--completed-older-than DUR] [--history-older-than DUR] [--keys] [--batch N]",
	    F_PURGE, 0, 0, cmd_purge },
	{ "lanes", "lanes [--handler NAME] [--all]", F_HANDLER | F_ALL, 0, 0, cmd_lanes },
	{ "subscriptions", "subscriptions [--handler NAME]", F_HANDLER, 0, 0, cmd_subscriptions },
	{ "top", "top [--handler NAME] [--once] [--interval DUR]", F_HANDLER | F_TOP, 0, 0, cmd_top },
	{ NULL, NULL, 0, 0, 0, NULL }
};

static const struct admin_cmd *the_cmd;
static int cmd_argc;		/* the command's arguments */
static char **cmd_argv;
static char *cmd_usage;		/* "usage: rb-admin <the command's usage>" */

static void
seen(unsigned flag, const char *name)
{
	for (int b = 0; b < 16; b++)
		if (flag == 1u << b)
			opt.seen_name[b] = name;
	opt.seen |= flag;
}

static int
parse_opts(int argc, char **argv, const char *shortopts)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "json", no_argument, NULL, OPT_JSON },
		{ "table", no_argument, NULL, OPT_TABLE },
		{ "status", required_argument, NULL, OPT_STATUS },
		{ "handler", required_argument, NULL, 'H' },
		{ "key", required_argument, NULL, OPT_KEY },
		{ "event", required_argument, NULL, OPT_EVENT },
		{ "limit", required_argument, NULL, 'n' },
		{ "all", no_argument, NULL, 'a' },
		{ "reason", required_argument, NULL, OPT_REASON },
		{ "prometheus", no_argument, NULL, OPT_PROMETHEUS },
		{ "dead-older-than", required_argument, NULL, OPT_DEAD_OLDER },
		{ "completed-older-than", required_argument, NULL, OPT_COMPLETED_OLDER },
		{ "history-older-than", required_argument, NULL, OPT_HISTORY_OLDER },
		{ "batch", required_argument, NULL, OPT_BATCH },
		{ "keys", no_argument, NULL, OPT_KEYS },
		{ "output", required_argument, NULL, OPT_OUTPUT },
		{ "once", no_argument, NULL, OPT_ONCE },
		{ "interval", required_argument, NULL, OPT_INTERVAL },
		{ NULL, 0, NULL, 0 }
	};
	const char *u = cmd_usage != NULL ? cmd_usage : usage_str;
	int c;

	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case OPT_JSON:
			opt.table = 0;
			break;
		case OPT_TABLE:
			opt.table = 1;
			break;
		case OPT_STATUS:
			if (!rb_admin_status_valid(optarg))
				rb_cli_usage_error(u, "--status: '%s' is not pending, processing, dead "
				    "or completed", optarg);
			opt.status = optarg;
			seen(F_STATUS, "--status");
			break;
		case 'H':
			opt.handler = rb_cli_handler(u, optarg);
			seen(F_HANDLER, "--handler");
			break;
		case OPT_KEY:
			opt.key = optarg;
			seen(F_KEY, "--key");
			break;
		case OPT_EVENT:
			opt.event = optarg;
			seen(F_EVENT, "--event");
			break;
		case 'n':
			opt.limit = rb_cli_int(u, "--limit", optarg, 1, INT_MAX);
			seen(F_LIMIT, "--limit");
			break;
		case 'a':
			opt.all = true;
			seen(F_ALL, "--all");
			break;
		case OPT_REASON:
			opt.reason = optarg;
			seen(F_REASON, "--reason");
			break;
		case OPT_PROMETHEUS:
			opt.prometheus = true;
			seen(F_PROMETHEUS, "--prometheus");
			break;
		case OPT_DEAD_OLDER:
			opt.dead_older = rb_cli_duration(u, "--dead-older-than", optarg);
			seen(F_PURGE, "--dead-older-than");
			break;
		case OPT_COMPLETED_OLDER:
			opt.completed_older = rb_cli_duration(u, "--completed-older-than", optarg);
			seen(F_PURGE, "--completed-older-than");
			break;
		case OPT_HISTORY_OLDER:
			opt.history_older = rb_cli_duration(u, "--history-older-than", optarg);
			seen(F_PURGE, "--history-older-than");
			break;
		case OPT_OUTPUT:
			if (*optarg == '\0')
				rb_cli_usage_error(u, "--output: give a file name");
			opt.output = optarg;
			seen(F_OUTPUT, "--output");
			break;
		case OPT_BATCH:
			opt.batch = rb_cli_int(u, "--batch", optarg, 1, 1000000);
			seen(F_PURGE, "--batch");
			break;
		case OPT_KEYS:
			opt.keys = true;
			seen(F_PURGE, "--keys");
			break;
		case OPT_ONCE:
			opt.once = true;
			seen(F_TOP, "--once");
			break;
		case OPT_INTERVAL:
			opt.interval = rb_cli_duration(u, "--interval", optarg);
			if (opt.interval < 100)
				rb_cli_usage_error(u, "--interval: at least 100ms");
			seen(F_TOP, "--interval");
			break;
		default:
			rb_cli_bad_option(u);
		}
	}
	return optind;
}

static void
parse_args(int argc, char **argv)
{
	int i;

	opt.table = -1;
	opt.dead_older = opt.completed_older = opt.history_older = -1;
	opt.batch = 1000;
	opt.interval = 1000;
	/* options before the command; '+' stops at the command name */
	i = parse_opts(argc, argv, "+" RB_COMMON_SHORTOPTS "H:n:a");
	if (i >= argc)
		rb_cli_usage_error(usage_str, "missing command");
	for (the_cmd = admin_cmds; the_cmd->name != NULL; the_cmd++)
		if (strcmp(the_cmd->name, argv[i]) == 0)
			break;
	if (the_cmd->name == NULL)
		rb_cli_usage_error(usage_str, "unknown command '%s'", argv[i]);
	cmd_usage = xasprintf("usage: rb-admin %s\n", the_cmd->usage);
	/* the command's options and arguments, in any order */
	{
		char *prog = argv[0], *name = argv[i];

		argc -= i;
		argv += i;
		argv[0] = prog;		/* getopt's messages name the program */
		optind = 0;
		i = parse_opts(argc, argv, RB_COMMON_SHORTOPTS "H:n:a");
		argv[0] = name;
	}
	for (int b = 0; b < 16; b++)
		if ((opt.seen & ~the_cmd->opts) & (1u << b))
			rb_cli_usage_error(cmd_usage, "%s: %s does not apply", the_cmd->name,
			    opt.seen_name[b]);
	if (argc - i < the_cmd->min_args)
		rb_cli_usage_error(cmd_usage, "%s: missing argument", the_cmd->name);
	if (argc - i > the_cmd->max_args)
		rb_cli_usage_error(cmd_usage, "%s: unexpected argument '%s'", the_cmd->name, argv[i]);
	if (the_cmd->run == cmd_purge && opt.dead_older < 0 && opt.completed_older < 0 &&
	    opt.history_older < 0 && !opt.keys)
		rb_cli_usage_error(cmd_usage, "purge: give --dead-older-than, --completed-older-than, "
		    "--history-older-than or --keys");
	if (the_cmd->opts & F_ALL && the_cmd->run != cmd_lanes) {
		bool select = (opt.seen & (F_ALL | F_KEY | F_EVENT | F_LIMIT)) != 0;

		if (select && argc > i)
			rb_cli_usage_error(cmd_usage, "%s: give event ids or --all/--key/--event/--limit, "
			    "not both", the_cmd->name);
		if (!select && argc == i && isatty(STDIN_FILENO))
			rb_cli_usage_error(cmd_usage, "%s: give event ids (arguments or stdin), or "
			    "--all/--key/--event/--limit", the_cmd->name);
	}
	if (opt.table < 0)
		opt.table = isatty(STDOUT_FILENO);
	cmd_argc = argc - i;
	cmd_argv = argv + i;
}

/* ---- output: JSON lines or a table --------------------------------------- */

static const char *schema_name;	/* for Prometheus labels */

static void
emit(json_t *rows, const struct column *cols)
{
	table_emit(rows, cols, opt.table);
}

/* ---- stats --------------------------------------------------------------- */

static const struct column stats_cols[] = {
	{ "HANDLER", "handler", 40 }, { "PENDING", "pending", 0 }, { "DUE", "due", 0 },
	{ "DELAYED", "delayed", 0 }, { "PROCESSING", "processing", 0 }, { "DEAD", "dead", 0 },
	{ "COMPLETED", "completed", 0 }, { "OLDEST_MS", "oldest_pending_age_ms", 0 }, { NULL, NULL, 0 }
};

/*
 * The bus cannot be read: with --prometheus, relaybus_up 0 (and --output
 * still renames the file into place), then the error and its exit status.
 */
static void
stats_failed(const struct rb_error *err)
{
	if (opt.prometheus) {
		const char *schema = opt.common.schema;

		if (schema == NULL || *schema == '\0')
			schema = getenv("RELAYBUS_SCHEMA");
		prom_write_down(stdout, schema != NULL && *schema != '\0' ? schema : RB_DEFAULT_SCHEMA);
		if (fflush(stdout) != 0 || ferror(stdout))
			out_failed();
		out_commit();
	}
	rb_cli_die(err);
}

static int
cmd_stats(struct rb_store *s, int argc, char **argv)
{
	struct rb_error err = { 0 };
	json_t *st, *rows, *total, *h;
	size_t i;

	if (rb_admin_stats(s, &st, &err) < 0)
		stats_failed(&err);
	/* --handler: only that handler's line; the total stays the bus's */
	rows = json_array();
	json_array_foreach(json_object_get(st, "handlers"), i, h)
		if (opt.handler == NULL || strcmp(opt.handler,
		    json_string_value(json_object_get(h, "handler"))) == 0)
			json_array_append(rows, h);
	/* a handler nobody subscribed and nothing was delivered to: most
	 * likely misspelled, said as rb-claim says it (78) */
	if (opt.handler != NULL && json_array_size(rows) == 0 &&
	    rb_admin_handler_check(s, opt.handler, &err) < 0) {
		json_decref(rows);
		json_decref(st);
		rb_cli_die(&err);
	}
	json_object_set(st, "handlers", rows);
	if (opt.prometheus) {
		prom_write(stdout, st, schema_name);
	} else {
		total = json_deep_copy(json_object_get(st, "total"));
		json_object_set(total, "events_without_deliveries",
		    json_object_get(st, "events_without_deliveries"));
		json_object_set(total, "history", json_object_get(st, "history"));
		if (opt.table)
			json_object_set_new(total, "handler", json_string("TOTAL"));
		json_array_append_new(rows, total);
		emit(rows, stats_cols);
		if (opt.table) {
			table_flush();
			/* (not "lost": every delivery of theirs completed, or
			 * they matched no handler; purge removes them) */
			printf("events with every delivery done (or none), kept until purge: %"
			    JSON_INTEGER_FORMAT "\n",
			    json_integer_value(json_object_get(st, "events_without_deliveries")));
		}
	}
	json_decref(rows);
	json_decref(st);
	return table_finish(RB_EXIT_OK);
}

/* ---- list and show ------------------------------------------------------- */

static const struct column list_cols[] = {
	{ "EVENT_ID", "event_id", 36 }, { "HANDLER", "handler", 30 }, { "STATUS", "status", 0 },
	{ "ATTEMPTS", "attempts", 0 }, { "DUE", "available_at", 0 }, { "LANE", "lane", 0 },
	{ "KEY", "key", 20 }, { "OWNER", "owner", 30 }, { "LAST_ERROR", "last_error", 40 },
	{ NULL, NULL, 0 }
};

static struct rb_admin_filter
the_filter(const char *status)
{
	return (struct rb_admin_filter){
		.status = status, .handler = opt.handler, .key = opt.key, .event_id = opt.event,
		.limit = opt.limit,
	};
}

static int
cmd_list(struct rb_store *s, int argc, char **argv)
{
	struct rb_admin_filter f = the_filter(opt.status);
	struct rb_error err = { 0 };
	json_t *rows;

	if (rb_admin_list(s, &f, &rows, &err) < 0)
		rb_cli_die(&err);
	emit(rows, list_cols);
	json_decref(rows);
	return table_finish(RB_EXIT_OK);
}

static const char *const show_fields[] = { "event_id", "name", "key", "created_at", "handlers",
	"headers", "payload", NULL };

static int
cmd_show(struct rb_store *s, int argc, char **argv)
{
	int rc = RB_EXIT_OK;

	for (int i = 0; i < argc; i++) {
		struct rb_error err = { 0 };
		json_t *ev;

		if (rb_admin_show(s, argv[i], &ev, &err) < 0)
			rb_cli_die(&err);
		if (ev == NULL) {
			rb_error("show: no event '%s'", argv[i]);
			rc = RB_EXIT_DATAERR;
			continue;
		}
		if (!opt.table) {
			if (rb_jsonl_write(stdout, ev) < 0)
				out_check();
		} else {
			if (i > 0)
				putchar('\n');
			for (size_t k = 0; show_fields[k] != NULL; k++) {
				char *c;

				if (json_object_get(ev, show_fields[k]) == NULL)
					continue;
				c = table_cell(json_object_get(ev, show_fields[k]), 0);
				printf("%-11s %s\n", show_fields[k], c);
				free(c);
			}
			putchar('\n');
			emit(json_object_get(ev, "deliveries"), list_cols);
			table_flush();
		}
		json_decref(ev);
	}
	return table_finish(rc);
}

/* ---- requeue, bury, cancel ----------------------------------------------- */

static const struct column apply_cols[] = {
	{ "EVENT_ID", "event_id", 36 }, { "HANDLER", "handler", 30 }, { "OUTCOME", "outcome", 0 },
	{ "STATUS", "status", 0 }, { NULL, NULL, 0 }
};

struct tally {
	long	changed, skipped, missing, bad;
};

/* Apply to one chunk of targets, print the outcomes, count them. */
static void
apply_chunk(struct rb_store *s, enum rb_admin_action action, json_t *targets, struct tally *t)
{
	struct rb_error err = { 0 };
	json_t *outcomes, *o;
	size_t i;

	if (json_array_size(targets) == 0)
		return;
	if (rb_admin_apply(s, action, targets, opt.reason, &outcomes, &err) < 0)
		rb_cli_die(&err);
	json_array_foreach(outcomes, i, o) {
		const char *oc = json_string_value(json_object_get(o, "outcome"));
		const char *h = json_string_value(json_object_get(o, "handler"));

		if (strcmp(oc, "missing") == 0) {
			t->missing++;
			if (h != NULL)
				rb_error("%s: no delivery of event '%s' for handler '%s'", the_cmd->name,
				    json_string_value(json_object_get(o, "event_id")), h);
			else
				rb_error("%s: no delivery of event '%s'", the_cmd->name,
				    json_string_value(json_object_get(o, "event_id")));
		} else if (strcmp(oc, "skipped") == 0)
			t->skipped++;
		else
			t->changed++;
	}
	emit(outcomes, apply_cols);
	json_decref(outcomes);
	json_array_clear(targets);
}

static void
add_target(json_t *targets, const char *event_id, const char *handler)
{
	json_array_append_new(targets, json_pack("{s:s, s:s?}", "event_id", event_id,
	    "handler", handler));
}

/* Why a bare event id cannot be one (a NUL would cut it, and the store
 * takes UTF-8 only), or NULL when it can. */
static const char *
bad_id(const char *id, size_t len)
{
	json_t *s;

	if (memchr(id, '\0', len) != NULL)
		return "holds a NUL byte";
	if ((s = json_stringn(id, len)) == NULL)
		return "is not valid UTF-8";
	json_decref(s);
	return NULL;
}

/* One stdin line: a JSON object with event_id (and handler), or a bare event id. */
static int
stdin_target(const char *line, size_t len, long lineno, json_t *targets)
{
	char msg[256];

	while (len > 0 && isspace((unsigned char)*line)) {
		line++;
		len--;
	}
	while (len > 0 && isspace((unsigned char)line[len - 1]))
		len--;
	if (len == 0)
		return 0;
	if (*line == '{') {
		json_t *o;
		const json_t *ev, *h;

		if (rb_jsonl_parse(line, len, &o, msg, sizeof msg) < 0) {
			rb_error("stdin:%ld: %s", lineno, msg);
			return -1;
		}
		ev = json_object_get(o, "event_id");
		h = json_object_get(o, "handler");
		if (!json_is_string(ev) || json_string_length(ev) == 0 ||
		    (h != NULL && !json_is_null(h) && !json_is_string(h))) {
			rb_error("stdin:%ld: need a string 'event_id' (and 'handler')", lineno);
			json_decref(o);
			return -1;
		}
		add_target(targets, json_string_value(ev),
		    json_is_string(h) ? json_string_value(h) : opt.handler);
		json_decref(o);
		return 0;
	}
	const char *why = bad_id(line, len);
	char *id;

	if (why != NULL) {
		rb_error("stdin:%ld: the event id %s", lineno, why);
		return -1;
	}
	id = xmalloc(len + 1);
	memcpy(id, line, len);
	id[len] = '\0';
	add_target(targets, id, opt.handler);
	free(id);
	return 0;
}

static int
apply_cmd(struct rb_store *s, enum rb_admin_action action, int argc, char **argv)
{
	static const char *const past[] = { "requeued", "buried", "cancelled" };
	json_t *targets = json_array();
	struct tally t = { 0 };
	bool select = (opt.seen & (F_ALL | F_KEY | F_EVENT | F_LIMIT)) != 0;

	if (select) {
		/* every matching delivery that the action could apply to */
		struct rb_admin_filter f = the_filter(action == RB_ADMIN_REQUEUE ? "dead" :
		    "pending,processing");
		struct rb_error err = { 0 };
		json_t *rows, *r;
		size_t i;

		if (rb_admin_list(s, &f, &rows, &err) < 0)
			rb_cli_die(&err);
		json_array_foreach(rows, i, r) {
			add_target(targets, json_string_value(json_object_get(r, "event_id")),
			    json_string_value(json_object_get(r, "handler")));
			if (json_array_size(targets) == APPLY_CHUNK)
				apply_chunk(s, action, targets, &t);
		}
		json_decref(rows);
	} else if (argc > 0) {
		for (int i = 0; i < argc; i++) {
			const char *why = bad_id(argv[i], strlen(argv[i]));

			if (why != NULL) {
				rb_error("%s: the event id '%s' %s", the_cmd->name, argv[i], why);
				t.bad++;
				continue;
			}
			add_target(targets, argv[i], opt.handler);
			if (json_array_size(targets) == APPLY_CHUNK)
				apply_chunk(s, action, targets, &t);
		}
	} else {
		struct rb_jsonl_reader *rd = rb_jsonl_reader_new(STDIN_FILENO, 0);
		const char *line;
		size_t len;
		int st;

		while ((st = rb_jsonl_next(rd, -1, &line, &len)) != RB_JSONL_EOF) {
			if (st == RB_JSONL_ERR)
				rb_die_errno(RB_EXIT_IOERR, "cannot read stdin");
			if (st == RB_JSONL_TOOLONG) {
				rb_error("stdin:%ld: line too long", rb_jsonl_lineno(rd));
				t.bad++;
				continue;
			}
			if (stdin_target(line, len, rb_jsonl_lineno(rd), targets) < 0)
				t.bad++;
			if (json_array_size(targets) == APPLY_CHUNK)
				apply_chunk(s, action, targets, &t);
		}
		rb_jsonl_reader_free(rd);
	}
	apply_chunk(s, action, targets, &t);
	json_decref(targets);
	rb_info("%s %ld, skipped %ld, missing %ld, bad lines %ld", past[action], t.changed,
	    t.skipped, t.missing, t.bad);
	return table_finish(t.missing > 0 || t.bad > 0 ? RB_EXIT_DATAERR : RB_EXIT_OK);
}

static int
cmd_requeue(struct rb_store *s, int argc, char **argv)
{
	return apply_cmd(s, RB_ADMIN_REQUEUE, argc, argv);
}

static int
cmd_bury(struct rb_store *s, int argc, char **argv)
{
	return apply_cmd(s, RB_ADMIN_BURY, argc, argv);
}

static int
cmd_cancel(struct rb_store *s, int argc, char **argv)
{
	return apply_cmd(s, RB_ADMIN_CANCEL, argc, argv);
}

/* ---- purge --------------------------------------------------------------- */

static volatile sig_atomic_t stop_signal;

static void
on_stop(int sig)
{
	stop_signal = sig;
}

static int
cmd_purge(struct rb_store *s, int argc, char **argv)
{
	static const struct {
		enum rb_admin_purge	 kind;
		const char		*field, *what;
	} kinds[] = {
		{ RB_PURGE_DEAD, "dead", "dead deliveries" },
		{ RB_PURGE_COMPLETED, "completed", "completed deliveries" },
		{ RB_PURGE_EVENTS, "events", "events" },
		{ RB_PURGE_HISTORY, "history", "history rows" },
	};
	int64_t ages[4] = { opt.dead_older, opt.completed_older, opt.completed_older, opt.history_older };
	long deleted[4] = { 0, 0, 0, 0 }, keys = 0, batches = 0;
	bool progress = isatty(STDERR_FILENO) && rb_log_level() >= RB_LOG_WARN;
	struct sigaction sa;
	int64_t t0 = rb_mono_ms();
	json_t *sum;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* dead deliveries first: events whose last deliveries they were follow
	 * (and so do completed ones relaybus 0.1.0 left); key counters last */
	for (int k = 0; k < 4 && !stop_signal; k++) {
		if (ages[k] < 0)
			continue;
		for (;;) {
			struct rb_error err = { 0 };
			int n = rb_admin_purge(s, kinds[k].kind, ages[k], opt.batch, &err);

			if (n < 0) {
				if (progress)
					fputc('\n', stderr);
				rb_error("purge stopped after %ld batches: %s", batches, err.msg);
				return table_finish(err.exit_code);
			}
			if (n > 0)
				batches++;
			deleted[k] += n;
			rb_debug("purge: %s: batch of %d", kinds[k].what, n);
			if (progress)
				fprintf(stderr, "\rrb-admin: purge: %s: %ld deleted", kinds[k].what,
				    deleted[k]);
			if (n < opt.batch || stop_signal)
				break;
		}
		if (progress)
			fputc('\n', stderr);
	}
	if (opt.keys && !stop_signal) {
		char *after = NULL;

		/* every counter is looked at once: a batch ends where it began */
		do {
			struct rb_error err = { 0 };
			int n = rb_admin_purge_keys(s, &after, opt.batch, &err);

			if (n < 0) {
				if (progress)
					fputc('\n', stderr);
				rb_error("purge stopped after %ld batches: %s", batches, err.msg);
				free(after);
				return table_finish(err.exit_code);
			}
			if (n > 0)
				batches++;
			keys += n;
			rb_debug("purge: key counters: batch of %d", n);
			if (progress)
				fprintf(stderr, "\rrb-admin: purge: key counters: %ld deleted", keys);
		} while (after != NULL && !stop_signal);
		free(after);
		if (progress)
			fputc('\n', stderr);
	}
	sum = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b}", "dead", (json_int_t)deleted[0],
	    "completed", (json_int_t)deleted[1], "events", (json_int_t)deleted[2],
	    "history", (json_int_t)deleted[3], "keys", (json_int_t)keys,
	    "batches", (json_int_t)batches, "elapsed_ms", (json_int_t)(rb_mono_ms() - t0),
	    "interrupted", stop_signal != 0);
	if (opt.table) {
		printf("purged %ld dead deliveries, ", deleted[0]);
		if (deleted[1] > 0)
			printf("%ld completed deliveries of relaybus 0.1.0, ", deleted[1]);
		printf("%ld events, %ld history rows", deleted[2], deleted[3]);
		if (opt.keys)
			printf(", %ld key counters", keys);
		printf(" in %ld batches (%.1fs)%s\n", batches, (double)(rb_mono_ms() - t0) / 1000.0,
		    stop_signal ? ", interrupted" : "");
	} else if (rb_jsonl_write(stdout, sum) < 0)
		out_check();
	json_decref(sum);
	if (stop_signal) {
		rb_error("purge interrupted by %s: the %ld batches done are committed; run it again "
		    "to go on", stop_signal == SIGINT ? "SIGINT" : "SIGTERM", batches);
		return table_finish(RB_EXIT_TEMPFAIL);
	}
	return table_finish(RB_EXIT_OK);
}

/* ---- lanes and subscriptions --------------------------------------------- */

static const struct column lanes_cols[] = {
	{ "HANDLER", "handler", 30 }, { "LANE", "lane", 0 }, { "EPOCH", "epoch", 0 },
	{ "OWNER", "owner", 40 }, { "LEASE_EXPIRES_AT", "lease_expires_at", 0 },
	{ "EXPIRED", "expired", 0 }, { "IN_FLIGHT", "in_flight", 0 }, { NULL, NULL, 0 }
};

static int
cmd_lanes(struct rb_store *s, int argc, char **argv)
{
	struct rb_error err = { 0 };
	json_t *rows;

	if (rb_admin_lanes(s, opt.handler, opt.all, &rows, &err) < 0)
		rb_cli_die(&err);
	emit(rows, lanes_cols);
	json_decref(rows);
	return table_finish(RB_EXIT_OK);
}

static const struct column subs_cols[] = {
	{ "HANDLER", "handler", 0 }, { "PATTERN", "pattern", 0 }, { "CREATED_AT", "created_at", 0 },
	{ NULL, NULL, 0 }
};

static int
cmd_subscriptions(struct rb_store *s, int argc, char **argv)
{
	struct rb_error err = { 0 };
	json_t *rows;

	if (rb_admin_subscriptions(s, opt.handler, &rows, &err) < 0)
		rb_cli_die(&err);
	emit(rows, subs_cols);
	json_decref(rows);
	return table_finish(RB_EXIT_OK);
}

/* ---- top ----------------------------------------------------------------- */

static int
cmd_top(struct rb_store *s, int argc, char **argv)
{
	return admin_top(s, schema_name, opt.handler, opt.once, opt.interval);
}

int
main(int argc, char **argv)
{
	struct rb_store *store;
	int rc;

	rb_cli_init("rb-admin", &opt.common);
	parse_args(argc, argv);
	if (opt.output != NULL)
		out_begin(opt.output);
	if (the_cmd->run == cmd_stats) {
		struct rb_error err = { 0 };

		if ((store = rb_store_open(opt.common.db, opt.common.schema, rb_log_prog(), &err)) == NULL)
			stats_failed(&err);
		/* (the schema check of rb_cli_open, with relaybus_up 0 on failure) */
		if (rb_store_require_schema(store, &err) < 0) {
			rb_store_close(store);
			stats_failed(&err);
		}
		rb_debug("connected to %s, schema %s", rb_store_url_redacted(store), rb_store_schema(store));
	} else
		store = rb_cli_open(&opt.common);
	schema_name = rb_store_schema(store);
	rc = the_cmd->run(store, cmd_argc, cmd_argv);
	if (opt.output != NULL)
		out_commit();
	rb_store_close(store);
	free(cmd_usage);
	return rc;
}
