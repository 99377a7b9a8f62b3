/* SPDX-License-Identifier: MIT */
/* rb_cli.c: the command-line conventions every program shares. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_cli.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

void
rb_cli_init(const char *prog, struct rb_common *c)
{
	signal(SIGPIPE, SIG_IGN);
	rb_log_init(prog);
	memset(c, 0, sizeof *c);
	c->verbosity = rb_log_level();
}

/* The first line of the usage text. */
static void
print_usage_line(const char *usage)
{
	size_t n = strcspn(usage, "\n");

	fprintf(stderr, "%.*s\n", (int)n, usage);
}

void
rb_cli_usage_error(const char *usage, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rb_logv(RB_LOG_ERROR, "usage", fmt, ap);
	va_end(ap);
	print_usage_line(usage);
	fprintf(stderr, "Try '%s --help' for more information.\n", rb_log_prog());
	exit(RB_EXIT_USAGE);
}

void
rb_cli_bad_option(const char *usage)
{
	if (optopt == 'h')	/* "option requires an argument -- 'h'" */
		fprintf(stderr, "%s: -h is the database host, as in psql; --help for help\n",
		    rb_log_prog());
	print_usage_line(usage);
	fprintf(stderr, "Try '%s --help' for more information.\n", rb_log_prog());
	exit(RB_EXIT_USAGE);
}

/*
 * --db URL: keep a copy and overwrite the argument where it stands, in
 * argv, with the URL as messages show it, so that /proc/PID/cmdline, which
 * every local user can read, no longer holds the password (it did from
 * exec until now: a passfile or the environment is better).  The rest of
 * a redacted URL shorter than the original is NUL bytes; one longer is cut.
 */
static const char *
take_url(char *arg)
{
	static char *copy;	/* the last --db given wins */
	char *r;
	size_t n = strlen(arg), m;

	free(copy);
	copy = xstrdup(arg);
	r = rb_store_redact(copy);
	if (strcmp(r, copy) != 0) {
		m = strlen(r) < n ? strlen(r) : n;
		memcpy(arg, r, m);
		memset(arg + m, '\0', n - m);
	}
	free(r);
	return copy;
}

/*
 * psql's -h, -p, -U, -d: libpq's environment variable for this run, so that
 * they fill in what a --db URL leaves out, as libpq's environment does (and
 * rb-pageinspect's own connection sees them too).  Explicit options win
 * over the environment: $RELAYBUS_URL is no longer used.
 */
static void
psql_option(const char *var, const char *arg)
{
	if (setenv(var, arg, 1) < 0 || unsetenv("RELAYBUS_URL") < 0)
		rb_die_errno(RB_EXIT_OSERR, "cannot set %s", var);
}

/*
 * -W: ask for the password on the terminal, as psql -W does, echo off, and
 * hand it to libpq as PGPASSWORD (the programs give it to no handler:
 * rb_env).  Without a terminal it is a usage error: a script has a
 * passfile (PGPASSFILE) instead.
 */
static void
ask_password(const char *usage)
{
	char buf[1024];
	struct termios old, quiet;
	FILE *tty = fopen("/dev/tty", "r+");
	bool ok, term;
	size_t n;

	if (tty == NULL)
		rb_cli_usage_error(usage, "--password: no terminal to ask on (give a passfile: PGPASSFILE)");
	fputs("Password: ", tty);
	fflush(tty);
	term = tcgetattr(fileno(tty), &old) == 0;
	if (term) {
		quiet = old;
		quiet.c_lflag &= ~(tcflag_t)ECHO;
		quiet.c_lflag |= ECHONL;
		tcsetattr(fileno(tty), TCSANOW, &quiet);
	}
	ok = fgets(buf, sizeof buf, tty) != NULL;
	if (term)
		tcsetattr(fileno(tty), TCSANOW, &old);
	fclose(tty);
	if (!ok)
		rb_cli_usage_error(usage, "--password: no password read");
	n = strcspn(buf, "\r\n");
	buf[n] = '\0';
	if (setenv("PGPASSWORD", buf, 1) < 0)
		rb_die_errno(RB_EXIT_OSERR, "cannot set PGPASSWORD");
	memset(buf, 0, sizeof buf);
}

bool
rb_cli_common(int c, const char *arg, struct rb_common *cm, const char *usage)
{
	switch (c) {
	case 'h':
		if (*arg == '\0')
			rb_cli_usage_error(usage, "--host: empty host name");
		psql_option("PGHOST", arg);
		return true;
	case 'p':
		rb_cli_int(usage, "--port", arg, 1, 65535);
		psql_option("PGPORT", arg);
		return true;
	case 'W':
		ask_password(usage);
		return true;
	case 'U':
		if (*arg == '\0')
			rb_cli_usage_error(usage, "--username: empty user name");
		psql_option("PGUSER", arg);
		return true;
	case 'd':
		if (*arg == '\0')
			rb_cli_usage_error(usage, "--dbname: empty database name");
		/* as psql's -d: a URL or a conninfo string is the whole connection */
		if (strstr(arg, "://") != NULL || strchr(arg, '=') != NULL)
			return rb_cli_common(RB_OPT_DB, arg, cm, usage);
		psql_option("PGDATABASE", arg);
		return true;
	case 'u':
	case RB_OPT_DB:
		cm->db = take_url((char *)arg);
		return true;
	case RB_OPT_SCHEMA:
		if (!rb_ident_valid(arg))
			rb_cli_usage_error(usage, "--schema: '%s' is not a schema name "
			    "(lowercase letters, digits, _; at most 50; not pg_* or information_schema)", arg);
		cm->schema = arg;
		return true;
	case RB_OPT_LOG_FORMAT:
		if (rb_log_set_format(arg) < 0)
			rb_cli_usage_error(usage, "--log-format: '%s' is not text or json", arg);
		return true;
	case 'v':
		cm->verbosity++;
		rb_log_set_level(cm->verbosity);
		return true;
	case 'q':
		cm->verbosity = RB_LOG_ERROR;
		rb_log_set_level(cm->verbosity);
		return true;
	case RB_OPT_HELP:
		fputs(usage, stdout);
		exit(RB_EXIT_OK);
	case 'V': {
		char *b = rb_store_backends();

		printf("%s %s (backends: %s, jansson %s)\n", rb_log_prog(), PACKAGE_VERSION, b,
		    JANSSON_VERSION);
		free(b);
		exit(RB_EXIT_OK);
	}
	default:
		return false;
	}
}

void
rb_cli_die(const struct rb_error *err)
{
	rb_die(err->exit_code != 0 ? err->exit_code : RB_EXIT_SOFTWARE, "%s", err->msg);
}

/*
 * Open the store (and, when `schema`, check its schema's version) without
 * dying: NULL and err filled on failure.  The one opening the three below
 * share.
 */
static struct rb_store *
cli_try_open(const struct rb_common *c, bool schema, struct rb_error *err)
{
	struct rb_store *s = rb_store_open(c->db, c->schema, c->app != NULL ? c->app : rb_log_prog(),
	    err);

	if (s == NULL)
		return NULL;
	if (schema && rb_store_require_schema(s, err) < 0) {
		rb_store_close(s);
		return NULL;
	}
	rb_debug("connected to %s, schema %s", rb_store_url_redacted(s), rb_store_schema(s));
	return s;
}

struct rb_store *
rb_cli_open_any(const struct rb_common *c)
{
	struct rb_error err = { 0 };
	struct rb_store *s = cli_try_open(c, false, &err);

	if (s == NULL)
		rb_cli_die(&err);
	return s;
}

struct rb_store *
rb_cli_open(const struct rb_common *c)
{
	struct rb_error err = { 0 };
	struct rb_store *s = cli_try_open(c, true, &err);

	if (s == NULL)
		rb_cli_die(&err);
	return s;
}

struct rb_store *
rb_cli_open_again(const struct rb_common *c, const struct rb_cli_again *a)
{
	int64_t since = rb_mono_ms(), backoff = 100;

	for (;;) {
		struct rb_error err = { 0 };
		struct rb_store *s = cli_try_open(c, true, &err);

		if (s != NULL)
			return s;
		if ((err.exit_code != RB_EXIT_TEMPFAIL &&
		    (err.exit_code != RB_EXIT_UNAVAILABLE || !a->unavailable)) ||
		    (a->for_ms > 0 && rb_mono_ms() - since + backoff > a->for_ms))
			rb_cli_die(&err);
		if (a->stop != NULL && a->stop())
			return NULL;
		if (a->level == RB_LOG_WARN)
			rb_warn("%s; connecting again", err.msg);
		else
			rb_info("%s; connecting again", err.msg);
		poll(NULL, 0, (int)backoff);
		backoff = backoff * 2 > RB_RECONNECT_MAX_MS ? RB_RECONNECT_MAX_MS : backoff * 2;
	}
}

/*
 * The largest value of each duration option (relaybus(7), DURATIONS).  A
 * wait ends up in poll(2), whose timeout is an int of milliseconds: 24d
 * fits, and so does every deadline of the monotonic clock plus 24d.
 * Leases and backoffs become SQL intervals; the purges' ages reach back.
 */
static const struct {
	const char	*opt, *text;
	int64_t		 ms;
} duration_max[] = {
	{ "--lease", "1d", 86400000LL },
	{ "--backoff", "365d", 365 * 86400000LL },
	{ "--dead-older-than", "3650d", 3650 * 86400000LL },
	{ "--completed-older-than", "3650d", 3650 * 86400000LL },
	{ "--history-older-than", "3650d", 3650 * 86400000LL },
	{ "--max-delay", "3650d", 3650 * 86400000LL },
	{ NULL, "24d", 24 * 86400000LL },	/* every other duration */
};

long long
rb_cli_duration(const char *usage, const char *opt, const char *arg)
{
	size_t i = 0;
	int64_t ms;
	int rc;

	while (duration_max[i].opt != NULL && strcmp(duration_max[i].opt, opt) != 0)
		i++;
	rc = rb_parse_duration_ms(arg, &ms);
	if (rc == RB_DURATION_BARE)
		rb_cli_usage_error(usage, "%s: '%s' has no unit: write %ss, %sms, %sm, %sh or %sd "
		    "(see relaybus(7))", opt, arg, arg, arg, arg, arg, arg);
	if (rc == RB_DURATION_FRACTION)
		rb_cli_usage_error(usage, "%s: '%s' is not a whole number of milliseconds", opt, arg);
	if (rc == RB_DURATION_RANGE || (rc == 0 && ms > duration_max[i].ms))
		rb_cli_usage_error(usage, "%s: '%s' is more than %s, the most it takes", opt, arg,
		    duration_max[i].text);
	if (rc < 0)
		rb_cli_usage_error(usage, "%s: '%s' is not a duration (such as 500ms, 30s, 1m30s, "
		    "1.5h; units d, h, m, s, ms)", opt, arg);
	return (long long)ms;
}

int
rb_cli_int(const char *usage, const char *opt, const char *arg, int min, int max)
{
	int v;

	if (rb_parse_int(arg, min, max, &v) < 0)
		rb_cli_usage_error(usage, "%s: '%s' is not a whole number from %d to %d", opt, arg,
		    min, max);
	return v;
}

const char *
rb_cli_handler(const char *usage, const char *arg)
{
	if (!rb_handler_valid(arg))
		rb_cli_usage_error(usage, "--handler: '%s' is not a handler name ([A-Za-z0-9_.:-], at most 200)",
		    arg);
	return arg;
}

const char *
rb_cli_owner_arg(const char *usage, const char *arg, size_t max)
{
	if (*arg == '\0' || strlen(arg) > max)
		rb_cli_usage_error(usage, "--owner: 1 to %zu characters", max);
	return arg;
}

long long
rb_cli_lease(const char *usage, const char *arg, long long min_ms)
{
	long long ms = rb_cli_duration(usage, "--lease", arg);

	if (ms < min_ms)
		rb_cli_usage_error(usage, "--lease: at least %lldms", min_ms);
	return ms;
}

char *
rb_cli_owner(void)
{
	char host[128] = "host";
	struct timespec ts;

	gethostname(host, sizeof host - 1);
	host[sizeof host - 1] = '\0';
	clock_gettime(CLOCK_REALTIME, &ts);
	srandom((unsigned)(ts.tv_nsec ^ getpid()));
	return xasprintf("%s:%d:%08lx", host, (int)getpid(), (unsigned long)random());
}

void
rb_cli_backoff(const char *usage, const char *opt, const char *arg, struct rb_backoff *b)
{
	char *copy = xstrdup(arg), *save = NULL, *part;
	int i = 0;

	for (part = strtok_r(copy, ",", &save); part != NULL; part = strtok_r(NULL, ",", &save), i++) {
		if (i == 0)
			b->base_ms = rb_cli_duration(usage, opt, part);
		else if (i == 1)
			b->max_ms = rb_cli_duration(usage, opt, part);
		else if (i == 2) {
			char *end;

			errno = 0;
			b->factor = strtod(part, &end);
			if (errno != 0 || *end != '\0' || b->factor < 1 || b->factor > 100)
				rb_cli_usage_error(usage, "%s: factor '%s' is not a number from 1 to 100",
				    opt, part);
		} else
			rb_cli_usage_error(usage, "%s: '%s' is not BASE[,MAX[,FACTOR]]", opt, arg);
	}
	free(copy);
	if (i == 0)
		rb_cli_usage_error(usage, "%s: '%s' is not BASE[,MAX[,FACTOR]]", opt, arg);
	if (b->max_ms < b->base_ms)
		b->max_ms = b->base_ms;
}
