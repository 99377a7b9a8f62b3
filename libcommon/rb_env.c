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

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rb_env.h"
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
