/* SPDX-License-Identifier: MIT */
/*
 * rb_env.c: the handlers' environment.  Handlers often come from another
 * trust level than the dispatcher; they need not be able to log in as it.
 * Removed: RELAYBUS_URL (it may hold the password), PGPASSWORD (it is the
 * password), PGPASSFILE and PGSERVICEFILE (files of passwords and
 * connection settings), PGSSLKEY (the client's private key).  The other
 * PG* variables (host, port, user, database, sslmode, ...) say where, not
 * how to prove who one is, and stay: a handler may connect with its own
 * credentials.  RELAYBUS_PASS_ENV="PGPASSWORD,RELAYBUS_URL" hands the
 * named ones on all the same.
 */
#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "rb_env.h"
#include "rb_exit.h"
#include "rb_log.h"
#include "rb_store.h"
#include "rb_util.h"

extern char **environ;

static const char *const secret_vars[] = {
	"RELAYBUS_URL", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "PGSSLKEY", NULL
};

/* Is the name [name, name+n) in the list (separated by commas or spaces)? */
static bool
listed(const char *list, const char *name, size_t n)
{
	while (list != NULL && *list != '\0') {
		size_t len;

		list += strspn(list, ", \t");
		len = strcspn(list, ", \t");
		if (len == n && strncmp(list, name, n) == 0)
			return true;
		list += len;
	}
	return false;
}

static bool
withheld(const char *var, const char *pass)
{
	size_t n = strcspn(var, "=");

	for (const char *const *s = secret_vars; *s != NULL; s++)
		if (strlen(*s) == n && strncmp(var, *s, n) == 0)
			return !listed(pass, var, n);
	return false;
}

char **
rb_handler_environ(void)
{
	static char **env;
	const char *pass;
	size_t n = 0, k = 0;

	if (env != NULL)
		return env;
	pass = getenv("RELAYBUS_PASS_ENV");
	while (environ != NULL && environ[n] != NULL)
		n++;
	env = xcalloc(n + 1, sizeof *env);
	for (size_t i = 0; i < n; i++)
		if (!withheld(environ[i], pass))
			env[k++] = environ[i];
	env[k] = NULL;
	return env;
}

/*
 * Move the value of var into private memory (setenv: a new string on the
 * heap, which getenv, and libpq at a reconnect, read from now on) and
 * overwrite the string the process started with, in place, with masked:
 * /proc/PID/environ shows that first area, whatever environ says since.
 * The rest of a masked value shorter than the original is NUL bytes; one
 * longer is cut.
 */
static void
hide_var(const char *var, char *(*mask)(const char *))
{
	size_t vn = strlen(var);
	char *orig = NULL, *val, *m;
	size_t n, k;

	for (size_t i = 0; environ != NULL && environ[i] != NULL; i++)
		if (strncmp(environ[i], var, vn) == 0 && environ[i][vn] == '=') {
			orig = environ[i];
			break;
		}
	if (orig == NULL || orig[vn + 1] == '\0')
		return;
	val = orig + vn + 1;
	m = mask(val);
	if (strcmp(m, val) != 0) {
		if (setenv(var, val, 1) < 0)
			rb_die_errno(RB_EXIT_OSERR, "cannot set %s", var);
		n = strlen(val);
		k = strlen(m) < n ? strlen(m) : n;
		memcpy(val, m, k);
		memset(val + k, '\0', n - k);
	}
	free(m);
}

static char *
mask_all(const char *v)
{
	(void)v;
	return xstrdup("xxxxx");
}

void
rb_env_hide_secrets(void)
{
#ifdef __linux__
	/* /proc/PID/environ, mem, maps, fd ...: root's alone (and no core) */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		rb_warn("cannot make the process non-dumpable: %s", strerror(errno));
#endif
	hide_var("RELAYBUS_URL", rb_store_redact);
	hide_var("PGPASSWORD", mask_all);
}
