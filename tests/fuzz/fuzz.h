/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h: what the libFuzzer harnesses of tests/fuzz share.  A difference
 * from the reference is a crash (abort), so that libFuzzer keeps the input.
 */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_FAIL(...) do {						\
	fprintf(stderr, "fuzz: difference at %s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__);					\
	fputc('\n', stderr);						\
	abort();							\
} while (0)

#define FUZZ_CHECK(cond, ...) do { if (!(cond)) FUZZ_FAIL(__VA_ARGS__); } while (0)

/* The input as a C string (cut at its first NUL).  Free it. */
static inline char *
fuzz_cstr(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (s == NULL)
		abort();
	memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
