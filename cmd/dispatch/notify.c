/* SPDX-License-Identifier: MIT */
/* notify.c: sd_notify(3) for rb-dispatch under systemd (Type=notify, WatchdogSec=). */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <systemd/sd-daemon.h>

#include "rb_log.h"
#include "notify.h"

static int64_t watchdog_ms = -2;	/* -2: not asked yet; 0: none */
static int64_t watchdog_next;

static void
say(const char *state)
{
	int r = sd_notify(0, state);

	if (r < 0)
		rb_debug("sd_notify %s: error %d", state, -r);
}

void
notify_ready(void)
{
	say("READY=1");
}

void
notify_stopping(void)
{
	say("STOPPING=1");
}

void
notify_status(const char *line)
{
	char buf[320];

	snprintf(buf, sizeof buf, "STATUS=%s", line);
	say(buf);
}

int64_t
notify_watchdog(int64_t now)
{
	if (watchdog_ms == -2) {
		uint64_t usec = 0;

		/* 0: keep WATCHDOG_USEC for a child (none of ours is a service) */
		watchdog_ms = sd_watchdog_enabled(0, &usec) > 0 ? (int64_t)(usec / 1000) : 0;
		if (watchdog_ms > 0 && watchdog_ms < 2)
			watchdog_ms = 2;
		watchdog_next = now;
	}
	if (watchdog_ms <= 0)
		return 0;
	if (now >= watchdog_next) {
		say("WATCHDOG=1");
		/* twice per period, as sd_watchdog_enabled(3) advises */
		watchdog_next = now + watchdog_ms / 2;
	}
	return watchdog_next;
}
