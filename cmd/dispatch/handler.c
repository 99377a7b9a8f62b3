/* SPDX-License-Identifier: MIT */
/*
 * handler.c: what the handler kinds that run processes share: /bin/sh -c
 * in its own process group, and the delivery's line as text.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_env.h"
#include "rb_util.h"

#include "dispatch.h"

extern char **environ;

void
set_nonblock(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
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
