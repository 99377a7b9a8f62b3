/* SPDX-License-Identifier: MIT */
/*
 * prom.h: rb-admin stats --prometheus (the text exposition format) and
 * --output FILE (written atomically, the node_exporter textfile
 * collector's convention: a temporary file in FILE's folder, renamed).
 */
#ifndef RB_ADMIN_PROM_H
#define RB_ADMIN_PROM_H

#include <stdio.h>

#include <jansson.h>

/* st: rb_admin_stats's object (handlers filtered); relaybus_up 1 and the rest */
void	prom_write(FILE *f, const json_t *st, const char *schema);
/* the bus could not be read: relaybus_up 0 alone */
void	prom_write_down(FILE *f, const char *schema);

/* stdout goes to a new temporary file beside path (mode 0644); dies 73 if it cannot */
void	out_begin(const char *path);
/* flush, fsync and rename it to path; dies 74 if that fails.  Without
 * out_commit the temporary file is removed at exit. */
void	out_commit(void);

#endif
