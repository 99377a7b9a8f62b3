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
 * Adding a backend is one new folder, libcommon/<name>/ (libcommon/README.md),
 * whose top file defines `const struct rb_store_ops rb_store_<name>_ops`
 * and whose private headers no front file includes; one entry in backends[]
 * in store.c (with its extern declaration there); and one line in
 * Makefile.am (under the configure conditional of its client library, as
 * HAVE_MONGO is for libmongoc).  A backend whose client library should not
 * load in every program is a module instead: one entry in modules[] in
 * store.c and a pkglib_LTLIBRARIES in Makefile.am, as relaybus-mongo.so is
 * (it finds libcommon in the program, libcommon/module.dynlist).  Its
 * records go through rb_records.h, so that its delivery lines, validation
 * messages and error text are those of every backend.
 * What rb-dispatch needs of it: claim and complete (the front then offers
 * the face that does not wait over them), or that face's own slots
 * (claim_start, complete_start, pollfds, service: a backend that overlaps
 * its work); and extend, relinquish, relinquish_owner, listen, reconnect.
 */
#ifndef STORE_INT_H
#define STORE_INT_H

#include <stdarg.h>
#include <stddef.h>

#include "rb_admin.h"
#include "rb_inspect.h"
#include "rb_records.h"
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
	/* The server the connection reached, for messages (NULL: the URL). */
	void	(*server)(const struct rb_store *s, char *buf, size_t size);

	/* ---- set-up ------------------------------------------------------- */

	/* Create or upgrade the schema in one transaction, idempotent; o's
	 * subscriptions were checked with rb_subscription_parse by the caller
	 * or are checked here. */
	int	(*setup)(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err);
	/* The set-up as one script for schema (a valid identifier), without a
	 * store or a connection (rb-setup --print-sql): a new string, or NULL
	 * + err (a bad subscription: RB_EXIT_USAGE). */
	char	*(*setup_script)(const char *schema, const struct rb_setup_opts *o, struct rb_error *err);
	/* Record o's grants and revokes (rb-setup --grant, --revoke) and make
	 * them privileges; setup calls it in its transaction.  NULL: the
	 * backend knows no roles, and rb_store_setup refuses a set-up that
	 * grants or revokes (RB_EXIT_UNAVAILABLE) before changing anything. */
	int	(*grant)(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err);
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
	 * lease_ms, max_attempts >= 1): out receives a new array of n new
	 * rb_dl, each fetched (rb_dl_new, rb_dl_fill).  Returns n. */
	int	(*claim)(struct rb_store *s, const struct rb_claim_opts *o, struct rb_dl ***out,
		    struct rb_error *err);
	/* Apply n results in order (rb_store.h rb_store_complete): fills in
	 * each one's outcome, missing, attempts and sql_error (the front has
	 * reset them: LOST, false, -1, NULL). */
	int	(*complete)(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v,
		    size_t n, struct rb_error *err);
	/*
	 * The delivery path without waiting (rb_store_claim_start and the
	 * rest, rb_store.h).  What a backend has to report it pushes onto
	 * s->evq (rb_records.h), at once or from service; the front reports
	 * it.  A backend without claim_start and complete_start needs none of
	 * these: the front then runs claim and complete at once and reports
	 * them at the next rb_store_service, with no descriptor to poll.
	 * With them, the front's rb_store_claim and rb_store_complete are
	 * claim_start and complete_start with wait set, whose event (pushed
	 * last) the front takes off the queue, and claim and complete may be
	 * NULL.  Every other slot may be called while something started is
	 * out: a backend that needs the connection it is on takes that
	 * answer first (and pushes what it says).
	 */
	/* Start a claim (o checked by the front, and copied here if kept).
	 * wait: the caller waits for its answer (rb_store_claim): nothing is
	 * to run beside it, the backend may answer at once.  Pushes CLAIMED
	 * (then DELIVERED) or FAILED, now or from service.  -1 + err: nothing
	 * started, nothing pushed. */
	int	(*claim_start)(struct rb_store *s, const struct rb_claim_opts *o, bool wait,
		    struct rb_error *err);
	/* Start a completion of n results (their outcomes reset by the
	 * front; v the caller's until the COMPLETED or FAILED event that
	 * gives it back).  wait as for claim_start. */
	int	(*complete_start)(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v,
		    size_t n, bool wait, struct rb_error *err);
	/* Whether claim_start and complete_start (wait false) may be called
	 * now; NULL: always.  Cheap, no I/O. */
	bool	(*claim_ready)(const struct rb_store *s);
	bool	(*complete_ready)(const struct rb_store *s);
	/* The descriptors to poll into pfd (at most max), events set; lowers
	 * *timeout_ms (to 0: something to report already).  No I/O. */
	int	(*pollfds)(struct rb_store *s, struct pollfd *pfd, int max, int *timeout_ms);
	/* Read what has come, without waiting, and push an event for each
	 * thing done.  Called by the front when s->evq is empty. */
	void	(*service)(struct rb_store *s);
	/* Renew every lane of handler held by owner for lease_ms; lanes renewed. */
	int	(*extend)(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
		    struct rb_error *err);
	/* As extend, and from now on as plain leases: the liveness lock of
	 * this store no longer speaks for them (rb_store_extend_plain).
	 * NULL: extend (a backend without the lock). */
	int	(*extend_plain)(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
		    struct rb_error *err);
	/* Hand back owner's idle lanes of handler; lanes freed. */
	int	(*relinquish)(struct rb_store *s, const char *handler, const char *owner,
		    struct rb_error *err);
	/* Hand back (and fence) every lane of handler held by owner; lanes freed. */
	int	(*relinquish_owner)(struct rb_store *s, const char *handler, const char *owner,
		    struct rb_error *err);
	/* Hand back the lanes of n results (handler, lease.lane and
	 * lease.epoch) that still have that epoch and run nothing. */
	int	(*relinquish_leases)(struct rb_store *s, const struct rb_result *v, size_t n,
		    struct rb_error *err);
	/* Whether each of n results' deliveries is still in flight under its
	 * lease (rb_store_in_flight): live[i] for v[i].  Reads only. */
	int	(*in_flight)(struct rb_store *s, const struct rb_result *v, size_t n, bool *live,
		    struct rb_error *err);

	/* ---- wake-up ------------------------------------------------------ */

	/* Ask to be woken by new deliveries of s->schema for handler (NULL:
	 * any): the backend then pushes RB_STORE_WOKEN from service (the front's
	 * rb_store_notified waits for one over pollfds and service). */
	int	(*listen)(struct rb_store *s, const char *handler, struct rb_error *err);

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
	/* the most connections the caller allows (rb_store_set_connections),
	 * 1 to 3; 0: the backend's own setting */
	int	 connections;
	/* what is to be reported by rb_store_service, in order: the front's
	 * and the backend's events (rb_records.h); cleared by a reconnect */
	struct rb_evq evq;
	void	*be;		/* backend state */
};

#endif
