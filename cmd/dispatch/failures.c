/* SPDX-License-Identifier: MIT */
/*
 * failures.c: a failed attempt is said at the default verbosity, one
 * warning naming the handler (the log prefix), the event, the attempt out
 * of --max-attempts and the first line of the error, with the handler,
 * event_id, attempt, lane and error as fields of their own (json, the
 * journal).  At most FAIL_WARN_MAX of them per FAIL_WARN_WINDOW_MS; the
 * rest are counted and said in one line when the window closes (and at
 * exit): a handler failing for everything must not drown the log, nor go
 * silent.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "rb_log.h"
#include "rb_util.h"

#include "dispatch.h"

#define FAIL_WARN_MAX		10
#define FAIL_WARN_WINDOW_MS	10000

/* The window is over: say how many were not said. */
void
failures_tick(struct dispatcher *dp, int64_t now)
{
	if (dp->warns.since == 0 || now < dp->warns.since + FAIL_WARN_WINDOW_MS)
		return;
	failures_flush(dp);
}

void
failures_flush(struct dispatcher *dp)
{
	if (dp->warns.more > 0) {
		const struct rb_log_field f[] = { { .key = "suppressed", .num = dp->warns.more } };

		rb_log_fields(RB_LOG_WARN, f, 1, "more failed attempts not logged",
		    "... and %ld more failed attempts in the last %d s", dp->warns.more,
		    FAIL_WARN_WINDOW_MS / 1000);
	}
	dp->warns.since = 0;
	dp->warns.shown = 0;
	dp->warns.more = 0;
}

int64_t
failures_due(const struct dispatcher *dp)
{
	return dp->warns.more > 0 ? dp->warns.since + FAIL_WARN_WINDOW_MS : 0;
}

void
failure_warn(struct dispatcher *dp, const char *event_id, int lane, int attempt, const char *error)
{
	int64_t now = rb_mono_ms();
	char first[1024];
	size_t n;

	dp->stats.failed_attempts++;
	failures_tick(dp, now);
	if (dp->warns.since == 0)
		dp->warns.since = now;
	if (dp->warns.shown >= FAIL_WARN_MAX) {
		dp->warns.more++;
		return;
	}
	dp->warns.shown++;
	if (error == NULL || *error == '\0')
		error = "handler failed";
	n = strcspn(error, "\r\n");
	snprintf(first, sizeof first, "%.*s", (int)(n < sizeof first ? n : sizeof first - 1), error);
	{
		const struct rb_log_field f[] = {
			{ .key = "handler", .str = dp->opt.handler },
			{ .key = "event_id", .str = event_id },
			{ .key = "attempt", .num = attempt },
			{ .key = "max_attempts", .num = dp->opt.complete.max_attempts },
			{ .key = "lane", .num = lane },
			{ .key = "error", .str = first },
		};

		rb_log_fields(RB_LOG_WARN, f, sizeof f / sizeof f[0], "attempt failed",
		    "%s: attempt %d/%d failed: %s", event_id, attempt,
		    dp->opt.complete.max_attempts, first);
	}
}
