/* SPDX-License-Identifier: MIT */
/*
 * rb_util.h: small pure helpers shared by every program and the store
 * library: allocation that dies on failure, number and duration parsing,
 * URL redaction, the lane hash and the lease token.  Returned char * are
 * the caller's to free.
 *
 * The rule (as tmux's xmalloc): running out of memory is not an error to
 * return but the end of the process, in a program and in the library
 * alike: x* print one line and exit RB_EXIT_OSERR.  Everything else the
 * library reports as an error (struct rb_error) and never exits on.
 */
#ifndef RB_UTIL_H
#define RB_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RB_LANES 256

void	*xmalloc(size_t);
void	*xcalloc(size_t, size_t);
void	*xrealloc(void *, size_t);
char	*xstrdup(const char *);
char	*xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** A growable string; rb_sb_init (or any put) leaves it NUL-terminated.  Free s. */
struct rb_sbuf {
	char	*s;
	size_t	 len, cap;
};
void	rb_sb_init(struct rb_sbuf *);
void	rb_sb_putn(struct rb_sbuf *, const char *, size_t);
void	rb_sb_puts(struct rb_sbuf *, const char *);

/**
 * Parse a duration (the grammar of relaybus(7), DURATIONS): "0", or one
 * or more terms NUMBER UNIT, largest unit first, each unit once; NUMBER
 * is digits with an optional decimal part, UNIT one of d, h, m (or min),
 * s, ms: "30s" -> 30000, "1m30s" -> 90000, "1.5s" -> 1500.  Returns 0,
 * or one of the negative RB_DURATION_* codes: SYNTAX (empty, no digits,
 * an unknown, repeated or misplaced unit, a sign, a space), BARE (a number
 * without a unit, other than 0), FRACTION (not a whole number of
 * milliseconds), RANGE (beyond INT64_MAX ms).  Options bound it further.
 */
enum { RB_DURATION_SYNTAX = -1, RB_DURATION_BARE = -2, RB_DURATION_FRACTION = -3,
	RB_DURATION_RANGE = -4 };
int	rb_parse_duration_ms(const char *, int64_t *out_ms);
/** Parse a decimal integer in [min, max].  Returns 0 or -1. */
int	rb_parse_int64(const char *, int64_t min, int64_t max, int64_t *out);
int	rb_parse_int(const char *, int min, int max, int *out);

/**
 * The backend-neutral redaction, for URLs no backend parses (mongodb://):
 * a copy of url with the userinfo password (from the first ':' after
 * "://" to the last '@') and any password= or sslpassword= value replaced
 * by "xxxxx".  NULL gives "(environment)".  PostgreSQL connection strings
 * go through rb_pg_url_redact (store_pg_url.h), which reads them as libpq does.
 */
char	*rb_url_redact(const char *url);

/** FNV-1a, 32 bit, of len bytes. */
uint32_t rb_fnv1a32(const void *data, size_t len);
/** The lane of a delivery: FNV-1a of the key, or of the event id when key is NULL, mod 256. */
int	rb_lane_of(const char *key, const char *event_id);

#ifndef RB_LEASE_DEFINED
#define RB_LEASE_DEFINED
/* A lane lease (also in rb_store.h, the same, since both stand alone). */
struct rb_lease {
	int	lane;		/* 0..255 */
	int64_t	epoch;		/* >= 0 */
	int64_t	claims;		/* >= 0 */
};
#endif
/** Format "lane:epoch:claims" into buf (at least 48 bytes). */
void	rb_lease_format(const struct rb_lease *, char *buf, size_t len);
/** v in decimal at buf (room for 21 bytes, no NUL); returns the length.
 * snprintf costs several times as much, on paths run per delivery. */
size_t	rb_fmt_int(char *buf, int64_t v);
/** Parse "lane:epoch:claims"; -1 on anything malformed or out of range. */
int	rb_lease_parse(const char *, struct rb_lease *);
/** rb_lease_parse of the n bytes at s (no NUL needed). */
int	rb_lease_parsen(const char *s, size_t n, struct rb_lease *);

/**
 * A SQL identifier we accept for a schema name: [a-z_][a-z0-9_]{0,49},
 * but not pg_* or information_schema (PostgreSQL's own).
 */
bool	rb_ident_valid(const char *);
/** A handler name: 1..200 bytes of [A-Za-z0-9_.:-]. */
bool	rb_handler_valid(const char *);

/** Monotonic milliseconds. */
int64_t	rb_mono_ms(void);
/** Wall-clock milliseconds since the epoch. */
int64_t	rb_wall_ms(void);
/** "2026-12-05T16:08:43.512Z" (the stores' created_at, lease_expires_at) as ms since the epoch; -1: not that. */
int64_t	rb_parse_iso_ms(const char *s);

#endif
