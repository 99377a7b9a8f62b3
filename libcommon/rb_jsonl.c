/* SPDX-License-Identifier: MIT */
/* rb_jsonl.c: a line reader with a length limit and timeouts, and a writer. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_jsonl.h"
#include "rb_util.h"

struct rb_jsonl_reader {
	int	fd;
	size_t	max_line;
	char	*buf;
	size_t	cap;		/* allocated */
	size_t	start;		/* first unconsumed byte */
	size_t	end;		/* one past the last buffered byte */
	size_t	scan;		/* bytes from start already known to hold no '\n' */
	long	lineno;
	bool	eof;
	bool	skipping;	/* discarding an overlong line up to its newline */
};

struct rb_jsonl_reader *
rb_jsonl_reader_new(int fd, size_t max_line)
{
	struct rb_jsonl_reader *r = xcalloc(1, sizeof *r);

	r->fd = fd;
	r->max_line = max_line == 0 ? RB_JSONL_DEFAULT_MAX : max_line;
	r->cap = 65536;
	r->buf = xmalloc(r->cap);
	return r;
}

void
rb_jsonl_reader_free(struct rb_jsonl_reader *r)
{
	if (r == NULL)
		return;
	free(r->buf);
	free(r);
}

long
rb_jsonl_lineno(const struct rb_jsonl_reader *r)
{
	return r->lineno;
}

bool
rb_jsonl_buffered(const struct rb_jsonl_reader *r)
{
	return memchr(r->buf + r->start, '\n', r->end - r->start) != NULL;
}

/* Read more bytes; 1 read, 0 eof, -1 error, -3 timeout. */
static int
fill(struct rb_jsonl_reader *r, int timeout_ms)
{
	ssize_t n;

	if (r->start > 0 && (r->start == r->end || r->end == r->cap)) {
		memmove(r->buf, r->buf + r->start, r->end - r->start);
		r->end -= r->start;
		r->start = 0;
	}
	if (r->end == r->cap) {
		r->cap *= 2;
		r->buf = xrealloc(r->buf, r->cap);
	}
	if (timeout_ms >= 0) {
		struct pollfd pfd = { .fd = r->fd, .events = POLLIN };
		int pr;

		do
			pr = poll(&pfd, 1, timeout_ms);
		while (pr < 0 && errno == EINTR);
		if (pr < 0)
			return -1;
		if (pr == 0)
			return RB_JSONL_AGAIN;
	}
	do
		n = read(r->fd, r->buf + r->end, r->cap - r->end);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	if (n == 0) {
		r->eof = true;
		return 0;
	}
	r->end += (size_t)n;
	return 1;
}

int
rb_jsonl_next(struct rb_jsonl_reader *r, int timeout_ms, const char **line, size_t *len)
{
	for (;;) {
		char *nl = NULL;
		size_t avail = r->end - r->start;

		if (r->scan < avail)
			nl = memchr(r->buf + r->start + r->scan, '\n', avail - r->scan);
		if (nl == NULL)
			r->scan = avail;
		if (r->skipping) {
			if (nl != NULL) {
				r->start = (size_t)(nl - r->buf) + 1;
				r->scan = 0;
				r->skipping = false;
				continue;
			}
			r->start = r->end;	/* drop what we have */
			r->scan = 0;
		} else if (nl != NULL || (r->eof && avail > 0)) {
			char *s = r->buf + r->start;
			size_t n = nl != NULL ? (size_t)(nl - s) : avail;

			r->start += n + (nl != NULL ? 1 : 0);
			r->scan = 0;
			r->lineno++;
			if (n > 0 && s[n - 1] == '\r')
				n--;
			if (n > r->max_line)
				return RB_JSONL_TOOLONG;
			s[n] = '\0';	/* overwrites '\n' or '\r'; at eof there is room: cap > end or we grow */
			if (strspn(s, " \t") == n)
				continue;	/* blank line */
			*line = s;
			*len = n;
			return RB_JSONL_LINE;
		} else if (avail > r->max_line + 1) {
			/* an overlong line: report it now, skip the rest as it comes */
			r->lineno++;
			r->skipping = true;
			r->start = r->end;
			r->scan = 0;
			return RB_JSONL_TOOLONG;
		}
		if (r->eof)
			return RB_JSONL_EOF;
		if (r->end == r->cap && r->start == 0 && r->cap <= r->max_line + 2) {
			/* grow is handled by fill */
		}
		int f = fill(r, timeout_ms);
		if (f == RB_JSONL_AGAIN)
			return RB_JSONL_AGAIN;
		if (f < 0)
			return RB_JSONL_ERR;
		if (f == 0 && r->end == r->cap) {
			/* need one byte for the terminator of a last line without newline */
			r->cap += 1;
			r->buf = xrealloc(r->buf, r->cap);
		}
	}
}

int
rb_jsonl_parse(const char *line, size_t len, json_t **obj, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *v;

	*obj = NULL;
	v = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (v == NULL) {
		snprintf(err, errlen, "invalid JSON: %s", jerr.text);
		return -1;
	}
	if (!json_is_object(v)) {
		json_decref(v);
		snprintf(err, errlen, "not a JSON object");
		return -1;
	}
	*obj = v;
	return 0;
}

int
rb_jsonl_write(FILE *f, const json_t *obj)
{
	if (json_dumpf(obj, f, JSON_COMPACT) < 0)
		return -1;
	if (putc('\n', f) == EOF)
		return -1;
	return 0;
}

int
rb_jsonl_put_string(FILE *f, const char *s)
{
	const char *run = s;

	if (putc('"', f) == EOF)
		return -1;
	for (;; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		/* flush the plain run before s */
		if (s > run && fwrite(run, 1, (size_t)(s - run), f) != (size_t)(s - run))
			return -1;
		run = s + 1;
		if (c == '\0')
			break;
		switch (c) {
		case '"': strcpy(esc, "\\\""); break;
		case '\\': strcpy(esc, "\\\\"); break;
		case '\b': strcpy(esc, "\\b"); break;
		case '\f': strcpy(esc, "\\f"); break;
		case '\n': strcpy(esc, "\\n"); break;
		case '\r': strcpy(esc, "\\r"); break;
		case '\t': strcpy(esc, "\\t"); break;
		default: snprintf(esc, sizeof esc, "\\u%04X", c); break;
		}
		if (fputs(esc, f) == EOF)
			return -1;
	}
	return putc('"', f) == EOF ? -1 : 0;
}
