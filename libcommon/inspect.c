/* SPDX-License-Identifier: MIT */
/*
 * inspect.c: the backend-neutral part of rb_inspect.h: the names of a heap
 * tuple's flags and the rates between two samples.  Pure functions of
 * their arguments (the samples come from a backend's inspect_sample).
 */
#include "config.h"

#include <jansson.h>

#include "rb_inspect.h"

/* t_infomask and t_infomask2 bits (src/include/access/htup_details.h) */
#define HEAP_XMAX_KEYSHR_LOCK	0x0010
#define HEAP_XMAX_EXCL_LOCK	0x0040
#define HEAP_XMAX_LOCK_ONLY	0x0080
#define HEAP_XMIN_COMMITTED	0x0100
#define HEAP_XMIN_INVALID	0x0200
#define HEAP_XMAX_COMMITTED	0x0400
#define HEAP_XMAX_INVALID	0x0800
#define HEAP_XMAX_IS_MULTI	0x1000
#define HEAP_UPDATED		0x2000
#define HEAP_KEYS_UPDATED	0x2000	/* infomask2 */
#define HEAP_HOT_UPDATED	0x4000	/* infomask2 */
#define HEAP_ONLY_TUPLE		0x8000	/* infomask2 */

json_t *
rb_inspect_flags(long infomask, long infomask2)
{
	json_t *f = json_array();

	if (infomask2 & HEAP_HOT_UPDATED)
		json_array_append_new(f, json_string("HOT_UPDATED"));
	if (infomask2 & HEAP_ONLY_TUPLE)
		json_array_append_new(f, json_string("HEAP_ONLY"));
	if ((infomask & (HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID)) ==
	    (HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID))
		json_array_append_new(f, json_string("XMIN_FROZEN"));
	else if (infomask & HEAP_XMIN_COMMITTED)
		json_array_append_new(f, json_string("XMIN_COMMITTED"));
	else if (infomask & HEAP_XMIN_INVALID)
		json_array_append_new(f, json_string("XMIN_INVALID"));
	if (infomask & HEAP_XMAX_COMMITTED)
		json_array_append_new(f, json_string("XMAX_COMMITTED"));
	if (infomask & HEAP_XMAX_INVALID)
		json_array_append_new(f, json_string("XMAX_INVALID"));
	if (infomask & HEAP_XMAX_IS_MULTI)
		json_array_append_new(f, json_string("XMAX_IS_MULTI"));
	if (infomask & HEAP_XMAX_LOCK_ONLY)
		json_array_append_new(f, json_string("XMAX_LOCK_ONLY"));
	if ((infomask & (HEAP_XMAX_KEYSHR_LOCK | HEAP_XMAX_EXCL_LOCK)) ==
	    (HEAP_XMAX_KEYSHR_LOCK | HEAP_XMAX_EXCL_LOCK))
		json_array_append_new(f, json_string("XMAX_SHR_LOCK"));
	else if (infomask & HEAP_XMAX_KEYSHR_LOCK)
		json_array_append_new(f, json_string("XMAX_KEYSHR_LOCK"));
	else if (infomask & HEAP_XMAX_EXCL_LOCK)
		json_array_append_new(f, json_string("XMAX_EXCL_LOCK"));
	if (infomask2 & HEAP_KEYS_UPDATED)
		json_array_append_new(f, json_string("KEYS_UPDATED"));
	if (infomask & HEAP_UPDATED)
		json_array_append_new(f, json_string("UPDATED"));
	return f;
}

static json_int_t
counter(const json_t *sample, const char *table, const char *field)
{
	return json_integer_value(json_object_get(json_object_get(json_object_get(sample, "tables"),
	    table), field));
}

json_t *
rb_inspect_delta(const json_t *prev, const json_t *cur)
{
	double secs = json_real_value(json_object_get(cur, "at")) -
	    json_real_value(json_object_get(prev, "at"));
	double wal = json_real_value(json_object_get(cur, "wal_lsn_bytes")) -
	    json_real_value(json_object_get(prev, "wal_lsn_bytes"));
	json_int_t done = counter(cur, "relaybus_deliveries", "del") -
	    counter(prev, "relaybus_deliveries", "del");
	json_int_t lupd = counter(cur, "relaybus_lanes", "upd") - counter(prev, "relaybus_lanes", "upd");
	json_int_t lhot = counter(cur, "relaybus_lanes", "hot_upd") -
	    counter(prev, "relaybus_lanes", "hot_upd");
	json_int_t dupd = counter(cur, "relaybus_deliveries", "upd") -
	    counter(prev, "relaybus_deliveries", "upd");
	json_t *dead = json_object(), *av = json_object(), *v;
	const char *name;

	json_object_foreach(json_object_get((json_t *)cur, "tables"), name, v) {
		json_object_set_new(dead, name, json_integer(counter(cur, name, "dead")));
		json_object_set_new(av, name, json_integer(counter(cur, name, "autovacuum_count") -
		    counter(prev, name, "autovacuum_count")));
	}
	if (secs <= 0)
		secs = 1e-9;
	return json_pack("{s:f, s:I, s:f, s:I, s:o, s:I, s:I, s:o, s:I, s:o, s:o}",
	    "seconds", secs, "completed", done, "completed_per_sec", (double)done / secs,
	    "wal_bytes", (json_int_t)wal,
	    "wal_bytes_per_delivery", done > 0 ? json_real(wal / (double)done) : json_null(),
	    "lane_updates", lupd, "lane_hot_updates", lhot,
	    "lane_hot_share", lupd > 0 ? json_real((double)lhot / (double)lupd) : json_null(),
	    "delivery_updates", dupd, "dead_tuples", dead, "autovacuum_runs", av);
}
