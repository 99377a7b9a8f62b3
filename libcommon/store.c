/* SPDX-License-Identifier: MIT */
/*
 * store.c: URL scheme -> backend, NULL-op checks, and the backend-neutral
 * validation of the JSON-lines records (events, results, subscriptions).
 */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"

int
rb_seterr(struct rb_error *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL)
		return -1;
	err->exit_code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	va_end(ap);
	/* one line: cut at the first newline */
	err->msg[strcspn(err->msg, "\n")] = '\0';
	return -1;
}

static bool
has_scheme(const char *url, const char *scheme)
{
	size_t n = strlen(scheme);

	return strncmp(url, scheme, n) == 0 && strncmp(url + n, "://", 3) == 0;
}

struct rb_store *
rb_store_open(const char *url, const char *schema, const char *app, struct rb_error *err)
{
	struct rb_store *s;

	if (url == NULL || *url == '\0')
		url = getenv("RELAYBUS_URL");
	if (url != NULL && *url == '\0')
		url = NULL;
	if (schema == NULL || *schema == '\0')
		schema = getenv("RELAYBUS_SCHEMA");
	if (schema == NULL || *schema == '\0')
		schema = RB_DEFAULT_SCHEMA;
	if (!rb_ident_valid(schema)) {
		rb_seterr(err, RB_EXIT_CONFIG,
		    "invalid schema name '%s': use lowercase letters, digits and _ (at most 50)", schema);
		return NULL;
	}
	if (url != NULL && strstr(url, "://") != NULL) {
		if (has_scheme(url, "mongodb") || has_scheme(url, "mongodb+srv")) {
			char *r = rb_url_redact(url);
			rb_seterr(err, RB_EXIT_UNAVAILABLE,
			    "%s: the mongodb backend is not part of this build", r);
			free(r);
			return NULL;
		}
		if (!has_scheme(url, "postgres") && !has_scheme(url, "postgresql")) {
			char *r = rb_url_redact(url);
			rb_seterr(err, RB_EXIT_CONFIG,
			    "unsupported URL scheme in %s: use postgresql:// (or a libpq conninfo)", r);
			free(r);
			return NULL;
		}
	}
	s = xcalloc(1, sizeof *s);
	s->ops = &rb_store_pg_ops;
	s->url = url != NULL ? xstrdup(url) : NULL;
	s->url_redacted = rb_url_redact(url);
	s->schema = xstrdup(schema);
	s->app = xstrdup(app != NULL ? app : "relaybus");
	if (s->ops->open(s, err) < 0) {
		rb_store_close(s);
		return NULL;
	}
	return s;
}

void
rb_store_close(struct rb_store *s)
{
	if (s == NULL)
		return;
	if (s->ops != NULL && s->ops->close != NULL)
		s->ops->close(s);
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

#define NEED_OP(s, op, err)						\
	do {								\
		if ((s)->ops->op == NULL)				\
			return rb_seterr((err), RB_EXIT_UNAVAILABLE,	\
			    "%s not supported by the %s backend", #op,	\
			    (s)->ops->name);				\
	} while (0)

int
rb_store_reconnect(struct rb_store *s, struct rb_error *err)
{
	NEED_OP(s, reconnect, err);
	return s->ops->reconnect(s, err);
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
	return s->ops->setup(s, o, err);
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
		return rb_seterr(err, RB_EXIT_UPGRADE, "schema \"%s\" holds the tables of relaybus 0.1.0, "
		    "this relaybus needs version %d: stop the 0.1.0 workers and run rb-setup", schema,
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

void
rb_publish_acks_clear(struct rb_publish_acks *a)
{
	if (a->free_priv != NULL)
		a->free_priv(a->priv);
	free(a->v);
	memset(a, 0, sizeof *a);
}

json_t *
rb_publish_acks_json(const struct rb_publish_acks *a)
{
	json_t *out = json_array();

	for (size_t i = 0; i < a->n; i++) {
		json_t *h = json_loads(a->v[i].handlers, 0, NULL);

		json_array_append_new(out, json_pack("{s:s, s:i, s:b, s:o}", "id", a->v[i].id,
		    "deliveries", a->v[i].deliveries, "duplicate", a->v[i].duplicate,
		    "handlers", h != NULL ? h : json_array()));
	}
	return out;
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

int
rb_store_claim(struct rb_store *s, const struct rb_claim_opts *o, json_t **out, struct rb_error *err)
{
	*out = NULL;
	NEED_OP(s, claim, err);
	if (claim_opts_check(o, err) < 0)
		return -1;
	return s->ops->claim(s, o, out, err);
}

int
rb_store_claim_send(struct rb_store *s, const struct rb_claim_opts *o, struct rb_error *err)
{
	NEED_OP(s, claim_send, err);
	if (claim_opts_check(o, err) < 0)
		return -1;
	return s->ops->claim_send(s, o, err);
}

int
rb_store_claim_recv(struct rb_store *s, bool wait, struct rb_dl ***out, struct rb_error *err)
{
	*out = NULL;
	NEED_OP(s, claim_recv, err);
	return s->ops->claim_recv(s, wait, out, err);
}

int
rb_store_fetch_send(struct rb_store *s, struct rb_dl *const *claimed, size_t n, bool line_text,
    struct rb_error *err)
{
	NEED_OP(s, fetch_send, err);
	return s->ops->fetch_send(s, claimed, n, line_text, err);
}

int
rb_store_fetch_recv(struct rb_store *s, bool wait, struct rb_error *err)
{
	NEED_OP(s, fetch_recv, err);
	return s->ops->fetch_recv(s, wait, err);
}

int
rb_store_fetch_socket(const struct rb_store *s)
{
	return s->ops->fetch_socket != NULL ? s->ops->fetch_socket(s) : -1;
}

int
rb_store_complete_socket(const struct rb_store *s)
{
	return s->ops->complete_socket != NULL ? s->ops->complete_socket(s) : -1;
}

int
rb_store_extend(struct rb_store *s, const char *handler, const char *owner, int64_t lease_ms,
    struct rb_error *err)
{
	NEED_OP(s, extend, err);
	return s->ops->extend(s, handler, owner, lease_ms, err);
}

int
rb_store_complete(struct rb_store *s, const struct rb_complete_opts *o, const json_t *results,
    json_t **outcomes, struct rb_error *err)
{
	*outcomes = NULL;
	NEED_OP(s, complete, err);
	return s->ops->complete(s, o, results, outcomes, err);
}

int
rb_store_complete_send(struct rb_store *s, struct rb_dl *const *v, size_t n, bool apart,
    struct rb_error *err)
{
	NEED_OP(s, complete_send, err);
	return s->ops->complete_send(s, v, n, apart, err);
}

int
rb_store_complete_recv(struct rb_store *s, bool wait, unsigned char *outcome, struct rb_error *err)
{
	NEED_OP(s, complete_recv, err);
	return s->ops->complete_recv(s, wait, outcome, err);
}

void
rb_dl_free(struct rb_dl *d)
{
	if (d == NULL)
		return;
	json_decref(d->line);
	free(d->mem);
	free(d);
}

json_t *
rb_dl_result(const struct rb_dl *d)
{
	json_t *r;
	char id[32];

	if (d->line != NULL) {
		r = json_copy(d->line);
		json_object_del(r, RB_LINE_TEXT_KEY);
		return r;
	}
	id[rb_fmt_int(id, d->id)] = '\0';
	r = json_object();
	json_object_set_new(r, "event_id", json_string(d->event_id));
	json_object_set_new(r, "handler", json_string(d->handler));
	json_object_set_new(r, "key", d->key != NULL ? json_string(d->key) : json_null());
	json_object_set_new(r, "attempt", json_integer(d->attempt));
	json_object_set_new(r, "lease", json_string(d->lease));
	json_object_set_new(r, "delivery_id", json_string(id));
	json_object_set_new(r, "lane", json_integer(d->lane));
	return r;
}

bool
rb_result_completes(const json_t *r)
{
	const json_t *ok = json_object_get(r, "ok");

	if (json_is_true(json_object_get(r, "release")) || json_is_true(json_object_get(r, "dead")))
		return false;
	return ok == NULL || json_is_true(ok);
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
rb_store_relinquish_leases(struct rb_store *s, const json_t *leases, struct rb_error *err)
{
	NEED_OP(s, relinquish_leases, err);
	return s->ops->relinquish_leases(s, leases, err);
}

int
rb_store_listen(struct rb_store *s, struct rb_error *err)
{
	NEED_OP(s, listen, err);
	return s->ops->listen(s, err);
}

int
rb_store_socket(const struct rb_store *s)
{
	return s->ops->socket != NULL ? s->ops->socket(s) : -1;
}

int
rb_store_notified(struct rb_store *s, const char *handler, int timeout_ms, struct rb_error *err)
{
	NEED_OP(s, notified, err);
	return s->ops->notified(s, handler, timeout_ms, err);
}

/* ---- record validation ------------------------------------------------ */

/* RFC 3339: 2026-11-30T05:44:09Z, fractions and offsets allowed. */
static bool
rfc3339_valid(const char *s)
{
	const char *shape = "dddd-dd-ddTdd:dd:dd";
	size_t i;

	for (i = 0; shape[i] != '\0'; i++) {
		if (shape[i] == 'd' ? !isdigit((unsigned char)s[i]) :
		    (shape[i] == 'T' ? (s[i] != 'T' && s[i] != 't' && s[i] != ' ') : s[i] != shape[i]))
			return false;
	}
	s += i;
	if (*s == '.') {
		s++;
		if (!isdigit((unsigned char)*s))
			return false;
		while (isdigit((unsigned char)*s))
			s++;
	}
	if (*s == 'Z' || *s == 'z')
		return s[1] == '\0';
	if ((*s == '+' || *s == '-') && isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) &&
	    s[3] == ':' && isdigit((unsigned char)s[4]) && isdigit((unsigned char)s[5]) && s[6] == '\0')
		return true;
	return false;
}

static int
want_string(const json_t *o, const char *field, bool required, size_t max, struct rb_error *err)
{
	const json_t *v = json_object_get(o, field);

	if (v == NULL || json_is_null(v)) {
		if (required)
			return rb_seterr(err, RB_EXIT_DATAERR, "missing field '%s'", field);
		return 0;
	}
	if (!json_is_string(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field '%s' must be a string", field);
	if (json_string_length(v) == 0)
		return rb_seterr(err, RB_EXIT_DATAERR, "field '%s' must not be empty", field);
	if (json_string_length(v) > max)
		return rb_seterr(err, RB_EXIT_DATAERR, "field '%s' is longer than %zu bytes", field, max);
	return 0;
}

int
rb_event_validate(const json_t *e, struct rb_error *err)
{
	const json_t *v;

	if (want_string(e, "name", true, 1000, err) < 0 || want_string(e, "id", false, 1000, err) < 0 ||
	    want_string(e, "key", false, 1000, err) < 0)
		return -1;
	if (json_object_get(e, "payload") == NULL)
		return rb_seterr(err, RB_EXIT_DATAERR, "missing field 'payload'");
	v = json_object_get(e, "headers");
	if (v != NULL && !json_is_null(v) && !json_is_object(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'headers' must be an object");
	v = json_object_get(e, "delay_ms");
	if (v != NULL && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 0))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'delay_ms' must be a whole number >= 0");
	v = json_object_get(e, "available_at");
	if (v != NULL && !json_is_null(v) &&
	    (!json_is_string(v) || !rfc3339_valid(json_string_value(v))))
		return rb_seterr(err, RB_EXIT_DATAERR,
		    "field 'available_at' must be an RFC 3339 time such as 2026-01-31T12:00:00Z");
	if (json_object_get(e, "delay_ms") != NULL && json_object_get(e, "available_at") != NULL &&
	    !json_is_null(json_object_get(e, "delay_ms")) && !json_is_null(json_object_get(e, "available_at")))
		return rb_seterr(err, RB_EXIT_DATAERR, "give 'delay_ms' or 'available_at', not both");
	v = json_object_get(e, "handlers");
	if (v != NULL && !json_is_null(v)) {
		size_t i;
		json_t *h;

		if (!json_is_array(v))
			return rb_seterr(err, RB_EXIT_DATAERR, "field 'handlers' must be an array of names");
		json_array_foreach(v, i, h) {
			if (!json_is_string(h) || !rb_handler_valid(json_string_value(h)))
				return rb_seterr(err, RB_EXIT_DATAERR,
				    "field 'handlers' must hold handler names ([A-Za-z0-9_.:-])");
		}
	}
	return 0;
}

int
rb_result_validate(const json_t *r, struct rb_error *err)
{
	const json_t *v;
	struct rb_lease lease;

	if (want_string(r, "event_id", true, 1000, err) < 0 || want_string(r, "handler", true, 200, err) < 0)
		return -1;
	if (!rb_handler_valid(json_string_value(json_object_get(r, "handler"))))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'handler' is not a handler name");
	v = json_object_get(r, "lease");
	if (v == NULL)
		return rb_seterr(err, RB_EXIT_DATAERR, "missing field 'lease'");
	if (!json_is_string(v) || rb_lease_parse(json_string_value(v), &lease) < 0)
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'lease' is not a lease token (lane:epoch:claims)");
	v = json_object_get(r, "ok");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'ok' must be true or false");
	v = json_object_get(r, "dead");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'dead' must be true or false");
	v = json_object_get(r, "release");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'release' must be true or false");
	v = json_object_get(r, "retry_ms");
	if (v != NULL && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 0))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'retry_ms' must be a whole number >= 0");
	v = json_object_get(r, "error");
	if (v != NULL && !json_is_null(v) && !json_is_string(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'error' must be a string");
	return 0;
}

int
rb_subscription_parse(const char *spec, char **buf, const char **handler, const char **pattern,
    struct rb_error *err)
{
	char *copy, *colon;

	*buf = NULL;
	colon = strchr(spec, ':');
	if (colon == NULL)
		return rb_seterr(err, RB_EXIT_USAGE, "'%s' is not HANDLER:PATTERN", spec);
	copy = xstrdup(spec);
	/* the handler is up to the last ':' that leaves a non-empty pattern?  No:
	 * handler names may hold ':', patterns may not, so split at the last ':' */
	colon = strrchr(copy, ':');
	*colon = '\0';
	if (!rb_handler_valid(copy)) {
		free(copy);
		return rb_seterr(err, RB_EXIT_USAGE, "'%s': invalid handler name ([A-Za-z0-9_.:-], at most 200)", spec);
	}
	if (colon[1] == '\0' || strlen(colon + 1) > 1000) {
		free(copy);
		return rb_seterr(err, RB_EXIT_USAGE, "'%s': the pattern must not be empty", spec);
	}
	*buf = copy;
	*handler = copy;
	*pattern = colon + 1;
	return 0;
}
