/* SPDX-License-Identifier: MIT */
/*
 * rb_exit.h: the one exit-code table of relaybus.  Values follow
 * sysexits(3) so that callers recognise them; relaybus(7) and every
 * program's man page copy this table.
 */
#ifndef RB_EXIT_H
#define RB_EXIT_H

enum rb_exit {
	RB_EXIT_OK = 0,
	RB_EXIT_EMPTY = 1,		/* documented "nothing": rb-claim found nothing due */
	RB_EXIT_USAGE = 64,		/* bad option or argument */
	RB_EXIT_DATAERR = 65,		/* bad input line */
	RB_EXIT_NOINPUT = 66,		/* an input file cannot be opened */
	RB_EXIT_UNAVAILABLE = 69,	/* cannot connect; op unsupported by backend */
	RB_EXIT_SOFTWARE = 70,		/* internal error, unexpected server error */
	RB_EXIT_OSERR = 71,		/* out of memory, fork failed, ... */
	RB_EXIT_CANTCREAT = 73,		/* an output file cannot be created */
	RB_EXIT_IOERR = 74,		/* stdout/stdin I/O failure */
	RB_EXIT_TEMPFAIL = 75,		/* connection lost, serialization failure: retry */
	RB_EXIT_PROTOCOL = 76,		/* the schema is newer than this relaybus understands */
	RB_EXIT_NOPERM = 77,		/* the role lacks a privilege, or its password was refused */
	RB_EXIT_CONFIG = 78,		/* bad URL or environment; schema not set up */
	/* not in sysexits(3), relaybus's own: */
	RB_EXIT_UPGRADE = 79,		/* the schema needs an upgrade: run rb-setup */
	RB_EXIT_CONFLICT = 81,		/* rb-publish: an event id exists with another name, key or payload */
	RB_EXIT_FAILED = 82,		/* rb-dispatch --drain --fail-exit: an attempt failed during the run */
};

#endif
