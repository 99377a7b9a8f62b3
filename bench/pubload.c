/* SPDX-License-Identifier: MIT */
/*
 * pubload: one bench publisher process.
 *
 *   pubload rb  [options] -- RB-PUBLISH-COMMAND...   feed the real rb-publish
 *   pubload sql [options]                            the hand-written outbox insert
 *   pubload same [options]                           relaybus's own statements, as plain SQL
 *   pubload fn [options]                             relaybus_publish() from SQL, once an event
 *
 * Both publish --events N events named ev.<prefix> in calls of --batch
 * events.  rb mode starts the command given after "--" (rb-publish ... -o),
 * writes one call's lines to its stdin and times until its acks are read
 * back; sql mode runs, per call, one statement that inserts the event rows
 * and one delivery row per subscribed handler (one transaction per call);
 * same mode runs, per call, the statements rb-publish's batch function runs
 * (the event insert with its dedup, the per-key counters, the deliveries
 * with their lanes, the notification) as one plain SQL statement against a
 * schema made by rb-setup: the baseline that isolates what rb-publish and
 * its function add.  --notify 0 leaves the notification out: the cost of
 * the wake-up to publishing, measured beside it.
 * fn mode publishes as an application does from SQL: one
 * SELECT relaybus_publish(name, payload, key) per event, --batch events to
 * a transaction (BEGIN ... COMMIT when more than one).
 * Call latencies (microseconds) go to --lat FILE, one per line.
 *
 * With --rate R the lines are written at R events/s in ticks of --tick-ms
 * and acks are not awaited (rb mode, scenario 5; rb-publish without -o).
 *
 * Payload: {"i":I,"t":MICROS,"k":KEY,"n":N,"pad":"..."}; with --keyed F a
 * fraction F of the events get the ordering key "<prefix>-kJ" (--keys
 * keys) and n counts the events of that key in publish order.
 *
 * Output: one JSON line {"events","deliveries","start_us","end_us"}.
 */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

static long long
now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void
die(const char *msg)
{
	fprintf(stderr, "pubload: %s\n", msg);
	exit(70);
}

struct sb {
	char	*s;
	size_t	 n, cap;
};

static void
sb_printf(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#include <stdarg.h>
static void
sb_printf(struct sb *b, const char *fmt, ...)
{
	va_list ap;
	int k;

	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
		va_end(ap);
		if (k >= 0 && b->n + (size_t)k < b->cap)
			break;
		b->cap = (b->cap + (size_t)k + 1) * 2;
		if ((b->s = realloc(b->s, b->cap)) == NULL)
			die("out of memory");
	}
	b->n += (size_t)k;
}

static const char *prefix = "pub";
static bool notify = true;	/* same mode: send the notification (--notify 0: leave it out) */
static double keyed = 0;
static long keys = 100;
static long *key_n;

/* One event as JSON (no newline). */
static void
event(struct sb *b, long i)
{
	long long t = now_us();
	static const char pad[] = "0123456789abcdef0123456789abcdef0123456789abcdef";

	/* spread keyed events evenly: event i is keyed when floor((i+1)F) > floor(iF) */
	if (keyed > 0 && (long)((double)(i + 1) * keyed) > (long)((double)i * keyed)) {
		long k = i % keys;

		key_n[k]++;
		sb_printf(b, "{\"name\":\"ev.%s\",\"key\":\"%s-k%ld\",\"payload\":{\"i\":%ld,\"t\":%lld,"
		    "\"k\":\"%s-k%ld\",\"n\":%ld,\"pad\":\"%s\"}}", prefix, prefix, k, i, t, prefix, k,
		    key_n[k], pad);
	} else {
		sb_printf(b, "{\"name\":\"ev.%s\",\"payload\":{\"i\":%ld,\"t\":%lld,\"pad\":\"%s\"}}",
		    prefix, i, t, pad);
	}
}

static void
write_all(int fd, const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, s, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			die("write to rb-publish failed");
		s += w;
		n -= (size_t)w;
	}
}

/* Read until `want` newlines have arrived; count "deliveries":N. */
static long
read_acks(int fd, long want, long *deliveries)
{
	static char buf[1 << 16];
	static size_t have;
	long got = 0;

	while (got < want) {
		ssize_t r;
		size_t start = 0;

		r = read(fd, buf + have, sizeof buf - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return got;
		have += (size_t)r;
		for (size_t i = 0; i < have; i++) {
			if (buf[i] != '\n')
				continue;
			buf[i] = '\0';
			const char *d = strstr(buf + start, "\"deliveries\":");
			if (d != NULL)
				*deliveries += atol(d + 13);
			got++;
			start = i + 1;
		}
		memmove(buf, buf + start, have - start);
		have -= start;
	}
	return got;
}

static void
wait_start(long long start_at_us)
{
	long long d = start_at_us - now_us();

	if (d > 0) {
		struct timespec ts = { d / 1000000, (d % 1000000) * 1000 };

		nanosleep(&ts, NULL);
	}
}

int
main(int argc, char **argv)
{
	const char *mode, *url = NULL, *schema = "public", *latpath = NULL;
	long events = 1000, batch = 1, deliveries = 0, done = 0;
	long long start_at = 0, start, end;
	double rate = 0;
	long tick_ms = 10;
	char **cmd = NULL;
	FILE *lat = NULL;
	struct sb b = { 0 };
	int i;

	signal(SIGPIPE, SIG_IGN);
	if (argc < 2)
		die("usage: pubload rb|sql|same|fn [--url U] [--schema S] [--events N] [--batch B] [--prefix P] "
		    "[--keyed F] [--keys K] [--start-at US] [--lat FILE] [--rate R] [--tick-ms T] [--notify 0|1] [-- CMD...]");
	mode = argv[1];
	for (i = 2; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--") == 0) {
			cmd = argv + i + 1;
			break;
		}
		if (v == NULL)
			die("option needs a value");
		i++;
		if (strcmp(a, "--url") == 0) url = v;
		else if (strcmp(a, "--schema") == 0) schema = v;
		else if (strcmp(a, "--events") == 0) events = atol(v);
		else if (strcmp(a, "--batch") == 0) batch = atol(v);
		else if (strcmp(a, "--prefix") == 0) prefix = v;
		else if (strcmp(a, "--keyed") == 0) keyed = atof(v);
		else if (strcmp(a, "--keys") == 0) keys = atol(v);
		else if (strcmp(a, "--start-at") == 0) start_at = atoll(v);
		else if (strcmp(a, "--lat") == 0) latpath = v;
		else if (strcmp(a, "--rate") == 0) rate = atof(v);
		else if (strcmp(a, "--tick-ms") == 0) tick_ms = atol(v);
		else if (strcmp(a, "--notify") == 0) notify = atoi(v) != 0;
		else die("unknown option");
	}
	if (batch < 1 || events < 0 || keys < 1)
		die("bad --batch, --events or --keys");
	key_n = calloc((size_t)keys, sizeof *key_n);
	if (latpath != NULL && (lat = fopen(latpath, "w")) == NULL)
		die("cannot open --lat file");

	if (strcmp(mode, "rb") == 0) {
		int in[2], out[2];
		pid_t pid;
		int st;

		if (cmd == NULL || cmd[0] == NULL)
			die("rb mode needs -- RB-PUBLISH-COMMAND");
		if (pipe(in) < 0 || pipe(out) < 0)
			die("pipe failed");
		if ((pid = fork()) < 0)
			die("fork failed");
		if (pid == 0) {
			dup2(in[0], 0);
			dup2(out[1], 1);
			close(in[0]); close(in[1]); close(out[0]); close(out[1]);
			execvp(cmd[0], cmd);
			_exit(127);
		}
		close(in[0]);
		close(out[1]);
		wait_start(start_at);
		start = now_us();
		if (rate > 0) {
			/* paced: per tick, the events due by then; no acks */
			long long t0 = now_us();
			long tick = 0;

			while (done < events) {
				long due = (long)((double)(tick + 1) * (double)tick_ms * rate / 1000.0);

				if (due > events)
					due = events;
				b.n = 0;
				for (; done < due; done++) {
					event(&b, done);
					sb_printf(&b, "\n");
				}
				if (b.n > 0)
					write_all(in[1], b.s, b.n);
				tick++;
				long long next = t0 + (long long)tick * tick_ms * 1000, d = next - now_us();
				if (d > 0) {
					struct timespec ts = { d / 1000000, (d % 1000000) * 1000 };

					nanosleep(&ts, NULL);
				}
			}
			close(in[1]);
			{
				char sink[4096];

				while (read(out[0], sink, sizeof sink) > 0)
					;
			}
		} else {
			while (done < events) {
				long n = events - done < batch ? events - done : batch;
				long long t0;

				b.n = 0;
				for (long k = 0; k < n; k++) {
					event(&b, done + k);
					sb_printf(&b, "\n");
				}
				t0 = now_us();
				write_all(in[1], b.s, b.n);
				if (read_acks(out[0], n, &deliveries) != n)
					die("rb-publish stopped early (see its stderr)");
				if (lat != NULL)
					fprintf(lat, "%lld\n", now_us() - t0);
				done += n;
			}
			close(in[1]);
		}
		end = now_us();
		if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			die("rb-publish failed");
	} else if (strcmp(mode, "fn") == 0) {
		PGconn *conn = PQconnectdb(url != NULL ? url : "");
		struct sb q = { 0 };

		if (PQstatus(conn) != CONNECTION_OK)
			die(PQerrorMessage(conn));
		sb_printf(&q, "SELECT deliveries FROM %s.relaybus_publish($1::jsonb->>'name', $1::jsonb->'payload', "
		    "$1::jsonb->>'key')", schema);
		wait_start(start_at);
		start = now_us();
		while (done < events) {
			long n = events - done < batch ? events - done : batch;
			long long t0 = now_us();
			PGresult *res;

			if (n > 1)
				PQclear(PQexec(conn, "BEGIN"));
			for (long k = 0; k < n; k++) {
				const char *p[1];

				b.n = 0;
				event(&b, done + k);
				p[0] = b.s;
				res = PQexecParams(conn, q.s, 1, NULL, p, NULL, NULL, 0);
				if (PQresultStatus(res) != PGRES_TUPLES_OK)
					die(PQresultErrorMessage(res));
				deliveries += atol(PQgetvalue(res, 0, 0));
				PQclear(res);
			}
			if (n > 1) {
				res = PQexec(conn, "COMMIT");
				if (PQresultStatus(res) != PGRES_COMMAND_OK)
					die(PQresultErrorMessage(res));
				PQclear(res);
			}
			if (lat != NULL)
				fprintf(lat, "%lld\n", now_us() - t0);
			done += n;
		}
		end = now_us();
		PQfinish(conn);
		free(q.s);
	} else if (strcmp(mode, "sql") == 0 || strcmp(mode, "same") == 0) {
		PGconn *conn = PQconnectdb(url != NULL ? url : "");
		struct sb q = { 0 };
		bool same = strcmp(mode, "same") == 0;

		if (PQstatus(conn) != CONNECTION_OK)
			die(PQerrorMessage(conn));
		if (!same)
			/* the minimal outbox insert a user writes by hand: the event rows,
			 * and one delivery row per subscribed handler, in one transaction */
			sb_printf(&q,
			    "WITH e AS (INSERT INTO %s.events (name, key, payload) "
			    "  SELECT x.name, x.key, x.payload FROM jsonb_to_recordset($1::jsonb) "
			    "    AS x(name text, key text, payload jsonb) RETURNING id, name) "
			    "INSERT INTO %s.deliveries (event_id, handler) "
			    "SELECT e.id, s.handler FROM e JOIN %s.subscriptions s ON e.name LIKE s.pattern",
			    schema, schema, schema);
		else
			/* relaybus_publish_batch's statements (libcommon/pg/schema_pg.sql), sent as SQL */
			sb_printf(&q,
			    "WITH src AS (SELECT x.o AS ord, coalesce(x.e->>'id', gen_random_uuid()::text) AS id, "
			    "    x.e->>'name' AS name, x.e->>'key' AS key, x.e->'payload' AS payload "
			    "  FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(e, o)), "
			    "routed AS (SELECT s.*, ARRAY(SELECT DISTINCT sub.handler FROM %s.relaybus_subscriptions sub "
			    "    WHERE s.name LIKE sub.like_pattern ORDER BY 1) AS hs FROM src s), "
			    "ins AS (INSERT INTO %s.relaybus_events AS ev (id, name, key, payload, headers, handlers) "
			    "  SELECT id, name, key, payload, NULL::jsonb, hs FROM routed ORDER BY ord ON CONFLICT (id) DO NOTHING RETURNING ev.id), "
			    "fresh AS (SELECT r.* FROM routed r JOIN ins ON ins.id = r.id), "
			    "keyed AS (SELECT key, count(*) AS n FROM fresh WHERE key IS NOT NULL GROUP BY key), "
			    "seq AS (INSERT INTO %s.relaybus_keys AS k (key, sequence) SELECT key, n FROM keyed ORDER BY key "
			    "  ON CONFLICT (key) DO UPDATE SET sequence = k.sequence + excluded.sequence RETURNING k.key, k.sequence), "
			    "numbered AS (SELECT f.*, CASE WHEN f.key IS NOT NULL THEN sq.sequence - kd.n "
			    "    + row_number() OVER (PARTITION BY f.key ORDER BY f.ord) END AS seqn "
			    "  FROM fresh f LEFT JOIN seq sq ON sq.key = f.key LEFT JOIN keyed kd ON kd.key = f.key), "
			    "del AS (INSERT INTO %s.relaybus_deliveries (event_id, handler, lane, key, sequence, created_at) "
			    "  SELECT n.id, h, %s.relaybus_lane(coalesce(n.key, n.id)), n.key, n.seqn, NULL FROM numbered n, unnest(n.hs) h "
			    "  RETURNING handler) "
			    "SELECT (SELECT count(*) FROM del), %s",
			    schema, schema, schema, schema, schema, notify ? "" : "0");
		if (same && notify)
			/* one notification per handler and transaction, as the function sends */
			sb_printf(&q, "(SELECT count(pg_notify('relaybus_%s', h)) FROM (SELECT DISTINCT handler AS h FROM del) x)",
			    schema);
		wait_start(start_at);
		start = now_us();
		while (done < events) {
			long n = events - done < batch ? events - done : batch;
			long long t0;
			const char *p[1];
			PGresult *res;

			b.n = 0;
			sb_printf(&b, "[");
			for (long k = 0; k < n; k++) {
				if (k > 0)
					sb_printf(&b, ",");
				event(&b, done + k);
			}
			sb_printf(&b, "]");
			p[0] = b.s;
			t0 = now_us();
			res = PQexecParams(conn, q.s, 1, NULL, p, NULL, NULL, 0);
			if (PQresultStatus(res) != (same ? PGRES_TUPLES_OK : PGRES_COMMAND_OK))
				die(PQresultErrorMessage(res));
			deliveries += same ? atol(PQgetvalue(res, 0, 0)) : atol(PQcmdTuples(res));
			PQclear(res);
			if (lat != NULL)
				fprintf(lat, "%lld\n", now_us() - t0);
			done += n;
		}
		end = now_us();
		PQfinish(conn);
		free(q.s);
	} else {
		die("mode must be rb, sql, same or fn");
	}
	if (lat != NULL)
		fclose(lat);
	printf("{\"events\":%ld,\"deliveries\":%ld,\"start_us\":%lld,\"end_us\":%lld}\n", done,
	    deliveries, start, end);
	free(b.s);
	free(key_n);
	return 0;
}
