/* SPDX-License-Identifier: MIT */
/*
 * rb_trace.h: W3C Trace Context (https://www.w3.org/TR/trace-context/)
 * as relaybus carries it: a "traceparent" (and "tracestate") member of an
 * event's headers.  rb-publish --trace makes one for an event without;
 * rb-dispatch hands a valid one to an --exec handler as TRACEPARENT and
 * TRACESTATE (relaybus(7) TRACE CONTEXT).
 */
#ifndef RB_TRACE_H
#define RB_TRACE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* "00-" 32 hex "-" 16 hex "-" 2 hex, and the NUL */
#define RB_TRACEPARENT_LEN	55
/* the longest tracestate passed on (the spec's limit: 32 members of 256 bytes) */
#define RB_TRACESTATE_MAX	512

/** Whether s is a traceparent a handler may take (lower-case hex, ids not all zero, version not ff). */
bool	rb_traceparent_valid(const char *s);
/** A new traceparent, version 00, sampled, random trace and parent ids, into out. */
void	rb_traceparent_new(char out[RB_TRACEPARENT_LEN + 1]);
/**
 * The traceparent (its first 55 bytes, those of version 00) and tracestate of the headers of a delivery or event
 * line (member names compared without case): true when the line has a
 * valid traceparent, copied to tp; ts gets a tracestate of printable
 * ASCII at most RB_TRACESTATE_MAX bytes, else "".
 */
bool	rb_trace_of_line(const char *line, size_t len, char tp[RB_TRACEPARENT_LEN + 1],
	    char ts[RB_TRACESTATE_MAX + 1]);

/**
 * rb-publish --trace: the line (len bytes) of event ev (its parse) with a
 * new traceparent in its headers, as a new string, or NULL when its
 * headers have one (in any case).  The rest of the line is kept as
 * written: numbers keep their spelling.
 */
char	*rb_trace_line_with_new(const json_t *ev, const char *line, size_t len);

#endif
