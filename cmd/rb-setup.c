/* SPDX-License-Identifier: MIT */
/*
 * rb-setup: create or upgrade the relaybus schema (a relaybus 0.1.0 one
 * too), and manage subscriptions and the privileges of roles (--grant,
 * --revoke).  Reads nothing; writes nothing on stdout
 * except with --print-sql, which renders the same statements as one script
 * instead of connecting, and --check, which prints the installed and the
 * expected schema version and changes nothing.  The set-up runs in one
 * transaction under a transaction-level advisory lock, so two rb-setup at
 * the same moment are safe and a second run changes nothing (a lock held
 * longer than --lock-timeout, by anyone: exit 75 naming the session); a
 * schema that a newer relaybus set up is refused before anything is
 * changed.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "rb_admin.h"
#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

static const char usage_str[] =
"usage: rb-setup [--db URL] [--schema NAME] [--subscribe HANDLER:PATTERN]...\n"
"                [--unsubscribe HANDLER:PATTERN]... [--completion-history]\n"
"                [--grant KIND=ROLE[:HANDLER,...]]... [--revoke KIND=ROLE[:HANDLER,...]]...\n"
"                [--max-delay DUR] [--lock-timeout DUR] [--print-sql [--no-transaction]]\n"
"       rb-setup --check [--db URL] [--schema NAME]\n"
"\n"
"Create or upgrade the relaybus schema (idempotent; a relaybus 0.1.0 schema is\n"
"upgraded in place), manage subscriptions and roles.\n"
"\n"
"  -u, --db URL                   postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n"
"  -h, --host HOST                server host or socket folder (PGHOST)\n"
"  -p, --port PORT                server port (PGPORT)\n"
"  -U, --username USER            database user (PGUSER)\n"
"  -d, --dbname NAME              database name (PGDATABASE), or a URL as --db\n"
"  -W, --password                 ask for the password on the terminal\n"
"      --schema NAME              schema for the tables (default: $RELAYBUS_SCHEMA or public)\n"
"  -s, --subscribe HANDLER:PATTERN    deliver events named PATTERN (exact or glob: order.*) to HANDLER\n"
"      --unsubscribe HANDLER:PATTERN  remove that subscription\n"
"      --completion-history       also create the append-only completion history table\n"
"      --grant KIND=ROLE[:HANDLER,...]  give ROLE what KIND needs: publisher (publish),\n"
"                                 worker (claim, complete, fail, extend, relinquish),\n"
"                                 handler (relaybus_complete in its own transaction),\n"
"                                 admin (rb-admin); publishers, workers and handlers\n"
"                                 only for the HANDLERs named (default: every handler)\n"
"      --revoke KIND=ROLE[:HANDLER,...]  take such a grant back\n"
"      --max-delay DUR            the latest a publish may make an event due, from now\n"
"                                 (delay_ms, available_at; default: kept, 30d when new)\n"
"      --lock-timeout DUR         wait at most DUR for the set-up lock (another set-up,\n"
"                                 or any session holding it), then exit 75 naming the\n"
"                                 session (default 10s; 0: wait for ever)\n"
"      --print-sql                print the set-up as one SQL script; do not connect\n"
"      --no-transaction           --print-sql: without BEGIN and COMMIT, for a migration\n"
"                                 tool that runs each file in a transaction of its own\n"
"      --check                    print the installed and the expected schema version;\n"
"                                 change nothing (exit 0 up to date, 79 upgrade due)\n"
"  -v, --verbose                  more messages (-vv: debug)\n"
"  -q, --quiet                    errors only\n"
"      --log-format FORMAT        text (default) or json diagnostics on stderr\n"
"      --help                     this help\n"
"  -V, --version                  version and libraries\n"
"\n"
"Exit status: 0 ok, 64 usage, 69 database unavailable, 70 internal error,\n"
"75 temporary failure, 76 the schema is newer than this relaybus, 77 permission\n"
"denied, 78 bad URL or schema name, or (--check) not set up, 79 (--check) an\n"
"upgrade is due.\n";

enum { OPT_UNSUBSCRIBE = RB_OPT_FIRST_PROGRAM, OPT_HISTORY, OPT_PRINT_SQL, OPT_CHECK, OPT_GRANT, OPT_REVOKE,
	OPT_MAX_DELAY, OPT_NO_TRANSACTION, OPT_LOCK_TIMEOUT };

static struct options {
	struct rb_common	 common;
	const char		**subscribe;
	size_t			 n_subscribe;
	const char		**unsubscribe;
	size_t			 n_unsubscribe;
	const char		**grant;
	size_t			 n_grant;
	const char		**revoke;
	size_t			 n_revoke;
	bool			 history;
	bool			 print_sql;
	bool			 check;
	long long		 max_delay_ms;	/* 0: not given */
	bool			 no_transaction;
	int64_t			 lock_timeout_ms;	/* 0 the default, -1 for ever */
} opt;

static void
parse_args(int argc, char **argv)
{
	static const struct option longopts[] = {
		RB_COMMON_LONGOPTS,
		{ "subscribe", required_argument, NULL, 's' },
		{ "unsubscribe", required_argument, NULL, OPT_UNSUBSCRIBE },
		{ "completion-history", no_argument, NULL, OPT_HISTORY },
		{ "print-sql", no_argument, NULL, OPT_PRINT_SQL },
		{ "grant", required_argument, NULL, OPT_GRANT },
		{ "revoke", required_argument, NULL, OPT_REVOKE },
		{ "check", no_argument, NULL, OPT_CHECK },
		{ "max-delay", required_argument, NULL, OPT_MAX_DELAY },
		{ "no-transaction", no_argument, NULL, OPT_NO_TRANSACTION },
		{ "lock-timeout", required_argument, NULL, OPT_LOCK_TIMEOUT },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	opt.subscribe = xcalloc((size_t)argc, sizeof *opt.subscribe);
	opt.unsubscribe = xcalloc((size_t)argc, sizeof *opt.unsubscribe);
	opt.grant = xcalloc((size_t)argc, sizeof *opt.grant);
	opt.revoke = xcalloc((size_t)argc, sizeof *opt.revoke);
	while ((c = getopt_long(argc, argv, RB_COMMON_SHORTOPTS "s:", longopts, NULL)) != -1) {
		if (rb_cli_common(c, optarg, &opt.common, usage_str))
			continue;
		switch (c) {
		case 's':
			opt.subscribe[opt.n_subscribe++] = optarg;
			break;
		case OPT_UNSUBSCRIBE:
			opt.unsubscribe[opt.n_unsubscribe++] = optarg;
			break;
		case OPT_HISTORY:
			opt.history = true;
			break;
		case OPT_PRINT_SQL:
			opt.print_sql = true;
			break;
		case OPT_GRANT:
			opt.grant[opt.n_grant++] = optarg;
			break;
		case OPT_REVOKE:
			opt.revoke[opt.n_revoke++] = optarg;
			break;
		case OPT_CHECK:
			opt.check = true;
			break;
		case OPT_NO_TRANSACTION:
			opt.no_transaction = true;
			break;
		case OPT_MAX_DELAY:
			opt.max_delay_ms = rb_cli_duration(usage_str, "--max-delay", optarg);
			if (opt.max_delay_ms < 1000)
				rb_cli_usage_error(usage_str, "--max-delay: '%s' is less than a second", optarg);
			break;
		case OPT_LOCK_TIMEOUT:
			opt.lock_timeout_ms = rb_cli_duration(usage_str, "--lock-timeout", optarg);
			if (opt.lock_timeout_ms == 0)
				opt.lock_timeout_ms = -1;
			break;
		default:
			rb_cli_bad_option(usage_str);
		}
	}
	if (optind < argc)
		rb_cli_usage_error(usage_str, "unexpected argument '%s'", argv[optind]);
	if (opt.no_transaction && !opt.print_sql)
		rb_cli_usage_error(usage_str, "--no-transaction goes with --print-sql");
	if (opt.check && (opt.print_sql || opt.history || opt.n_subscribe > 0 ||
	    opt.n_unsubscribe > 0 || opt.max_delay_ms > 0))
		rb_cli_usage_error(usage_str, "--check changes nothing: it takes no other set-up option");
	for (size_t i = 0; i < opt.n_subscribe + opt.n_unsubscribe; i++) {
		const char *spec = i < opt.n_subscribe ? opt.subscribe[i] : opt.unsubscribe[i - opt.n_subscribe];
		struct rb_error err = { 0 };
		char *buf;
		const char *h, *p;

		if (rb_subscription_parse(spec, &buf, &h, &p, &err) < 0)
			rb_cli_usage_error(usage_str, "%s: %s",
			    i < opt.n_subscribe ? "--subscribe" : "--unsubscribe", err.msg);
		free(buf);
	}
	for (size_t i = 0; i < opt.n_grant + opt.n_revoke; i++) {
		struct rb_error err = { 0 };
		char *buf;
		const char *k, *r, *h;

		if (rb_grant_parse(i < opt.n_grant ? opt.grant[i] : opt.revoke[i - opt.n_grant], &buf, &k, &r, &h,
		    &err) < 0)
			rb_cli_usage_error(usage_str, "%s: %s", i < opt.n_grant ? "--grant" : "--revoke", err.msg);
		free(buf);
	}
}

/* --check: "schema public: installed 1, expected 1: up to date" on stdout,
 * and the exit status of rb_schema_problem (0 when up to date). */
static int
check(struct rb_store *store)
{
	struct rb_schema_info info;
	struct rb_error err = { 0 };
	const char *schema = rb_store_schema(store);
	char installed[64];
	int rc;

	if (rb_store_schema_info(store, &info, &err) < 0) {
		rb_store_close(store);
		rb_cli_die(&err);
	}
	rc = rb_schema_problem(schema, &info, &err) < 0 ? err.exit_code : RB_EXIT_OK;
	/* in words an operator cannot misread: the program's version
	 * (PACKAGE_VERSION) is not the schema's (RB_SCHEMA_VERSION) */
	if (info.state == RB_SCHEMA_ABSENT)
		snprintf(installed, sizeof installed, "not set up");
	else if (info.state == RB_SCHEMA_010)
		snprintf(installed, sizeof installed, "the 0.1.0 row-lease schema");
	else
		snprintf(installed, sizeof installed, "schema version %d", info.installed);
	printf("schema %s: %s; relaybus %s %s schema version %d: %s\n", schema, installed, PACKAGE_VERSION,
	    info.state == RB_SCHEMA_NEWER ? "understands up to" : "expects", info.expected,
	    info.state == RB_SCHEMA_CURRENT ? "up to date" :
	    info.state == RB_SCHEMA_ABSENT ? "run rb-setup" :
	    info.state == RB_SCHEMA_NEWER ? "use a newer relaybus" : "upgrade due, run rb-setup");
	rb_store_close(store);
	free(opt.subscribe);
	free(opt.unsubscribe);
	if (fflush(stdout) != 0 || ferror(stdout))
		rb_die_errno(RB_EXIT_IOERR, "cannot write the result");
	return rc;
}

/* The one line of an upgrade from the 0.1.0 row-lease schema, at the
 * default verbosity: what it converted, and how long it took. */
static void
upgraded(struct rb_store *store, int version, int64_t ms)
{
	struct rb_error err = { 0 };
	json_t *st = NULL, *total;
	json_int_t n = -1;

	if (rb_admin_stats(store, &st, &err) == 0 && (total = json_object_get(st, "total")) != NULL)
		n = json_integer_value(json_object_get(total, "pending")) +
		    json_integer_value(json_object_get(total, "processing")) +
		    json_integer_value(json_object_get(total, "dead")) +
		    json_integer_value(json_object_get(total, "completed"));
	json_decref(st);
	if (n >= 0)
		rb_notice("schema %s upgraded from the 0.1.0 row-lease schema to schema version %d: %" JSON_INTEGER_FORMAT
		    " deliveries converted in %.1f s", rb_store_schema(store), version, n, (double)ms / 1000);
	else
		rb_notice("schema %s upgraded from the 0.1.0 row-lease schema to schema version %d in %.1f s",
		    rb_store_schema(store), version, (double)ms / 1000);
}

int
main(int argc, char **argv)
{
	struct rb_setup_opts so;
	struct rb_schema_info info;
	struct rb_error err = { 0 };
	struct rb_store *store;
	int64_t started;

	rb_cli_init("rb-setup", &opt.common);
	parse_args(argc, argv);
	so = (struct rb_setup_opts){
		.completion_history = opt.history,
		.subscribe = opt.subscribe, .n_subscribe = opt.n_subscribe,
		.unsubscribe = opt.unsubscribe, .n_unsubscribe = opt.n_unsubscribe,
		.grant = opt.grant, .n_grant = opt.n_grant,
		.revoke = opt.revoke, .n_revoke = opt.n_revoke,
		.max_delay_ms = opt.max_delay_ms,
		.no_transaction = opt.no_transaction,
		.lock_timeout_ms = opt.lock_timeout_ms,
	};
	if (opt.print_sql) {
		/* the script of the backend --db picks, for the schema rb_store_open would use */
		char *sql = rb_store_setup_script(opt.common.db, opt.common.schema, &so, &err);

		if (sql == NULL)
			rb_cli_die(&err);
		fputs(sql, stdout);
		free(sql);
		free(opt.subscribe);
		free(opt.unsubscribe);
		free(opt.grant);
		free(opt.revoke);
		if (fflush(stdout) != 0 || ferror(stdout)) {
			/* a reader that went away (| head) is normal in a pipeline: say it only with -v */
			if (errno == EPIPE) {
				rb_info("stdout closed: the script was cut short");
				return RB_EXIT_IOERR;
			}
			rb_die_errno(RB_EXIT_IOERR, "cannot write the script");
		}
		return RB_EXIT_OK;
	}
	store = rb_cli_open_any(&opt.common);
	if (opt.check)
		return check(store);
	/* a newer relaybus's schema: refused before the transaction (the
	 * script's own guard refuses it too, under the lock) */
	if (rb_store_schema_info(store, &info, &err) < 0 ||
	    (info.state == RB_SCHEMA_NEWER && rb_schema_problem(rb_store_schema(store), &info, &err) < 0)) {
		rb_store_close(store);
		rb_cli_die(&err);
	}
	if (info.state == RB_SCHEMA_010)
		rb_notice("upgrading schema %s from the 0.1.0 row-lease schema to schema version %d, in one "
		    "transaction (its workers stopped)", rb_store_schema(store), info.expected);
	started = rb_mono_ms();
	if (rb_store_setup(store, &so, &err) < 0) {
		rb_store_close(store);
		rb_cli_die(&err);
	}
	if (info.state == RB_SCHEMA_010)
		upgraded(store, info.expected, rb_mono_ms() - started);
	else if (info.state == RB_SCHEMA_OLDER)
		rb_info("schema %s upgraded from version %d to %d", rb_store_schema(store),
		    info.installed, info.expected);
	rb_info("schema %s is set up (%zu subscribed, %zu unsubscribed, %zu granted, %zu revoked)",
	    rb_store_schema(store), opt.n_subscribe, opt.n_unsubscribe, opt.n_grant, opt.n_revoke);
	rb_store_close(store);
	free(opt.subscribe);
	free(opt.unsubscribe);
	free(opt.grant);
	free(opt.revoke);
	return RB_EXIT_OK;
}
