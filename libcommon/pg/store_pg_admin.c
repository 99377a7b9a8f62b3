/* SPDX-License-Identifier: MIT */
/*
 * store_pg_admin.c: the PostgreSQL side of rb-admin (rb_admin.h).  Every
 * statement is a template rendered for the store's schema and run with
 * parameters only.  Nothing here is on the delivery path: listings are
 * scans (the seed's "Admin listings are scans"), and the writes (requeue,
 * bury, cancel, purge) are short transactions that lock what a claim
 * would lock, in the order a claim locks it, so that an admin action and
 * a worker never both act on one delivery.
 *
 * "In flight" (status processing) means: a pending delivery whose id is
 * in its lane row's in_flight array.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_admin.h"
#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_pg_int.h"
#include "store_pg_steps.h"

/* ---- helpers ------------------------------------------------------------- */

/* Render tmpl and run it on the main connection (pg_exec + pg_expect). */
static PGresult *
q(struct rb_store *s, const char *tmpl, int n, const char *const *params, ExecStatusType want,
    const char *what, bool *retry, struct rb_error *err)
{
	PGconn *c = pg_be(s)->conn;
	char *sql = pg_render(tmpl, s->schema);
	PGresult *res = pg_expect(s, c, pg_exec(pg_be(s), c, sql, n, params), want, what, retry, err);

	free(sql);
	return res;
}

/* 1 if the schema was upgraded from relaybus 0.1.0 and may hold the
 * completed deliveries 0.1.0 left (status 'completed', completion time in
 * updated_at: upgrade_010_pg.sql), 0 if not, -1 error. */
static int
has_old_completed(struct rb_store *s, struct rb_error *err)
{
	PGresult *res = q(s, "SELECT to_regclass('@S@.relaybus_deliveries_completed_010_idx') IS NOT NULL",
	    0, NULL, PGRES_TUPLES_OK, "history", NULL, err);
	int h;

	if (res == NULL)
		return -1;
	h = PQgetvalue(res, 0, 0)[0] == 't';
	PQclear(res);
	return h;
}

/* ---- statistics ---------------------------------------------------------- */

/* The in-flight ids of every lane, one row per id. */
#define IN_FLIGHT_CTE							\
	"f AS (SELECT x.handler, x.lane, x.lease_owner, x.lease_expires_at, "	\
	"  unnest(x.in_flight) AS id FROM @S@.relaybus_lanes x "		\
	"  WHERE cardinality(x.in_flight) > 0) "

#define STATS_SQL(COMPLETIONS)						\
	"WITH " IN_FLIGHT_CTE ", "					\
	"d AS (SELECT d.handler, "					\
	"  count(*) FILTER (WHERE d.status = 'pending' AND f.id IS NULL AND d.available_at <= now()) AS due, " \
	"  count(*) FILTER (WHERE d.status = 'pending' AND f.id IS NULL AND d.available_at > now()) AS delayed, " \
	"  count(*) FILTER (WHERE d.status = 'pending' AND f.id IS NOT NULL) AS processing, " \
	"  count(*) FILTER (WHERE d.status = 'dead') AS dead, "		\
	"  min(coalesce(d.created_at, d.available_at)) FILTER (WHERE d.status = 'pending' AND f.id IS NULL) AS oldest, " \
	"  count(*) FILTER (WHERE d.status = 'completed') AS completed, " \
	"  min(d.available_at) FILTER (WHERE d.status = 'pending' AND f.id IS NULL AND d.available_at <= now()) AS oldest_due " \
	"  FROM @S@.relaybus_deliveries d "				\
	"  LEFT JOIN f ON f.id = d.id AND f.handler = d.handler AND f.lane = d.lane " \
	"  GROUP BY d.handler), "					\
	"c AS (" COMPLETIONS "), "					\
	"k AS (SELECT handler, sum(failed) AS failed, sum(buried) AS buried, " \
	"  sum(completed_purged) AS purged FROM @S@.relaybus_lanes GROUP BY handler), " \
	"h AS (SELECT handler FROM d UNION SELECT handler FROM c "	\
	"  UNION SELECT handler FROM @S@.relaybus_subscriptions "	\
	"  UNION SELECT DISTINCT handler FROM @S@.relaybus_lanes) "	\
	"SELECT h.handler, coalesce(d.due, 0), coalesce(d.delayed, 0), coalesce(d.processing, 0), " \
	"  coalesce(d.dead, 0), c.n, floor(extract(epoch FROM now() - d.oldest) * 1000)::bigint, " \
	"  coalesce(d.completed, 0), " \
	"  floor(extract(epoch FROM now() - d.oldest_due) * 1000)::bigint, " \
	"  coalesce(k.failed, 0), coalesce(k.buried, 0), coalesce(k.purged, 0) " \
	"FROM h LEFT JOIN d USING (handler) LEFT JOIN c USING (handler) LEFT JOIN k USING (handler) " \
	"ORDER BY h.handler"

static const char stats_sql_hist[] = STATS_SQL(
    "SELECT handler, count(*) AS n FROM @S@.relaybus_completions GROUP BY handler");
static const char stats_sql_nohist[] = STATS_SQL(
    "SELECT NULL::text AS handler, NULL::bigint AS n WHERE false");

static const char orphans_sql[] =
    "SELECT count(*) FROM @S@.relaybus_events e "
    "WHERE NOT EXISTS (SELECT 1 FROM @S@.relaybus_deliveries d WHERE d.event_id = e.id)";

/*
 * The deliveries table in PostgreSQL's cumulative statistics: counters
 * that cost the delivery path nothing (the server keeps them anyway).  A
 * completion deletes its row, so n_tup_del counts completions (and
 * rb-admin cancel, and purges of dead letters); n_tup_upd counts failures,
 * burials and releases (a claim updates the lane row, not the delivery);
 * n_tup_ins counts deliveries published.  They start from 0 again after
 * pg_stat_reset() or a crash (a fast-shutdown restart keeps them).
 */
static const char table_sql[] =
    "SELECT t.n_tup_ins, t.n_tup_upd, t.n_tup_del, t.n_live_tup, t.n_dead_tup, "
    "  floor(extract(epoch FROM now() - greatest(t.last_autovacuum, t.last_vacuum)) * 1000)::bigint, "
    "  t.autovacuum_count + t.vacuum_count "
    "FROM pg_stat_user_tables t WHERE t.schemaname = $1 AND t.relname = 'relaybus_deliveries'";

static json_t *
table_stats(struct rb_store *s, struct rb_error *err)
{
	static const char *const f[] = { "inserted", "updated", "deleted", "live_tuples",
	    "dead_tuples", "vacuum_age_ms", "vacuums" };
	const char *params[1] = { s->schema };
	PGresult *res = q(s, table_sql, 1, params, PGRES_TUPLES_OK, "stats", NULL, err);
	json_t *o;

	if (res == NULL)
		return NULL;
	o = json_object();
	for (int k = 0; k < 7; k++)
		json_object_set_new(o, f[k], PQntuples(res) == 1 ? pg_jint(res, 0, k) : json_null());
	PQclear(res);
	return o;
}

static void
add_count(json_t *total, const char *field, const json_t *v)
{
	json_t *t = json_object_get(total, field);

	if (json_is_integer(v))
		json_object_set_new(total, field, json_integer(json_integer_value(v) +
		    (json_is_integer(t) ? json_integer_value(t) : 0)));
}

int
pg_admin_stats(struct rb_store *s, json_t **out, struct rb_error *err)
{
	static const char *const counts[] = { "pending", "due", "delayed", "processing", "dead",
	    "completed", "completed_total", "failed_total", "buried_total" };
	PGresult *res = NULL, *orph = NULL;
	json_t *handlers = NULL, *total = NULL, *table = NULL;
	int64_t oldest = -1, oldest_due = -1;
	int hist, old, rc = -1;

	*out = NULL;
	/* one snapshot, one now(), for every number */
	if (pg_run_cmd(s, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "stats", err) < 0)
		return -1;
	if ((hist = pg_history(s, pg_be(s)->conn, "history", err)) < 0 ||
	    (old = has_old_completed(s, err)) < 0)
		goto out;
	res = q(s, hist ? stats_sql_hist : stats_sql_nohist, 0, NULL, PGRES_TUPLES_OK, "stats", NULL, err);
	if (res == NULL)
		goto out;
	orph = q(s, orphans_sql, 0, NULL, PGRES_TUPLES_OK, "stats", NULL, err);
	if (orph == NULL)
		goto out;
	if ((table = table_stats(s, err)) == NULL)
		goto out;
	handlers = json_array();
	total = json_pack("{s:n, s:i, s:i, s:i, s:i, s:i}", "handler", "pending", 0, "due", 0,
	    "delayed", 0, "processing", 0, "dead", 0);
	json_object_set_new(total, "completed", hist || old ? json_integer(0) : json_null());
	json_object_set_new(total, "completed_total", hist || old ? json_integer(0) : json_null());
	json_object_set_new(total, "failed_total", json_integer(0));
	json_object_set_new(total, "buried_total", json_integer(0));
	for (int i = 0; i < PQntuples(res); i++) {
		int64_t due = strtoll(PQgetvalue(res, i, 1), NULL, 10);
		int64_t delayed = strtoll(PQgetvalue(res, i, 2), NULL, 10);
		json_t *h = json_object();

		json_object_set_new(h, "handler", pg_jstr(res, i, 0));
		json_object_set_new(h, "pending", json_integer(due + delayed));
		json_object_set_new(h, "due", json_integer(due));
		json_object_set_new(h, "delayed", json_integer(delayed));
		json_object_set_new(h, "processing", pg_jint(res, i, 3));
		json_object_set_new(h, "dead", pg_jint(res, i, 4));
		/* the completion history, and what relaybus 0.1.0 left */
		json_object_set_new(h, "completed", !hist && !old ? json_null() :
		    json_integer(pg_num(res, i, 5) + pg_num(res, i, 7)));
		/* the cumulative counters: completions (in the history, and
		 * purged from it; none without it), failed attempts, burials */
		json_object_set_new(h, "completed_total", !hist && !old ? json_null() :
		    json_integer(pg_num(res, i, 5) + pg_num(res, i, 7) + pg_num(res, i, 11)));
		json_object_set_new(h, "failed_total", pg_jint(res, i, 9));
		json_object_set_new(h, "buried_total", pg_jint(res, i, 10));
		json_object_set_new(h, "oldest_pending_age_ms", pg_jint(res, i, 6));
		if (!PQgetisnull(res, i, 6) && strtoll(PQgetvalue(res, i, 6), NULL, 10) > oldest)
			oldest = strtoll(PQgetvalue(res, i, 6), NULL, 10);
		json_object_set_new(h, "oldest_due_age_ms", pg_jint(res, i, 8));
		if (!PQgetisnull(res, i, 8) && strtoll(PQgetvalue(res, i, 8), NULL, 10) > oldest_due)
			oldest_due = strtoll(PQgetvalue(res, i, 8), NULL, 10);
		for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
			add_count(total, counts[k], json_object_get(h, counts[k]));
		json_array_append_new(handlers, h);
	}
	json_object_set_new(total, "oldest_pending_age_ms", oldest >= 0 ? json_integer(oldest) : json_null());
	json_object_set_new(total, "oldest_due_age_ms", oldest_due >= 0 ? json_integer(oldest_due) : json_null());
	*out = json_pack("{s:b, s:I, s:o, s:o, s:o}", "history", hist,
	    "events_without_deliveries", (json_int_t)strtoll(PQgetvalue(orph, 0, 0), NULL, 10),
	    "handlers", handlers, "total", total, "deliveries_table", table);
	handlers = total = table = NULL;
	rc = 0;
out:
	PQclear(res);
	PQclear(orph);
	json_decref(handlers);
	json_decref(total);
	json_decref(table);
	if (rc == 0)
		rc = pg_run_cmd(s, "COMMIT", "stats", err);
	else
		pg_rollback_quietly(s);
	if (rc < 0) {
		json_decref(*out);
		*out = NULL;
	}
	return rc;
}

/* ---- listings ------------------------------------------------------------ */

static const char list_sql[] =
    "WITH " IN_FLIGHT_CTE ", "
    "l AS (SELECT d.*, coalesce(d.created_at, d.available_at) AS created, "
    "  CASE WHEN d.status = 'dead' THEN 'dead' WHEN d.status = 'completed' THEN 'completed' "
    "       WHEN f.id IS NOT NULL THEN 'processing' ELSE 'pending' END AS state, "
    "  CASE WHEN d.status = 'pending' THEN f.lease_owner END AS owner, "
    "  CASE WHEN d.status = 'pending' THEN f.lease_expires_at END AS lease_until "
    "  FROM @S@.relaybus_deliveries d "
    "  LEFT JOIN f ON f.id = d.id AND f.handler = d.handler AND f.lane = d.lane "
    "  WHERE ($1::text IS NULL OR d.handler = $1) AND ($2::text IS NULL OR d.key = $2) "
    "    AND ($3::text IS NULL OR d.id = ANY (ARRAY(SELECT @S@.relaybus_event_deliveries($3, $1))))) "
    "SELECT l.id::text, l.event_id, l.handler, e.name, l.key, l.state, l.attempts, l.last_error, "
    "  @S@.relaybus_ts(l.available_at), l.lane, l.owner, @S@.relaybus_ts(l.lease_until), "
    "  @S@.relaybus_ts(l.created), @S@.relaybus_ts(coalesce(l.updated_at, l.created)) "
    "FROM l LEFT JOIN @S@.relaybus_events e ON e.id = l.event_id "
    "WHERE l.state = ANY ($4::text[]) "
    "ORDER BY l.created, l.id LIMIT $5::bigint";

static const char list_completed_sql[] =
    "SELECT c.event_id, c.handler, e.name, e.key, c.attempts, @S@.relaybus_ts(c.completed_at) "
    "FROM @S@.relaybus_completions c LEFT JOIN @S@.relaybus_events e ON e.id = c.event_id "
    "WHERE ($1::text IS NULL OR c.handler = $1) AND ($2::text IS NULL OR e.key = $2) "
    "  AND ($3::text IS NULL OR c.event_id = $3) "
    "ORDER BY c.completed_at, c.event_id, c.handler LIMIT $4::bigint";

/* Append the rows matching f to rows; history: whether the table exists;
 * old: whether the schema may hold completed rows of relaybus 0.1.0. */
static int
list_into(struct rb_store *s, const struct rb_admin_filter *f, bool flags[RB_ADMIN_NSTATUS], int history,
    int old, json_t *rows, struct rb_error *err)
{
	char limit[32], states[64] = "{";
	const char *limitp = NULL;
	PGresult *res;

	if (f->limit > 0) {
		snprintf(limit, sizeof limit, "%" PRId64, f->limit);
		limitp = limit;
	}
	for (int k = 0; k < RB_ADMIN_NSTATUS; k++)
		if (flags[k] && (k < 3 || old)) {
			if (states[1] != '\0')
				strcat(states, ",");
			strcat(states, rb_admin_statuses[k]);
		}
	strcat(states, "}");
	if (flags[0] || flags[1] || flags[2] || (flags[3] && old)) {
		const char *params[5] = { f->handler, f->key, f->event_id, states, limitp };

		res = q(s, list_sql, 5, params, PGRES_TUPLES_OK, "list", NULL, err);
		if (res == NULL)
			return -1;
		for (int i = 0; i < PQntuples(res); i++) {
			json_t *o = json_object();

			json_object_set_new(o, "delivery_id", pg_jstr(res, i, 0));
			json_object_set_new(o, "event_id", pg_jstr(res, i, 1));
			json_object_set_new(o, "handler", pg_jstr(res, i, 2));
			json_object_set_new(o, "name", pg_jstr(res, i, 3));
			json_object_set_new(o, "key", pg_jstr(res, i, 4));
			json_object_set_new(o, "status", pg_jstr(res, i, 5));
			json_object_set_new(o, "attempts", pg_jint(res, i, 6));
			json_object_set_new(o, "last_error", pg_jstr(res, i, 7));
			json_object_set_new(o, "available_at", pg_jstr(res, i, 8));
			json_object_set_new(o, "lane", pg_jint(res, i, 9));
			json_object_set_new(o, "owner", pg_jstr(res, i, 10));
			json_object_set_new(o, "lease_expires_at", pg_jstr(res, i, 11));
			json_object_set_new(o, "created_at", pg_jstr(res, i, 12));
			json_object_set_new(o, "updated_at", pg_jstr(res, i, 13));
			/* (relaybus 0.1.0's: completed at their last update) */
			if (strcmp(PQgetvalue(res, i, 5), "completed") == 0)
				json_object_set_new(o, "completed_at", pg_jstr(res, i, 13));
			json_array_append_new(rows, o);
		}
		PQclear(res);
	}
	if (flags[3] && history) {
		int64_t left = f->limit > 0 ? f->limit - (int64_t)json_array_size(rows) : 0;

		if (f->limit > 0 && left <= 0)
			return 0;
		if (limitp != NULL)
			snprintf(limit, sizeof limit, "%" PRId64, left);
		const char *params[4] = { f->handler, f->key, f->event_id, limitp };

		res = q(s, list_completed_sql, 4, params, PGRES_TUPLES_OK, "list", NULL, err);
		if (res == NULL)
			return -1;
		for (int i = 0; i < PQntuples(res); i++) {
			json_t *o = json_object();

			json_object_set_new(o, "delivery_id", json_null());
			json_object_set_new(o, "event_id", pg_jstr(res, i, 0));
			json_object_set_new(o, "handler", pg_jstr(res, i, 1));
			json_object_set_new(o, "name", pg_jstr(res, i, 2));
			json_object_set_new(o, "key", pg_jstr(res, i, 3));
			json_object_set_new(o, "status", json_string("completed"));
			json_object_set_new(o, "attempts", pg_jint(res, i, 4));
			json_object_set_new(o, "completed_at", pg_jstr(res, i, 5));
			json_array_append_new(rows, o);
		}
		PQclear(res);
	}
	return 0;
}

int
pg_admin_list(struct rb_store *s, const struct rb_admin_filter *f, json_t **out, struct rb_error *err)
{
	bool flags[RB_ADMIN_NSTATUS];
	int hist = 0, old = 0;
	json_t *rows;

	*out = NULL;
	if (rb_admin_status_flags(f->status, flags) < 0)
		return rb_seterr(err, RB_EXIT_USAGE,
		    "unknown status '%s': use pending, processing, dead or completed", f->status);
	if (flags[3]) {
		if ((hist = pg_history(s, pg_be(s)->conn, "history", err)) < 0 ||
		    (old = has_old_completed(s, err)) < 0)
			return -1;
		if (!hist && !old)
			return rb_seterr(err, RB_EXIT_CONFIG, "schema \"%s\" keeps no completion history "
			    "(rb-setup --completion-history)", s->schema);
	}
	rows = json_array();
	if (list_into(s, f, flags, hist, old, rows, err) < 0) {
		json_decref(rows);
		return -1;
	}
	*out = rows;
	return (int)json_array_size(rows);
}

static const char show_sql[] =
    "SELECT id, name, key, payload::text, coalesce(headers, '{}')::text, array_to_json(handlers)::text, "
    "  @S@.relaybus_ts(created_at) FROM @S@.relaybus_events WHERE id = $1";

int
pg_admin_show(struct rb_store *s, const char *event_id, json_t **out, struct rb_error *err)
{
	struct rb_admin_filter f = { .event_id = event_id };
	bool flags[RB_ADMIN_NSTATUS] = { true, true, true, true };
	PGresult *res;
	json_t *ev, *dels;
	int hist, old;

	*out = NULL;
	if ((hist = pg_history(s, pg_be(s)->conn, "history", err)) < 0 ||
	    (old = has_old_completed(s, err)) < 0)
		return -1;
	const char *params[1] = { event_id };
	res = q(s, show_sql, 1, params, PGRES_TUPLES_OK, "show", NULL, err);
	if (res == NULL)
		return -1;
	ev = json_object();
	json_object_set_new(ev, "event_id", json_string(event_id));
	if (PQntuples(res) > 0) {
		json_object_set_new(ev, "name", pg_jstr(res, 0, 1));
		json_object_set_new(ev, "key", pg_jstr(res, 0, 2));
		json_object_set_new(ev, "payload", pg_jjson(res, 0, 3));
		json_object_set_new(ev, "headers", pg_jjson(res, 0, 4));
		json_object_set_new(ev, "handlers", pg_jjson(res, 0, 5));
		json_object_set_new(ev, "created_at", pg_jstr(res, 0, 6));
	}
	dels = json_array();
	if (list_into(s, &f, flags, hist, old, dels, err) < 0) {
		PQclear(res);
		json_decref(ev);
		json_decref(dels);
		return -1;
	}
	if (PQntuples(res) == 0 && json_array_size(dels) == 0) {
		json_decref(ev);
		json_decref(dels);
	} else {
		json_object_set_new(ev, "deliveries", dels);
		*out = ev;
	}
	PQclear(res);
	return 0;
}

/* ---- requeue, bury, cancel ----------------------------------------------- */

/* The deliveries d of target t (event_id, handler or NULL for all): there
 * is no index on event_id; relaybus_event_deliveries finds them through
 * their event's lane (schema_pg.sql) */
#define EVENT_DELIVERIES						\
	"(SELECT d.* FROM @S@.relaybus_event_deliveries(t.event_id, t.handler) AS x(id) " \
	"  JOIN @S@.relaybus_deliveries d ON d.id = x.id AND d.event_id = t.event_id OFFSET 0) d"

/* Lock the lane rows of the targeted deliveries, in the order a claim and
 * relaybus_fail lock them: a claim of one of those lanes now waits (or
 * skips the lane), so "in flight" cannot change under the update. */
static const char lock_lanes_sql[] =
    "SELECT 1 FROM @S@.relaybus_lanes x "
    "WHERE (x.handler, x.lane) IN (SELECT d.handler, d.lane FROM unnest($1::text[], $2::text[]) AS t(event_id, handler) "
    "  CROSS JOIN LATERAL " EVENT_DELIVERIES ") "
    "ORDER BY x.handler, x.lane FOR NO KEY UPDATE OF x";

/*
 * Before a requeue: a dead keyed delivery with a later delivery of its
 * handler and key in flight (which started, or may have, once it was
 * buried) could no longer run first.  It goes to the back of its key: new
 * sequences from the key's counter, in its old order when several are
 * requeued, so that the claim's per-key rule (the lowest pending sequence
 * is the head) holds it until the later ones are done.  The others keep
 * their place.  Runs after lock_lanes_sql: in flight cannot change.
 */
static const char requeue_reorder_sql[] =
    "WITH t AS (SELECT * FROM unnest($1::text[], $2::text[]) AS t(event_id, handler)), "
    "r AS (SELECT DISTINCT d.id, d.key, d.sequence FROM t CROSS JOIN LATERAL " EVENT_DELIVERIES " "
    "  WHERE d.status = 'dead' AND d.key IS NOT NULL AND EXISTS ("
    "    SELECT 1 FROM @S@.relaybus_deliveries e JOIN @S@.relaybus_lanes x "
    "      ON x.handler = e.handler AND x.lane = e.lane AND e.id = ANY (x.in_flight) "
    "     WHERE e.handler = d.handler AND e.lane = d.lane AND e.key = d.key "
    "       AND e.status = 'pending' AND e.sequence > d.sequence)), "
    "o AS (SELECT r.id, r.key, row_number() OVER (PARTITION BY r.key ORDER BY r.sequence, r.id) AS n, "
    "  count(*) OVER (PARTITION BY r.key) AS cnt FROM r), "
    "k AS (INSERT INTO @S@.relaybus_keys AS k (key, sequence) "
    "  SELECT o.key, max(o.cnt) FROM o GROUP BY o.key ORDER BY o.key "
    "  ON CONFLICT (key) DO UPDATE SET sequence = k.sequence + excluded.sequence "
    "  RETURNING k.key, k.sequence) "
    "UPDATE @S@.relaybus_deliveries d SET sequence = k.sequence - o.cnt + o.n "
    "  FROM o JOIN k ON k.key = o.key WHERE d.id = o.id";

#define APPLY_SQL(ACTION, DONE, NEW_STATUS, COUNT)			\
	"WITH t AS (SELECT * FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(event_id, handler, ord)), " \
	"m AS (SELECT t.ord, t.event_id AS t_event, t.handler AS t_handler, d.id, d.handler, d.status, " \
	"  (d.status = 'pending' AND EXISTS (SELECT 1 FROM @S@.relaybus_lanes x "	\
	"     WHERE x.handler = d.handler AND x.lane = d.lane AND d.id = ANY (x.in_flight))) AS in_flight " \
	"  FROM t LEFT JOIN LATERAL " EVENT_DELIVERIES " ON true), "	\
	"ch AS (" ACTION " RETURNING d.id, d.handler, d.lane) " COUNT	\
	"SELECT m.t_event, coalesce(m.handler, m.t_handler), m.id::text, "	\
	"  CASE WHEN m.id IS NULL THEN 'missing' WHEN c.id IS NOT NULL THEN '" DONE "' ELSE 'skipped' END, " \
	"  CASE WHEN m.id IS NULL THEN NULL WHEN c.id IS NOT NULL THEN " NEW_STATUS " "	\
	"       WHEN m.in_flight THEN 'processing' ELSE m.status END "	\
	"FROM m LEFT JOIN (SELECT DISTINCT id FROM ch) c ON c.id = m.id ORDER BY m.ord, m.handler"

static const char requeue_sql[] = APPLY_SQL(
    "UPDATE @S@.relaybus_deliveries d SET status = 'pending', attempts = 0, claims = d.claims + 1, "
    "  created_at = coalesce(d.created_at, d.available_at), available_at = clock_timestamp(), updated_at = now() "
    /* (the claim cursors' rule, relaybus_claim_ids: the xid, which the
     * WHERE takes before the first row's SET reads the clock) */
    "  FROM m WHERE d.id = m.id AND m.status = 'dead' AND pg_current_xact_id() IS NOT NULL",
    "requeued", "'pending'", "");
static const char bury_sql[] = APPLY_SQL(
    "UPDATE @S@.relaybus_deliveries d SET status = 'dead', last_error = $3, updated_at = now() "
    "  FROM m WHERE d.id = m.id AND m.status = 'pending' AND NOT m.in_flight",
    "buried", "'dead'",
    /* the cumulative count, in the lane rows (locked already: lock_lanes_sql) */
    ", nb AS (UPDATE @S@.relaybus_lanes x SET buried = x.buried + c.n "
    "  FROM (SELECT handler, lane, count(*) AS n FROM ch GROUP BY handler, lane) c "
    "  WHERE x.handler = c.handler AND x.lane = c.lane) ");
static const char cancel_sql[] = APPLY_SQL(
    "DELETE FROM @S@.relaybus_deliveries d USING m "
    "  WHERE d.id = m.id AND m.status = 'pending' AND NOT m.in_flight",
    "cancelled", "NULL", "");

/* text[] literal of one field of every target (NULL elements for a missing one); new string. */
static char *
target_array(const json_t *targets, const char *field)
{
	struct rb_sbuf b = { 0 };
	size_t i;
	const json_t *t;

	pg_arr_start(&b);
	json_array_foreach(targets, i, t)
		pg_arr_text(&b, json_string_value(json_object_get(t, field)));
	pg_arr_end(&b);
	return b.s;
}

int
pg_admin_apply(struct rb_store *s, enum rb_admin_action action, const json_t *targets,
    const char *reason, json_t **out, struct rb_error *err)
{
	static const char *const what[] = { "requeue", "bury", "cancel" };
	const char *sql = action == RB_ADMIN_REQUEUE ? requeue_sql :
	    action == RB_ADMIN_BURY ? bury_sql : cancel_sql;
	char *evs = NULL, *hs = NULL;
	PGresult *res = NULL;
	json_t *outcomes = NULL;
	bool retry = false;
	int rc = -1, changed = 0;

	*out = NULL;
	if (json_array_size(targets) == 0) {
		*out = json_array();
		return 0;
	}
	evs = target_array(targets, "event_id");
	hs = target_array(targets, "handler");
	const char *params[3] = { evs, hs, reason != NULL ? reason : "buried by rb-admin" };
	/* a deadlock with a claim locking the same lanes: run it again */
	for (int attempt = 0; attempt < 5; attempt++) {
		PGresult *lk;

		if (pg_run_cmd(s, "BEGIN", what[action], err) < 0)
			goto out;
		lk = q(s, lock_lanes_sql, 2, params, PGRES_TUPLES_OK, what[action], &retry, err);
		if (lk != NULL && action == RB_ADMIN_REQUEUE) {
			PQclear(lk);
			lk = q(s, requeue_reorder_sql, 2, params, PGRES_COMMAND_OK, what[action], &retry, err);
		}
		if (lk != NULL) {
			PQclear(lk);
			res = q(s, sql, action == RB_ADMIN_BURY ? 3 : 2, params, PGRES_TUPLES_OK,
			    what[action], &retry, err);
		}
		if (res != NULL)
			break;
		pg_rollback_quietly(s);
		if (!retry)
			goto out;
	}
	if (res == NULL)
		goto out;
	if (pg_run_cmd(s, "COMMIT", what[action], err) < 0)
		goto out;
	outcomes = json_array();
	for (int i = 0; i < PQntuples(res); i++) {
		json_t *o = json_object();

		json_object_set_new(o, "event_id", pg_jstr(res, i, 0));
		json_object_set_new(o, "handler", pg_jstr(res, i, 1));
		json_object_set_new(o, "delivery_id", pg_jstr(res, i, 2));
		json_object_set_new(o, "outcome", pg_jstr(res, i, 3));
		json_object_set_new(o, "status", pg_jstr(res, i, 4));
		if (strcmp(PQgetvalue(res, i, 3), "skipped") != 0 &&
		    strcmp(PQgetvalue(res, i, 3), "missing") != 0)
			changed++;
		json_array_append_new(outcomes, o);
	}
	*out = outcomes;
	rc = changed;
out:
	PQclear(res);
	free(evs);
	free(hs);
	return rc;
}

/* ---- purge --------------------------------------------------------------- */

#define CUTOFF "now() - $1::bigint * interval '1 millisecond'"

static const char purge_dead_sql[] =
    "DELETE FROM @S@.relaybus_deliveries WHERE id = ANY (ARRAY("
    "  SELECT id FROM @S@.relaybus_deliveries WHERE status = 'dead' AND updated_at < " CUTOFF
    "  ORDER BY updated_at, id LIMIT $2::integer FOR UPDATE SKIP LOCKED)) AND status = 'dead'";
static const char purge_events_sql[] =
    "DELETE FROM @S@.relaybus_events WHERE id = ANY (ARRAY("
    "  SELECT e.id FROM @S@.relaybus_events e WHERE e.created_at < " CUTOFF
    "    AND NOT EXISTS (SELECT 1 FROM @S@.relaybus_deliveries d WHERE d.event_id = e.id) "
    "  LIMIT $2::integer FOR UPDATE OF e SKIP LOCKED))";
/* (completions purged are added to completed_purged of the handler's lane
 * 0, so that the completed counter of rb-admin stats never goes back) */
#define COUNT_PURGED(DELETE)						\
    "WITH p AS (" DELETE " RETURNING handler), "			\
    "c AS (UPDATE @S@.relaybus_lanes x SET completed_purged = x.completed_purged + c.n " \
    "  FROM (SELECT handler, count(*) AS n FROM p GROUP BY handler) c "	\
    "  WHERE x.handler = c.handler AND x.lane = 0) "			\
    "SELECT count(*) FROM p"
static const char purge_history_sql[] = COUNT_PURGED(
    "DELETE FROM @S@.relaybus_completions WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @S@.relaybus_completions WHERE completed_at < " CUTOFF
    "  ORDER BY completed_at LIMIT $2::integer FOR UPDATE SKIP LOCKED))");

/* the completed deliveries relaybus 0.1.0 left (upgrade_010_pg.sql), by
 * their completion time */
static const char purge_completed_sql[] = COUNT_PURGED(
    "DELETE FROM @S@.relaybus_deliveries WHERE id = ANY (ARRAY("
    "  SELECT id FROM @S@.relaybus_deliveries WHERE status = 'completed' AND updated_at < " CUTOFF
    "  ORDER BY updated_at, id LIMIT $2::integer FOR UPDATE SKIP LOCKED)) AND status = 'completed'");

int
pg_admin_purge(struct rb_store *s, enum rb_admin_purge kind, int64_t older_than_ms, int batch,
    struct rb_error *err)
{
	char age[32], lim[16];
	const char *params[2] = { age, lim };
	PGresult *res;
	int n;

	if (batch < 1 || older_than_ms < 0)
		return rb_seterr(err, RB_EXIT_USAGE, "purge: invalid batch or age");
	if (kind == RB_PURGE_HISTORY || kind == RB_PURGE_COMPLETED) {
		/* (without the 0.1.0 index the search would be a scan of every delivery) */
		int h = kind == RB_PURGE_HISTORY ? pg_history(s, pg_be(s)->conn, "history", err) :
		    has_old_completed(s, err);

		if (h <= 0)
			return h;
	}
	snprintf(age, sizeof age, "%" PRId64, older_than_ms);
	snprintf(lim, sizeof lim, "%d", batch);
	if (kind == RB_PURGE_HISTORY || kind == RB_PURGE_COMPLETED) {
		res = q(s, kind == RB_PURGE_HISTORY ? purge_history_sql : purge_completed_sql, 2, params,
		    PGRES_TUPLES_OK, "purge", NULL, err);
		if (res == NULL)
			return -1;
		n = atoi(PQgetvalue(res, 0, 0));
		PQclear(res);
		return n;
	}
	res = q(s, kind == RB_PURGE_DEAD ? purge_dead_sql : purge_events_sql, 2, params,
	    PGRES_COMMAND_OK, "purge", NULL, err);
	if (res == NULL)
		return -1;
	n = atoi(PQcmdTuples(res));
	PQclear(res);
	return n;
}

/*
 * Key counters.  A publish locks its key's counter row (INSERT ... ON
 * CONFLICT DO UPDATE) before it writes its deliveries, and holds it until
 * it commits.  So: 1. lock a batch of counters, skipping those a publish in
 * progress holds; 2. in a new statement, whose snapshot (READ COMMITTED)
 * is taken after the locks, so that every publish of those keys that
 * committed is seen, delete the counters of keys with no pending or dead
 * delivery.  No publish of those keys can add a delivery in between (it
 * waits for the lock), and one that waits publishes after the purge
 * commits, from sequence 1, later than everything of its key that ran.  A
 * single DELETE ... WHERE NOT EXISTS would not do: after waiting for a
 * publish's lock it rechecks the row, but not its NOT EXISTS, against what
 * that publish committed.  Pending deliveries of a key are found through
 * lane_key_idx: every handler that has pending keyed deliveries (a skip
 * scan of the index), the key's lane (a keyed delivery's lane is
 * relaybus_lane(key)) and the key; dead ones through dead_idx, once per
 * batch.  (Completed deliveries relaybus 0.1.0 left need no counter.)
 */
static const char keys_lock_sql[] =
    "SELECT key FROM @S@.relaybus_keys WHERE $1::text IS NULL OR key > $1 "
    "ORDER BY key LIMIT $2::integer FOR UPDATE SKIP LOCKED";
static const char keys_delete_sql[] =
    "WITH RECURSIVE hs AS ("
    "  (SELECT d.handler FROM @S@.relaybus_deliveries d "
    "    WHERE d.key IS NOT NULL AND d.status = 'pending' ORDER BY d.handler LIMIT 1) "
    "  UNION ALL "
    "  SELECT (SELECT d.handler FROM @S@.relaybus_deliveries d "
    "           WHERE d.key IS NOT NULL AND d.status = 'pending' AND d.handler > hs.handler "
    "           ORDER BY d.handler LIMIT 1) "
    "    FROM hs WHERE hs.handler IS NOT NULL), "
    "h AS (SELECT coalesce(array_agg(hs.handler), '{}') AS hs FROM hs WHERE hs.handler IS NOT NULL), "
    "dk AS (SELECT DISTINCT d.key FROM @S@.relaybus_deliveries d "
    "  WHERE d.status = 'dead' AND d.key IS NOT NULL) "
    "DELETE FROM @S@.relaybus_keys k USING h "
    "WHERE k.key = ANY ($1::text[]) "
    "  AND NOT EXISTS (SELECT 1 FROM @S@.relaybus_deliveries d "
    "    WHERE d.handler = ANY (h.hs) AND d.lane = @S@.relaybus_lane(k.key) AND d.key = k.key "
    "      AND d.status = 'pending') "
    "  AND NOT EXISTS (SELECT 1 FROM dk WHERE dk.key = k.key)";

int
pg_admin_purge_keys(struct rb_store *s, char **after, int batch, struct rb_error *err)
{
	char lim[16];
	const char *params[2] = { *after, lim };
	struct rb_sbuf keys = { 0 };
	PGresult *res;
	int n = -1, found;

	if (batch < 1)
		return rb_seterr(err, RB_EXIT_USAGE, "purge: invalid batch");
	snprintf(lim, sizeof lim, "%d", batch);
	/* READ COMMITTED whatever the session's default: the second statement
	 * must see what committed while the first waited for nothing */
	if (pg_run_cmd(s, "BEGIN ISOLATION LEVEL READ COMMITTED", "purge", err) < 0)
		return -1;
	if (pg_run_cmd(s, "SET LOCAL enable_seqscan = off", "purge", err) < 0 ||
	    (res = q(s, keys_lock_sql, 2, params, PGRES_TUPLES_OK, "purge", NULL, err)) == NULL) {
		pg_rollback_quietly(s);
		return -1;
	}
	found = PQntuples(res);
	pg_arr_start(&keys);
	for (int i = 0; i < found; i++)
		pg_arr_text(&keys, PQgetvalue(res, i, 0));
	pg_arr_end(&keys);
	free(*after);
	*after = found > 0 ? xstrdup(PQgetvalue(res, found - 1, 0)) : NULL;
	PQclear(res);
	if (found > 0) {
		const char *p[1] = { keys.s };

		if ((res = q(s, keys_delete_sql, 1, p, PGRES_COMMAND_OK, "purge", NULL, err)) != NULL) {
			n = atoi(PQcmdTuples(res));
			PQclear(res);
		}
	} else
		n = 0;
	free(keys.s);
	if (n < 0) {
		pg_rollback_quietly(s);
		return -1;
	}
	if (pg_run_cmd(s, "COMMIT", "purge", err) < 0)
		return -1;
	return n;
}

/* ---- lanes and subscriptions --------------------------------------------- */

static const char lanes_sql[] =
    "SELECT handler, lane, epoch, lease_owner, @S@.relaybus_ts(lease_expires_at), "
    "  lease_expires_at <= now(), cardinality(in_flight), array_to_json(in_flight::text[])::text "
    "FROM @S@.relaybus_lanes "
    "WHERE ($1::text IS NULL OR handler = $1) "
    "  AND ($2::boolean OR lease_owner IS NOT NULL OR cardinality(in_flight) > 0) "
    "ORDER BY handler, lane";

int
pg_admin_lanes(struct rb_store *s, const char *handler, bool all, json_t **out, struct rb_error *err)
{
	const char *params[2] = { handler, all ? "true" : "false" };
	PGresult *res;
	json_t *rows;

	*out = NULL;
	res = q(s, lanes_sql, 2, params, PGRES_TUPLES_OK, "lanes", NULL, err);
	if (res == NULL)
		return -1;
	rows = json_array();
	for (int i = 0; i < PQntuples(res); i++) {
		json_t *o = json_object();

		json_object_set_new(o, "handler", pg_jstr(res, i, 0));
		json_object_set_new(o, "lane", pg_jint(res, i, 1));
		json_object_set_new(o, "epoch", pg_jint(res, i, 2));
		json_object_set_new(o, "owner", pg_jstr(res, i, 3));
		json_object_set_new(o, "lease_expires_at", pg_jstr(res, i, 4));
		json_object_set_new(o, "expired", pg_jbool(res, i, 5));
		json_object_set_new(o, "in_flight", pg_jint(res, i, 6));
		json_object_set_new(o, "in_flight_ids", pg_jjson(res, i, 7));
		json_array_append_new(rows, o);
	}
	PQclear(res);
	*out = rows;
	return (int)json_array_size(rows);
}

static const char subs_sql[] =
    "SELECT handler, pattern, @S@.relaybus_ts(created_at) FROM @S@.relaybus_subscriptions "
    "WHERE $1::text IS NULL OR handler = $1 ORDER BY handler, pattern";

int
pg_admin_subscriptions(struct rb_store *s, const char *handler, json_t **out, struct rb_error *err)
{
	const char *params[1] = { handler };
	PGresult *res;
	json_t *rows;

	*out = NULL;
	res = q(s, subs_sql, 1, params, PGRES_TUPLES_OK, "subscriptions", NULL, err);
	if (res == NULL)
		return -1;
	rows = json_array();
	for (int i = 0; i < PQntuples(res); i++)
		json_array_append_new(rows, json_pack("{s:o, s:o, s:o}", "handler", pg_jstr(res, i, 0),
		    "pattern", pg_jstr(res, i, 1), "created_at", pg_jstr(res, i, 2)));
	PQclear(res);
	*out = rows;
	return (int)json_array_size(rows);
}
