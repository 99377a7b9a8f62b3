/* SPDX-License-Identifier: MIT */
/*
 * store.c: the front of the store library.  It picks the backend of a URL
 * from backends[] (by each one's schemes), and every function of
 * rb_store.h, rb_admin.h and rb_inspect.h checks its slot (NEED_OP: a NULL
 * slot is "not supported by the X backend", RB_EXIT_UNAVAILABLE) and calls
 * it.  Nothing here knows a backend's insides; the backend-neutral records
 * are in records.c and delivery.c.
 *
 * A backend with a heavy client library (MongoDB: libmongoc sets itself up
 * in every process that loads it) is a module instead, loaded with
 * dlopen() the first time one of its URLs is used (modules[]).
 */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rb_admin.h"
#include "rb_exit.h"
#include "rb_inspect.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"

/*
 * The backends linked into this build, in the order --version lists them.
 * The first also takes what has no scheme: no URL at all and a libpq
 * conninfo string ("host=db dbname=app").  A new backend is one entry here
 * (under its configure conditional), its store_<name>.c and one Makefile.am
 * line.
 */
extern const struct rb_store_ops rb_store_pg_ops;	/* pg/store_pg.c */

static const struct rb_store_ops *const backends[] = {
	&rb_store_pg_ops,
};
#define N_BACKENDS	(sizeof backends / sizeof backends[0])

/*
 * The backends of this build that are modules (after backends[] in
 * --version): FILE in $RELAYBUS_MODULE_DIR, else RB_MODULE_DIR (the
 * configured pkglibdir), defining `const struct rb_store_ops NAME_ops` and
 * `const char NAME_relaybus[]` (the PACKAGE_VERSION it was built for).  It
 * is opened the first time one of its schemes is used; when it cannot be,
 * its URLs are refused with RB_EXIT_UNAVAILABLE, saying why (dlerror).
 */
#ifndef RB_MODULE_DIR			/* (Makefile.am sets it: a build outside it, scripts/fuzz) */
#define RB_MODULE_DIR	"/usr/local/lib/relaybus"
#endif

static struct module {
	const char		*name;
	const char *const	 schemes[3];
	const char		*file;
	const char		*symbol;
	const struct rb_store_ops *ops;	/* once loaded */
	char			*why;	/* once it could not be */
} modules[] = {
#ifdef HAVE_MONGO
	{ "mongodb", { "mongodb", "mongodb+srv", NULL }, "relaybus-mongo.so", "rb_store_mongo", NULL, NULL },
#endif
	{ NULL, { NULL }, NULL, NULL, NULL, NULL }
};

/* Backends relaybus knows of that this build lacks: their URLs are refused
 * with "not part of this build" (69), not as an unknown scheme (78). */
static const struct {
	const char		*name;
	const char *const	 schemes[3];
} absent[] = {
	{ "mongodb", { "mongodb", "mongodb+srv", NULL } },
};

static int
unsupported(const struct rb_store_ops *ops, const char *op, struct rb_error *err)
{
	return rb_seterr(err, RB_EXIT_UNAVAILABLE, "%s not supported by the %s backend", op, ops->name);
}

/* The one way a front function refuses a NULL slot (returns -1). */
#define NEED_OP(s, op, err)						\
	do {								\
		if ((s)->ops->op == NULL)				\
			return unsupported((s)->ops, #op, (err));	\
	} while (0)

static bool
has_scheme(const char *url, const char *scheme)
{
	size_t n = strlen(scheme);

	return strncmp(url, scheme, n) == 0 && strncmp(url + n, "://", 3) == 0;
}

static bool
takes(const char *const *schemes, const char *url)
{
	for (; *schemes != NULL; schemes++)
		if (has_scheme(url, *schemes))
			return true;
	return false;
}

/* m's ops, loading it on first use; NULL with m->why set when it cannot be. */
static const struct rb_store_ops *
module_ops(struct module *m)
{
	const char *dir = getenv("RELAYBUS_MODULE_DIR"), *built;
	char *path, *sym;
	void *h;

	if (m->ops != NULL || m->why != NULL)
		return m->ops;
	if (dir == NULL || *dir == '\0')
		dir = RB_MODULE_DIR;
	path = xasprintf("%s/%s", dir, m->file);
	if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
		m->why = xstrdup(dlerror());
		free(path);
		return NULL;
	}
	sym = xasprintf("%s_relaybus", m->symbol);
	built = dlsym(h, sym);
	free(sym);
	sym = xasprintf("%s_ops", m->symbol);
	if (built == NULL || (m->ops = dlsym(h, sym)) == NULL)
		m->why = xasprintf("%s: not a relaybus backend module", path);
	else if (strcmp(built, PACKAGE_VERSION) != 0)
		m->why = xasprintf("%s: built for relaybus %.20s, this is %s", path, built, PACKAGE_VERSION);
	free(sym);
	free(path);
	if (m->why != NULL) {
		m->ops = NULL;
		dlclose(h);
	}
	return m->ops;
}

/* $RELAYBUS_URL and $RELAYBUS_SCHEMA for what is not given, the schema
 * checked: the same for every function that takes a URL. */
static int
resolve(const char **url, const char **schema, struct rb_error *err)
{
	if (*url == NULL || **url == '\0')
		*url = getenv("RELAYBUS_URL");
	if (*url != NULL && **url == '\0')
		*url = NULL;
	if (*schema == NULL || **schema == '\0')
		*schema = getenv("RELAYBUS_SCHEMA");
	if (*schema == NULL || **schema == '\0')
		*schema = RB_DEFAULT_SCHEMA;
	if (!rb_ident_valid(*schema))
		return rb_seterr(err, RB_EXIT_CONFIG,
		    "invalid schema name '%s': use lowercase letters, digits and _ "
		    "(at most 50; not pg_* or information_schema)", *schema);
	return 0;
}

/* The backend of url (resolved: NULL is the environment), or NULL + err. */
static const struct rb_store_ops *
backend_of(const char *url, struct rb_error *err)
{
	struct rb_sbuf known = { 0 };
	char *r;

	if (url == NULL || strstr(url, "://") == NULL)
		return backends[0];
	for (size_t i = 0; i < N_BACKENDS; i++)
		if (takes(backends[i]->schemes, url))
			return backends[i];
	r = rb_url_redact(url);
	for (struct module *m = modules; m->name != NULL; m++)
		if (takes(m->schemes, url)) {
			const struct rb_store_ops *ops = module_ops(m);

			if (ops == NULL)
				rb_seterr(err, RB_EXIT_UNAVAILABLE, "%s: %s backend not available: %s", r,
				    m->name, m->why);
			free(r);
			return ops;
		}
	for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
		if (takes(absent[i].schemes, url)) {
			rb_seterr(err, RB_EXIT_UNAVAILABLE, "%s: the %s backend is not part of this build",
			    r, absent[i].name);
			free(r);
			return NULL;
		}
	for (size_t i = 0; i < N_BACKENDS; i++) {
		rb_sb_puts(&known, i > 0 ? ", " : "");
		rb_sb_puts(&known, backends[i]->schemes[0]);
		rb_sb_puts(&known, "://");
	}
	for (struct module *m = modules; m->name != NULL; m++) {
		rb_sb_puts(&known, ", ");
		rb_sb_puts(&known, m->schemes[0]);
		rb_sb_puts(&known, "://");
	}
	rb_seterr(err, RB_EXIT_CONFIG, "unsupported URL scheme in %s: use %s (or a libpq conninfo)", r,
	    known.s);
	free(known.s);
	free(r);
	return NULL;
}

/* How ops masks passwords in url (a new string). */
static char *
redact_with(const struct rb_store_ops *ops, const char *url)
{
	return ops != NULL && ops->redact != NULL ? ops->redact(url) : rb_url_redact(url);
}

char *
rb_store_redact(const char *url)
{
	const struct rb_store_ops *ops = backends[0];

	if (url != NULL && strstr(url, "://") != NULL) {
		ops = NULL;
		for (size_t i = 0; i < N_BACKENDS; i++)
			if (takes(backends[i]->schemes, url))
				ops = backends[i];
		/* (a module not loaded for that: rb_url_redact until it is) */
		for (struct module *m = modules; m->name != NULL; m++)
			if (takes(m->schemes, url))
				ops = m->ops;
	}
	return redact_with(ops, url);
}

/* Open a store of ops (url and schema resolved). */
static struct rb_store *
open_with(const struct rb_store_ops *ops, const char *url, const char *schema, const char *app,
    struct rb_error *err)
{
	struct rb_store *s = xcalloc(1, sizeof *s);

	s->ops = ops;
	s->url = url != NULL ? xstrdup(url) : NULL;
	s->url_redacted = redact_with(ops, url);
	s->schema = xstrdup(schema);
	s->app = xstrdup(app != NULL ? app : "relaybus");
	if (s->ops->open(s, err) < 0) {
		rb_store_close(s);
		return NULL;
	}
	return s;
}

struct rb_store *
rb_store_open(const char *url, const char *schema, const char *app, struct rb_error *err)
{
	const struct rb_store_ops *ops;

	if (resolve(&url, &schema, err) < 0 || (ops = backend_of(url, err)) == NULL)
		return NULL;
	return open_with(ops, url, schema, app, err);
}

void
rb_store_close(struct rb_store *s)
{
	if (s == NULL)
		return;
	if (s->ops != NULL && s->ops->close != NULL)
		s->ops->close(s);
	rb_evq_free(&s->evq);
	free(s->url);
	free(s->url_redacted);
	free(s->schema);
	free(s->app);
	free(s);
}

const char *
rb_store_backend(const struct rb_store *s)
{
	return s->ops->name;
}

const char *
rb_store_schema(const struct rb_store *s)
{
	return s->schema;
}

const char *
rb_store_url_redacted(const struct rb_store *s)
{
	return s->url_redacted;
}

char *
rb_store_backends(void)
{
	struct rb_sbuf b = { 0 };
	char v[128];

	for (size_t i = 0; i < N_BACKENDS; i++) {
		rb_sb_puts(&b, i > 0 ? ", " : "");
		rb_sb_puts(&b, backends[i]->name);
	}
	for (struct module *m = modules; m->name != NULL; m++) {
		rb_sb_puts(&b, ", ");
		rb_sb_puts(&b, m->name);
	}
	for (size_t i = 0; i < N_BACKENDS; i++) {
		backends[i]->version(v, sizeof v);
		rb_sb_puts(&b, i > 0 ? ", " : "; ");
		rb_sb_puts(&b, v);
	}
	/* (--version loads the modules: whether they work is what it is asked) */
	for (struct module *m = modules; m->name != NULL; m++) {
		rb_sb_puts(&b, ", ");
		if (module_ops(m) != NULL) {
			m->ops->version(v, sizeof v);
			rb_sb_puts(&b, v);
		} else {
			rb_sb_puts(&b, m->name);
			rb_sb_puts(&b, " not available (");
			rb_sb_puts(&b, m->why);
			rb_sb_puts(&b, ")");
		}
	}
	return b.s;
}

int
rb_store_reconnect(struct rb_store *s, struct rb_error *err)
{
	NEED_OP(s, reconnect, err);
	rb_evq_clear(&s->evq);		/* what was out is forgotten, and so is what it said */
	return s->ops->reconnect(s, err);
}

void
rb_store_server(const struct rb_store *s, char *buf, size_t size)
{
	if (s->ops->server != NULL && !rb_store_broken(s))
		s->ops->server(s, buf, size);
	else
		snprintf(buf, size, "%s", s->url_redacted);
}

bool
rb_store_broken(const struct rb_store *s)
{
	return s->ops->broken != NULL && s->ops->broken(s);
}

int
rb_store_setup(struct rb_store *s, const struct rb_setup_opts *o, struct rb_error *err)
{
	NEED_OP(s, setup, err);
	if (o->n_grant + o->n_revoke > 0)
		NEED_OP(s, grant, err);
	return s->ops->setup(s, o, err);
}

char *
rb_store_setup_script(const char *url, const char *schema, const struct rb_setup_opts *o,
    struct rb_error *err)
{
	const struct rb_store_ops *ops;

	if (resolve(&url, &schema, err) < 0 || (ops = backend_of(url, err)) == NULL)
		return NULL;
	if (ops->setup_script == NULL) {
		unsupported(ops, "setup_script", err);
		return NULL;
	}
	return ops->setup_script(schema, o, err);
}

int
rb_store_schema_info(struct rb_store *s, struct rb_schema_info *info, struct rb_error *err)
{
	NEED_OP(s, schema_info, err);
	return s->ops->schema_info(s, info, err);
}

int
rb_schema_problem(const char *schema, const struct rb_schema_info *i, struct rb_error *err)
{
	switch (i->state) {
	case RB_SCHEMA_CURRENT:
		return 0;
	case RB_SCHEMA_ABSENT:
		return rb_seterr(err, RB_EXIT_CONFIG, "schema \"%s\" is not set up: run rb-setup", schema);
	case RB_SCHEMA_010:
		return rb_seterr(err, RB_EXIT_UPGRADE, "schema \"%s\" holds the 0.1.0 row-lease schema, "
		    "this relaybus needs schema version %d: stop the 0.1.0 workers and run rb-setup", schema,
		    i->expected);
	case RB_SCHEMA_OLDER:
		return rb_seterr(err, RB_EXIT_UPGRADE, "schema \"%s\" is at version %d, this relaybus "
		    "needs %d: run rb-setup", schema, i->installed, i->expected);
	case RB_SCHEMA_NEWER:
		return rb_seterr(err, RB_EXIT_PROTOCOL, "schema \"%s\" is at version %d, this relaybus "
		    "understands up to %d: use a newer relaybus", schema, i->installed, i->expected);
	}
	return rb_seterr(err, RB_EXIT_SOFTWARE, "schema \"%s\": unknown state", schema);
}

int
rb_store_require_schema(struct rb_store *s, struct rb_error *err)
{
	struct rb_schema_info i;

	if (rb_store_schema_info(s, &i, err) < 0)
		return -1;
	return rb_schema_problem(s->schema, &i, err);
}

int
rb_store_publish_text(struct rb_store *s, const char *events_json, size_t n,
    struct rb_publish_acks *acks, struct rb_error *err)
{
	memset(acks, 0, sizeof *acks);
	NEED_OP(s, publish, err);
	return s->ops->publish(s, events_json, n, acks, err);
}

int
rb_store_publish(struct rb_store *s, const json_t *events, json_t **acks, struct rb_error *err)
{
	struct rb_publish_acks a;
	char *text;
	int rc;

	*acks = NULL;
	if ((text = json_dumps(events, JSON_COMPACT)) == NULL)
		return rb_seterr(err, RB_EXIT_OSERR, "out of memory");
	rc = rb_store_publish_text(s, text, json_array_size(events), &a, err);
	free(text);
	if (rc < 0)
		return -1;
	*acks = rb_publish_acks_json(&a);
	rb_publish_acks_clear(&a);
	return 0;
}

static int
claim_opts_check(const struct rb_claim_opts *o, struct rb_error *err)
{
	if (o->handler == NULL || !rb_handler_valid(o->handler))
		return rb_seterr(err, RB_EXIT_USAGE, "invalid handler name");
	if (o->batch < 1 || o->lease_ms < 1 || o->max_attempts < 1 || o->owner == NULL ||
	    strlen(o->owner) > 200)
		return rb_seterr(err, RB_EXIT_USAGE, "invalid claim options");
	return 0;
}

/* Where a backend has claim_start and complete_start, the synchronous
 * calls are those with wait set: the backend answers at once, and its
 * event is the last of its kind on the queue. */
static int
answer_of(struct rb_store *s, enum rb_store_event_kind kind, struct rb_store_event *ev, struct rb_error *err)
{
	if (rb_evq_take_last(&s->evq, kind, ev))
		return 0;
	return rb_seterr(err, RB_EXIT_SOFTWARE, "the %s backend gave no answer", s->ops->name);
}

int
rb_store_claim(struct rb_store *s, const struct rb_claim_opts *o, struct rb_dl ***out, struct rb_error *err)
{
	struct rb_store_event ev;

	*out = NULL;
	if (o->retry_ms != NULL)
		*o->retry_ms = 0;
	if (s->ops->claim_start == NULL)
		NEED_OP(s, claim, err);
	if (claim_opts_check(o, err) < 0)
		return -1;
	if (s->ops->claim_start == NULL)
		return s->ops->claim(s, o, out, err);
	if (s->ops->claim_start(s, o, true, err) < 0 || answer_of(s, RB_STORE_CLAIMED, &ev, err) < 0)
		return -1;
	if (o->retry_ms != NULL)
		*o->retry_ms = ev.retry_ms;
	*out = ev.v != NULL ? ev.v : xcalloc(1, sizeof **out);
	return (int)ev.n;
}

int
rb_store_claim_start(struct rb_store *s, const struct rb_claim_opts *o, struct rb_error *err)
{
	struct rb_store_event ev = { .kind = RB_STORE_CLAIMED };
	int n;

	if (s->ops->claim_start == NULL)
		NEED_OP(s, claim, err);
	if (claim_opts_check(o, err) < 0)
		return -1;
	if (s->ops->claim_start != NULL)
		return s->ops->claim_start(s, o, false, err);
	/* a backend that only claims at once: now, reported at the next service */
	if ((n = s->ops->claim(s, o, &ev.v, err)) < 0)
		return -1;
	ev.claimed = n;
	ev.n = (size_t)n;
	if (n == 0) {
		free(ev.v);
		ev.v = NULL;
	}
	rb_evq_push(&s->evq, &ev);
	return 0;
}

bool
rb_store_claim_ready(const struct rb_store *s)
{
	return s->ops->claim_ready == NULL || s->ops->claim_ready(s);
}

bool
rb_store_complete_ready(const struct rb_store *s)
{
	return s->ops->complete_ready == NULL || s->ops->complete_ready(s);
}

int
rb_store_pollfds(struct rb_store *s, struct pollfd *pfd, int max, int *timeout_ms)
{
	int n = s->ops->pollfds != NULL ? s->ops->pollfds(s, pfd, max, timeout_ms) : 0;

	if (s->evq.n > 0)
		*timeout_ms = 0;
	return n;
}

int
rb_store_service(struct rb_store *s, struct rb_store_event *ev)
{
	if (s->evq.n == 0 && s->ops->service != NULL)
		s->ops->service(s);
	return rb_evq_pop(&s->evq, ev) ? 1 : 0;
}

void
rb_store_set_connections(struct rb_store *s, int n)
{
	s->connections = n >= 1 && n <= 3 ? n : 0;
}







int
rb_store_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	NEED_OP(s, extend, err);
	return s->ops->extend(s, handler, owner, lease_ms, err);
}

int
rb_store_extend_plain(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	if (s->ops->extend_plain != NULL)
		return s->ops->extend_plain(s, handler, owner, lease_ms, err);
	return rb_store_extend(s, handler, owner, lease_ms, err);
}

/* The outcome part of n results, before a completion fills it in. */
static void
outcomes_reset(struct rb_result *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		v[i].outcome = RB_OUTCOME_LOST;
		v[i].missing = false;
		v[i].attempts = -1;
		v[i].sql_error = NULL;
	}
}

int
rb_store_complete(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    struct rb_error *err)
{
	struct rb_store_event ev;

	outcomes_reset(v, n);
	if (s->ops->complete_start == NULL) {
		NEED_OP(s, complete, err);
		return s->ops->complete(s, o, v, n, err);
	}
	if (s->ops->complete_start(s, o, v, n, true, err) < 0 || answer_of(s, RB_STORE_COMPLETED, &ev, err) < 0)
		return -1;
	return 0;
}

int
rb_store_complete_start(struct rb_store *s, const struct rb_complete_opts *o, struct rb_result *v, size_t n,
    struct rb_error *err)
{
	struct rb_store_event ev = { .kind = RB_STORE_COMPLETED, .results = v, .nresults = n };

	outcomes_reset(v, n);
	if (s->ops->complete_start != NULL)
		return s->ops->complete_start(s, o, v, n, false, err);
	NEED_OP(s, complete, err);
	/* a backend that only completes at once: now, reported at the next service */
	if (s->ops->complete(s, o, v, n, err) < 0)
		return -1;
	rb_evq_push(&s->evq, &ev);
	return 0;
}



int
rb_store_relinquish(struct rb_store *s, const char *handler, const char *owner, struct rb_error *err)
{
	NEED_OP(s, relinquish, err);
	return s->ops->relinquish(s, handler, owner, err);
}

int
rb_store_relinquish_owner(struct rb_store *s, const char *handler, const char *owner,
    struct rb_error *err)
{
	NEED_OP(s, relinquish_owner, err);
	return s->ops->relinquish_owner(s, handler, owner, err);
}

int
rb_store_relinquish_leases(struct rb_store *s, const struct rb_result *v, size_t n, struct rb_error *err)
{
	NEED_OP(s, relinquish_leases, err);
	return s->ops->relinquish_leases(s, v, n, err);
}

int
rb_store_in_flight(struct rb_store *s, const struct rb_result *v, size_t n, bool *live, struct rb_error *err)
{
	NEED_OP(s, in_flight, err);
	for (size_t i = 0; i < n; i++)
		live[i] = false;
	if (n == 0)
		return 0;
	return s->ops->in_flight(s, v, n, live, err);
}

int
rb_store_listen(struct rb_store *s, const char *handler, struct rb_error *err)
{
	NEED_OP(s, listen, err);
	return s->ops->listen(s, handler, err);
}

/* (over the face without waiting: a backend without descriptors sleeps) */
int
rb_store_notified(struct rb_store *s, int timeout_ms, struct rb_error *err)
{
	struct pollfd pfd[4];
	struct rb_store_event ev;
	struct rb_evq other = { 0 };
	int n, hit = 0, timeout = timeout_ms > 0 ? timeout_ms : 0;

	n = rb_store_pollfds(s, pfd, 4, &timeout);
	if (timeout > 0 || n > 0) {
		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR)
			return rb_seterr(err, RB_EXIT_OSERR, "poll: %s", strerror(errno));
	}
	while (rb_store_service(s, &ev) > 0) {
		if (ev.kind == RB_STORE_WOKEN)
			hit = 1;
		else if (ev.kind == RB_STORE_FAILED && hit >= 0) {
			*err = ev.err;
			hit = -1;
		} else if (ev.kind != RB_STORE_FAILED)
			rb_evq_push(&other, &ev);	/* (not ours: kept, in order) */
	}
	while (rb_evq_pop(&other, &ev))
		rb_evq_push(&s->evq, &ev);
	free(other.v);
	return hit;
}



/* ---- rb_admin.h ---------------------------------------------------------- */

int
rb_admin_stats(struct rb_store *s, json_t **stats, struct rb_error *err)
{
	*stats = NULL;
	NEED_OP(s, admin_stats, err);
	return s->ops->admin_stats(s, stats, err);
}

int
rb_admin_list(struct rb_store *s, const struct rb_admin_filter *f, json_t **rows, struct rb_error *err)
{
	*rows = NULL;
	NEED_OP(s, admin_list, err);
	return s->ops->admin_list(s, f, rows, err);
}

int
rb_admin_show(struct rb_store *s, const char *event_id, json_t **event, struct rb_error *err)
{
	*event = NULL;
	NEED_OP(s, admin_show, err);
	return s->ops->admin_show(s, event_id, event, err);
}

int
rb_admin_apply(struct rb_store *s, enum rb_admin_action action, const json_t *targets,
    const char *reason, json_t **outcomes, struct rb_error *err)
{
	*outcomes = NULL;
	NEED_OP(s, admin_apply, err);
	return s->ops->admin_apply(s, action, targets, reason, outcomes, err);
}

int
rb_admin_purge(struct rb_store *s, enum rb_admin_purge kind, int64_t older_than_ms, int batch,
    struct rb_error *err)
{
	NEED_OP(s, admin_purge, err);
	return s->ops->admin_purge(s, kind, older_than_ms, batch, err);
}

int
rb_admin_purge_keys(struct rb_store *s, char **after, int batch, struct rb_error *err)
{
	NEED_OP(s, admin_purge_keys, err);
	return s->ops->admin_purge_keys(s, after, batch, err);
}

int
rb_admin_lanes(struct rb_store *s, const char *handler, bool all, json_t **rows, struct rb_error *err)
{
	*rows = NULL;
	NEED_OP(s, admin_lanes, err);
	return s->ops->admin_lanes(s, handler, all, rows, err);
}

int
rb_admin_subscriptions(struct rb_store *s, const char *handler, json_t **rows, struct rb_error *err)
{
	*rows = NULL;
	NEED_OP(s, admin_subscriptions, err);
	return s->ops->admin_subscriptions(s, handler, rows, err);
}

int
rb_admin_handler_check(struct rb_store *s, const char *handler, struct rb_error *err)
{
	struct rb_admin_filter f = { .handler = handler, .limit = 1 };
	struct rb_sbuf names = { 0 };
	json_t *subs = NULL, *rows = NULL, *r;
	const char *prev = NULL;
	size_t i;
	int rc = 0;

	/* A role granted only the delivery path (rb-setup --grant worker=,
	 * publisher=) may not read the subscriptions or the deliveries: the
	 * check is a courtesy, and is skipped rather than refuse its work. */
	if (rb_admin_subscriptions(s, NULL, &subs, err) < 0)
		return err->exit_code == RB_EXIT_NOPERM ? 0 : -1;
	json_array_foreach(subs, i, r) {
		const char *h = json_string_value(json_object_get(r, "handler"));

		if (h == NULL)
			continue;
		if (strcmp(h, handler) == 0)
			goto out;
		if (prev == NULL || strcmp(prev, h) != 0) {	/* (rows come by handler) */
			if (names.len > 0)
				rb_sb_puts(&names, ", ");
			rb_sb_puts(&names, h);
		}
		prev = h;
	}
	if ((rc = rb_admin_list(s, &f, &rows, err)) < 0 || json_array_size(rows) > 0) {
		if (rc < 0 && err->exit_code == RB_EXIT_NOPERM)
			rc = 0;
		goto out;
	}
	rc = rb_seterr(err, RB_EXIT_CONFIG, "handler '%s' has no subscription and no deliveries "
	    "(subscribed: %s)", handler, names.len > 0 ? names.s : "none");
out:
	json_decref(subs);
	json_decref(rows);
	free(names.s);
	return rc;
}

/* ---- rb_inspect.h -------------------------------------------------------- */

int
rb_inspect_lifecycle(const char *url, const struct rb_inspect_opts *o, json_t **report,
    struct rb_error *err)
{
	const struct rb_store_ops *ops;
	const char *schema = RB_DEFAULT_SCHEMA;
	char scratch[64];
	struct rb_store *s;
	int rc;

	*report = NULL;
	if (resolve(&url, &schema, err) < 0 || (ops = backend_of(url, err)) == NULL)
		return -1;
	if (ops->inspect_lifecycle == NULL)
		return unsupported(ops, "inspect_lifecycle", err);
	/* the run's own scratch schema, never the user's */
	snprintf(scratch, sizeof scratch, "rb_inspect_%s%ld", o->baseline ? "base_" : "", (long)getpid());
	if ((s = open_with(ops, url, scratch, o->app != NULL ? o->app : "rb-pageinspect", err)) == NULL)
		return -1;
	rc = ops->inspect_lifecycle(s, o, report, err);
	rb_store_close(s);
	return rc;
}

int
rb_inspect_sample(struct rb_store *s, json_t **sample, struct rb_error *err)
{
	*sample = NULL;
	NEED_OP(s, inspect_sample, err);
	return s->ops->inspect_sample(s, sample, err);
}
