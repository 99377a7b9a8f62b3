/* SPDX-License-Identifier: MIT */
/*
 * metrics.c: rb-dispatch's own metrics (metrics.h): counters from the
 * engine's stats, gauges from its state, two histograms kept here, and
 * the textfile of --metrics-file with the labels handler and owner.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "rb_log.h"
#include "rb_textfile.h"
#include "rb_util.h"

#include "dispatch.h"
#include "metrics.h"
#include "notify.h"

/* handler durations: 5 ms to 5 min */
static const double duration_le[METRICS_DURATION_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300
};
/* commit to handler: 5 ms to 1 h (retries and delays included) */
static const double latency_le[METRICS_LATENCY_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600
};

static void
observe(long *counts, double *sum, const double *le, int n, double v)
{
	int i = 0;

	while (i < n && v > le[i])
		i++;
	counts[i]++;
	*sum += v;
}

void
metrics_claimed(struct dispatcher *dp)
{
	dp->metrics.last_claim_ms = rb_wall_ms();
}

void
metrics_started(struct dispatcher *dp, const struct rb_dl *d)
{
	int64_t at = rb_parse_iso_ms(d->created_at);
	double v;

	if (at < 0)
		return;
	v = (double)(rb_wall_ms() - at) / 1000.0;
	if (v < 0)
		v = 0;	/* (clocks of two hosts) */
	observe(dp->metrics.latency, &dp->metrics.latency_sum, latency_le, METRICS_LATENCY_BUCKETS, v);
}

void
metrics_finished(struct dispatcher *dp, const struct slot *s, int64_t now)
{
	double v = (double)(now - s->started) / 1000.0;

	if (s->started == 0)
		return;
	observe(dp->metrics.duration, &dp->metrics.duration_sum, duration_le, METRICS_DURATION_BUCKETS,
	    v < 0 ? 0 : v);
}

static void
lane_mark(unsigned char *seen, int *n, const struct rb_dl *d)
{
	int l = d->lease.lane;

	if (l >= 0 && l < 256 && !seen[l]) {
		seen[l] = 1;
		(*n)++;
	}
}

static void
chain_mark(unsigned char *seen, int *n, const struct chain *c)
{
	for (size_t k = c != NULL ? c->at : 0; c != NULL && k < c->n; k++)
		lane_mark(seen, n, c->v[k]);
}

int
metrics_lanes_held(const struct dispatcher *dp)
{
	unsigned char seen[256] = { 0 };
	int n = 0;

	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used) {
			lane_mark(seen, &n, dp->slots[i].d);
			chain_mark(seen, &n, dp->slots[i].followers);
		}
	for (size_t i = 0; i < dp->nqueue; i++) {
		lane_mark(seen, &n, dp->queue[i].d);
		chain_mark(seen, &n, dp->queue[i].followers);
	}
	return n;
}

static int
in_flight(const struct dispatcher *dp)
{
	return dp->running + (int)dp->nqueue + dp->nwait + dp->owed;
}

const char *
metrics_summary(struct dispatcher *dp, double per_sec)
{
	static char buf[256];
	char last[48] = "no claim yet";

	if (dp->metrics.last_claim_ms > 0)
		snprintf(last, sizeof last, "last claim %.1fs ago",
		    (double)(rb_wall_ms() - dp->metrics.last_claim_ms) / 1000.0);
	snprintf(buf, sizeof buf, "%s: claimed %ld, completed %ld, failed %ld (dead %ld), lost %ld, "
	    "in flight %d, lanes %d, %.1f/s, %s%s", dp->opt.handler, dp->stats.claimed, dp->stats.completed,
	    dp->stats.rescheduled + dp->stats.buried, dp->stats.buried, dp->stats.lost, in_flight(dp),
	    metrics_lanes_held(dp), per_sec, last, dp->db_down ? ", database down" : "");
	return buf;
}

/* ---- the textfile -------------------------------------------------------- */

struct out {
	FILE		*f;
	const char	*handler, *owner;
};

static void
labels(struct out *o, const char *extra)
{
	fputs("{handler=\"", o->f);
	rb_prom_label(o->f, o->handler);
	fputs("\",owner=\"", o->f);
	rb_prom_label(o->f, o->owner);
	fprintf(o->f, "\"%s}", extra != NULL ? extra : "");
}

static void
family(struct out *o, const char *name, const char *type, const char *help)
{
	fprintf(o->f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void
one(struct out *o, const char *name, const char *type, const char *help, double v)
{
	family(o, name, type, help);
	fputs(name, o->f);
	labels(o, NULL);
	fprintf(o->f, " %.15g\n", v);
}

static void
histogram(struct out *o, const char *name, const char *help, const long *counts, double sum,
    const double *le, int n)
{
	long cum = 0;
	char extra[64];

	family(o, name, "histogram", help);
	for (int i = 0; i <= n; i++) {
		cum += counts[i];
		if (i < n)
			snprintf(extra, sizeof extra, ",le=\"%g\"", le[i]);
		else
			snprintf(extra, sizeof extra, ",le=\"+Inf\"");
		fprintf(o->f, "%s_bucket", name);
		labels(o, extra);
		fprintf(o->f, " %ld\n", cum);
	}
	fprintf(o->f, "%s_sum", name);
	labels(o, NULL);
	fprintf(o->f, " %.15g\n", sum);
	fprintf(o->f, "%s_count", name);
	labels(o, NULL);
	fprintf(o->f, " %ld\n", cum);
}

static void
write_all(struct dispatcher *dp, FILE *f)
{
	struct out o = { f, dp->opt.handler, dp->owner_base };
	const struct dispatch_metrics *m = &dp->metrics;

	one(&o, "relaybus_dispatch_up", "gauge",
	    "1 while this dispatcher is connected to the bus, 0 while it reconnects.", dp->db_down ? 0 : 1);
	one(&o, "relaybus_dispatch_start_time_seconds", "gauge",
	    "When this dispatcher started (Unix time).", (double)m->started_ms / 1000.0);
	one(&o, "relaybus_dispatch_claimed_total", "counter",
	    "Deliveries this dispatcher claimed.", (double)dp->stats.claimed);
	one(&o, "relaybus_dispatch_completed_total", "counter",
	    "Deliveries this dispatcher completed (by the handler itself included).",
	    (double)dp->stats.completed);
	one(&o, "relaybus_dispatch_failed_total", "counter",
	    "Failed attempts: rescheduled or dead.", (double)(dp->stats.rescheduled + dp->stats.buried));
	one(&o, "relaybus_dispatch_dead_total", "counter",
	    "Deliveries this dispatcher buried (dead letters).", (double)dp->stats.buried);
	one(&o, "relaybus_dispatch_lost_total", "counter",
	    "Results not applied because the lease was taken over (they run again elsewhere).",
	    (double)dp->stats.lost);
	one(&o, "relaybus_dispatch_released_total", "counter",
	    "Deliveries handed back unrun (no attempt charged).", (double)dp->stats.released);
	one(&o, "relaybus_dispatch_in_flight", "gauge",
	    "Deliveries claimed and not yet completed: running, waiting in a key's chain, or queued.",
	    (double)in_flight(dp));
	one(&o, "relaybus_dispatch_lanes_held", "gauge",
	    "Lanes with a delivery of this dispatcher in flight.", (double)metrics_lanes_held(dp));
	one(&o, "relaybus_dispatch_concurrency", "gauge",
	    "At most this many deliveries in flight (--concurrency).", (double)dp->opt.concurrency);
	if (m->last_claim_ms > 0)
		one(&o, "relaybus_dispatch_last_claim_timestamp_seconds", "gauge",
		    "When the store last answered a claim of this dispatcher, whatever it found (Unix time).",
		    (double)m->last_claim_ms / 1000.0);
	histogram(&o, "relaybus_dispatch_handler_duration_seconds",
	    "How long the handler took per attempt, whatever its verdict.", m->duration,
	    m->duration_sum, duration_le, METRICS_DURATION_BUCKETS);
	histogram(&o, "relaybus_dispatch_latency_seconds",
	    "From the event's commit (created_at) to its handler's start, per attempt.", m->latency,
	    m->latency_sum, latency_le, METRICS_LATENCY_BUCKETS);
}

void
metrics_tick(struct dispatcher *dp, double per_sec)
{
	const char *path = dp->opt.metrics_file;
	char *tmp = NULL;
	FILE *f;

	notify_status(metrics_summary(dp, per_sec));
	if (path == NULL)
		return;
	if ((f = rb_textfile_open(path, &tmp)) != NULL) {
		write_all(dp, f);
		if (rb_textfile_commit(f, tmp, path) == 0) {
			if (dp->metrics.write_failed)
				rb_notice("--metrics-file %s: written again", path);
			dp->metrics.write_failed = 0;
			return;
		}
	}
	if (!dp->metrics.write_failed)
		rb_warn("--metrics-file %s: cannot write: %s (trying again every period)", path,
		    strerror(errno));
	dp->metrics.write_failed = 1;
}
