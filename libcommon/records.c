/* SPDX-License-Identifier: MIT */
/*
 * records.c: the backend-neutral rules of the JSON-lines records (events,
 * results, subscriptions, publish acks, admin statuses) and rb_seterr.
 * Every backend checks and reports through these, so that the same bad
 * line gets the same message whatever the store.  See rb_records.h.
 */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rb_admin.h"
#include "rb_exit.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"

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

		json_array_append_new(out, json_pack("{s:s, s:i, s:b, s:o}", "event_id", a->v[i].id,
		    "deliveries", a->v[i].deliveries, "duplicate", a->v[i].duplicate,
		    "handlers", h != NULL ? h : json_array()));
	}
	return out;
}

/* ---- outcomes ------------------------------------------------------------ */

static const char *const outcome_names[RB_NOUTCOMES] = {
	[RB_OUTCOME_COMPLETED] = "completed",
	[RB_OUTCOME_RESCHEDULED] = "rescheduled",
	[RB_OUTCOME_BURIED] = "buried",
	[RB_OUTCOME_RELEASED] = "released",
	[RB_OUTCOME_LOST] = "lost",
};

const char *
rb_outcome_name(enum rb_outcome o)
{
	return (unsigned)o < RB_NOUTCOMES ? outcome_names[o] : "lost";
}

enum rb_outcome
rb_outcome_of(const char *name)
{
	for (int i = 0; name != NULL && i < RB_NOUTCOMES; i++)
		if (strcmp(name, outcome_names[i]) == 0)
			return (enum rb_outcome)i;
	return RB_OUTCOME_LOST;
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
	static const char *const known[] = { "id", "event_id", "name", "key", "payload", "headers",
	    "delay_ms", "available_at", "handlers" };
	const json_t *v, *id, *eid;
	const char *field;

	if (!json_is_object(e))
		return rb_seterr(err, RB_EXIT_DATAERR, "an event must be a JSON object");
	/* a field the contract does not have is a mistake, not an extension:
	 * extra data goes in "headers" (an "event_id" dropped here once cost
	 * the event its id, and its duplicate protection) */
	json_object_foreach((json_t *)e, field, v) {
		size_t i = 0;

		while (i < sizeof known / sizeof known[0] && strcmp(known[i], field) != 0)
			i++;
		if (i == sizeof known / sizeof known[0])
			return rb_seterr(err, RB_EXIT_DATAERR, "unknown field '%.100s' (an event has id, "
			    "name, key, payload, headers, delay_ms or available_at, handlers; "
			    "put other data in headers)", field);
	}
	if (want_string(e, "name", true, 1000, err) < 0 || want_string(e, "id", false, 1000, err) < 0 ||
	    want_string(e, "event_id", false, 1000, err) < 0 || want_string(e, "key", false, 1000, err) < 0)
		return -1;
	/* "event_id", as rb-claim and rb-complete spell it, is the same field */
	id = json_object_get(e, "id");
	eid = json_object_get(e, "event_id");
	if (json_is_string(id) && json_is_string(eid) && !json_equal(id, eid))
		return rb_seterr(err, RB_EXIT_DATAERR, "fields 'id' and 'event_id' differ (they name the "
		    "same id: give one)");
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

bool
rb_event_id_alias(json_t *e)
{
	json_t *eid = json_object_get(e, "event_id");

	if (eid == NULL)
		return false;
	if (json_is_string(eid) && !json_is_string(json_object_get(e, "id")))
		json_object_set(e, "id", eid);
	json_object_del(e, "event_id");
	return true;
}

/* The verdict members of a result line (ok, dead, release, retry_ms, error). */
static int
verdict_check(const json_t *r, struct rb_error *err)
{
	const json_t *v;

	v = json_object_get(r, "ok");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'ok' must be true or false");
	v = json_object_get(r, "dead");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'dead' must be true or false");
	v = json_object_get(r, "release");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'release' must be true or false");
	v = json_object_get(r, "completed");
	if (v != NULL && !json_is_boolean(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'completed' must be true or false");
	if (json_is_true(v) && (json_is_false(json_object_get(r, "ok")) || json_is_true(json_object_get(r, "dead")) ||
	    json_is_true(json_object_get(r, "release"))))
		return rb_seterr(err, RB_EXIT_DATAERR,
		    "field 'completed' is true, but 'ok' is false or 'dead' or 'release' true");
	v = json_object_get(r, "retry_ms");
	if (v != NULL && !json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 0))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'retry_ms' must be a whole number >= 0");
	v = json_object_get(r, "error");
	if (v != NULL && !json_is_null(v) && !json_is_string(v))
		return rb_seterr(err, RB_EXIT_DATAERR, "field 'error' must be a string");
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
	return verdict_check(r, err);
}

int
rb_result_parse(const json_t *r, struct rb_result *out, struct rb_error *err)
{
	const json_t *v;
	int64_t id;

	if (rb_result_validate(r, err) < 0)
		return -1;
	*out = (struct rb_result){ .event_id = json_string_value(json_object_get(r, "event_id")),
	    .handler = json_string_value(json_object_get(r, "handler")) };
	rb_lease_parse(json_string_value(json_object_get(r, "lease")), &out->lease);
	/* a delivery_id that is not one is no reason to refuse the line: the
	 * delivery is then found by event_id and handler */
	v = json_object_get(r, "delivery_id");
	if (json_is_string(v) && rb_parse_int64(json_string_value(v), 1, INT64_MAX, &id) == 0)
		out->delivery_id = id;
	return rb_result_verdict(r, out, err);
}

int
rb_result_verdict(const json_t *r, struct rb_result *out, struct rb_error *err)
{
	const json_t *v;

	if (verdict_check(r, err) < 0)
		return -1;
	out->retry_ms = -1;
	out->outcome = RB_OUTCOME_LOST;
	out->missing = false;
	out->by_handler = false;
	out->attempts = -1;
	out->sql_error = NULL;
	if (json_is_true(json_object_get(r, "completed")))
		out->verdict = RB_VERDICT_DONE;
	else if (json_is_true(json_object_get(r, "release")))
		out->verdict = RB_VERDICT_RELEASE;
	else if (json_is_true(json_object_get(r, "dead")))
		out->verdict = RB_VERDICT_DEAD;
	else if (json_is_false(json_object_get(r, "ok")))
		out->verdict = RB_VERDICT_FAIL;
	else
		out->verdict = RB_VERDICT_OK;
	v = json_object_get(r, "retry_ms");
	if (json_is_integer(v))
		out->retry_ms = json_integer_value(v);
	out->error = json_string_value(json_object_get(r, "error"));
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

/* ---- grants (rb-setup --grant, --revoke) ------------------------------ */

static const char *const kinds[] = { "publisher", "worker", "handler", "admin", NULL };

/* A role name as rb-setup takes it: [A-Za-z_][A-Za-z0-9_.-]*, at most 63
 * bytes (NAMEDATALEN - 1), and not a name PostgreSQL reserves.  It is the
 * exact name (quoted, never folded to lower case). */
static bool
role_valid(const char *r)
{
	size_t n;

	if (!((r[0] >= 'a' && r[0] <= 'z') || (r[0] >= 'A' && r[0] <= 'Z') || r[0] == '_'))
		return false;
	for (n = 0; r[n] != '\0'; n++)
		if (!((r[n] >= 'a' && r[n] <= 'z') || (r[n] >= 'A' && r[n] <= 'Z') ||
		    (r[n] >= '0' && r[n] <= '9') || strchr("_.-", r[n]) != NULL))
			return false;
	return n <= 63 && strcmp(r, "public") != 0 && strcmp(r, "none") != 0 && strncmp(r, "pg_", 3) != 0;
}

int
rb_grant_parse(const char *spec, char **buf, const char **kind, const char **role,
    const char **handlers, struct rb_error *err)
{
	size_t len = strlen(spec);
	char *copy, *eq, *colon, *lit, *h;
	bool known = false;

	*buf = NULL;
	*handlers = NULL;
	eq = strchr(spec, '=');
	if (eq == NULL || eq == spec)
		return rb_seterr(err, RB_EXIT_USAGE, "'%s' is not KIND=ROLE[:HANDLER,...]", spec);
	/* the spec, cut at '=' and ':', then the handlers as a text[] literal */
	copy = xmalloc(4 * len + 8);	/* the spec, then the literal: room for quotes */
	memcpy(copy, spec, len + 1);
	eq = copy + (eq - spec);
	*eq = '\0';
	for (int i = 0; kinds[i] != NULL; i++)
		known = known || strcmp(copy, kinds[i]) == 0;
	if (!known) {
		rb_seterr(err, RB_EXIT_USAGE, "'%s': unknown kind '%s' (publisher, worker, handler or admin)",
		    spec, copy);
		goto fail;
	}
	colon = strchr(eq + 1, ':');
	if (colon != NULL)
		*colon = '\0';
	if (!role_valid(eq + 1)) {
		rb_seterr(err, RB_EXIT_USAGE, "'%s': invalid role name ([A-Za-z_][A-Za-z0-9_.-], at most 63; "
		    "not public, none or pg_*)", spec);
		goto fail;
	}
	if (colon != NULL) {
		if (strcmp(copy, "admin") == 0) {
			rb_seterr(err, RB_EXIT_USAGE, "'%s': an admin grant names no handlers", spec);
			goto fail;
		}
		lit = copy + len + 1;
		lit[0] = '{';
		lit[1] = '\0';
		h = colon + 1;
		for (;;) {
			size_t hn = strcspn(h, ",");
			char save = h[hn];

			h[hn] = '\0';
			if (!rb_handler_valid(h)) {
				rb_seterr(err, RB_EXIT_USAGE, "'%s': invalid handler name '%s' ([A-Za-z0-9_.:-], "
				    "at most 200)", spec, h);
				goto fail;
			}
			/* an array element needs quotes only when it is NULL in any
			 * case (the SQL null unquoted): a handler name has no ',',
			 * '"', '\\', brace or space */
			if (strcasecmp(h, "null") == 0) {
				strcat(lit, "\"");
				strcat(lit, h);
				strcat(lit, "\"");
			} else
				strcat(lit, h);
			h[hn] = save;
			if (save == '\0')
				break;
			strcat(lit, ",");
			h += hn + 1;
		}
		strcat(lit, "}");
		*handlers = lit;
	}
	*buf = copy;
	*kind = copy;
	*role = eq + 1;
	return 0;
fail:
	free(copy);
	return -1;
}

/* ---- admin statuses ---------------------------------------------------- */

const char *const rb_admin_statuses[RB_ADMIN_NSTATUS] = { "pending", "processing", "dead", "completed" };

int
rb_admin_status_flags(const char *status, bool flags[RB_ADMIN_NSTATUS])
{
	const char *p = status;

	memset(flags, 0, RB_ADMIN_NSTATUS * sizeof flags[0]);
	if (status == NULL) {
		flags[0] = flags[1] = flags[2] = true;
		return 0;
	}
	for (;;) {
		size_t n = strcspn(p, ","), k;

		for (k = 0; k < RB_ADMIN_NSTATUS; k++)
			if (strlen(rb_admin_statuses[k]) == n && strncmp(p, rb_admin_statuses[k], n) == 0)
				break;
		if (k == RB_ADMIN_NSTATUS)
			return -1;
		flags[k] = true;
		if (p[n] == '\0')
			return 0;
		p += n + 1;
	}
}

bool
rb_admin_status_valid(const char *status)
{
	bool f[RB_ADMIN_NSTATUS];

	return status != NULL && rb_admin_status_flags(status, f) == 0;
}
