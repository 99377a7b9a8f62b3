/* SPDX-License-Identifier: MIT */
/* rb_textfile.c: Prometheus label values and atomic textfiles (rb_textfile.h). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rb_textfile.h"
#include "rb_util.h"

void
rb_prom_label(FILE *f, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\' || *v == '"')
			fprintf(f, "\\%c", *v);
		else if (*v == '\n')
			fputs("\\n", f);
		else
			putc(*v, f);
	}
}

FILE *
rb_textfile_open(const char *path, char **tmp)
{
	const char *slash = strrchr(path, '/');
	char *t;
	FILE *f;
	int fd, e;

	if (slash != NULL)
		t = xasprintf("%.*s/.%s.XXXXXX", (int)(slash - path), path, slash + 1);
	else
		t = xasprintf(".%s.XXXXXX", path);
	if ((fd = mkstemp(t)) < 0) {
		e = errno;
		free(t);
		errno = e;
		return NULL;
	}
	if (fchmod(fd, 0644) < 0 || (f = fdopen(fd, "w")) == NULL) {
		e = errno;
		(void)close(fd);
		(void)unlink(t);
		free(t);
		errno = e;
		return NULL;
	}
	*tmp = t;
	return f;
}

int
rb_textfile_commit(FILE *f, char *tmp, const char *path)
{
	int bad = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) < 0;
	int e = errno;

	if (fclose(f) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	if (!bad && rename(tmp, path) < 0) {
		bad = 1;
		e = errno;
	}
	if (bad)
		(void)unlink(tmp);
	free(tmp);
	errno = e;
	return bad ? -1 : 0;
}
