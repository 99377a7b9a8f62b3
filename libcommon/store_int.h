/* SPDX-License-Identifier: MIT */
/*
 * store_int.h: PRIVATE to the store library.  The ops vtable every backend
 * fills in, and struct rb_store.  This is the only seam between the
 * programs and a backend: rb_store.h, rb_admin.h and rb_inspect.h are
 * front functions in store.c, each of which checks its slot and calls it.
 *
 * Conventions for every slot (as in rb_store.h): 0 or a count on success,
 * -1 with err filled (err->exit_code an RB_EXIT_* value, err->msg one line,
 * passwords redacted); json_t parameters are borrowed, json_t **
 * out-parameters receive a new reference (store.c has set them to NULL
 * before the call).  A slot may die on out-of-memory (xmalloc, rb_util.h)
 * and may log through rb_log.h, nothing else: it never exits or prints.
 *
 * A NULL slot means "not supported by this backend": the front answers
 * RB_EXIT_UNAVAILABLE, "<slot> not supported by the <name> backend", the
 * same way for every slot (NEED_OP in store.c).  Only name, schemes,
 * version, open and close are required.
 *
 * Adding a backend is one new file, libcommon/store_<name>.c, defining
 * `const struct rb_store_ops rb_store_<name>_ops`; one entry in backends[]
 * in store.c (with its extern declaration there); and one line in
 * Makefile.am (under the configure conditional of its client library, as
 * HAVE_MONGO is for libmongoc).  Its records go through rb_records.h, so that its delivery
 * lines, validation messages and error text are those of every backend.
 */
#ifndef STORE_INT_H
#define STORE_INT_H

#include <stdarg.h>
#include <stddef.h>

#include "rb_admin.h"
#include "rb_inspect.h"
#include "rb_store.h"

struct rb_store_ops {
	/* "postgresql": rb_store_backend(), and the <name> of the messages */
	const char		*name;
	/* NULL-terminated URL schemes this backend takes ("postgresql" takes
	 * postgresql://...); the first is the one shown to users.  The first
	 * backend of backends[] also takes a URL without a scheme and none at
	 * all (libpq conninfo and environment). */
	const char *const	*schemes;
	/* Write the client library's name and version ("libpq 15.18") into buf
	 * (len bytes, at least 64), for --version.  Needs no store. */
	void	(*version)(char *buf, size_t len);
	/* A copy of url fit for messages (a new string): every password the
	 * backend's client library would read in it masked.  Needs no store.
	 * NULL: rb_url_redact (userinfo and password= parameters). */
	char	*(*redact)(const char *url);

	/* ---- the store ---------------------------------------------------- */

	/* Connect.  s->url (NULL: the environment), s->schema (a valid
	 * identifier), s->app (the program name) are set; s->be is NULL and
	 * the slot sets it.  -1 + err, leaving s closable. */
	int	(*open)(struct rb_store *s, struct rb_error *err);
	/* Free s->be and everything behind it.  Must tolerate a half-opened
	 * store (open failed part-way; s->be may be NULL). */
	void	(*close)(struct rb_store *s);
	/* Drop the connection(s) and connect again; anything in flight is
	 * forgotten (LISTEN is restored). */
	int	(*reconnect)(struct rb_store *s, struct rb_error *err);
	/* True when the connection is known to be broken (cheap: no I/O). */
	bool	(*broken)(const struct rb_store *s);

	/* ---- set-up ------------------------------------------------------- */

	/* Create or upgrade the schema in one transaction, idempotent; o's
	 * subscriptions were checked with rb_subscription_parse by the caller
	 * or are checked here. */
	int	(*setup)(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err);
	/* The set-up as one script for schema (a valid identifier), without a
	 * store or a connection (rb-setup --print-sql): a new string, or NULL
	 * + err (a bad subscription: RB_EXIT_USAGE). */
	char	*(*setup_script)(const char *schema, const struct rb_setup_opts *o, struct rb_error *err);
	/* What s->schema holds (rb_store_schema_info, rb-setup --check, and
	 * every other program once at start through rb_cli_open): info (not
	 * zeroed by the front) receives the state, the version found (0 when
	 * none, or relaybus 0.1.0's tables) and expected = RB_SCHEMA_VERSION.
	 * A schema that is not set up, or is 0.1.0's, is a state, not an
	 * error: -1 only when the question could not be asked.  Cheap: one
	 * query on the happy path, and it must not abort a transaction the
	 * caller has open. */
	int	(*schema_info)(struct rb_store *s, struct rb_schema_info *info, struct rb_error *err);

	/* ---- the delivery path -------------------------------------------- */

	/* Publish n events, events_json the text of a JSON array of them that
	 * passed rb_event_validate, in one transaction.  Fills acks (zeroed by
	 * the front) with n acks in order; their strings live in acks->priv,
	 * freed by acks->free_priv (rb_publish_acks_clear). */
	int	(*publish)(struct rb_store *s, const char *events_json, size_t n,
		    struct rb_publish_acks *acks, struct rb_error *err);
	/* Claim (o checked by the front: handler and owner valid, batch,
	 * lease_ms, max_attempts >= 1): deliveries receives a new array of
	 * delivery objects (rb_delivery_object).  Returns how many. */
	int	(*claim)(struct rb_store *s, const struct rb_claim_opts *o, json_t **deliveries,
		    struct rb_error *err);
	/* rb_store_claim_send/recv (rb_store.h): send the claim, collect it
	 * later (wait false: RB_CLAIM_PENDING until it arrived); recv gives a
	 * new array of new rb_dl (rb_dl_new/rb_dl_fill), the caller's. */
	int	(*claim_send)(struct rb_store *s, const struct rb_claim_opts *o, struct rb_error *err);
	int	(*claim_recv)(struct rb_store *s, bool wait, struct rb_dl ***deliveries,
		    struct rb_error *err);
	/* rb_store_fetch_send/recv/socket: read the events of n deliveries a
	 * claim took with o->apart (the array and its rb_dl stay the caller's
	 * and outlive the fetch); recv fills them in (rb_dl_fill). */
	int	(*fetch_send)(struct rb_store *s, struct rb_dl *const *claimed, size_t n, bool line_text,
		    struct rb_error *err);
	int	(*fetch_recv)(struct rb_store *s, bool wait, struct rb_error *err);
	/* the socket to poll while a fetch is out, else -1 (no error) */
	int	(*fetch_socket)(const struct rb_store *s);
	/* rb_store_complete_send/recv/socket: complete n successes in one
	 * statement, collected later; v and its rb_dl stay the caller's and
	 * outlive it; recv writes n RB_DL_* into outcome (n bytes). */
	int	(*complete_send)(struct rb_store *s, struct rb_dl *const *v, size_t n, bool apart,
		    struct rb_error *err);
	int	(*complete_recv)(struct rb_store *s, bool wait, unsigned char *outcome,
		    struct rb_error *err);
	/* the socket to poll while a completion is out apart, else -1 */
	int	(*complete_socket)(const struct rb_store *s);
	/* Apply results (an array that passed rb_result_validate, one object
	 * each): outcomes receives a new array, one object per result in
	 * order (rb_store.h rb_store_complete). */
	int	(*complete)(struct rb_store *s, const struct rb_complete_opts *o, const json_t *results,
		    json_t **outcomes, struct rb_error *err);
	/* Renew every lane of handler held by owner for lease_ms; lanes renewed. */
	int	(*extend)(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
		    struct rb_error *err);
	/* Hand back owner's idle lanes of handler; lanes freed. */
	int	(*relinquish)(struct rb_store *s, const char *handler, const char *owner,
		    struct rb_error *err);
	/* Hand back (and fence) every lane of handler held by owner; lanes freed. */
	int	(*relinquish_owner)(struct rb_store *s, const char *handler, const char *owner,
		    struct rb_error *err);
	/* Hand back the lanes of leases ([{"handler", "lease"}], malformed
	 * ones skipped) that still have that epoch and run nothing. */
	int	(*relinquish_leases)(struct rb_store *s, const json_t *leases, struct rb_error *err);

	/* ---- wake-up ------------------------------------------------------ */

	/* Ask to be woken by new deliveries of s->schema (any handler). */
	int	(*listen)(struct rb_store *s, struct rb_error *err);
	/* The connection's socket for poll(2), -1 when there is none. */
	int	(*socket)(const struct rb_store *s);
	/* Consume wake-ups (timeout_ms > 0: wait that long first): 1 when one
	 * for handler (NULL: any) came, 0 if none, -1 on error. */
	int	(*notified)(struct rb_store *s, const char *handler, int timeout_ms,
		    struct rb_error *err);

	/* ---- rb_admin.h: the front has set the out-parameter to NULL ------ */

	int	(*admin_stats)(struct rb_store *s, json_t **stats, struct rb_error *err);
	/* f->status is checked here (RB_EXIT_USAGE for an unknown word) */
	int	(*admin_list)(struct rb_store *s, const struct rb_admin_filter *f, json_t **rows,
		    struct rb_error *err);
	/* *event stays NULL (return 0) when there is no such event */
	int	(*admin_show)(struct rb_store *s, const char *event_id, json_t **event,
		    struct rb_error *err);
	int	(*admin_apply)(struct rb_store *s, enum rb_admin_action action, const json_t *targets,
		    const char *reason, json_t **outcomes, struct rb_error *err);
	int	(*admin_purge)(struct rb_store *s, enum rb_admin_purge kind, int64_t older_than_ms,
		    int batch, struct rb_error *err);
	/* rb_admin_purge_keys: one batch of key counters after *after (NULL:
	 * the first); *after (the caller's, free()) is freed and replaced by
	 * the last key looked at, NULL after the last.  Returns how many were
	 * deleted. */
	int	(*admin_purge_keys)(struct rb_store *s, char **after, int batch, struct rb_error *err);
	int	(*admin_lanes)(struct rb_store *s, const char *handler, bool all, json_t **rows,
		    struct rb_error *err);
	int	(*admin_subscriptions)(struct rb_store *s, const char *handler, json_t **rows,
		    struct rb_error *err);

	/* ---- rb_inspect.h ------------------------------------------------- */

	/* The lifecycle of rb_inspect_lifecycle on s, a store the front opened
	 * for the run on a scratch schema that does not exist yet (s->schema,
	 * rb_inspect_[base_]PID): create it, run, report, drop it (also on
	 * error and when o->stop is set). */
	int	(*inspect_lifecycle)(struct rb_store *s, const struct rb_inspect_opts *o, json_t **report,
		    struct rb_error *err);
	/* One sample of s->schema's counters (rb_inspect_sample). */
	int	(*inspect_sample)(struct rb_store *s, json_t **sample, struct rb_error *err);
};

struct rb_store {
	const struct rb_store_ops *ops;
	char	*url;		/* as given; NULL = environment */
	char	*url_redacted;
	char	*schema;	/* validated identifier */
	char	*app;
	void	*be;		/* backend state */
};

#endif
