/* SPDX-License-Identifier: MIT */
/*
 * top_frame.c: the lines of one frame of rb-admin top (top_int.h).  The
 * rates come from the difference with the frame before: completions per
 * second from a handler's completed_total (with rb-setup
 * --completion-history), else only for the whole bus, from the deliveries
 * table's deletions.  A holder's last renewal is when this view saw its
 * lease move on.  No line is wider than TOP_WIDTH.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "rb_util.h"
#include "top_int.h"

#define MAXH	64		/* handlers remembered between frames */
#define MAXO	64		/* holders remembered between frames */

/* ---- what the frames remember -------------------------------------------- */

struct hmem {
	char	 name[64];
	long	 completed;	/* completed_total; -1: none */
};
struct omem {
	char	 key[200];	/* handler NUL owner */
	int64_t	 expires_ms, renewed_ms;	/* renewed_ms: wall clock, 0: not seen yet */
};

static struct {
	struct hmem	 h[MAXH];
	int		 nh;
	struct omem	 o[MAXO];
	int		 no;
	long		 deleted;	/* the table's deletions; -1: none */
	int64_t		 at;		/* rb_mono_ms of the frame before; 0: none */
} prev = { .deleted = -1 }, cur;

static long
jlong(const json_t *o, const char *k)
{
	const json_t *v = json_object_get(o, k);

	return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static const char *
jstr(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s != NULL ? s : "";
}

static long
prev_completed(const char *name)
{
	for (int i = 0; i < prev.nh; i++)
		if (strcmp(prev.h[i].name, name) == 0)
			return prev.h[i].completed;
	return -1;
}

static const struct omem *
prev_owner(const char *key, size_t klen)
{
	for (int i = 0; i < prev.no; i++)
		if (memcmp(prev.o[i].key, key, klen) == 0)
			return &prev.o[i];
	return NULL;
}

/* a duration in a few columns: 950ms, 12.3s, 4m05s, 3h02m, 12d */
static void
age(char *b, size_t n, long ms)
{
	if (ms < 0)
		snprintf(b, n, "-");
	else if (ms < 1000)
		snprintf(b, n, "%ldms", ms);
	else if (ms < 60000)
		snprintf(b, n, "%.1fs", (double)ms / 1000.0);
	else if (ms < 3600000)
		snprintf(b, n, "%ldm%02lds", ms / 60000, ms / 1000 % 60);
	else if (ms < 86400000)
		snprintf(b, n, "%ldh%02ldm", ms / 3600000, ms / 60000 % 60);
	else
		snprintf(b, n, "%ldd", ms / 86400000);
}

/* ---- one frame ----------------------------------------------------------- */

static void
put(struct frame *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
put(struct frame *f, const char *fmt, ...)
{
	va_list ap;
	char buf[512];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	buf[TOP_WIDTH] = '\0';	/* (never wider than 80 columns: the fields are cut to fit) */
	if (f->n == f->cap) {
		f->cap = f->cap == 0 ? 32 : f->cap * 2;
		f->line = xrealloc(f->line, (size_t)f->cap * sizeof *f->line);
	}
	f->line[f->n++] = xstrdup(buf);
}

/* (name cut to w columns, with '~' when cut) */
static const char *
cut(const char *s, int w, char *b)
{
	if ((int)strlen(s) <= w)
		return s;
	memcpy(b, s, (size_t)w - 1);
	b[w - 1] = '~';
	b[w] = '\0';
	return b;
}

static void
handlers_part(struct frame *f, const json_t *st, const char *pick, double secs)
{
	const json_t *h, *total = json_object_get(st, "total");
	bool history = json_is_true(json_object_get(st, "history"));
	size_t i;
	char b1[32], b2[32], nb[32];

	put(f, "%-20s %9s %9s %9s %7s %8s %8s", "HANDLER", "PENDING", "DUE", "IN FLIGHT", "DEAD",
	    "DONE/S", "OLDEST");
	cur.nh = 0;
	json_array_foreach(json_object_get(st, "handlers"), i, h) {
		const char *name = jstr(h, "handler");
		long done = jlong(h, "completed_total"), was = prev_completed(name);

		if (cur.nh < MAXH) {
			snprintf(cur.h[cur.nh].name, sizeof cur.h[cur.nh].name, "%s", name);
			cur.h[cur.nh++].completed = done;
		}
		if (pick != NULL && strcmp(pick, name) != 0)
			continue;
		if (done >= 0 && was >= 0 && secs > 0)
			snprintf(b1, sizeof b1, "%.1f", (double)(done - was) / secs);
		else
			snprintf(b1, sizeof b1, "-");
		age(b2, sizeof b2, jlong(h, "oldest_due_age_ms"));
		put(f, "%-20s %9ld %9ld %9ld %7ld %8s %8s", cut(name, 20, nb), jlong(h, "pending"),
		    jlong(h, "due"), jlong(h, "processing"), jlong(h, "dead"), b1, b2);
	}
	{
		const json_t *tab = json_object_get(st, "deliveries_table");
		long del = jlong(tab, "deleted");

		if (del >= 0 && prev.deleted >= 0 && secs > 0 && del >= prev.deleted)
			snprintf(b1, sizeof b1, "%.1f", (double)(del - prev.deleted) / secs);
		else
			snprintf(b1, sizeof b1, "-");
		cur.deleted = del;
	}
	age(b2, sizeof b2, jlong(total, "oldest_due_age_ms"));
	put(f, "%-20s %9ld %9ld %9ld %7ld %8s %8s", "TOTAL", jlong(total, "pending"), jlong(total, "due"),
	    jlong(total, "processing"), jlong(total, "dead"), b1, b2);
	put(f, "events without deliveries: %ld   %s", jlong(st, "events_without_deliveries"),
	    history ? "DONE/S: completions" : "DONE/S: TOTAL's are deletions (no history)");
}

/* the holders: lanes grouped by handler and owner */
static void
holders_part(struct frame *f, const json_t *lanes, const char *pick, int room)
{
	const json_t *l;
	size_t i;
	int64_t now = rb_wall_ms();
	int shown = 0, nrow = 0;
	struct row {
		char	 key[200];
		size_t	 klen;
		int	 lanes;
		long	 in_flight;
		int64_t	 expires;
	} *rows = xcalloc(json_array_size(lanes) + 1, sizeof *rows);

	json_array_foreach(lanes, i, l) {
		const char *hn = jstr(l, "handler"), *ow = jstr(l, "owner");
		char key[200];
		size_t klen;
		int k;

		if (*ow == '\0' || json_is_true(json_object_get(l, "expired")))
			continue;
		if (pick != NULL && strcmp(pick, hn) != 0)
			continue;
		klen = (size_t)snprintf(key, sizeof key, "%s%c%s", hn, '\0', ow) + 1;
		if (klen > sizeof key)
			klen = sizeof key;
		for (k = 0; k < nrow; k++)
			if (rows[k].klen == klen && memcmp(rows[k].key, key, klen) == 0)
				break;
		if (k == nrow) {
			memcpy(rows[k].key, key, klen);
			rows[k].klen = klen;
			nrow++;
		}
		rows[k].lanes++;
		rows[k].in_flight += jlong(l, "in_flight") > 0 ? jlong(l, "in_flight") : 0;
		if (rb_parse_iso_ms(jstr(l, "lease_expires_at")) > rows[k].expires)
			rows[k].expires = rb_parse_iso_ms(jstr(l, "lease_expires_at"));
	}
	put(f, "%s", "");
	put(f, "%-26s %-16s %6s %9s %10s %8s", "HOLDER (OWNER)", "HANDLER", "LANES", "IN FLIGHT",
	    "LEASE LEFT", "RENEWED");
	cur.no = 0;
	for (int k = 0; k < nrow; k++) {
		const struct omem *was = prev_owner(rows[k].key, rows[k].klen);
		int64_t renewed = 0;
		char b1[32], b2[32], nb1[32], nb2[32];

		/* renewed: seen moving on now, or remembered from before */
		if (was != NULL && rows[k].expires > was->expires_ms)
			renewed = now;
		else if (was != NULL)
			renewed = was->renewed_ms;
		if (cur.no < MAXO) {
			memcpy(cur.o[cur.no].key, rows[k].key, rows[k].klen);
			cur.o[cur.no].expires_ms = rows[k].expires;
			cur.o[cur.no++].renewed_ms = renewed;
		}
		if (shown >= room) {
			continue;
		}
		age(b1, sizeof b1, rows[k].expires > now ? (long)(rows[k].expires - now) : 0);
		if (renewed > 0)
			age(b2, sizeof b2, (long)(now - renewed));
		else
			snprintf(b2, sizeof b2, "-");
		put(f, "%-26s %-16s %6d %9ld %10s %8s", cut(rows[k].key + strlen(rows[k].key) + 1, 26, nb1),
		    cut(rows[k].key, 16, nb2), rows[k].lanes, rows[k].in_flight, b1, b2);
		shown++;
	}
	if (nrow == 0)
		put(f, "(no lane is held)");
	else if (nrow > shown)
		put(f, "(%d more holders)", nrow - shown);
	free(rows);
}

void
frame_free(struct frame *f)
{
	for (int i = 0; i < f->n; i++)
		free(f->line[i]);
	free(f->line);
	memset(f, 0, sizeof *f);
}

/* the handlers the stats name, for h */
const char *
next_handler(const json_t *st, const char *pick, char *buf, size_t n)
{
	const json_t *hs = json_object_get(st, "handlers"), *h;
	size_t i;
	bool take = pick == NULL;

	json_array_foreach(hs, i, h) {
		if (take) {
			snprintf(buf, n, "%s", jstr(h, "handler"));
			return buf;
		}
		if (strcmp(jstr(h, "handler"), pick) == 0)
			take = true;
	}
	return NULL;		/* after the last: all of them again */
}

void
frame_build(struct frame *f, const json_t *st, const json_t *lanes, const char *schema,
    const char *pick, double interval_s, int rows)
{
	int64_t now = rb_mono_ms();
	double secs = prev.at > 0 ? (double)(now - prev.at) / 1000.0 : 0;
	time_t t = time(NULL);
	struct tm tm;
	char ts[32];

	gmtime_r(&t, &tm);
	strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%SZ", &tm);
	put(f, "relaybus top  schema %.20s  %s  %s%s", schema, ts,
	    pick != NULL ? "handler " : "all handlers", pick != NULL ? pick : "");
	if (interval_s > 0)
		put(f, "q quit  h next handler  every %.1fs", interval_s);
	put(f, "%s", "");
	handlers_part(f, st, pick, secs);
	holders_part(f, lanes, pick, rows > 0 ? rows - f->n - 3 : 1000);
	memcpy(&prev, &cur, sizeof prev);
	prev.at = now;
}
