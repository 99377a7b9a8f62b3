/* SPDX-License-Identifier: MIT */
/* rb_log.c: stderr diagnostics for every relaybus program. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <jansson.h>

#include "rb_exit.h"
#include "rb_log.h"

static const char *log_prog = "relaybus";
static const char *log_prefix;
static int log_level = RB_LOG_WARN;
static bool log_json;
static bool log_journal;	/* stderr is the journal: <N> priority prefixes */
static rb_log_journal_fn log_journal_fn;	/* rb_log_fields' lines to the journal */

/*
 * Whether stderr is the stream systemd gave us: JOURNAL_STREAM holds the
 * device and inode of that stream ("DEV:INO"); a child that inherited the
 * variable but not the stream sees different numbers (systemd.exec(5)).
 */
static bool
stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	char end;

	if (js == NULL || sscanf(js, "%llu:%llu%c", &dev, &ino, &end) != 2)
		return false;
	if (fstat(2, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void
rb_log_init(const char *prog)
{
	const char *fmt, *dbg;

	log_prog = prog;
	log_journal = stderr_is_journal();
	fmt = getenv("RELAYBUS_LOG_FORMAT");
	if (fmt != NULL && *fmt != '\0')
		(void)rb_log_set_format(fmt);
	dbg = getenv("RELAYBUS_DEBUG");
	if (dbg != NULL && strcmp(dbg, "1") == 0)
		log_level = RB_LOG_DEBUG;
}

const char *
rb_log_prog(void)
{
	return log_prog;
}

void
rb_log_set_level(int level)
{
	if (level < RB_LOG_ERROR)
		level = RB_LOG_ERROR;
	if (level > RB_LOG_DEBUG)
		level = RB_LOG_DEBUG;
	log_level = level;
}

int
rb_log_level(void)
{
	return log_level;
}

void
rb_log_set_prefix(const char *prefix)
{
	log_prefix = prefix;
}

int
rb_log_set_format(const char *format)
{
	if (strcmp(format, "text") == 0)
		log_json = false;
	else if (strcmp(format, "json") == 0)
		log_json = true;
	else
		return -1;
	return 0;
}

const char *
rb_exit_name(int code)
{
	switch (code) {
	case RB_EXIT_OK: return "ok";
	case RB_EXIT_EMPTY: return "empty";
	case RB_EXIT_USAGE: return "usage";
	case RB_EXIT_DATAERR: return "dataerr";
	case RB_EXIT_NOINPUT: return "noinput";
	case RB_EXIT_UNAVAILABLE: return "unavailable";
	case RB_EXIT_SOFTWARE: return "software";
	case RB_EXIT_OSERR: return "oserr";
	case RB_EXIT_CANTCREAT: return "cantcreat";
	case RB_EXIT_IOERR: return "ioerr";
	case RB_EXIT_TEMPFAIL: return "tempfail";
	case RB_EXIT_NOPERM: return "noperm";
	case RB_EXIT_CONFIG: return "config";
	case RB_EXIT_FAILED: return "failed";
	default: return "error";
	}
}

/* The syslog priority sd-daemon(3) prefixes: <3> err ... <7> debug. */
static const char *
journal_prefix(enum rb_log_level level)
{
	if (!log_journal)
		return "";
	switch (level) {
	case RB_LOG_ERROR: return "<3>";
	case RB_LOG_WARN: return "<4>";
	case RB_LOG_NOTICE: return "<5>";
	case RB_LOG_INFO: return "<6>";
	default: return "<7>";
	}
}

static const char *
level_name(enum rb_log_level level)
{
	switch (level) {
	case RB_LOG_ERROR: return "error";
	case RB_LOG_WARN: return "warning";
	case RB_LOG_INFO: return "info";
	case RB_LOG_NOTICE: return "notice";
	default: return "debug";
	}
}

/* The length of the valid UTF-8 sequence at s (n bytes left) and its code
 * point in *cp, or 0 (the rules jansson checks: no overlong form, no
 * surrogate, nothing above U+10FFFF). */
static size_t
utf8_seq(const unsigned char *s, size_t n, unsigned *cp)
{
	size_t len;
	unsigned v;

	if (s[0] >= 0xC2 && s[0] <= 0xDF)
		len = 2, v = s[0] & 0x1F;
	else if (s[0] >= 0xE0 && s[0] <= 0xEF)
		len = 3, v = s[0] & 0x0F;
	else if (s[0] >= 0xF0 && s[0] <= 0xF4)
		len = 4, v = s[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3F);
	}
	if ((len == 3 && v < 0x800) || (len == 4 && v < 0x10000) || v > 0x10FFFF ||
	    (v >= 0xD800 && v <= 0xDFFF))
		return 0;
	*cp = v;
	return len;
}

/*
 * A message fit for a terminal and a log file: messages quote event ids,
 * handler names and handlers' error texts, which publishers and handlers
 * choose.  Control characters become \n, \r, \t or \xHH (no forged lines,
 * no escape sequences), bytes that are not UTF-8 \xHH (the json format
 * stays valid), and the C1 controls and the line, paragraph and
 * bidirectional marks \uHHHH.  Cut to size.
 */
static void
log_escape(const char *in, char *out, size_t size)
{
	const unsigned char *p = (const unsigned char *)in;
	size_t o = 0, n = strlen(in);

	while (*p != '\0' && o + 11 < size) {
		unsigned cp = 0;
		size_t len = *p >= 0x80 ? utf8_seq(p, n - (size_t)(p - (const unsigned char *)in), &cp) : 1;

		if (*p == '\n' || *p == '\r' || *p == '\t')
			o += (size_t)snprintf(out + o, size - o, "\\%c", *p == '\n' ? 'n' : *p == '\r' ? 'r' : 't');
		else if (*p < 0x20 || *p == 0x7F || len == 0)
			o += (size_t)snprintf(out + o, size - o, "\\x%02x", *p);
		else if (len > 1 && ((cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
		    cp == 0x200E || cp == 0x200F || (cp >= 0x202A && cp <= 0x202E) ||
		    (cp >= 0x2066 && cp <= 0x2069)))
			o += (size_t)snprintf(out + o, size - o, "\\u%04x", cp);
		else {
			memcpy(out + o, p, len);
			o += len;
		}
		p += len == 0 ? 1 : len;
	}
	out[o] = '\0';
}

static bool
log_shown(enum rb_log_level level)
{
	return (level == RB_LOG_NOTICE ? RB_LOG_WARN : (int)level) <= log_level;
}

void
rb_fmt_iso_ms(int64_t ms, char buf[32])
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, 24, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + strlen(buf), 8, ".%03dZ", (int)(ms % 1000) % 1000);
}

static bool progress_shown;	/* a progress line is on the terminal, no newline */

bool
rb_log_progress_wanted(void)
{
	return !log_json && !log_journal && log_shown(RB_LOG_NOTICE) && isatty(STDERR_FILENO);
}

void
rb_progress(const char *fmt, ...)
{
	char raw[1024], msg[1024];
	va_list ap;

	if (!rb_log_progress_wanted())
		return;
	va_start(ap, fmt);
	vsnprintf(raw, sizeof raw, fmt, ap);
	va_end(ap);
	log_escape(raw, msg, sizeof msg);
	fprintf(stderr, "\r\033[K%s: %s", log_prog, msg);
	fflush(stderr);
	progress_shown = true;
}

void
rb_progress_end(void)
{
	if (progress_shown) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
		progress_shown = false;
	}
}

/* One line on stderr: text, or (json) msg and the fields. */
static void
log_emit(enum rb_log_level level, const char *code, const char *raw_text, const char *raw_msg,
    const struct rb_log_field *f, size_t n)
{
	char msg[8192];

	if (log_json) {
		char ts[32];
		struct timespec now;
		json_t *o;

		log_escape(raw_msg, msg, sizeof msg);
		clock_gettime(CLOCK_REALTIME, &now);
		rb_fmt_iso_ms((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000, ts);
		o = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "prog", log_prog,
		    "level", level_name(level), "msg", msg);
		if (o != NULL && code != NULL)
			json_object_set_new(o, "code", json_string(code));
		if (o != NULL && log_prefix != NULL)
			json_object_set_new(o, "handler", json_string(log_prefix));
		for (size_t i = 0; o != NULL && i < n; i++) {
			char v[4096];

			if (f[i].str == NULL) {
				json_object_set_new(o, f[i].key, json_integer(f[i].num));
				continue;
			}
			log_escape(f[i].str, v, sizeof v);
			json_object_set_new(o, f[i].key, json_string(v));
		}
		if (o != NULL) {
			fputs(journal_prefix(level), stderr);
			json_dumpf(o, stderr, JSON_COMPACT | JSON_SORT_KEYS);
			fputc('\n', stderr);
			json_decref(o);
		}
	} else {
		log_escape(raw_text, msg, sizeof msg);
		if (progress_shown) {	/* the line goes where the progress was */
			fputs("\r\033[K", stderr);
			progress_shown = false;
		}
		if (log_prefix != NULL)
			fprintf(stderr, "%s%s: %s: %s\n", journal_prefix(level), log_prog, log_prefix, msg);
		else
			fprintf(stderr, "%s%s: %s\n", journal_prefix(level), log_prog, msg);
	}
	fflush(stderr);
}

void
rb_logv(enum rb_log_level level, const char *code, const char *fmt, va_list ap)
{
	char raw[2048];

	if (!log_shown(level))
		return;
	vsnprintf(raw, sizeof raw, fmt, ap);
	log_emit(level, code, raw, raw, NULL, 0);
}

void
rb_log_fields(enum rb_log_level level, const struct rb_log_field *f, size_t n, const char *msg,
    const char *fmt, ...)
{
	char raw[2048];
	va_list ap;

	if (!log_shown(level))
		return;
	va_start(ap, fmt);
	vsnprintf(raw, sizeof raw, fmt, ap);
	va_end(ap);
	if (log_journal && log_journal_fn != NULL) {
		char text[8192];
		int prio = level == RB_LOG_ERROR ? 3 : level == RB_LOG_WARN ? 4 :
		    level == RB_LOG_NOTICE ? 5 : level == RB_LOG_INFO ? 6 : 7;

		log_escape(raw, text, sizeof text);
		if (log_journal_fn(prio, text, f, n) == 0)
			return;
	}
	log_emit(level, NULL, raw, msg, f, n);
}

void
rb_log_set_journal(rb_log_journal_fn fn)
{
	log_journal_fn = fn;
}

bool
rb_log_journal(void)
{
	return log_journal;
}

#define RB_LOG_FN(fn, level)						\
void									\
fn(const char *fmt, ...)						\
{									\
	va_list ap;							\
	va_start(ap, fmt);						\
	rb_logv(level, NULL, fmt, ap);					\
	va_end(ap);							\
}
RB_LOG_FN(rb_debug, RB_LOG_DEBUG)
RB_LOG_FN(rb_info, RB_LOG_INFO)
RB_LOG_FN(rb_warn, RB_LOG_WARN)
RB_LOG_FN(rb_notice, RB_LOG_NOTICE)

int
rb_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rb_logv(RB_LOG_ERROR, NULL, fmt, ap);
	va_end(ap);
	return -1;
}

void
rb_die(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	rb_logv(RB_LOG_ERROR, rb_exit_name(code), fmt, ap);
	va_end(ap);
	exit(code);
}

void
rb_die_errno(int code, const char *fmt, ...)
{
	char buf[1024];
	int saved = errno;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	rb_die(code, "%s: %s", buf, strerror(saved));
}
