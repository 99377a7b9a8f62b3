/* SPDX-License-Identifier: MIT */
/*
 * store_pg_url.h: connection strings read with libpq's own parser (the
 * PostgreSQL backend; store_pg_url.c).  Returned char * are the caller's.
 */
#ifndef STORE_PG_URL_H
#define STORE_PG_URL_H

#include <stdbool.h>
#include <stddef.h>

/**
 * A copy of url fit for messages: every value that PQconninfoParse reads
 * as password or sslpassword replaced by "xxxxx", everything else as
 * given (or, when masking in place would change what libpq reads, the
 * parsed options as key=value pairs).  NULL or "" give "(environment)", a
 * plain database name comes back as is, a string that libpq cannot parse
 * gives "(unparsable connection string)", and a URL of another scheme
 * (mongodb://) goes through rb_url_redact.
 */
char	*rb_pg_url_redact(const char *url);
/**
 * libpq's message pqmsg on one line, into out: its lines that are not
 * indented hints, joined with "; " (a multi-host URL's error has one line
 * per host tried), the final newline dropped.
 */
void	rb_pg_error_lines(const char *pqmsg, char *out, size_t size);
/**
 * libpq's connection error pqmsg for url (every host's line), fit for
 * messages, into out: when libpq cannot parse url, its reason without the
 * quoted input (which may be the password), and true; otherwise the line
 * with any password of url (3 bytes or more) masked, and false.
 */
bool	rb_pg_conn_error(const char *url, const char *pqmsg, char *out, size_t size);

#endif
