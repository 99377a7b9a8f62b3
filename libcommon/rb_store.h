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
/* the longest wait between two reconnect attempts (rb-dispatch, rb-publish
 * --reconnect): a refused connection costs nothing, and a server back
 * from an outage is reached within about this long (issue 25 item 2) */
#define RB_RECONNECT_MAX_MS	500

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
/**
 * Drop and re-establish the connection (after a restart of the server, a
 * failover).  On PostgreSQL the server reached is compared with the one the
 * store had (relaybus(7), HA AND FAILOVER): another cluster, an older
 * timeline or, after a primary, a standby is refused (RB_EXIT_UNAVAILABLE,
 * after the URL's other hosts were tried); a newer timeline is logged.
 */
int		 rb_store_reconnect(struct rb_store *, struct rb_error *);
/** The server the store's connection reached ("host:port"), for messages;
 * the redacted URL when the backend does not say. */
void		 rb_store_server(const struct rb_store *, char *buf, size_t size);
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
	/* the latest a publish may make an event due, from now (ms;
	 * 0: keep the schema's setting, 30 days when new) */
	int64_t		 max_delay_ms;
	/* rb_store_setup_script: without BEGIN and COMMIT, for a migration
	 * tool that runs each file in a transaction of its own */
	bool		 no_transaction;
	/* how long to wait for the set-up lock (another set-up, or any
	 * session holding its advisory key): 0 the default (10 s), < 0 for
	 * ever; then exit 75 naming the session that holds it */
	int64_t		 lock_timeout_ms;
};

/** Validate "handler:pattern"; on success split it (pointers into a copy in *buf, caller frees *buf). */
int	rb_subscription_parse(const char *spec, char **buf, const char **handler,
	    const char **pattern, struct rb_error *err);
/**
 * Validate "KIND=ROLE[:HANDLER,...]" (KIND publisher, worker, handler or
 * admin; handlers for all but admin) and split it: pointers into
 * a copy in *buf (caller frees *buf); *handlers NULL when none are named
 * (every handler), else a "{h1,h2}" text[] literal (a handler named
 * NULL, in any case, quoted: the name, not the SQL null).
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
	/* the deliveries the caller still runs (claimed, not yet completed or
	 * failed), if it knows them: their ids, and their lanes element by
	 * element (or NULL).  The claim then need not look them up, and a held
	 * lane gets no more than fills it to 32 in flight.  NULL: unknown.
	 * Never leave one out (a superset is harmless). */
	const int64_t	*live;
	size_t		 n_live;
	const int	*live_lanes;
	/* take only from the lanes the owner holds already, and look for no
	 * more: the caller's last claim that looked found fewer than it asked
	 * for, and nothing woke it since (a cheaper claim) */
	bool		 held_only;
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
	/* a long-lived holder (rb-dispatch, rb-claim --follow): PostgreSQL
	 * keeps a session lock of this process's holder on the connection,
	 * taken again after every reconnect, so that another claimer can take
	 * the lanes over about 1.5 s after this process died instead of when
	 * their lease ends.  Not for a claim whose deliveries are completed by
	 * another process after it exits (rb-claim | ... | rb-complete), but
	 * while it runs: such a claimer turns its leases into plain ones
	 * before it exits (rb_store_extend_plain).  Ignored by MongoDB. */
	bool		 liveness;
	/* a long-lived claimer (rb-dispatch, rb-claim --follow): PostgreSQL
	 * keeps claim cursors between its claims, so that a claim under a
	 * held snapshot does not walk every delivery completed since
	 * (relaybus(7), "Claim cursors"; RELAYBUS_PG_RESCAN).  Ignored by
	 * MongoDB. */
	bool		 cursors;
	/* rb_store_claim: when not NULL, receives the CLAIMED event's
	 * retry_ms (below: when a lane another holder's cut lease frees may
	 * be taken over; 0 none known) */
	int64_t		*retry_ms;
};
#define RB_LINE_TEXT_KEY	"_line"

#ifndef RB_LEASE_DEFINED
#define RB_LEASE_DEFINED
/* A lane lease, as integers; its token "lane:epoch:claims" is how the JSON
 * lines spell it (also in rb_util.h, the same, since both stand alone). */
struct rb_lease {
	int	lane;		/* 0..255 */
	int64_t	epoch;		/* >= 0 */
	int64_t	claims;		/* >= 0 */
};
#endif

/*
 * A claimed delivery: plain fields in one allocation and its line as text
 * (the JSON line of DESIGN.md "delivery out", as the store spelled it),
 * no JSON object (a dispatcher spent most of its time building, copying
 * and freeing objects of eight members).  The lease is integers; its
 * token ("lane:epoch:claims") exists only in the line.  Free with
 * rb_dl_free.
 */
struct rb_dl {
	int64_t		 id;		/* delivery_id */
	struct rb_lease	 lease;
	uint64_t	 addr;		/* where the claim read its row (a backend's own
					 * address, for the completion; 0: not known) */
	int		 attempt;	/* this attempt: attempts so far + 1 */
	const char	*event_id, *handler;
	const char	*sequence;	/* as text; NULL: none */
	const char	*created_at;
	bool		 fetched;	/* key and text are there */
	const char	*key;		/* NULL: none */
	const char	*text;		/* its line, newline-terminated */
	size_t		 tlen;
	char		*mem;		/* (what key and text point into) */
};
void	rb_dl_free(struct rb_dl *);
/**
 * d failed and was kept in flight (rb_result.kept) with attempts recorded:
 * it becomes the next attempt, its lease's claims one up, its line said
 * again with both (the rest of the line as it was).
 */
void	rb_dl_again(struct rb_dl *d, int attempts);

/* What the handler said of an attempt. */
enum rb_verdict {
	RB_VERDICT_OK,		/* done: complete it (delete, fenced by the lease) */
	RB_VERDICT_FAIL,	/* failed: retry with backoff, or bury at max_attempts */
	RB_VERDICT_DEAD,	/* failed for good: bury now */
	RB_VERDICT_RELEASE,	/* not run: give it back, no attempt charged */
	RB_VERDICT_DONE,	/* "completed": true: the handler completed it itself, in its own
				 * transaction (relaybus_complete); verified (the delivery is
				 * gone), never completed again */
};

/* What a completion did with a result.  rb_outcome_name: the word of the JSON lines. */
enum rb_outcome {
	RB_OUTCOME_COMPLETED,
	RB_OUTCOME_RESCHEDULED,
	RB_OUTCOME_BURIED,
	RB_OUTCOME_RELEASED,
	RB_OUTCOME_LOST,	/* the lease was taken over: nothing applied */
};
#define RB_NOUTCOMES	5
/** "completed", "rescheduled", "buried", "released", "lost". */
const char	*rb_outcome_name(enum rb_outcome);
/** The outcome of a name; RB_OUTCOME_LOST for anything else. */
enum rb_outcome	 rb_outcome_of(const char *name);

/*
 * A result to complete: the delivery it is for, the verdict, and (filled
 * in by the completion) the outcome.  The strings are borrowed and must
 * outlive the completion.
 */
struct rb_result {
	const char	*event_id, *handler;
	struct rb_lease	 lease;
	int64_t		 delivery_id;	/* 0: not known (found by event_id and handler) */
	uint64_t	 addr;		/* rb_dl.addr (0: not known: found by delivery_id) */
	enum rb_verdict	 verdict;
	const char	*error;		/* why it failed; NULL: "handler failed" (no reason for OK) */
	int64_t		 retry_ms;	/* FAIL: retry after this; < 0: the backoff's delay */
	bool		 keep;		/* FAIL: when its retry is due at once, keep it in flight
					 * under this lease (kept), to run it again without a claim */
	/* rb_complete_opts.sql: the result as JSON text, $1 of the statement */
	const char	*json;
	/* ---- the outcome ---- */
	enum rb_outcome	 outcome;
	bool		 missing;	/* lost, and the delivery no longer exists */
	bool		 by_handler;	/* completed by the handler (relaybus_complete): its line
					 * said so, or its delivery was found gone while the lease
					 * still held (the handler committed, its answer was lost) */
	int		 attempts;	/* a failure's attempts so far, as recorded; -1: not told */
	bool		 kept;		/* RESCHEDULED, and (keep) still in flight under the lease,
					 * its claims one up: run it again (rb_dl_again); a store
					 * that cannot keep one would leave it false (both can) */
	char		*sql_error;	/* the sql statement failed (the result then took the
					 * failure path): why, a new string the caller frees */
};
/** A result for d (pointers into d, which must outlive it), retry_ms -1. */
struct rb_result rb_result_of(const struct rb_dl *d, enum rb_verdict);
/**
 * A result line (a delivery line plus ok, error, retry_ms, dead, release)
 * as a result: checked (rb_result_validate), then its fields, borrowed
 * from line.  -1 with a reason in err->msg.
 */
int	rb_result_parse(const json_t *line, struct rb_result *out, struct rb_error *err);
/**
 * Only the verdict of a result line (ok, dead, release, retry_ms, error:
 * checked as rb_result_validate checks them) into out's verdict, error
 * and retry_ms, the rest of out left as it is.  -1 with a reason.
 */
int	rb_result_verdict(const json_t *line, struct rb_result *out, struct rb_error *err);
/** Check a result line's fields; -1 with a reason in err->msg. */
int	rb_result_validate(const json_t *result, struct rb_error *err);

/**
 * Claim due deliveries in one short transaction (the seed's "Lane
 * leases").  deliveries receives a new array of the deliveries (fetched:
 * each with its line), the array and them the caller's.  Returns the
 * number claimed, or -1.
 */
int	rb_store_claim(struct rb_store *, const struct rb_claim_opts *, struct rb_dl ***deliveries,
	    struct rb_error *err);

/** Renew the lease of every lane held by owner for handler.  Returns lanes renewed, or -1. */
int	rb_store_extend(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *err);

/**
 * The same, and from now on as plain leases: the liveness lock of this
 * store (rb_claim_opts.liveness) no longer speaks for its lanes, so they
 * stay owner's until the lease ends, even after this process exits.  For a
 * long-lived claimer whose deliveries another process completes (rb-claim
 * --follow), before it exits.  Returns lanes renewed, or -1.
 */
int	rb_store_extend_plain(struct rb_store *, const char *handler, const char *owner, int64_t lease_ms,
	    struct rb_error *err);

struct rb_backoff {
	int64_t	base_ms;	/* first retry after this */
	int64_t	max_ms;		/* never more than this */
	double	factor;		/* multiplied per attempt */
};

struct rb_complete_opts {
	int			max_attempts;	/* a failure reaching this buries */
	struct rb_backoff	backoff;
	const char		*sql;		/* run per ok delivery in its completing transaction,
						 * $1 = the result's json */
};

/**
 * Apply n results in order: OK completes (deletes, fenced by the lease);
 * FAIL reschedules with backoff or buries at max_attempts; DEAD buries
 * now; RELEASE gives the delivery back without charging an attempt.
 * Fills in each one's outcome, missing, attempts and sql_error (when
 * o->sql failed: the result then takes the failure path).
 */
int	rb_store_complete(struct rb_store *, const struct rb_complete_opts *, struct rb_result *v, size_t n,
	    struct rb_error *err);

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
 * Hand back the lanes of n results (their handler, and their lease's lane
 * and epoch: nothing else is read) when they still have that epoch and
 * run nothing.  Returns lanes freed, or -1.
 */
int	rb_store_relinquish_leases(struct rb_store *, const struct rb_result *v, size_t n,
	    struct rb_error *err);
/**
 * Which of n results' deliveries are still in flight under their lease:
 * pending, and listed in flight on their lane at the lease's epoch with
 * the lease's claims (what a completion's fence checks).  live[i] for
 * v[i] (handler, event_id, lease, delivery_id are read).  Reads only.  For
 * a claimer whose deliveries another process completes (rb-claim
 * --follow counts what is still downstream).  0, or -1.
 */
int	rb_store_in_flight(struct rb_store *, const struct rb_result *v, size_t n, bool *live,
	    struct rb_error *err);

/* ---- the delivery path, without waiting (rb-dispatch) ------------------ */

/*
 * A program that serves its handlers while the store works (pgqd's shape):
 * it starts a claim or a completion, polls the store's descriptors beside
 * its own, and after every poll takes what the store has to report:
 *
 *	if (rb_store_claim_ready(s)) rb_store_claim_start(s, &opts, &err);
 *	if (rb_store_complete_ready(s)) rb_store_complete_start(s, &co, v, n, &err);
 *	n = rb_store_pollfds(s, pfd, max, &timeout);  poll(pfd, n + ..., timeout);
 *	while (rb_store_service(s, &ev) > 0)
 *		... ev.kind: CLAIMED, DELIVERED, COMPLETED, WOKEN or FAILED
 *
 * How the store overlaps its work is its own business: the PostgreSQL
 * backend keeps up to $RELAYBUS_PG_CONNECTIONS connections (relaybus(7)).
 * The synchronous calls (rb_store_extend, _relinquish*, rb_store_claim,
 * rb_store_complete) may be made at any time: what they find out is
 * reported by the next rb_store_service, never lost.  A reconnect forgets
 * what was out and what was not reported yet.
 */
struct pollfd;

enum rb_store_event_kind {
	RB_STORE_CLAIMED = 1,	/* a claim committed: claimed, and v/n of them ready */
	RB_STORE_DELIVERED,	/* more of a claim's deliveries are ready: v/n (dropped: gone) */
	RB_STORE_COMPLETED,	/* a completion is done: its results' outcomes are filled in */
	RB_STORE_WOKEN,		/* new deliveries for the handler of rb_store_listen may be due */
	RB_STORE_FAILED,	/* what failed (failed) and why (err) */
};

struct rb_store_event {
	enum rb_store_event_kind kind;
	/* CLAIMED: how many deliveries the claim took; they come as v here
	 * and in DELIVERED events that follow (0: the claim found nothing) */
	int			 claimed;
	/* CLAIMED: a lane another holder leases is free in this many ms (its
	 * holder died and its lease was cut, or the lease ends soon): a claim
	 * that looks for lanes then may take it over.  0: none known (only a
	 * claim with cursors says) */
	int64_t			 retry_ms;
	/* CLAIMED, DELIVERED: those ready to run, a new array of n new rb_dl
	 * (fetched), the array and they the caller's; NULL when n is 0 */
	struct rb_dl		**v;
	size_t			 n;
	/* DELIVERED, FAILED: deliveries a claim took that will not come (their
	 * event is gone, or they were lost with the failure) */
	int			 dropped;
	/* COMPLETED: the results given to rb_store_complete_start */
	struct rb_result	*results;
	size_t			 nresults;
	/* FAILED: a claim (RB_STORE_CLAIMED), reading a claim's deliveries
	 * (RB_STORE_DELIVERED), a completion (RB_STORE_COMPLETED: its results
	 * were not applied), or the connection while idle (RB_STORE_WOKEN) */
	enum rb_store_event_kind failed;
	struct rb_error		 err;
};

/**
 * Start a claim (o as rb_store_claim; copied).  Its deliveries come as
 * RB_STORE_CLAIMED, maybe followed by RB_STORE_DELIVERED events, or it
 * fails (RB_STORE_FAILED).  Only when rb_store_claim_ready.  -1 + err:
 * nothing started.
 */
int	rb_store_claim_start(struct rb_store *, const struct rb_claim_opts *, struct rb_error *err);
/**
 * Start a completion of n results (as rb_store_complete; v stays the
 * caller's until RB_STORE_COMPLETED or RB_STORE_FAILED hands it back).
 * Only when rb_store_complete_ready.  A store may apply some at once (the
 * PostgreSQL backend: o->sql, the handlers' own completions, and failures
 * when it completes beside the claims); it still reports them from
 * rb_store_service.  -1 + err: nothing started.
 */
int	rb_store_complete_start(struct rb_store *, const struct rb_complete_opts *, struct rb_result *v,
	    size_t n, struct rb_error *err);
/** Whether a claim may start now (else after a later event). */
bool	rb_store_claim_ready(const struct rb_store *);
/** Whether a completion may start now (else after a later event). */
bool	rb_store_complete_ready(const struct rb_store *);
/**
 * The store's descriptors to poll (at most max, 3 for PostgreSQL) into
 * pfd, events set; returns how many.  *timeout_ms is lowered to 0 when the
 * store has something to report already (call rb_store_service first).
 */
int	rb_store_pollfds(struct rb_store *, struct pollfd *pfd, int max, int *timeout_ms);
/**
 * After a poll (whatever woke it): the next thing the store has to report
 * into ev, and 1; 0 when there is nothing (more).  Never waits.
 */
int	rb_store_service(struct rb_store *, struct rb_store_event *ev);
/**
 * The most connections the store may keep for the calls above, 1 to 3
 * (rb-dispatch --connections, deprecated); 0: the backend's own setting
 * (the PostgreSQL backend: $RELAYBUS_PG_CONNECTIONS, else 2).  Any time.
 */
void	rb_store_set_connections(struct rb_store *, int n);

/* ---- wake-up --------------------------------------------------------- */

/** Ask to be woken by new deliveries for handler (NULL: any), through
 * rb_store_notified and RB_STORE_WOKEN. */
int	rb_store_listen(struct rb_store *, const char *handler, struct rb_error *err);
/**
 * Wait up to timeout_ms (0: not at all) for a wake-up (rb_store_listen):
 * 1 when one came, 0 if none, -1 on error (the connection lost).  Not
 * while a claim or completion started without waiting is out.
 */
int	rb_store_notified(struct rb_store *, int timeout_ms, struct rb_error *err);

#endif
