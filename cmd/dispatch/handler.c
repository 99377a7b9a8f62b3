/* SPDX-License-Identifier: MIT */
/*
 * handler.c: what the handler kinds that run processes share: /bin/sh -c
 * in its own process group, the guard that kills those groups when
 * rb-dispatch dies, and the delivery's line as text.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_env.h"
#include "rb_log.h"
#include "rb_util.h"

#include "dispatch.h"

extern char **environ;

void
set_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/*
 * The guard: a child of rb-dispatch's (forked before any connection is
 * made) that lives as long as rb-dispatch does.  rb-dispatch tells it
 * through a pipe the process group of each handler it starts (+pid) and of
 * each it reaps (-pid); when the pipe ends, because rb-dispatch exited or
 * was killed (kill -9 too), it kills the groups still there (SIGKILL) and
 * exits.  So a handler never runs on after its dispatcher, beside the
 * takeover that runs its delivery again and then the key's next ones.  It
 * has a process group of its own, so that a kill of rb-dispatch's group
 * does not reach it, ignores the signals it is sent (it ends with
 * rb-dispatch, not before), and holds none of its descriptors.
 */
static int	guard_fd = -1;
static pid_t	guard_pid;

static _Noreturn void
guard_run(int rfd)
{
	pid_t *g = NULL;
	size_t n = 0, cap = 0;
	int32_t m;
	ssize_t r;

	/* every signal but a fault's (a bug), SIGCHLD's (it has none) and those
	 * that cannot be */
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD && sig != SIGSEGV && sig != SIGBUS &&
		    sig != SIGFPE && sig != SIGILL && sig != SIGABRT && sig != SIGTRAP && sig != SIGSYS)
			signal(sig, SIG_IGN);
	for (;;) {
		r = read(rfd, &m, sizeof m);
		if (r < 0 && errno == EINTR)
			continue;
		if (r != (ssize_t)sizeof m)
			break;		/* the end: rb-dispatch is gone */
		if (m > 0) {
			if (n == cap) {
				pid_t *ng = realloc(g, (cap = cap * 2 + 64) * sizeof *g);

				if (ng == NULL)
					continue;
				g = ng;
			}
			g[n++] = (pid_t)m;
		} else
			for (size_t i = 0; i < n; i++)
				if (g[i] == (pid_t)-m) {
					g[i] = g[--n];
					break;
				}
	}
	for (size_t i = 0; i < n; i++)
		kill(-g[i], SIGKILL);
	free(g);
	_exit(0);	/* (not exit: nothing of rb-dispatch's to flush or to check) */
}

void
guard_start(void)
{
	int p[2], nul;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0) {
		rb_warn("cannot start the handlers' guard (pipe: %s): a kill -9 would leave them running",
		    strerror(errno));
		return;
	}
	if ((pid = fork()) < 0) {
		rb_warn("cannot start the handlers' guard (fork: %s): a kill -9 would leave them running",
		    strerror(errno));
		close(p[0]);
		close(p[1]);
		return;
	}
	if (pid == 0) {
		/* a process group of its own: a kill -9 of rb-dispatch's
		 * group (an operator's kill -- -PGID) must not take it along,
		 * since the handlers, in groups of their own, would run on */
		setpgid(0, 0);
		/* nothing of rb-dispatch's open here: whoever reads its output
		 * sees the end when it ends */
		if ((nul = open("/dev/null", O_RDWR)) >= 0) {
			dup2(nul, STDIN_FILENO);
			dup2(nul, STDOUT_FILENO);
			dup2(nul, STDERR_FILENO);
		}
		/* its pipe moved to fd 3, then everything else closed: with
		 * closefrom, one call, where a close() of every possible fd
		 * took 20,000 calls and some 10 ms at each start of
		 * rb-dispatch under ulimit -n 20000 */
		if (p[0] != 3 && dup2(p[0], 3) == 3)
			p[0] = 3;
		for (int fd = 3; fd < p[0]; fd++)
			close(fd);
#ifdef HAVE_CLOSEFROM
		closefrom(p[0] + 1);
#else
		{
			long max = sysconf(_SC_OPEN_MAX);

			for (int fd = p[0] + 1; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
				close(fd);
		}
#endif
		guard_run(p[0]);
	}
	close(p[0]);
	guard_fd = p[1];
	guard_pid = pid;
}

static void
guard_tell(int32_t m)
{
	ssize_t r;

	if (guard_fd < 0)
		return;
	do
		r = write(guard_fd, &m, sizeof m);
	while (r < 0 && errno == EINTR);
	if (r != (ssize_t)sizeof m) {	/* it is gone */
		close(guard_fd);
		guard_fd = -1;
	}
}

void
guard_stop(void)
{
	if (guard_fd >= 0)
		close(guard_fd);
	guard_fd = -1;
	if (guard_pid > 0)
		while (waitpid(guard_pid, NULL, 0) < 0 && errno == EINTR)
			;
	guard_pid = 0;
}

bool
guard_reaped(pid_t pid)
{
	if (pid == guard_pid && guard_pid > 0) {
		rb_warn("the handlers' guard ended: a kill -9 would leave them running");
		if (guard_fd >= 0)
			close(guard_fd);
		guard_fd = -1;
		guard_pid = 0;
		return true;
	}
	guard_tell(-(int32_t)pid);
	return false;
}

/*
 * Start /bin/sh -c cmd in its own process group (so that a ^C at the
 * terminal reaches only us, and a timeout kills the whole group) with
 * stdin from in_fd and, when out_fd >= 0, stdout to out_fd.
 */
pid_t
spawn(const char *cmd, int in_fd, int out_fd)
{
	return spawn_env(cmd, in_fd, out_fd, NULL);
}

/* Whether an environment entry is one of those a delivery sets (trace context). */
static bool
per_delivery(const char *e)
{
	return strncmp(e, "TRACEPARENT=", 12) == 0 || strncmp(e, "TRACESTATE=", 11) == 0;
}

/*
 * spawn, with extra (NULL-ended; NULL: the handlers' environment as it
 * is) as the delivery's own: TRACEPARENT and TRACESTATE inherited by
 * rb-dispatch are dropped, so that a handler never joins a trace its
 * delivery does not carry.
 */
pid_t
spawn_env(const char *cmd, int in_fd, int out_fd, char *const *extra)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none, def;
	char *argv[] = { "/bin/sh", "-c", (char *)cmd, NULL };
	pid_t pid;
	int rc;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in_fd, STDIN_FILENO);
	if (out_fd >= 0)
		posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
	posix_spawnattr_init(&at);
	sigemptyset(&none);
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	sigaddset(&def, SIGCHLD);
	sigaddset(&def, SIGTERM);
	sigaddset(&def, SIGINT);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setpgroup(&at, 0);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
	    POSIX_SPAWN_SETSIGMASK);
	char **env = rb_handler_environ();

	if (extra != NULL) {
		size_t n = 0, k = 0, x = 0;
		char **base = env;

		while (base[n] != NULL)
			n++;
		while (extra[x] != NULL)
			x++;
		env = xcalloc(n + x + 1, sizeof *env);
		for (size_t i = 0; i < n; i++)
			if (!per_delivery(base[i]))
				env[k++] = base[i];
		for (size_t i = 0; i < x; i++)
			env[k++] = extra[i];
	}
	rc = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, env);
	if (extra != NULL)
		free(env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	if (rc != 0) {
		errno = rc;
		return -1;
	}
	guard_tell((int32_t)pid);
	return pid;
}

/* The delivery's line, to hand the handler (a copy: *len bytes, newline-ended). */
char *
line_text(const struct rb_dl *d, size_t *len)
{
	char *s = xmalloc(d->tlen + 1);

	memcpy(s, d->text, d->tlen + 1);
	*len = d->tlen;
	return s;
}

const char *
cannot_run(int status)
{
	if (!WIFEXITED(status))
		return NULL;
	if (WEXITSTATUS(status) == 127)
		return "cannot run the handler: exit 127 (command not found)";
	if (WEXITSTATUS(status) == 126)
		return "cannot run the handler: exit 126 (not executable)";
	return NULL;
}
