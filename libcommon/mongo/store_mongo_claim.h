/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_claim.h: what the MongoDB claim (store_mongo_lanes.c) and its
 * takeover (store_mongo_takeover.c) share: the lanes and picks of one
 * claim, the id lists of lane documents, and the takeover's two steps.
 */
#ifndef RB_STORE_MONGO_CLAIM_H
#define RB_STORE_MONGO_CLAIM_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

struct ids {
	int64_t	*v;
	size_t	 n, cap;
};

static inline void
ids_add(struct ids *a, int64_t v)
{
	if (a->n == a->cap) {
		a->cap = a->cap ? 2 * a->cap : 16;
		a->v = xrealloc(a->v, a->cap * sizeof *a->v);
	}
	a->v[a->n++] = v;
}

static inline bool
ids_has(const struct ids *a, int64_t v)
{
	for (size_t i = 0; i < a->n; i++)
		if (a->v[i] == v)
			return true;
	return false;
}

static inline void
ids_append_bson(bson_t *b, const char *key, const struct ids *a)
{
	bson_t arr;

	bson_append_array_begin(b, key, -1, &arr);
	for (size_t i = 0; i < a->n; i++) {
		char ks[16];
		const char *kp;

		bson_uint32_to_string((uint32_t)i, &kp, ks, sizeof ks);
		bson_append_int64(&arr, kp, -1, a->v[i]);
	}
	bson_append_array_end(b, &arr);
}

static inline void
ids_of_iter(struct ids *a, const bson_t *d, const char *key)
{
	bson_iter_t it, c;

	if (bson_iter_init_find(&it, d, key) && BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &c))
		while (bson_iter_next(&c))
			ids_add(a, bson_iter_as_int64(&c));
}

struct lane {
	int64_t		 epoch;
	char		*owner, *holder;
	int64_t		 expires;	/* -1: none */
	struct ids	 inflight, lost;
	int		 chain_early;	/* chainEarly: 1, 0, -1 unknown (an older release) */
	int		 lost_early;	/* lostChainEarly, the same */
	char		*lost_owner;	/* lostOwner */
	struct ids	 live;		/* the in-flight ones still pending */
	struct ids	 picks;
	enum { L_OTHER, L_HELD, L_FREE, L_TAKEN } kind;
	int64_t		 new_epoch;
	bool		 ok;		/* the record write matched */
};

struct pick {
	int64_t		 id, seq, created;
	char		*event_id, *key;
	int		 lane, attempts;
	int64_t		 claims;
	bool		 has_seq;
};

struct claim {
	struct rb_store			*s;
	const struct rb_claim_opts	*o;
	struct lane			 l[RB_LANES];
	struct pick			*p;
	size_t				 np, cap;
	int64_t				 now, expires;
	struct mg_park			*park;	/* the keys to park after the claim */
	size_t				 npark;
};

static inline char *
dup_str(const bson_t *d, const char *key)
{
	const char *v = mg_get_str(d, key);

	return v != NULL ? xstrdup(v) : NULL;
}

static inline bool
str_eq(const char *a, const char *b)
{
	return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* a boolean field: 1, 0, or -1 when missing or null */
static inline int
get_tristate(const bson_t *d, const char *key)
{
	bson_iter_t it;

	if (!bson_iter_init_find(&it, d, key) || !BSON_ITER_HOLDS_BOOL(&it))
		return -1;
	return bson_iter_bool(&it) ? 1 : 0;
}

static inline void
append_tristate(bson_t *b, const char *key, int v)
{
	if (v < 0)
		BSON_APPEND_NULL(b, key);
	else
		BSON_APPEND_BOOL(b, key, v > 0);
}

/* store_mongo_takeover.c */
int	mgc_charge_lost(struct claim *, int, int64_t, struct rb_error *);
int	mgc_take_over(struct claim *, int, struct rb_error *);

#endif
