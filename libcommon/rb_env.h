/* SPDX-License-Identifier: MIT */
/*
 * rb_env.h: the environment a handler runs with (rb-dispatch --exec and
 * --pipe): ours, less the variables that carry or point to the database
 * credentials, unless RELAYBUS_PASS_ENV names them.
 */
#ifndef RB_ENV_H
#define RB_ENV_H

/**
 * The environment for execve/posix_spawn: every variable of environ but
 * RELAYBUS_URL, PGPASSWORD, PGPASSFILE, PGSERVICEFILE and PGSSLKEY, except
 * those named in RELAYBUS_PASS_ENV (a list separated by commas or spaces).
 * Made at the first call from environ as it is then, and kept: the array
 * is ours (do not free it); its strings are environ's.
 */
char	**rb_handler_environ(void);
/**
 * For a long-lived process whose handlers or pipeline neighbours run as
 * its uid: make it non-dumpable (on Linux: /proc/PID/environ, mem and the
 * like become root's alone, and no core is written), and keep the values
 * of RELAYBUS_URL and PGPASSWORD in private memory (getenv still gives
 * them, for a reconnect), overwriting the copies the process started with,
 * which /proc/PID/environ shows, with the password masked ("xxxxx").
 * Call it before rb_handler_environ.
 */
void	rb_env_hide_secrets(void);

#endif
