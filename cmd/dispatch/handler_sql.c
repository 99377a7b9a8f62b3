/* SPDX-License-Identifier: MIT */
/*
 * handler_sql.c: --sql, the handler that is a statement: it runs ($1 =
 * the delivery as JSON) in the transaction that completes the delivery
 * (rb_complete_opts.sql), so its writes and the deletion commit together
 * (effectively-once).  Nothing runs beside the dispatcher: a delivery's
 * result is ready as soon as it is started.
 */
#include "config.h"

#include "rb_store.h"

#include "dispatch.h"

/* Its result is a success at once: the statement runs ($1: the line
 * parsed, plus "ok": true), and commits or fails, in the transaction that
 * completes it (flush_results). */
static void
sql_start(struct dispatcher *dp, struct rb_dl *d, unsigned gen, struct chain *followers)
{
	queue_result(dp, d, verdict_ok(), gen, followers);
}

const struct handler_kind handler_sql = {
	.option = "--sql",
	.concurrency = 10, .batch = RB_DEFAULT_BATCH, .chain = 8,
	.at_once = true,
	.start = sql_start,
};
