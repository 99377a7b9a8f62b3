/* SPDX-License-Identifier: MIT */
/*
 * rb_log.h: diagnostics on stderr, "prog: message", or one JSON object per
 * line with --log-format=json / RELAYBUS_LOG_FORMAT=json.
 * Levels: -q errors only; default warnings; -v info; -vv debug.
 */
#ifndef RB_LOG_H
#define RB_LOG_H

#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

enum rb_log_level { RB_LOG_ERROR = 0, RB_LOG_WARN = 1, RB_LOG_INFO = 2, RB_LOG_DEBUG = 3,
	RB_LOG_NOTICE = 100 /* printed at the WARN threshold */ };

/** Set the program name used as prefix and read RELAYBUS_LOG_FORMAT and RELAYBUS_DEBUG. */
void	rb_log_init(const char *prog);
/** The program name given to rb_log_init(). */
const char *rb_log_prog(void);
/** ms since the epoch as "2026-12-05T16:08:43.512Z": UTC, the one format of a
 * time in every program's output (the JSON log's ts, delivery lines, watch). */
void	rb_fmt_iso_ms(int64_t ms, char buf[32]);
/** Set verbosity: 0 = errors only (-q), 1 = warnings (default), 2 = -v, 3 = -vv. */
void	rb_log_set_level(int level);
int	rb_log_level(void);
/** Set an optional prefix (for example the handler name) put before messages. */
void	rb_log_set_prefix(const char *prefix);
/** "text" or "json"; returns -1 for anything else. */
int	rb_log_set_format(const char *format);
/** code: the short machine name of the exit code (json format only). */
void	rb_logv(enum rb_log_level, const char *code, const char *fmt, va_list ap)
	    __attribute__((format(printf, 3, 0)));
void	rb_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void	rb_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void	rb_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** A summary or status line: shown by default, hidden by -q (level "notice" in json). */
void	rb_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** Whether progress lines are shown: stderr a terminal, text format, not -q. */
bool	rb_log_progress_wanted(void);
/** A progress line on a terminal ("prog: text", rewritten in place, no
 * newline); the next log line, or rb_progress_end(), takes its place.
 * Nothing when rb_log_progress_wanted() is false. */
void	rb_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void	rb_progress_end(void);
/** Log an error; returns -1 so that "return rb_error(...)" works. */
int	rb_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** Log an error and exit with code. */
void	rb_die(int code, const char *fmt, ...)
	    __attribute__((format(printf, 2, 3), noreturn));
/** Like rb_die, with ": strerror(errno)" appended. */
void	rb_die_errno(int code, const char *fmt, ...)
	    __attribute__((format(printf, 2, 3), noreturn));
/*
 * A line with structured fields (an event's story: handler, event_id,
 * attempt, lane, error).  text: "prog: prefix: " and the formatted text;
 * json: msg, with each field a member of its own; when stderr is the
 * journal and a sink is set (rb_log_set_journal), the sink gets the
 * formatted text and the fields, so that journalctl can select them
 * (RELAYBUS_EVENT_ID=...).  A field is a string (str) or, str NULL, the
 * number num.
 */
struct rb_log_field {
	const char	*key;
	const char	*str;
	long long	 num;
};
void	rb_log_fields(enum rb_log_level, const struct rb_log_field *f, size_t n, const char *msg,
	    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/** Where rb_log_fields' lines go when stderr is the journal (priority: syslog's, 3..7):
 * 0 when sent, -1 to print them on stderr instead. */
typedef int (*rb_log_journal_fn)(int priority, const char *text, const struct rb_log_field *f,
	    size_t n);
void	rb_log_set_journal(rb_log_journal_fn);
/** Whether stderr is the journal (JOURNAL_STREAM, as systemd sets it). */
bool	rb_log_journal(void);
/** The short name of an exit code ("usage", "dataerr", ...). */
const char *rb_exit_name(int code);

#endif
