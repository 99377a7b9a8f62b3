/* SPDX-License-Identifier: MIT */
/*
 * Unit tests: a claimed row's address (rb_dl.addr) read from the claim's
 * tid column (pg_addr) and written back as a tid[] element for the
 * completion (pg_arr_addr): block << 16 | offset, 0 for none or anything
 * PostgreSQL would not have printed.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rb_util.h"
#include "pg/store_pg_int.h"
#include "tap.h"

static void
test_read(void)
{
	static const struct { const char *in; uint64_t want; } cases[] = {
		{ "(0,1)", 1 },
		{ "(5,52)", (uint64_t)5 << 16 | 52 },
		{ "(4294967295,65535)", (uint64_t)4294967295u << 16 | 65535 },
		/* none, and what no tid prints as: offset 0 or past 16 bits,
		 * a block past 32 bits, signs, missing parts */
		{ NULL, 0 }, { "", 0 }, { "(1,0)", 0 }, { "(1,65536)", 0 }, { "(4294967296,1)", 0 },
		{ "(-1,1)", 0 }, { "(1,-1)", 0 }, { "(,1)", 0 }, { "(1,)", 0 }, { "(1,2", 0 }, { "1,2)", 0 },
		{ "(1;2)", 0 },
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		ok(pg_addr(cases[i].in) == cases[i].want, "pg_addr(%s)", cases[i].in ? cases[i].in : "NULL");
}

static void
test_write(void)
{
	struct rb_sbuf b = { 0 };

	pg_arr_start(&b);
	pg_arr_addr(&b, (uint64_t)5 << 16 | 52);
	pg_arr_addr(&b, 0);
	pg_arr_addr(&b, (uint64_t)4294967295u << 16 | 65535);
	pg_arr_end(&b);
	is_str(b.s, "{\"(5,52)\",NULL,\"(4294967295,65535)\"}", "a tid[] literal, NULL for none");
	pg_arr_start(&b);
	pg_arr_addr(&b, 0);
	pg_arr_addr(&b, 1);
	pg_arr_end(&b);
	is_str(b.s, "{NULL,\"(0,1)\"}", "none first, then an address");
	/* and back: what the claim read is what the completion sends */
	pg_arr_start(&b);
	pg_arr_addr(&b, pg_addr("(123456,7)"));
	pg_arr_end(&b);
	is_str(b.s, "{\"(123456,7)\"}", "read and written back unchanged");
	free(b.s);
}

int
main(void)
{
	test_read();
	test_write();
	return done_testing();
}
