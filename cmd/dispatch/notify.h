/* SPDX-License-Identifier: MIT */
/*
 * notify.h: rb-dispatch's messages to its service manager (sd_notify(3)):
 * READY=1 once connected and listening, STOPPING=1 when the graceful stop
 * begins, WATCHDOG=1 from the loop when the manager set WATCHDOG_USEC;
 * and the journal as the sink of structured log lines (rb_log_fields).
 * Without libsystemd (configure --without-systemd) they are no-ops.
 */
#ifndef RB_DISPATCH_NOTIFY_H
#define RB_DISPATCH_NOTIFY_H

#include <stdint.h>

#ifdef HAVE_SYSTEMD
void	notify_ready(void);
void	notify_stopping(void);
/* STATUS=line: what systemctl status shows */
void	notify_status(const char *line);
/* WATCHDOG=1 when due; returns the next time (rb_mono_ms) it is due, or 0 (none) */
int64_t	notify_watchdog(int64_t now);
/* when stderr is the journal: rb_log_fields' lines go to it with their fields */
void	notify_journal(void);
#else
static inline void notify_ready(void) {}
static inline void notify_stopping(void) {}
static inline void notify_status(const char *line) { (void)line; }
static inline int64_t notify_watchdog(int64_t now) { (void)now; return 0; }
static inline void notify_journal(void) {}
#endif

#endif
