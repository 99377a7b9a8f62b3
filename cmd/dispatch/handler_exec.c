/* SPDX-License-Identifier: MIT */
/*
 * handler_exec.c: --exec, one /bin/sh -c CMD per delivery, the delivery
 * line on its stdin (written as the pipe takes it).  Its exit status is
 * the verdict: 0 completes, 80 says it completed the delivery itself
 * (relaybus_complete), 75 retries later, anything else fails the
 * attempt (126 and 127, the shell's "cannot run it", named so).  A timeout or an abort kills the process group; the verdict
 * then comes with its exit.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_trace.h"

#include "dispatch.h"

/* Write what we can of the line to an exec child; close its stdin when done. */
static void
exec_write(struct slot *s)
{
	while (s->h.exec.in_fd >= 0 && s->h.exec.woff < s->h.exec.wlen) {
		ssize_t n = write(s->h.exec.in_fd, s->h.exec.wbuf + s->h.exec.woff,
		    s->h.exec.wlen - s->h.exec.woff);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) {
			/* EPIPE: the handler did not read its input; its exit status decides */
			break;
		}
		s->h.exec.woff += (size_t)n;
	}
	if (s->h.exec.in_fd >= 0) {
		close(s->h.exec.in_fd);
		s->h.exec.in_fd = -1;
	}
	free(s->h.exec.wbuf);
	s->h.exec.wbuf = NULL;
}

static void
exec_start(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	struct slot *s = slot_take(dp, d, gen, followers);
	int p[2] = { -1, -1 };
	/* the event's trace context, W3C traceparent and tracestate in its
	 * headers, as the environment OpenTelemetry's SDKs read (rb_trace.h) */
	char tp[RB_TRACEPARENT_LEN + 1], ts[RB_TRACESTATE_MAX + 1];
	char tpe[RB_TRACEPARENT_LEN + 13], tse[RB_TRACESTATE_MAX + 12];
	char *extra[3] = { NULL, NULL, NULL };

	if (rb_trace_of_line(d->text, d->tlen, tp, ts)) {
		snprintf(tpe, sizeof tpe, "TRACEPARENT=%s", tp);
		extra[0] = tpe;
		if (ts[0] != '\0') {
			snprintf(tse, sizeof tse, "TRACESTATE=%s", ts);
			extra[1] = tse;
		}
	}
	s->h.exec.in_fd = -1;
	if (pipe2(p, O_CLOEXEC) < 0 || (s->h.exec.pid = spawn_env(dp->opt.cmd, p[0], -1, extra)) < 0) {
		char msg[200];

		snprintf(msg, sizeof msg, "cannot start the handler: %s", strerror(errno));
		rb_error("%s", msg);
		if (p[0] >= 0) {
			close(p[0]);
			close(p[1]);
		}
		finish_slot(dp, s, verdict_fail(msg));
		return;
	}
	close(p[0]);
	s->h.exec.in_fd = p[1];
	set_nonblock(s->h.exec.in_fd);
	s->h.exec.wbuf = line_text(s->d, &s->h.exec.wlen);
	s->h.exec.woff = 0;
	exec_write(s);
}

static void
exec_release(struct dispatcher *dp, struct slot *s)
{
	if (s->h.exec.in_fd >= 0)
		close(s->h.exec.in_fd);
	free(s->h.exec.wbuf);
}

/* Kill the child's process group; its exit (exec_exited) says what to queue. */
static void
exec_cancel(struct dispatcher *dp, struct slot *s, enum cancel why)
{
	if (why == CANCEL_TIMEOUT) {
		rb_info("%s: timed out: killing pid %d", s->d->event_id, (int)s->h.exec.pid);
		s->h.exec.timed_out = true;
	} else
		s->h.exec.aborted = true;
	kill(-s->h.exec.pid, SIGKILL);
}

static void
exec_child_exited(struct dispatcher *dp, struct slot *s, int status)
{
	char msg[200];

	if (s->h.exec.aborted) {
		finish_slot(dp, s, verdict_release());
		return;
	}
	if (s->h.exec.timed_out) {
		snprintf(msg, sizeof msg, "timed out after %" PRId64 "ms", dp->opt.timeout_ms);
		finish_slot(dp, s, verdict_fail(msg));
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		finish_slot(dp, s, verdict_ok());
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == RB_HANDLER_EXIT_COMPLETED) {
		finish_slot(dp, s, verdict_done());
		return;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == RB_EXIT_TEMPFAIL)
		snprintf(msg, sizeof msg, "exit %d: retry later", RB_EXIT_TEMPFAIL);
	else if (cannot_run(status) != NULL)
		snprintf(msg, sizeof msg, "%s", cannot_run(status));
	else if (WIFEXITED(status))
		snprintf(msg, sizeof msg, "exit %d", WEXITSTATUS(status));
	else
		snprintf(msg, sizeof msg, "killed by signal %d", WTERMSIG(status));
	finish_slot(dp, s, verdict_fail(msg));
}

static void
exec_exited(struct dispatcher *dp, pid_t pid, int status)
{
	for (int i = 0; i < dp->opt.concurrency; i++)
		if (dp->slots[i].used && dp->slots[i].h.exec.pid == pid) {
			exec_child_exited(dp, &dp->slots[i], status);
			break;
		}
}

/* The stdin of every child whose line is not all written yet (ref: the slot). */
static int
exec_pollfds(struct dispatcher *dp, struct pollfd *pfd, int *ref, int64_t *until)
{
	int n = 0;

	for (int i = 0; i < dp->opt.concurrency; i++) {
		struct slot *s = &dp->slots[i];

		if (!s->used)
			continue;
		if (s->h.exec.in_fd >= 0) {
			pfd[n].fd = s->h.exec.in_fd;
			pfd[n].events = POLLOUT;
			ref[n++] = i;
		}
	}
	return n;
}

static void
exec_ready(struct dispatcher *dp, int ref)
{
	if (dp->slots[ref].used)
		exec_write(&dp->slots[ref]);
}

const struct handler_kind handler_exec = {
	.option = "--exec",
	.concurrency = 10, .batch = RB_DEFAULT_BATCH, .chain = 8,
	.start = exec_start,
	.release = exec_release,
	.cancel = exec_cancel,
	.exited = exec_exited,
	.pollfds = exec_pollfds,
	.ready = exec_ready,
};
