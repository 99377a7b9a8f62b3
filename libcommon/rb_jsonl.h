/* SPDX-License-Identifier: MIT */
/*
 * rb_jsonl.h: JSON lines in and out.
 *
 * The reader works on a file descriptor with its own buffer so that a
 * program can wait for input with a timeout (rb-complete groups results
 * that arrive within a window).  It numbers lines from 1, skips blank
 * lines, strips a final CR (CRLF input), accepts a last line without a
 * newline, and reports a line longer than max_line once, without keeping
 * it in memory: its bytes are skipped up to the next newline.
 *
 * Ownership: a returned line points into the reader's buffer and is valid
 * until the next call; json_t out-parameters receive a new reference.
 */
#ifndef RB_JSONL_H
#define RB_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#define RB_JSONL_DEFAULT_MAX (1024 * 1024)
/* The longest result line (rb-complete, a --pipe handler's answers): a
 * result may echo its delivery line, whose payload and headers the store
 * takes up to 1 MiB as stored (relaybus_check_event), which JSON text can
 * make about twice as long */
#define RB_JSONL_RESULT_MAX (8 * 1024 * 1024)

enum rb_jsonl_status {
	RB_JSONL_LINE = 1,	/* a line is returned */
	RB_JSONL_EOF = 0,	/* end of input */
	RB_JSONL_ERR = -1,	/* read error, errno set */
	RB_JSONL_TOOLONG = -2,	/* the line (number in lineno) exceeded max_line; it was skipped */
	RB_JSONL_AGAIN = -3,	/* timeout with no complete line */
};

struct rb_jsonl_reader;

/** A reader on fd (not closed by free).  max_line 0 means RB_JSONL_DEFAULT_MAX. */
struct rb_jsonl_reader *rb_jsonl_reader_new(int fd, size_t max_line);
void	rb_jsonl_reader_free(struct rb_jsonl_reader *);
/**
 * Next non-blank line.  timeout_ms < 0 blocks; 0 only returns what is
 * already buffered or readable now; otherwise waits at most that long.
 */
int	rb_jsonl_next(struct rb_jsonl_reader *, int timeout_ms, const char **line, size_t *len);
/** Number of the line last returned (or skipped as too long). */
long	rb_jsonl_lineno(const struct rb_jsonl_reader *);
/** True when a complete line is already buffered (next will not block). */
bool	rb_jsonl_buffered(const struct rb_jsonl_reader *);

/**
 * Parse one line as a JSON object (duplicate keys rejected).  On failure
 * returns -1 and writes a short reason to err ("invalid JSON: ...",
 * "not a JSON object").
 */
int	rb_jsonl_parse(const char *line, size_t len, json_t **obj, char *err, size_t errlen);
/**
 * Write s as a JSON string, quoted and escaped the way rb_jsonl_write
 * does (", \\ and control characters; UTF-8 passes through).  Returns 0 or -1.
 */
int	rb_jsonl_put_string(FILE *, const char *s);
/** Write obj compactly followed by '\n'.  Returns 0 or -1 (errno set). */
int	rb_jsonl_write(FILE *, const json_t *obj);

struct rb_sbuf;
/**
 * Append v to b as json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) prints
 * it, byte for byte, without building a string per value (rb-dispatch
 * writes every delivery line this way).
 */
void	rb_json_sb_dump(struct rb_sbuf *b, const json_t *v);
/** Append the n bytes of s as a JSON string, escaped as jansson escapes it. */
void	rb_json_sb_string(struct rb_sbuf *b, const char *s, size_t n);
/** Append valid JSON text without the whitespace outside its strings
 * (PostgreSQL prints jsonb as {"a": 1, "b": [1, 2]}). */
void	rb_json_sb_compact(struct rb_sbuf *b, const char *json, size_t n);

/** A top-level member of an object found by rb_json_scan. */
struct rb_json_member {
	const char	*key, *val;	/* the key's text between its quotes; the value's text */
	size_t		 klen, vlen;
	char		 type;		/* '"' string, 'n' number, 't', 'f', '0' (null), '{', '[' */
	bool		 escaped;	/* the key or the string value holds a backslash escape */
};

/**
 * A quick look at a line that should be one JSON object: returns the
 * number of its top-level members (the first max of them in m) when the
 * line is certainly valid JSON that rb_jsonl_parse takes the same way, or
 * -1 when in doubt (invalid, a duplicate top-level key, a number jansson
 * might refuse as too big, nesting over 64 levels): then use
 * rb_jsonl_parse, which gives the verdict and the reason.  Nothing is
 * allocated.
 */
int	rb_json_scan(const char *s, size_t len, struct rb_json_member *m, int max);
/**
 * The members named in want (a NULL-ended list) of a line that should be
 * one JSON object, as a new object in *obj (with them, perhaps others): how
 * a reader takes a line of which it needs a few members, such as a result
 * line that echoes a delivery's payload.  The rest of the line is only
 * checked to be valid JSON, so a number jansson cannot hold (an integer
 * beyond 64 bits, 1e400) is no error there.  -1 with a reason in err as
 * rb_jsonl_parse.
 */
int	rb_json_members(const char *line, size_t len, const char *const *want, json_t **obj, char *err,
	    size_t errlen);

#endif
