/* SPDX-License-Identifier: MIT */
/*
 * prom.c: rb-admin's Prometheus text format and its atomic --output.
 * Families: gauges of the deliveries by handler and state, the oldest
 * pending and due ages, dead letters (state "dead"), the deliveries
 * table's dead tuples and vacuum age; exact counters (_total) by handler
 * that the store keeps (failed attempts, burials, and completions with the
 * history); counters from PostgreSQL's cumulative statistics of the
 * deliveries table, which cost the delivery path nothing and start again
 * from 0 after pg_stat_reset() (and count attempted changes: a deletion
 * rolled back counts too).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_textfile.h"
#include "rb_util.h"
#include "prom.h"

/* ---- the text format ----------------------------------------------------- */

/* A label value: \ " and newline escaped (libcommon, as rb-dispatch writes them). */
#define label rb_prom_label

static void
family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

enum unit { INT, MS };		/* MS: milliseconds printed as seconds */

/* v: an integer (null: 0, or with skip_null no sample at all) */
static void
sample(FILE *f, const char *name, const char *schema, const char *handler, const char *state,
    const json_t *v, enum unit u, bool skip_null)
{
	if (skip_null && !json_is_integer(v))
		return;
	fprintf(f, "%s{schema=\"", name);
	label(f, schema);
	putc('"', f);
	if (handler != NULL) {
		fputs(",handler=\"", f);
		label(f, handler);
		putc('"', f);
	}
	if (state != NULL)
		fprintf(f, ",state=\"%s\"", state);
	if (u == MS)
		fprintf(f, "} %.3f\n", json_is_integer(v) ? (double)json_integer_value(v) / 1000.0 : 0.0);
	else
		fprintf(f, "} %" JSON_INTEGER_FORMAT "\n", json_is_integer(v) ? json_integer_value(v) : 0);
}

static const char *const states[] = { "due", "delayed", "processing", "dead" };

/* one family (type: "gauge", "counter") with a sample per handler */
static void
per_handler_typed(FILE *f, const json_t *hs, const char *schema, const char *name, const char *type,
    const char *help, const char *field, enum unit u)
{
	size_t i;
	json_t *h;

	family(f, name, type, help);
	json_array_foreach(hs, i, h)
		sample(f, name, schema, json_string_value(json_object_get(h, "handler")), NULL,
		    json_object_get(h, field), u, false);
}

static void
per_handler(FILE *f, const json_t *hs, const char *schema, const char *name, const char *help,
    const char *field, enum unit u)
{
	per_handler_typed(f, hs, schema, name, "gauge", help, field, u);
}

/* relaybus_up: v 1 or 0 */
static void
up(FILE *f, const char *schema, int v)
{
	json_t *j = json_integer(v);

	family(f, "relaybus_up", "gauge", "1 when rb-admin could read the bus, 0 when it could not "
	    "(the database is down, or the schema is missing).");
	sample(f, "relaybus_up", schema, NULL, NULL, j, INT, false);
	json_decref(j);
}

void
prom_write_down(FILE *f, const char *schema)
{
	up(f, schema, 0);
}

void
prom_write(FILE *f, const json_t *st, const char *schema)
{
	const json_t *hs = json_object_get(st, "handlers"), *total = json_object_get(st, "total");
	const json_t *tab = json_object_get(st, "deliveries_table");
	/* (completed counts: with a completion history, or the deliveries
	 * relaybus 0.1.0 completed) */
	bool hist = json_is_integer(json_object_get(json_object_get(st, "total"), "completed"));
	json_t *h;
	size_t i;

	up(f, schema, 1);
	family(f, "relaybus_handler_deliveries", "gauge", "Deliveries of one handler by state "
	    "(due and delayed are pending; processing is in flight; dead are dead letters).");
	json_array_foreach(hs, i, h)
		for (size_t k = 0; k < 4; k++)
			sample(f, "relaybus_handler_deliveries", schema, json_string_value(
			    json_object_get(h, "handler")), states[k], json_object_get(h, states[k]),
			    INT, false);
	if (hist)
		per_handler(f, hs, schema, "relaybus_handler_completions", "Completions of one "
		    "handler kept in the completion history (and those relaybus 0.1.0 left).", "completed", INT);
	/* the exact cumulative counters (the store keeps them; a backend
	 * without them has no such member) */
	if (hist && json_object_get(json_object_get(st, "total"), "completed_total") != NULL)
		per_handler_typed(f, hs, schema, "relaybus_handler_completed_total", "counter",
		    "Deliveries of one handler completed (the completion history, and what was purged "
		    "from it; only with rb-setup --completion-history).", "completed_total", INT);
	if (json_is_integer(json_object_get(json_object_get(st, "total"), "failed_total"))) {
		per_handler_typed(f, hs, schema, "relaybus_handler_failed_total", "counter",
		    "Attempts of one handler that failed (a failure or dead letter, a timeout, an attempt "
		    "lost with an expired lease; a release is none).", "failed_total", INT);
		per_handler_typed(f, hs, schema, "relaybus_handler_buried_total", "counter",
		    "Deliveries of one handler that became dead letters (rb-admin bury included).",
		    "buried_total", INT);
	}
	per_handler(f, hs, schema, "relaybus_handler_oldest_pending_age_seconds", "Age of the "
	    "oldest pending delivery of one handler, since it was published (0 when none).",
	    "oldest_pending_age_ms", MS);
	per_handler(f, hs, schema, "relaybus_handler_oldest_due_age_seconds", "How long the "
	    "oldest due delivery of one handler has been due and not claimed (0 when none).",
	    "oldest_due_age_ms", MS);
	family(f, "relaybus_deliveries", "gauge", "Deliveries of every handler by state.");
	for (size_t k = 0; k < 4; k++)
		sample(f, "relaybus_deliveries", schema, NULL, states[k], json_object_get(total,
		    states[k]), INT, false);
	if (hist) {
		family(f, "relaybus_completions", "gauge", "Completions kept in the completion history "
		    "(and those relaybus 0.1.0 left).");
		sample(f, "relaybus_completions", schema, NULL, NULL, json_object_get(total, "completed"),
		    INT, false);
	}
	family(f, "relaybus_oldest_pending_age_seconds", "gauge", "Age of the oldest pending "
	    "delivery (0 when none).");
	sample(f, "relaybus_oldest_pending_age_seconds", schema, NULL, NULL,
	    json_object_get(total, "oldest_pending_age_ms"), MS, false);
	family(f, "relaybus_oldest_due_age_seconds", "gauge", "How long the oldest due delivery "
	    "has been due and not claimed (0 when none): workers are behind or down.");
	sample(f, "relaybus_oldest_due_age_seconds", schema, NULL, NULL,
	    json_object_get(total, "oldest_due_age_ms"), MS, false);
	family(f, "relaybus_events_without_deliveries", "gauge", "Events with no delivery left "
	    "(removed by rb-admin purge --completed-older-than).");
	sample(f, "relaybus_events_without_deliveries", schema, NULL, NULL,
	    json_object_get(st, "events_without_deliveries"), INT, false);
	if (!json_is_object(tab))
		return;		/* a backend without table statistics */
	family(f, "relaybus_deliveries_inserted_total", "counter", "Deliveries published "
	    "(PostgreSQL n_tup_ins of the deliveries table; reset by pg_stat_reset).");
	sample(f, "relaybus_deliveries_inserted_total", schema, NULL, NULL,
	    json_object_get(tab, "inserted"), INT, true);
	family(f, "relaybus_deliveries_deleted_total", "counter", "Deliveries deleted: "
	    "one by each completion, and by rb-admin cancel and purges of dead letters (PostgreSQL "
	    "n_tup_del; reset by pg_stat_reset).");
	sample(f, "relaybus_deliveries_deleted_total", schema, NULL, NULL,
	    json_object_get(tab, "deleted"), INT, true);
	family(f, "relaybus_deliveries_updated_total", "counter", "Delivery updates: failures "
	    "(retries and burials), releases, lease-expiry charges, rb-admin requeue and bury "
	    "(PostgreSQL n_tup_upd; a claim or a completion does not update it; reset by pg_stat_reset).");
	sample(f, "relaybus_deliveries_updated_total", schema, NULL, NULL,
	    json_object_get(tab, "updated"), INT, true);
	family(f, "relaybus_deliveries_dead_tuples", "gauge", "Dead row versions in the "
	    "deliveries table (one per completion until vacuum; PostgreSQL n_dead_tup).");
	sample(f, "relaybus_deliveries_dead_tuples", schema, NULL, NULL,
	    json_object_get(tab, "dead_tuples"), INT, true);
	family(f, "relaybus_deliveries_live_tuples", "gauge", "Live rows in the deliveries table, "
	    "as PostgreSQL estimates them (n_live_tup).");
	sample(f, "relaybus_deliveries_live_tuples", schema, NULL, NULL,
	    json_object_get(tab, "live_tuples"), INT, true);
	family(f, "relaybus_deliveries_vacuum_age_seconds", "gauge", "Seconds since the last "
	    "vacuum (auto or manual) of the deliveries table (no sample: never vacuumed).");
	sample(f, "relaybus_deliveries_vacuum_age_seconds", schema, NULL, NULL,
	    json_object_get(tab, "vacuum_age_ms"), MS, true);
	family(f, "relaybus_deliveries_vacuums_total", "counter", "Vacuums (auto and manual) of "
	    "the deliveries table (reset by pg_stat_reset).");
	sample(f, "relaybus_deliveries_vacuums_total", schema, NULL, NULL,
	    json_object_get(tab, "vacuums"), INT, true);
}

/* ---- --output FILE: a temporary file, renamed ---------------------------- */

static char *out_path, *out_tmp;

static void
out_cleanup(void)
{
	if (out_tmp != NULL)
		(void)unlink(out_tmp);
}

void
out_begin(const char *path)
{
	const char *slash = strrchr(path, '/');
	int fd;

	/* a dot name without .prom: the textfile collector reads *.prom only */
	if (slash != NULL)
		out_tmp = xasprintf("%.*s/.%s.XXXXXX", (int)(slash - path), path, slash + 1);
	else
		out_tmp = xasprintf(".%s.XXXXXX", path);
	if ((fd = mkstemp(out_tmp)) < 0) {
		int e = errno;

		free(out_tmp);
		out_tmp = NULL;
		errno = e;
		rb_die_errno(RB_EXIT_CANTCREAT, "--output %s: cannot create a file beside it", path);
	}
	out_path = xstrdup(path);
	atexit(out_cleanup);
	if (fchmod(fd, 0644) < 0 || fflush(stdout) != 0 || dup2(fd, STDOUT_FILENO) < 0)
		rb_die_errno(RB_EXIT_CANTCREAT, "--output %s", out_tmp);
	(void)close(fd);
}

void
out_commit(void)
{
	if (out_tmp == NULL)
		return;
	if (fflush(stdout) != 0 || ferror(stdout) || fsync(STDOUT_FILENO) < 0)
		rb_die_errno(RB_EXIT_IOERR, "--output %s: cannot write", out_tmp);
	if (rename(out_tmp, out_path) < 0)
		rb_die_errno(RB_EXIT_IOERR, "--output: cannot rename %s to %s", out_tmp, out_path);
	free(out_tmp);
	out_tmp = NULL;
	free(out_path);
	out_path = NULL;
}
