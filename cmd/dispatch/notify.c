/* SPDX-License-Identifier: MIT */
/* notify.c: sd_notify(3) for rb-dispatch under systemd (Type=notify,
 * WatchdogSec=), and its structured log lines to the journal. */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>

#include "rb_log.h"
#include "rb_util.h"
#include "notify.h"

/* "KEY=value" (a string, or str NULL the number num); a newline in the
 * value is fine: sd_journal_sendv takes the whole iovec. */
static char *
rb_journal_field(const char *key, const char *str, long long num)
{
	return str != NULL ? xasprintf("%s=%s", key, str) : xasprintf("%s=%lld", key, num);
}

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

/*
 * A line with fields (rb_log_fields) as a journal entry of its own:
 * MESSAGE= the text, each field as RELAYBUS_KEY=value, so that
 * journalctl RELAYBUS_EVENT_ID=o-42 finds a delivery's story.
 */
static int
journal_send(int priority, const char *text, const struct rb_log_field *f, size_t n)
{
	struct iovec iov[3 + 16];
	char *mem[3 + 16];
	size_t k = 0;
	int r;

	mem[k++] = rb_journal_field("MESSAGE", text, 0);
	mem[k++] = rb_journal_field("PRIORITY", NULL, priority);
	mem[k++] = rb_journal_field("SYSLOG_IDENTIFIER", rb_log_prog(), 0);
	for (size_t i = 0; i < n && k < sizeof mem / sizeof mem[0]; i++) {
		char key[64];
		size_t j = 0;

		j = (size_t)snprintf(key, sizeof key, "RELAYBUS_");
		for (const char *c = f[i].key; *c != '\0' && j + 1 < sizeof key; c++)
			key[j++] = isalnum((unsigned char)*c) ? (char)toupper((unsigned char)*c) : '_';
		key[j] = '\0';
		mem[k++] = rb_journal_field(key, f[i].str, f[i].num);
	}
	for (size_t i = 0; i < k; i++) {
		iov[i].iov_base = mem[i];
		iov[i].iov_len = strlen(mem[i]);
	}
	r = sd_journal_sendv(iov, (int)k);
	for (size_t i = 0; i < k; i++)
		free(mem[i]);
	return r < 0 ? -1 : 0;
}

void
notify_journal(void)
{
	if (rb_log_journal())
		rb_log_set_journal(journal_send);
}
