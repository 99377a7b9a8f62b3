/* SPDX-License-Identifier: MIT */
/*
 * sqlloop: one baseline dispatcher process for bench scenario 2.
 *
 *   sqlloop fused    --url U --schema S --batch B --log FILE
 *       the plain-SQL limit: a loop of one fused statement per batch,
 *       DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id
 *       FOR UPDATE SKIP LOCKED LIMIT B) RETURNING ..., until it returns nothing.
 *   sqlloop rowlease --url U --schema S --batch B --log FILE
 *       the row-lease design of relaybus 0.1.0: claim = UPDATE status =
 *       'processing', attempts + 1, lease_owner, lease_expires_at of up to B
 *       due pending rows (SKIP LOCKED); completion = one UPDATE status =
 *       'completed', completed_at per delivery, fenced by the owner.
 *   sqlloop txlock   --url U --schema S --batch B --log FILE
 *       the minimal at-least-once outbox: relaybus's shape (an events table,
 *       a delivery row per handler without the payload) drained the
 *       simplest way that runs each delivery at least once: one transaction
 *       per batch that locks up to B delivery rows (FOR UPDATE SKIP LOCKED,
 *       the lock is the lease), reads their events, runs the "handler",
 *       then deletes them and commits (a crash before the commit leaves
 *       them pending).  What it lacks against relaybus: per-key order
 *       across processes, retries, leases that outlive a transaction.
 *
 * The no-op "handler" appends each event id to --log.  Exits when a claim
 * finds nothing.  Output: {"handled":N,"start_us":..,"end_us":..}.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
die(const char *what, const char *msg)
{
	fprintf(stderr, "sqlloop: %s: %s\n", what, msg);
	exit(70);
}

static void
exec_ok(PGconn *conn, const char *sql)
{
	PGresult *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		die(sql, PQresultErrorMessage(res));
	PQclear(res);
}

/* the ids of column 0 as an array literal, {1,2,3}, in *buf */
static void
ids_of(const PGresult *res, char **buf, size_t *cap)
{
	size_t len = 0, need = 3;

	for (int r = 0; r < PQntuples(res); r++)
		need += strlen(PQgetvalue(res, r, 0)) + 1;
	if (need > *cap) {
		*cap = need;
		if ((*buf = realloc(*buf, *cap)) == NULL)
			die("ids", "out of memory");
	}
	(*buf)[len++] = '{';
	for (int r = 0; r < PQntuples(res); r++) {
		const char *v = PQgetvalue(res, r, 0);

		if (r > 0)
			(*buf)[len++] = ',';
		memcpy(*buf + len, v, strlen(v));
		len += strlen(v);
	}
	(*buf)[len++] = '}';
	(*buf)[len] = '\0';
}

int
main(int argc, char **argv)
{
	const char *mode, *url = "", *schema = "public", *logpath = "/dev/null";
	char claim[1024], done_q[512], owner[64], bs[32];
	bool txlock = false;
	long batch = 100, handled = 0;
	long long start, end;
	char *ids = NULL;
	size_t idcap = 0;
	PGconn *conn;
	FILE *log;
	int i;

	if (argc < 2)
		die("usage", "sqlloop fused|rowlease|txlock --url U --schema S --batch B --log FILE");
	mode = argv[1];
	for (i = 2; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--url") == 0) url = argv[i + 1];
		else if (strcmp(argv[i], "--schema") == 0) schema = argv[i + 1];
		else if (strcmp(argv[i], "--batch") == 0) batch = atol(argv[i + 1]);
		else if (strcmp(argv[i], "--log") == 0) logpath = argv[i + 1];
		else die("usage", argv[i]);
	}
	if ((log = fopen(logpath, "a")) == NULL)
		die(logpath, "cannot open");
	snprintf(owner, sizeof owner, "sqlloop:%ld", (long)getpid());
	snprintf(bs, sizeof bs, "%ld", batch);
	if (strcmp(mode, "fused") == 0) {
		snprintf(claim, sizeof claim,
		    "DELETE FROM %s.q WHERE id IN (SELECT id FROM %s.q ORDER BY id "
		    "FOR UPDATE SKIP LOCKED LIMIT $1::integer) RETURNING id, event_id, handler, key, payload",
		    schema, schema);
	} else if (strcmp(mode, "rowlease") == 0) {
		snprintf(claim, sizeof claim,
		    "UPDATE %s.rl d SET status = 'processing', attempts = d.attempts + 1, "
		    "lease_owner = $2, lease_expires_at = now() + interval '30 seconds', updated_at = now() "
		    "WHERE d.id IN (SELECT id FROM %s.rl WHERE status = 'pending' AND available_at <= now() "
		    "ORDER BY available_at, id FOR UPDATE SKIP LOCKED LIMIT $1::integer) "
		    "RETURNING d.id, d.event_id, d.handler, d.key, d.payload",
		    schema, schema);
		snprintf(done_q, sizeof done_q,
		    "UPDATE %s.rl SET status = 'completed', completed_at = now(), updated_at = now(), "
		    "lease_owner = NULL, lease_expires_at = NULL "
		    "WHERE id = $1::bigint AND lease_owner = $2 AND status = 'processing'", schema);
	} else if (strcmp(mode, "txlock") == 0) {
		txlock = true;
		snprintf(claim, sizeof claim,
		    "WITH c AS (SELECT id, event_id, handler, key FROM %s.deliveries ORDER BY id "
		    "FOR UPDATE SKIP LOCKED LIMIT $1::integer) "
		    "SELECT c.id, c.event_id, c.handler, c.key, e.payload FROM c JOIN %s.events e ON e.id = c.event_id",
		    schema, schema);
		snprintf(done_q, sizeof done_q, "DELETE FROM %s.deliveries WHERE id = ANY ($1::bigint[])", schema);
	} else {
		die("mode", "must be fused, rowlease or txlock");
	}
	conn = PQconnectdb(url);
	if (PQstatus(conn) != CONNECTION_OK)
		die("connect", PQerrorMessage(conn));
	start = now_us();
	for (;;) {
		const char *p[2] = { bs, owner };
		PGresult *res;
		int n;

		if (txlock)
			exec_ok(conn, "BEGIN");
		res = PQexecParams(conn, claim, mode[0] == 'r' ? 2 : 1, NULL, p, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die("claim", PQresultErrorMessage(res));
		n = PQntuples(res);
		if (txlock)
			ids_of(res, &ids, &idcap);
		for (int r = 0; r < n; r++) {
			fprintf(log, "%s\t%s\n", PQgetvalue(res, r, 1), PQgetvalue(res, r, 2));
			if (mode[0] == 'r') {
				const char *pp[2] = { PQgetvalue(res, r, 0), owner };
				PGresult *c = PQexecParams(conn, done_q, 2, NULL, pp, NULL, NULL, 0);

				if (PQresultStatus(c) != PGRES_COMMAND_OK || strcmp(PQcmdTuples(c), "1") != 0)
					die("complete", PQresultErrorMessage(c));
				PQclear(c);
			}
		}
		PQclear(res);
		if (txlock) {
			/* the handler ran (its log written): the rows go, then the commit */
			const char *pp[1] = { ids };
			PGresult *c;

			if (fflush(log) != 0)
				die(logpath, "cannot write");
			c = PQexecParams(conn, done_q, 1, NULL, pp, NULL, NULL, 0);
			if (PQresultStatus(c) != PGRES_COMMAND_OK || atol(PQcmdTuples(c)) != n)
				die("complete", PQresultErrorMessage(c));
			PQclear(c);
			exec_ok(conn, "COMMIT");
		}
		handled += n;
		if (n == 0)
			break;
	}
	free(ids);
	end = now_us();
	PQfinish(conn);
	if (fclose(log) != 0)
		die(logpath, "cannot write");
	printf("{\"handled\":%ld,\"start_us\":%lld,\"end_us\":%lld}\n", handled, start, end);
	return 0;
}
