/* SPDX-License-Identifier: MIT */
/* tap.h: a tiny TAP producer shared by the C unit tests. */
#ifndef TAP_H
#define TAP_H

#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...) do {						\
	int c_ = (cond) ? 1 : 0;					\
	tap_n++;							\
	if (c_) {							\
		printf("ok %d - ", tap_n);				\
	} else {							\
		tap_failed++;						\
		printf("not ok %d - ", tap_n);				\
	}								\
	printf(__VA_ARGS__);						\
	printf("\n");							\
	if (!c_)							\
		printf("#   failed at %s:%d\n", __FILE__, __LINE__);	\
} while (0)

#define is_int(got, want, ...) do {					\
	long long g_ = (long long)(got), w_ = (long long)(want);	\
	ok(g_ == w_, __VA_ARGS__);					\
	if (g_ != w_)							\
		printf("#   got %lld, want %lld\n", g_, w_);		\
} while (0)

#define is_str(got, want, ...) do {					\
	const char *g_ = (got), *w_ = (want);				\
	int same_ = (g_ == NULL && w_ == NULL) ||			\
	    (g_ != NULL && w_ != NULL && strcmp(g_, w_) == 0);		\
	ok(same_, __VA_ARGS__);						\
	if (!same_)							\
		printf("#   got '%s', want '%s'\n", g_ ? g_ : "(null)", w_ ? w_ : "(null)"); \
} while (0)

static inline int
done_testing(void)
{
	printf("1..%d\n", tap_n);
	return tap_failed == 0 ? 0 : 1;
}

#endif
