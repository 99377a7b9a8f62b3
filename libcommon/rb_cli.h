/* SPDX-License-Identifier: MIT */
/*
 * rb_cli.h: what every program's command line shares: the common long
 * options (--db, psql's -h/-p/-U/-d, --schema, -v, -q, --log-format,
 * --help, -V), the usage error,
 * --version, and opening the store with a one-line error.
 */
#ifndef RB_CLI_H
#define RB_CLI_H

#include <getopt.h>
#include <stdbool.h>

#include "rb_store.h"

struct rb_common {
	const char	*db;		/* --db URL */
	const char	*schema;	/* --schema NAME */
	int		 verbosity;	/* RB_LOG_* */
	const char	*app;		/* application_name (NULL: the program's name) */
};

/* option values for the common long options, above any short option char */
enum {
	RB_OPT_DB = 1000, RB_OPT_SCHEMA, RB_OPT_LOG_FORMAT, RB_OPT_HELP,
	RB_OPT_FIRST_PROGRAM = 1100
};

#define RB_COMMON_LONGOPTS						\
	{ "db", required_argument, NULL, RB_OPT_DB },			\
	{ "schema", required_argument, NULL, RB_OPT_SCHEMA },		\
	{ "log-format", required_argument, NULL, RB_OPT_LOG_FORMAT },	\
	{ "verbose", no_argument, NULL, 'v' },				\
	{ "quiet", no_argument, NULL, 'q' },				\
	{ "host", required_argument, NULL, 'h' },			\
	{ "port", required_argument, NULL, 'p' },			\
	{ "username", required_argument, NULL, 'U' },			\
	{ "dbname", required_argument, NULL, 'd' },			\
	{ "password", no_argument, NULL, 'W' },				\
	{ "help", no_argument, NULL, RB_OPT_HELP },		\
	{ "version", no_argument, NULL, 'V' }
/* -h/-p/-U/-d are psql's (host, port, user, database); help is --help */
#define RB_COMMON_SHORTOPTS "u:vqVh:p:U:d:W"

/*
 * The help lines of the common options, for a program's usage text (string
 * literal concatenation; options at 25 columns, as rb-claim, rb-complete,
 * rb-dispatch and rb-pageinspect print theirs).  --schema stays with each
 * program: what it names differs.
 */
#define RB_COMMON_CONN_HELP \
"  -u, --db URL           postgresql:// URL or conninfo (default: $RELAYBUS_URL, PG*)\n" \
"  -h, --host HOST        server host or socket folder (PGHOST)\n" \
"  -p, --port PORT        server port (PGPORT)\n" \
"  -U, --username USER    database user (PGUSER)\n" \
"  -d, --dbname NAME      database name (PGDATABASE), or a URL as --db\n" \
"  -W, --password         ask for the password on the terminal\n"
#define RB_COMMON_LOG_HELP \
"  -v, --verbose          more messages (-vv: debug)\n" \
"  -q, --quiet            errors only\n" \
"      --log-format FMT   text (default) or json diagnostics on stderr\n" \
"      --help             this help\n" \
"  -V, --version          version and libraries\n"

/** Start a program: logging, SIGPIPE ignored, defaults. */
void	rb_cli_init(const char *prog, struct rb_common *);
/**
 * Handle a common option; returns true when c was one.  --help prints
 * usage (the full text) and exits 0; -V prints the version and exits
 * 0.  psql's -h HOST, -p PORT, -U USER and -d NAME set PGHOST, PGPORT,
 * PGUSER and PGDATABASE, which fill in what --db leaves out, as libpq does;
 * given any of them, $RELAYBUS_URL is not used (-d URL or conninfo is --db).
 * --db (-u) keeps a copy of arg and overwrites arg, in argv, with the URL
 * as messages show it (no password in /proc/PID/cmdline).
 */
bool	rb_cli_common(int c, const char *arg, struct rb_common *, const char *usage);
/** "usage: ..." line and the "Try --help" hint on stderr; exit 64. */
void	rb_cli_usage_error(const char *usage, const char *fmt, ...)
	    __attribute__((format(printf, 2, 3), noreturn));
/** Report an unknown option or missing argument (getopt already printed it) and exit 64. */
void	rb_cli_bad_option(const char *usage) __attribute__((noreturn));
/**
 * Open the store or die with the error's exit code; die too, with one line
 * naming rb-setup, unless the schema is set up at RB_SCHEMA_VERSION
 * (rb_store_require_schema: one query).
 */
struct rb_store *rb_cli_open(const struct rb_common *);
/** rb_cli_open without the schema check (rb-setup). */
struct rb_store *rb_cli_open_any(const struct rb_common *);
/** What rb_cli_open_again tries again on, and for how long. */
struct rb_cli_again {
	int64_t		 for_ms;	/* give up after about this long; 0: never */
	bool		 unavailable;	/* a server not there (69) too, not only a lost connection (75) */
	bool		(*stop)(void);	/* give up when it says so (a signal came); may be NULL */
	int		 level;		/* each failure is logged at RB_LOG_WARN or RB_LOG_INFO */
};
/**
 * rb_cli_open, trying again with backoff (100 ms doubling to
 * RB_RECONNECT_MAX_MS) after a connection lost while it starts (a server's
 * restart, pg_terminate_backend), and with `unavailable` after a server
 * not there yet; each failure logged with "; connecting again".  Any other
 * error or the time up dies as rb_cli_open does; NULL when stop() says so
 * (looked at after each failure: a signal interrupts the wait).
 */
struct rb_store *rb_cli_open_again(const struct rb_common *, const struct rb_cli_again *);
/** Die with err's code and message. */
void	rb_cli_die(const struct rb_error *) __attribute__((noreturn));
/**
 * Parse a duration option (a unit required: rb_parse_duration_ms) or die
 * with a usage error naming the option; at most the option's maximum
 * (--lease 1d, --backoff 365d, rb-admin's --*-older-than 3650d, any other
 * 24d: the table in rb_cli.c, relaybus(7) DURATIONS).
 */
long long rb_cli_duration(const char *usage, const char *opt, const char *arg);
/** Parse an integer option in [min, max] or die with a usage error. */
int	rb_cli_int(const char *usage, const char *opt, const char *arg, int min, int max);
/** --handler: the name, or a usage error. */
const char *rb_cli_handler(const char *usage, const char *arg);
/** --owner: 1 to max characters, or a usage error. */
const char *rb_cli_owner_arg(const char *usage, const char *arg, size_t max);
/** --lease: a duration of at least min_ms, or a usage error. */
long long rb_cli_lease(const char *usage, const char *arg, long long min_ms);
/** A default lease owner name: host:pid:random. New string. */
char	*rb_cli_owner(void);
/**
 * Parse a backoff option "BASE[,MAX[,FACTOR]]" (durations, factor 1 to 100)
 * into *b, keeping b's defaults for omitted parts; a usage error names opt.
 * MAX below BASE is raised to BASE.
 */
void	rb_cli_backoff(const char *usage, const char *opt, const char *arg, struct rb_backoff *b);

#endif
