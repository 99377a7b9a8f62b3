/* SPDX-License-Identifier: MIT */
/*
 * handler.h: rb-dispatch's handler kinds, private to rb-dispatch.  A kind
 * is how deliveries are run: --exec (handler_exec.c: one process per
 * delivery), --pipe (handler_pipe.c: long-running co-processes speaking
 * JSON lines) or --sql (handler_sql.c: the statement runs in the
 * completion).  The loop, the claims and the results know a kind only
 * through this table, so that a fourth kind is one more file.
 *
 * Every hook takes the dispatcher first.  A NULL hook has nothing to do
 * for that kind; start is always there, and release and cancel are there
 * for every kind that takes slots (slot_take).
 */
#ifndef RB_DISPATCH_HANDLER_H
#define RB_DISPATCH_HANDLER_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct chain;
struct dispatcher;
struct rb_dl;
struct slot;

/* What --exec keeps of a slot: its child, and the line still to write to the child's stdin. */
struct exec_slot {
	pid_t	 pid;
	int	 in_fd;		/* -1: written (or never opened) */
	char	*wbuf;
	size_t	 wlen, woff;
	bool	 timed_out;	/* killed at --timeout */
	bool	 aborted;	/* killed at shutdown: release */
};

/* What --pipe keeps of a slot: the co-process it was handed to. */
struct pipe_slot {
	int	 proc;		/* -1: none */
	uint32_t hash;		/* of its event_id and lease (the slot index) */
};

/* Why an attempt is ended early (handler_kind.cancel). */
enum cancel { CANCEL_TIMEOUT, CANCEL_ABORT };

struct handler_kind {
	const char	*option;	/* "--exec": for messages */
	/* the defaults of --concurrency, --batch and --chain */
	int		 concurrency, batch, chain;
	/* a delivery's result is ready as soon as it starts (--sql: the
	 * statement runs in its completion): complete without --window */
	bool		 at_once;

	/* the loop begins: the kind's state (dispatcher.kind_state), its processes started */
	void	(*begin)(struct dispatcher *);
	/* hand over a claimed delivery (stolen), claimed under owner
	 * generation gen; followers (stolen or NULL) are the rest of its key's
	 * chain.  Takes a slot (slot_take) or queues its result (queue_result). */
	void	(*start)(struct dispatcher *, struct rb_dl *d, unsigned gen, struct chain *followers);
	/* the slot's delivery is done (finish_slot): free what the kind kept of it */
	void	(*release)(struct dispatcher *, struct slot *s);
	/* end the slot's attempt: at --timeout (a failure), or at shutdown
	 * (released, no attempt charged); finish_slot now, or once its process is gone */
	void	(*cancel)(struct dispatcher *, struct slot *s, enum cancel why);
	/* a child process ended (waitpid) */
	void	(*exited)(struct dispatcher *, pid_t pid, int status);
	/* write out what start queued for the handler (after a batch of starts) */
	void	(*flush)(struct dispatcher *);
	/* whether the handler can take deliveries now (else no claim) */
	bool	(*accepting)(const struct dispatcher *);
	/* once per loop while not stopping: restarts that are due */
	void	(*tick)(struct dispatcher *, int64_t now);
	/* its fds to poll, ref[i] its own number (>= 0) for each, lowering
	 * *until for its own timers; returns how many (at most --concurrency
	 * + 2 --procs) */
	int	(*pollfds)(struct dispatcher *, struct pollfd *pfd, int *ref, int64_t *until);
	/* the fd it gave ref for is ready */
	void	(*ready)(struct dispatcher *, int ref);
	/* the loop is over: end the handler's processes (the results may
	 * still be completed, and flush called, after this) */
	void	(*stop)(struct dispatcher *);
	/* free the kind's state (begin may not have run) */
	void	(*fini)(struct dispatcher *);
};

extern const struct handler_kind handler_exec, handler_pipe, handler_sql;

/* handler.c: what the process kinds share */
void	set_nonblock(int fd);
pid_t	spawn(const char *cmd, int in_fd, int out_fd);
/* spawn with the delivery's own environment entries (NULL-ended): TRACEPARENT, TRACESTATE */
pid_t	spawn_env(const char *cmd, int in_fd, int out_fd, char *const *extra);
char	*line_text(const struct rb_dl *d, size_t *len);
/* the handlers' guard (handler.c): kills the handlers' process groups when
 * rb-dispatch ends, even by kill -9; started before any connection */
void	guard_start(void);
/* at the end: the guard told, and gone before rb-dispatch is */
void	guard_stop(void);
/* a child reaped: true if it was the guard (then there is none) */
bool	guard_reaped(pid_t pid);
/* "cannot run the handler: exit 127 (command not found)" for the shell's
 * exit statuses 126 and 127 (POSIX 2.8.2), else NULL */
const char *cannot_run(int status);

#endif
