/* SPDX-License-Identifier: MIT */
/*
 * store_pg_cursor.c: the claim cursors of a long-lived claimer
 * (rb_claim_opts.cursors: rb-dispatch, rb-claim --follow).  Under a held
 * snapshot no index entry of a completed delivery can be removed, and a
 * claim that scans from a lane's oldest entry walks all of them; a claim
 * with cursors starts where the claimer's last one found the first pending
 * entry (relaybus_claim_ids, "Claim cursors", in schema_pg.sql).  What is
 * kept here is text: the ticks of the last claims (their clock and xid),
 * the global cursor, the lane cursors past it and the lanes held, as the
 * last claim returned them in its rows without an id, passed back as its
 * parameters.  None of it survives a reconnect (another server, or the
 * same after a failover, has other xids), a change of handler, or the
 * safety net: every RELAYBUS_PG_RESCAN the cursors are dropped and the
 * next claim scans from the start, which finds a delivery written outside
 * the cursors' rule (an INSERT by hand with an old available_at).
 */
#include "config.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rb_exit.h"
#include "rb_util.h"
#include "store_pg_int.h"

/* a claim that reads every lane row (and probes the other holders'
 * liveness) at least this often; the others start from the lanes held */
enum { PASS_MS = 1000 };

/* $RELAYBUS_PG_RESCAN: a duration (unset or empty: 5s; 0: no cursors). */
int
pg_cursors_env(struct pg_cursors *c, struct rb_error *err)
{
	const char *v = getenv("RELAYBUS_PG_RESCAN");

	rb_sb_init(&c->tc);
	rb_sb_init(&c->tx);
	c->rescan_ms = 5000;
	if (v == NULL || *v == '\0')
		return 0;
	if (strcmp(v, "0") == 0) {
		c->rescan_ms = 0;
		return 0;
	}
	if (rb_parse_duration_ms(v, &c->rescan_ms) < 0 || c->rescan_ms <= 0)
		return rb_seterr(err, RB_EXIT_CONFIG,
		    "invalid RELAYBUS_PG_RESCAN '%s': use a duration such as 5s or 500ms, or 0", v);
	return 0;
}

static void
clear(char **p)
{
	free(*p);
	*p = NULL;
}

/* Forget what a pass over the lane rows renews: the lanes held, their
 * rows' versions, the lanes others hold, the lanes of 64 keyed or more. */
static void
forget_lanes(struct pg_cursors *c)
{
	clear(&c->mine);
	clear(&c->mine_t);
	clear(&c->others);
	clear(&c->kf);
}

/* Forget the cursors (all: the ticks and the lanes held too). */
void
pg_cursors_drop(struct pg_cursors *c, bool all)
{
	clear(&c->g);
	clear(&c->cl);
	clear(&c->cu);
	clear(&c->ck);
	if (!all)
		return;
	forget_lanes(c);
	clear(&c->handler);
	for (int i = 0; i < PG_TICKS; i++) {
		clear(&c->tick_c[i]);
		clear(&c->tick_x[i]);
	}
	c->next = 0;
	c->pass_at = 0;
}

/* Free it all (the store closes). */
void
pg_cursors_free(struct pg_cursors *c)
{
	pg_cursors_drop(c, true);
	free(c->tc.s);
	free(c->tx.s);
	c->tc.s = NULL;
	c->tx.s = NULL;
}

/* The claim's ten cursor parameters in c->params: none unless want (a
 * long-lived claimer) and cursors are on. */
void
pg_cursors_params(struct pg_cursors *c, const char *handler, bool want)
{
	int64_t now = rb_mono_ms();
	int k = 0;

	memset(c->params, 0, sizeof c->params);
	if (!want || c->rescan_ms == 0) {
		/* (a claim without cursors may take lanes: the next one with
		 * them reads every lane row first) */
		forget_lanes(c);
		return;
	}
	if (c->handler == NULL || strcmp(c->handler, handler) != 0) {
		/* (the ticks are the server's, not the handler's) */
		pg_cursors_drop(c, false);
		forget_lanes(c);
		free(c->handler);
		c->handler = xstrdup(handler);
		c->dropped_at = now;
		c->pass_at = 0;
	}
	if (now - c->dropped_at >= c->rescan_ms) {
		pg_cursors_drop(c, false);
		c->dropped_at = now;
	}
	c->tc.len = 0;
	c->tx.len = 0;
	rb_sb_puts(&c->tc, "{");
	rb_sb_puts(&c->tx, "{");
	for (int i = 0; i < PG_TICKS; i++) {
		int j = (c->next + i) % PG_TICKS;

		if (c->tick_c[j] == NULL || c->tick_x[j] == NULL)
			continue;
		if (k++ > 0) {
			rb_sb_puts(&c->tc, ",");
			rb_sb_puts(&c->tx, ",");
		}
		rb_sb_puts(&c->tc, "\"");
		rb_sb_puts(&c->tc, c->tick_c[j]);
		rb_sb_puts(&c->tc, "\"");
		rb_sb_puts(&c->tx, c->tick_x[j]);
	}
	rb_sb_puts(&c->tc, "}");
	rb_sb_puts(&c->tx, "}");
	c->params[0] = c->tc.s;
	c->params[1] = c->tx.s;
	c->params[2] = c->cl;
	c->params[3] = c->cu;
	c->params[4] = c->ck;
	c->params[5] = c->g;
	/* (every PASS_MS a claim that reads every lane row, and counts the
	 * keyed entries of every lane it reads again: p_kf NULL) */
	if (c->mine != NULL && now - c->pass_at < PASS_MS) {
		c->params[6] = c->mine;
		c->params[7] = c->others;
		c->params[8] = c->mine_t;
		c->params[9] = c->kf;
	} else {
		c->pass_at = now;
	}
}

/* Is row i of a claim's result one of the cursors' (no id)? */
bool
pg_cursors_row(const PGresult *res, int i)
{
	return PQgetisnull(res, i, 0);
}

static void
keep(char **p, const PGresult *res, int i)
{
	free(*p);
	*p = PQgetisnull(res, i, 1) ? NULL : xstrdup(PQgetvalue(res, i, 1));
}

/* Take what a claim handed back: its rows without an id, the value's name
 * in the third column (handler) and its text in the second (event_id). */
void
pg_cursors_take(struct pg_cursors *c, const PGresult *res)
{
	char *tick_c = NULL, *tick_x = NULL, *free_in = NULL;
	struct {
		const char *name;
		char **at;
	} const slots[] = {
		{ "tick_c", &tick_c }, { "tick_x", &tick_x }, { "g", &c->g }, { "cl", &c->cl },
		{ "cu", &c->cu }, { "ck", &c->ck }, { "mine", &c->mine }, { "others", &c->others },
		{ "mine_t", &c->mine_t }, { "kf", &c->kf }, { "free_in", &free_in },
	};

	for (int i = 0; i < PQntuples(res); i++) {
		const char *k;

		if (!pg_cursors_row(res, i) || PQgetisnull(res, i, 2))
			continue;
		k = PQgetvalue(res, i, 2);
		for (size_t j = 0; j < sizeof slots / sizeof slots[0]; j++)
			if (strcmp(k, slots[j].name) == 0) {
				keep(slots[j].at, res, i);
				break;
			}
	}
	/* (a pass: when a lease of another's that ends within the grace of a
	 * dead holder's ends; the caller may look again then) */
	c->free_in_ms = free_in != NULL ? strtoll(free_in, NULL, 10) : 0;
	if (c->free_in_ms < 0)
		c->free_in_ms = 0;
	free(free_in);
	if (tick_c != NULL && tick_x != NULL) {
		free(c->tick_c[c->next]);
		free(c->tick_x[c->next]);
		c->tick_c[c->next] = tick_c;
		c->tick_x[c->next] = tick_x;
		c->next = (c->next + 1) % PG_TICKS;
	} else {
		free(tick_c);
		free(tick_x);
	}
}
