/* SPDX-License-Identifier: MIT */
/* Unit tests: the JSON-lines reader (blank lines, CRLF, overlong lines, no final newline). */
#include "config.h"

#include <stdlib.h>
#include <unistd.h>

#include "rb_jsonl.h"
#include "tap.h"

/* A reader over the bytes of s through a pipe. */
static struct rb_jsonl_reader *
reader_of(const char *s, size_t max)
{
	int fds[2];
	size_t n = strlen(s);

	if (pipe(fds) < 0)
		abort();
	if (fork() == 0) {
		close(fds[0]);
		while (n > 0) {
			ssize_t w = write(fds[1], s, n > 7 ? 7 : n);	/* small writes: lines cross reads */
			if (w <= 0)
				_exit(1);
			s += w;
			n -= (size_t)w;
		}
		_exit(0);
	}
	close(fds[1]);
	return rb_jsonl_reader_new(fds[0], max);
}

int
main(void)
{
	struct rb_jsonl_reader *r;
	const char *line;
	size_t len;
	json_t *o;
	char err[200];

	r = reader_of("{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}", 0);
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"a\":1}") == 0, "first line");
	is_int(rb_jsonl_lineno(r), 1, "line 1");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"b\":2}") == 0,
	    "blank lines skipped, CR stripped");
	is_int(rb_jsonl_lineno(r), 4, "blank lines still count");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"c\":3}") == 0 && len == 7,
	    "last line without newline");
	is_int(rb_jsonl_lineno(r), 5, "line 5");
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "then end of input");
	rb_jsonl_reader_free(r);

	r = reader_of("{\"x\":\"0123456789012345678901234567890123456789\"}\n{\"ok\":1}\n", 20);
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_TOOLONG, "overlong line reported");
	is_int(rb_jsonl_lineno(r), 1, "with its number");
	ok(rb_jsonl_next(r, -1, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"ok\":1}") == 0,
	    "the next line is read after an overlong one");
	is_int(rb_jsonl_lineno(r), 2, "line 2");
	rb_jsonl_reader_free(r);

	/* an overlong line far beyond the buffer, without newline */
	{
		size_t big = 300000;
		char *s = malloc(big + 1);

		memset(s, 'x', big);
		s[big] = '\0';
		r = reader_of(s, 1000);
		is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_TOOLONG, "huge line without newline");
		is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "then eof");
		rb_jsonl_reader_free(r);
		free(s);
	}

	r = reader_of("", 0);
	is_int(rb_jsonl_next(r, -1, &line, &len), RB_JSONL_EOF, "empty input");
	rb_jsonl_reader_free(r);

	{
		int fds[2];

		if (pipe(fds) < 0)
			abort();
		r = rb_jsonl_reader_new(fds[0], 0);
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_AGAIN, "timeout with no input");
		if (write(fds[1], "{\"p\":", 5) != 5)
			abort();
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_AGAIN, "timeout with half a line");
		ok(!rb_jsonl_buffered(r), "no complete line buffered");
		if (write(fds[1], "1}\n", 3) != 3)
			abort();
		ok(rb_jsonl_next(r, 10, &line, &len) == RB_JSONL_LINE && strcmp(line, "{\"p\":1}") == 0,
		    "the line completes");
		close(fds[1]);
		is_int(rb_jsonl_next(r, 10, &line, &len), RB_JSONL_EOF, "eof after close");
		rb_jsonl_reader_free(r);
		close(fds[0]);
	}

	ok(rb_jsonl_parse("{\"a\":1}", 7, &o, err, sizeof err) == 0 && json_is_object(o), "parse object");
	json_decref(o);
	ok(rb_jsonl_parse("[1]", 3, &o, err, sizeof err) < 0 && strcmp(err, "not a JSON object") == 0,
	    "array rejected");
	ok(rb_jsonl_parse("{\"a\":", 5, &o, err, sizeof err) < 0 && strncmp(err, "invalid JSON:", 13) == 0,
	    "truncated JSON rejected");
	ok(rb_jsonl_parse("{\"a\":1,\"a\":2}", 13, &o, err, sizeof err) < 0, "duplicate keys rejected");
	ok(rb_jsonl_parse("{\"a\":\"\xff\"}", 8, &o, err, sizeof err) < 0, "invalid UTF-8 rejected");
	ok(rb_jsonl_parse("{\"a\":\"\\u0000\"}", 13, &o, err, sizeof err) < 0, "NUL in a string rejected");
	{
		/* rb_jsonl_put_string prints what jansson prints for the same string */
		static const char *const cases[] = { "plain", "q\"uote", "back\\slash", "tab\tnl\ncr\r",
		    "ctl\x01\x1f\b\f", "utf-8 \xc3\xa9 / slash", "" };

		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
			char *mine = NULL, *theirs;
			size_t sz = 0;
			FILE *f = open_memstream(&mine, &sz);
			json_t *js = json_string(cases[i]);

			ok(rb_jsonl_put_string(f, cases[i]) == 0 && fclose(f) == 0, "put_string %zu", i);
			theirs = json_dumps(js, JSON_ENCODE_ANY);
			ok(mine != NULL && theirs != NULL && strcmp(mine, theirs) == 0, "put_string %zu as jansson: %s",
			    i, mine != NULL ? mine : "(null)");
			free(mine);
			free(theirs);
			json_decref(js);
		}
	}
	return done_testing();
}
