/* SPDX-License-Identifier: MIT */
/*
 * table.h: rb-admin's records on stdout, as JSON lines or (table mode) an
 * aligned table printed when the command finishes.
 */
#ifndef RB_ADMIN_TABLE_H
#define RB_ADMIN_TABLE_H

#include <stdbool.h>

#include <jansson.h>

struct column {
	const char	*title, *field;
	int		 max;		/* cut longer cells (0: never) */
};

/* rows (borrowed array of objects): JSON lines now, or kept for the table (cols ends with a NULL title) */
void	table_emit(json_t *rows, const struct column *cols, bool table);
/* print a kept table, flush stdout; returns rc (dies 74 if stdout failed) */
int	table_finish(int rc);
/* print the kept rows now (table mode), then start a new table */
void	table_flush(void);
/* the text of one cell, control characters as spaces, cut to max columns when max > 3 (new string) */
char	*table_cell(const json_t *v, int max);
/* stdout failed: exit 74 (a closed pipe is said only with -v) */
void	out_failed(void) __attribute__((noreturn));
/* exit 74 if stdout has an error */
void	out_check(void);

#endif
