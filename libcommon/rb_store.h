/* SPDX-License-Identifier: MIT */
/*
 * rb_store.h: the store library's public interface.  Programs include this
 * and <jansson.h>; they never see libpq types and never write SQL.
 *
 * Conventions: functions return 0 (or a count) on success and -1 on error
 * with err filled (err->exit_code is an RB_EXIT_* value, err->msg one line
 * without a final period, passwords redacted).  json_t parameters are
 * borrowed; json_t ** out-parameters receive a new reference.  The library
 * never exits but on out-of-memory (xmalloc, rb_util.h), and prints only
 * through rb_log.h (the server's notices, as diagnostics).
 */
#ifndef RB_STORE_H
#define RB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct rb_store;

struct rb_error {
	int	exit_code;
	char	msg[512];
};

#define RB_DEFAULT_SCHEMA	"public"
#define RB_DEFAULT_LEASE_MS	30000
#define RB_DEFAULT_MAX_ATTEMPTS	10
#define RB_DEFAULT_BATCH	100

/**
 * Open a store.  url: a postgres:// or postgresql:// URL, a libpq conninfo
 * string, or NULL/"" for $RELAYBUS_URL, else libpq's PG* environment.
 * schema: NULL for $RELAYBUS_SCHEMA, else "public".  app: the program name,
 * shown in pg_stat_activity.  Returns NULL with err filled.  Each store is
 * a lane holder of its own (a random id, kept across rb_store_reconnect):
 * claims, rb_store_extend, rb_store_relinquish and _relinquish_owner act
 * on the lanes held under the owner name AND this holder, so a process
 * restarted under its predecessor's owner name does not adopt its lanes
 * (it takes them over once their lease expired, as any claimer would).
 */
struct rb_store	*rb_store_open(const char *url, const char *schema, const char *app,
		    struct rb_error *err);
void		 rb_store_close(struct rb_store *);
const char	*rb_store_backend(const struct rb_store *);
/** The backends of this build and their client libraries, for --version:
 * "postgresql; libpq 15.18" (names, then versions).  New string. */
char		*rb_store_backends(void);
const char	*rb_store_schema(const struct rb_store *);
/** The URL with any password masked (for messages). */
const char	*rb_store_url_redacted(const struct rb_store *);
/**
 * A copy of url (NULL: the environment) fit for messages, without a store:
 * every password masked the way the backend its scheme picks reads it
 * (libpq's own parser for PostgreSQL URLs and conninfo strings).  New string.
 */
char		*rb_store_redact(const char *url);
/** Drop and re-establish the connection (after a restart of the server). */
int		 rb_store_reconnect(struct rb_store *, struct rb_error *);
/** True when the connection is known to be broken. */
bool		 rb_store_broken(const struct rb_store *);

/* ---- set-up ---------------------------------------------------------- */

struct rb_setup_opts {
	bool		 completion_history;	/* create relaybus_completions */
	const char	*const *subscribe;	/* "handler:pattern", n_subscribe of them */
	size_t		 n_subscribe;
	const char	*const *unsubscribe;
	size_t		 n_unsubscribe;
	const char	*const *grant;		/* "KIND=ROLE[:HANDLER,...]" (rb_grant_parse), n_grant of them */
	size_t		 n_grant;
	const char	*const *revoke;		/* the same, to take back */
	size_t		 n_revoke;
};

/** Validate "handler:pattern"; on success split it (pointers into a copy in *buf, caller frees *buf). */
int	rb_subscription_parse(const char *spec, char **buf, const char **handler,
	    const char **pattern, struct rb_error *err);
/**
 * Validate "KIND=ROLE[:HANDLER,...]" (KIND publisher, worker, handler or
 * admin; handlers only for worker and handler) and split it: pointers into
 * a copy in *buf (caller frees *buf); *handlers NULL when none are named
 * (every handler), else a "{h1,h2}" text[] literal.
 */
int	rb_grant_parse(const char *spec, char **buf, const char **kind, const char **role,
	    const char **handlers, struct rb_error *err);
/**
 * The set-up as one script (rb-setup --print-sql), from the backend url
 * picks (as rb_store_open: NULL for $RELAYBUS_URL, no URL or a conninfo
 * string for PostgreSQL) for schema (as rb_store_open: NULL for
 * $RELAYBUS_SCHEMA, else "public"), without connecting.  A new string,
 * the caller's; NULL + err on bad input or a backend that has no script.
 */
char	*rb_store_setup_script(const char *url, const char *schema, const struct rb_setup_opts *,
	    struct rb_error *err);
/** Create or upgrade the schema in one transaction under an advisory lock; idempotent. */
int	rb_store_setup(struct rb_store *, const struct rb_setup_opts *, struct rb_error *err);

/* ---- schema versions ------------------------------------------------ */

/** The schema version this relaybus writes (rb-setup) and understands. */
#define RB_SCHEMA_VERSION	1

enum rb_schema_state {
	RB_SCHEMA_ABSENT,	/* not set up */
	RB_SCHEMA_010,		/* the tables of relaybus 0.1.0: rb-setup upgrades them */
	RB_SCHEMA_OLDER,	/* an older version: rb-setup upgrades it */
	RB_SCHEMA_CURRENT,	/* RB_SCHEMA_VERSION */
	RB_SCHEMA_NEWER,	/* set up by a newer relaybus */
};

struct rb_schema_info {
	enum rb_schema_state	state;
	int			installed;	/* the version found; 0 when none (or 0.1.0) */
	int			expected;	/* RB_SCHEMA_VERSION */
};

/** What the store's schema holds: one query on the happy path. */
int	rb_store_schema_info(struct rb_store *, struct rb_schema_info *, struct rb_error *err);
/**
 * 0 when info says the schema is current; else -1 with err: RB_EXIT_CONFIG
 * (not set up), RB_EXIT_UPGRADE (run rb-setup) or RB_EXIT_PROTOCOL (newer),
 * and a one-line message naming the schema and both versions.
 */
int	rb_schema_problem(const char *schema, const struct rb_schema_info *, struct rb_error *err);
/** rb_store_schema_info, then rb_schema_problem: every program but rb-setup, at start. */
int	rb_store_require_schema(struct rb_store *, struct rb_error *err);

/* ---- publish --------------------------------------------------------- */

/**
 * Check one event object against the JSON-lines contract (DESIGN.md):
 * name (string, required), payload (any, required), id (or its alias
 * event_id: the same value if both are given), key (strings), headers
 * (object), delay_ms (integer >= 0) or available_at (RFC 3339 string),
 * handlers (array of handler names); any other field is an error.
 * Returns 0, or -1 with a reason in err->msg ("missing field 'name'").
 */
int	rb_event_validate(const json_t *event, struct rb_error *err);
/** A validated event's "event_id" becomes its "id"; true when event changed. */
bool	rb_event_id_alias(json_t *event);

/**
 * Publish events (a JSON array of validated event objects) in one
 * transaction.  acks receives one object per event, in order:
 * {"event_id", "deliveries": n, "duplicate": bool, "handlers": [...]} where
 * handlers are those that got a new delivery.  All or nothing.
 */
int	rb_store_publish(struct rb_store *, const json_t *events, json_t **acks,
	    struct rb_error *err);

/** One event's outcome, as rb_store_publish_text returns it. */
struct rb_publish_ack {
	const char	*id;
	int		 deliveries;	/* new deliveries */
	bool		 duplicate;	/* the id existed already */
	const char	*handlers;	/* compact JSON array of the handlers that got one */
};

struct rb_publish_acks {
	size_t			 n;
	struct rb_publish_ack	*v;	/* n of them, in input order */
	void			*priv;	/* the backend's storage behind the strings */
	void			(*free_priv)(void *);
};

/**
 * rb_store_publish for events already serialized: events_json is the text
 * of a JSON array of n events that passed rb_event_validate (rb-publish
 * joins its input lines, so nothing is parsed and printed again).  The
 * acks' strings stay valid until rb_publish_acks_clear.
 */
int	rb_store_publish_text(struct rb_store *, const char *events_json, size_t n,
	    struct rb_publish_acks *acks, struct rb_error *err);
void	rb_publish_acks_clear(struct rb_publish_acks *);
/** The acks as JSON: [{"event_id", "deliveries", "duplicate", "handlers": [...]}, ...]. */
json_t	*rb_publish_acks_json(const struct rb_publish_acks *);

/* ---- the delivery path ----------------------------------------------- */

struct rb_claim_opts {
	const char	*handler;
	const char	*owner;		/* lease owner name, unique per worker (with the store's holder) */
	int		 batch;		/* at most this many deliveries */
	int64_t		 lease_ms;
	int		 max_attempts;	/* a takeover buries a delivery reaching this */
	/* the delivery ids the caller still runs (claimed, not yet completed or
	 * failed), if it knows them: the claim then need not look them up.
	 * NULL: unknown.  Never leave one out (a superset is harmless). */
	const int64_t	*live;
	size_t		 n_live;
	/* their lanes, element by element, or NULL: a held lane then gets no
	 * more than fills it to 32 in flight (relaybus_claim_ids) */
	const int	*live_lanes;
	/* do not look for more lanes unless none is held (relaybus_claim's
	 * p_search): the last look found too few, and nothing woke us since */
	bool		 no_search;
	/* take up to this many deliveries of one key at once (0 or 1: only the
	 * head of each key).  They come in sequence order; the caller must run
	 * each only after the previous one's completion committed, or, with
	 * chain_early, once the previous one succeeded on its first attempt
	 * (attempt 1).  A takeover charges what may have run under that rule:
	 * of a key's deliveries in flight, the first still pending, and (early)
	 * those after it as long as every one before them is on its first
	 * attempt. */
	int		 chain;
	bool		 chain_early;
	/* each delivery carries its line, newline-terminated, as the string
	 * member RB_LINE_TEXT_KEY instead of "payload" and "headers" (which
	 * are then not parsed at all) */
	bool		 line_text;
	/* claim only: rb_store_claim_recv's deliveries come without their
	 * events (not fetched), for rb_store_fetch_send */
	bool		 apart;
};
#define RB_LINE_TEXT_KEY	"_line"

/*
 * A claimed delivery as rb-dispatch carries it through the two-step calls
 * (rb_store_claim_recv, rb_store_fetch_*, rb_store_complete_send): plain
 * fields in one allocation, its line as text, and no JSON object unless
 * one is asked for (a dispatcher spent most of its time building,
 * copying and freeing objects of eight members).  Free with rb_dl_free.
 */
struct rb_dl {
	int64_t		 id;		/* delivery_id */
	int64_t		 epoch, claims;
	int		 lane;
	int		 attempt;	/* this attempt: attempts so far + 1 */
	const char	*event_id, *handler;
	const char	*sequence;	/* as text; NULL: none */
	const char	*created_at;
	char		 lease[64];	/* lane:epoch:claims */
	bool		 fetched;	/* key and text (or line) are there */
	const char	*key;		/* NULL: none */
	const char	*text;		/* its line, newline-terminated (line_text) ... */
	size_t		 tlen;
	json_t		*line;		/* ... or the delivery object (line_text false) */
	char		*mem;		/* (what key and text point into) */
};
void	rb_dl_free(struct rb_dl *);
/**
 * The delivery as a result object to complete (rb_store_complete): its
 * line as an object (a shallow copy, without RB_LINE_TEXT_KEY) when it has
 * one, else the members a completion reads (event_id, handler, key,
 * attempt, lease, delivery_id, lane).
 */
json_t	*rb_dl_result(const struct rb_dl *);


/**
 * Claim due deliveries in one short transaction (the seed's "Lane
 * leases").  deliveries receives an array of delivery objects (DESIGN.md
 * "delivery out", plus "delivery_id", "lane", "sequence").  Returns the
 * number claimed, or -1.
 */
int	rb_store_claim(struct rb_store *, const struct rb_claim_opts *, json_t **deliveries,
	    struct rb_error *err);

/**
 * rb_store_claim in two steps, so that a program can serve its handlers
 * while the database works on the claim: send it, then collect it when
 * the store's socket is readable (or waiting).  While a claim is out, the
 * store takes no other call but rb_store_notified and rb_store_socket.
 * recv returns the number claimed (the deliveries, as rb_dl, in an array
 * the caller frees with them), -1, or RB_CLAIM_PENDING when wait is false
 * and the answer has not arrived.  A deadlock or serialization failure is
 * retried, as rb_store_claim does.
 */
#define RB_CLAIM_PENDING (-2)
int	rb_store_claim_send(struct rb_store *, const struct rb_claim_opts *, struct rb_error *err);
int	rb_store_claim_recv(struct rb_store *, bool wait, struct rb_dl ***deliveries, struct rb_error *err);

/**
 * Read the events of the n deliveries that a claim sent with
 * rb_claim_opts.apart took, on a second connection of the store's (opened
 * on first use, closed with the first), so that reading the events runs
 * beside the next claim instead of inside it.  One at a time; the array
 * and the deliveries stay the caller's and must outlive the fetch.  recv
 * fills in each one's key and text (line_text) or line, and sets fetched
 * (not for one whose event is gone); it returns the number fetched, -1, or
 * RB_CLAIM_PENDING.  rb_store_fetch_socket: the socket to poll while one
 * is out, else -1.
 */
int	rb_store_fetch_send(struct rb_store *, struct rb_dl *const *claimed, size_t n, bool line_text,
	    struct rb_error *err);
int	rb_store_fetch_recv(struct rb_store *, bool wait, struct rb_error *err);
int	rb_store_fetch_socket(const struct rb_store *);

/**
 * Complete n deliveries that all succeeded (no --sql) in two steps, as the
 * claim (rb_store_claim_send): one statement, sent now, its outcomes
 * collected later.  The array and the deliveries stay the caller's and
 * must outlive it.  While it is out the store takes no other call but
 * rb_store_notified and rb_store_socket.  recv returns 0 with an outcome
 * per delivery in outcome[] (RB_DL_*), -1, or RB_CLAIM_PENDING.  apart: on
 * a third connection of the store's (opened on first use, closed with the
 * first), so that it runs beside a claim, and the store takes every other
 * call meanwhile but another completion; rb_store_complete_socket is then
 * the socket to poll for its answer (else -1).
 */
enum { RB_DL_LOST, RB_DL_COMPLETED, RB_DL_MISSING /* lost, and the delivery is gone */ };
int	rb_store_complete_send(struct rb_store *, struct rb_dl *const *v, size_t n, bool apart,
	    struct rb_error *err);
int	rb_store_complete_recv(struct rb_store *, bool wait, unsigned char *outcome, struct rb_error *err);
int	rb_store_complete_socket(const struct rb_store *);
/** Whether a result completes its delivery (ok, not released, not dead). */
bool	rb_result_completes(const json_t *result);

/** Renew the lease of every lane held by owner for handler.  Returns lanes renewed, or -1. */
int	rb_store_extend(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *err);

struct rb_backoff {
	int64_t	base_ms;	/* first retry after this */
	int64_t	max_ms;		/* never more than this */
	double	factor;		/* multiplied per attempt */
};

struct rb_complete_opts {
	int			max_attempts;	/* a failure reaching this buries */
	struct rb_backoff	backoff;
	const char		*sql;		/* run per ok delivery in its completing transaction, $1 = delivery JSON */
};

/**
 * Apply results (a JSON array of objects: a delivery line plus ok, error,
 * retry_ms, dead, release).  ok (default true) completes (deletes, fenced);
 * a failure reschedules with backoff or buries at max_attempts; dead buries
 * now; release gives the delivery back without charging an attempt.
 * Every element must carry event_id, handler and a well-formed lease
 * (check with rb_result_validate first).  outcomes receives one object per
 * result, in order: {"event_id", "handler", "outcome"} with outcome one of
 * completed, rescheduled, buried, released, lost (plus "error" when --sql
 * failed, and "missing": true when the delivery no longer exists).
 */
int	rb_store_complete(struct rb_store *, const struct rb_complete_opts *, const json_t *results,
	    json_t **outcomes, struct rb_error *err);
/** Check a result line's fields; -1 with a reason in err->msg. */
int	rb_result_validate(const json_t *result, struct rb_error *err);

/** Hand back every lane of handler held by owner that runs nothing.  Returns lanes freed, or -1. */
int	rb_store_relinquish(struct rb_store *, const char *handler, const char *owner,
	    struct rb_error *err);
/**
 * Hand back every lane of handler held by owner, whatever is in flight
 * there (a new epoch fences those leases; the deliveries stay pending, no
 * attempt charged).  For an owner name whose deliveries the caller no
 * longer runs, such as the name before a reconnect: a claim that
 * committed but whose answer was lost with the connection would otherwise
 * hold its lanes until the lease ends.  Returns lanes freed, or -1.
 */
int	rb_store_relinquish_owner(struct rb_store *, const char *handler, const char *owner,
	    struct rb_error *err);
/**
 * Hand back the lanes named by leases (array of {"handler", "lease"}) when
 * they still have that epoch and run nothing.  Returns lanes freed, or -1.
 */
int	rb_store_relinquish_leases(struct rb_store *, const json_t *leases, struct rb_error *err);

/* ---- wake-up --------------------------------------------------------- */

/** LISTEN for new deliveries of this schema (any handler). */
int	rb_store_listen(struct rb_store *, struct rb_error *err);
/** The connection's socket, for poll(2); -1 when not connected. */
int	rb_store_socket(const struct rb_store *);
/**
 * Consume pending notifications after the socket became readable (or with
 * timeout_ms > 0, wait up to that long).  Returns 1 when a notification for
 * handler (NULL: any) arrived, 0 if none, -1 on error.
 */
int	rb_store_notified(struct rb_store *, const char *handler, int timeout_ms,
	    struct rb_error *err);

#endif
