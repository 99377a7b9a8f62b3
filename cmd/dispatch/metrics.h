/* SPDX-License-Identifier: MIT */
/*
 * metrics.h: what rb-dispatch says of itself (rb-dispatch(1) METRICS):
 * the node_exporter textfile of --metrics-file, written atomically every
 * --stats-every (15s without it) and once more at exit, and the same
 * summary as the status line and as sd_notify STATUS= for systemctl
 * status.  The engine calls these hooks; they never fail it (a file that
 * cannot be written is one warning, until it can again).
 */
#ifndef RB_DISPATCH_METRICS_H
#define RB_DISPATCH_METRICS_H

#include <stdint.h>

struct dispatcher;
struct slot;
struct rb_dl;

/* the histograms' buckets (seconds) */
#define METRICS_DURATION_BUCKETS	14
#define METRICS_LATENCY_BUCKETS		16

struct dispatch_metrics {
	/* bucket counts (not cumulative), the last one +Inf */
	long	 duration[METRICS_DURATION_BUCKETS + 1];
	double	 duration_sum;
	long	 latency[METRICS_LATENCY_BUCKETS + 1];
	double	 latency_sum;
	int64_t	 last_claim_ms;		/* wall clock: the last claim the store answered (0: none) */
	int64_t	 started_ms;		/* wall clock: when it started */
	int	 write_failed;		/* the last write failed (warned once) */
};

/* a claim the store answered (whatever it found) */
void	metrics_claimed(struct dispatcher *);
/* a delivery's handler starts: the commit-to-handler latency, from its event's created_at */
void	metrics_started(struct dispatcher *, const struct rb_dl *);
/* a slot's handler is done (its verdict whatever it is): the duration since it started */
void	metrics_finished(struct dispatcher *, const struct slot *, int64_t now_mono);
/* every --stats-every and at exit: the file (--metrics-file) and STATUS= */
void	metrics_tick(struct dispatcher *, double per_sec);
/* the one-line summary (static buffer) */
const char *metrics_summary(struct dispatcher *, double per_sec);
/* lanes with a delivery of ours in flight (running, waiting in a chain, or queued) */
int	metrics_lanes_held(const struct dispatcher *);

#endif
