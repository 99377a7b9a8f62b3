/* SPDX-License-Identifier: MIT */
/*
 * rb_textfile.h: the Prometheus text exposition format as the programs
 * write it (rb-admin stats --prometheus, rb-dispatch --metrics-file):
 * label values escaped, and a textfile for node_exporter's textfile
 * collector written atomically: a hidden temporary file beside it (the
 * collector reads *.prom only), mode 0644, flushed, synced and renamed.
 */
#ifndef RB_TEXTFILE_H
#define RB_TEXTFILE_H

#include <stdio.h>

/** A label value, with \ " and newline escaped. */
void	rb_prom_label(FILE *f, const char *v);

/**
 * A new temporary file beside path, mode 0644, open for writing; *tmp
 * its name (free it).  NULL with errno set if it cannot be made.
 */
FILE	*rb_textfile_open(const char *path, char **tmp);
/**
 * Close f (from rb_textfile_open) and rename tmp to path; tmp is freed
 * and, on failure, removed.  0, or -1 with errno set.
 */
int	rb_textfile_commit(FILE *f, char *tmp, const char *path);

#endif
