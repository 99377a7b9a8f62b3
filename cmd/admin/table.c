/* SPDX-License-Identifier: MIT */
/*
 * table.c: rb-admin's output, JSON lines or an aligned table (the rows of
 * one command are kept and printed at table_finish, their widths measured
 * in terminal columns).
 */
#include "config.h"

#include <errno.h>
#include <locale.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include <jansson.h>

#include "rb_exit.h"
#include "rb_jsonl.h"
#include "rb_log.h"
#include "rb_util.h"
#include "table.h"

static json_t *tab_rows;		/* table mode: rows kept until flush */
static const struct column *tab_cols;

/*
 * Table cells are UTF-8 (JSON text); they are measured in terminal columns,
 * not bytes: wcwidth(3) in a UTF-8 LC_CTYPE (C.UTF-8, set while the table is
 * printed), or one column per character where the C library has none.
 */
static bool tab_utf8;

/* The columns of s; with max > 0, *cut gets the length of the longest prefix of at most max columns. */
static size_t
text_width(const char *s, size_t max, size_t *cut)
{
	mbstate_t st;
	size_t cols = 0, i = 0, len = strlen(s);

	memset(&st, 0, sizeof st);
	if (cut != NULL)
		*cut = len;
	while (i < len) {
		size_t n = 1;
		int w = 1;

		if (tab_utf8) {
			wchar_t wc;

			n = mbrtowc(&wc, s + i, len - i, &st);
			if (n == (size_t)-1 || n == (size_t)-2 || n == 0) {
				n = 1;	/* not UTF-8 (cannot come from jansson): a column a byte */
				memset(&st, 0, sizeof st);
			} else if ((w = wcwidth(wc)) < 0)
				w = 1;
		} else
			while (i + n < len && ((unsigned char)s[i + n] & 0xc0) == 0x80)
				n++;
		if (max > 0 && cut != NULL && cols + (size_t)w > max && *cut == len)
			*cut = i;
		cols += (size_t)w;
		i += n;
	}
	return cols;
}

/* s padded with spaces to width columns, on the left when right. */
static void
put_cell(const char *s, size_t width, bool right)
{
	size_t w = text_width(s, 0, NULL), pad = width > w ? width - w : 0;

	if (right)
		printf("%*s", (int)pad, "");
	fputs(s, stdout);
	if (!right)
		printf("%*s", (int)pad, "");
}

/* The text of one cell (new string). */
char *
table_cell(const json_t *v, int max)
{
	char *s;

	if (v == NULL || json_is_null(v))
		s = xstrdup("-");
	else if (json_is_string(v))
		s = xstrdup(json_string_value(v));
	else if (json_is_integer(v))
		s = xasprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v));
	else if (json_is_real(v))
		s = xasprintf("%.3f", json_real_value(v));
	else if (json_is_boolean(v))
		s = xstrdup(json_is_true(v) ? "yes" : "no");
	else {
		s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		if (s == NULL)
			rb_die(RB_EXIT_OSERR, "out of memory");
	}
	/* no terminal controls: C0, DEL and C1 (U+0080-U+009F, 0xC2 0x80-0x9F
	 * in UTF-8, as CSI U+009B) become one space each */
	{
		unsigned char *p = (unsigned char *)s, *q = p;

		while (*p != '\0') {
			if (*p < ' ' || *p == 0x7f) {
				*q++ = ' ';
				p++;
			} else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
				*q++ = ' ';
				p += 2;
			} else
				*q++ = *p++;
		}
		*q = '\0';
	}
	if (max > 3) {
		size_t cut;

		if (text_width(s, (size_t)max - 3, &cut) > (size_t)max)
			strcpy(s + cut, "...");
	}
	return s;
}

/* stdout failed: a reader that went away (| head) is normal in a pipeline, said only with -v */
void
out_failed(void)
{
	if (errno == EPIPE) {
		rb_info("stdout closed");
		exit(RB_EXIT_IOERR);
	}
	rb_die_errno(RB_EXIT_IOERR, "cannot write to stdout");
}

void
out_check(void)
{
	if (ferror(stdout))
		out_failed();
}

void
table_flush(void)
{
	size_t ncols = 0, nrows = json_array_size(tab_rows), r, c;
	size_t *width;
	bool *right, *numeric;
	char ***cells;
	char *old_ctype;

	if (tab_rows == NULL)
		return;
	old_ctype = xstrdup(setlocale(LC_CTYPE, NULL));
	tab_utf8 = setlocale(LC_CTYPE, "C.UTF-8") != NULL;
	while (tab_cols[ncols].title != NULL)
		ncols++;
	width = xcalloc(ncols, sizeof *width);
	right = xcalloc(ncols, sizeof *right);
	cells = xcalloc(nrows, sizeof *cells);
	numeric = xcalloc(ncols, sizeof *numeric);
	for (c = 0; c < ncols; c++) {
		width[c] = strlen(tab_cols[c].title);
		right[c] = true;	/* numbers (and "-") only, and at least one number */
	}
	for (r = 0; r < nrows; r++) {
		cells[r] = xcalloc(ncols, sizeof **cells);
		for (c = 0; c < ncols; c++) {
			const json_t *v = json_object_get(json_array_get(tab_rows, r), tab_cols[c].field);

			cells[r][c] = table_cell(v, tab_cols[c].max);
			if (text_width(cells[r][c], 0, NULL) > width[c])
				width[c] = text_width(cells[r][c], 0, NULL);
			if (v != NULL && !json_is_null(v) && !json_is_number(v))
				right[c] = false;
			if (json_is_number(v))
				numeric[c] = true;
		}
	}
	for (c = 0; c < ncols; c++)
		right[c] = right[c] && numeric[c];
	free(numeric);
	for (c = 0; c < ncols; c++) {
		fputs(c > 0 ? "  " : "", stdout);
		put_cell(tab_cols[c].title, c + 1 < ncols || right[c] ? width[c] : 0, false);
	}
	putchar('\n');
	for (r = 0; r < nrows; r++) {
		for (c = 0; c < ncols; c++) {
			fputs(c > 0 ? "  " : "", stdout);
			put_cell(cells[r][c], c + 1 < ncols || right[c] ? width[c] : 0, right[c]);
			free(cells[r][c]);
		}
		putchar('\n');
		free(cells[r]);
	}
	free(cells);
	free(width);
	free(right);
	json_decref(tab_rows);
	tab_rows = NULL;
	tab_cols = NULL;
	setlocale(LC_CTYPE, old_ctype);
	free(old_ctype);
	out_check();
}

/* Print rows (borrowed array of objects; not changed) as JSON lines now, or keep them for the table. */
void
table_emit(json_t *rows, const struct column *cols, bool table)
{
	size_t i;
	json_t *v;

	if (table) {
		if (tab_rows == NULL)
			tab_rows = json_array();
		tab_cols = cols;
		json_array_extend(tab_rows, rows);
		return;
	}
	json_array_foreach(rows, i, v)
		if (rb_jsonl_write(stdout, v) < 0)
			out_check();
	out_check();
}

int
table_finish(int rc)
{
	table_flush();
	if (fflush(stdout) != 0 || ferror(stdout))
		out_failed();
	return rc;
}
