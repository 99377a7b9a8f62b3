/* SPDX-License-Identifier: MIT */
/*
 * store.c: URL scheme -> backend, and the front functions of rb_store.h:
 * each checks its slot (NULL: not supported by the backend) and calls it.
 * The backend-neutral records are in records.c and delivery.c.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"

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

