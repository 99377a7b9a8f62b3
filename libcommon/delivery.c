/* SPDX-License-Identifier: MIT */
/*
 * delivery.c: the one place a delivery line is spelled, for every backend
 * (rb_records.h): a claimed delivery's fields become its line, its JSON
 * object or a struct rb_dl, and a struct rb_dl becomes a result to
 * complete (struct rb_result, no object).  The line is written from the fields as they come (the
 * payload's JSON text compacted, never parsed): rb-dispatch spent a third
 * of its time parsing payloads only to print them again.
 */
#include "config.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rb_jsonl.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"

static json_t *
json_or_null(const char *text)
{
	json_t *v = text != NULL ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;

	return v != NULL ? v : json_null();
}

/* Append a JSON string, or null for NULL. */
static void
sb_str(struct rb_sbuf *b, const char *v)
{
	if (v == NULL)
		rb_sb_putn(b, "null", 4);
	else
		rb_json_sb_string(b, v, strlen(v));
}

/* The members are in the order the delivery objects have them. */
void
rb_delivery_line(const struct rb_delivery_fields *c, const char *token, struct rb_sbuf *b)
{
	char num[32];

	b->len = 0;
	rb_sb_puts(b, "{\"event_id\":");
	sb_str(b, c->event_id);
	rb_sb_puts(b, ",\"handler\":");
	sb_str(b, c->handler);
	rb_sb_puts(b, ",\"name\":");
	sb_str(b, c->name);
	rb_sb_puts(b, ",\"key\":");
	sb_str(b, c->key);
	for (int k = 0; k < 2; k++) {
		const char *v = k == 0 ? c->payload : c->headers;

		rb_sb_puts(b, k == 0 ? ",\"payload\":" : ",\"headers\":");
		if (v == NULL)
			rb_sb_puts(b, "null");
		else
			rb_json_sb_compact(b, v, strlen(v));
	}
	rb_sb_puts(b, ",\"attempt\":");
	rb_sb_putn(b, num, rb_fmt_int(num, c->attempts + 1));
	rb_sb_puts(b, ",\"lease\":\"");
	rb_sb_puts(b, token);
	rb_sb_puts(b, "\",\"created_at\":");
	sb_str(b, c->created_at);
	rb_sb_puts(b, ",\"delivery_id\":");
	sb_str(b, c->id);
	rb_sb_puts(b, ",\"lane\":");
	rb_sb_putn(b, num, rb_fmt_int(num, c->lane));
	rb_sb_puts(b, ",\"sequence\":");
	rb_sb_puts(b, c->sequence == NULL ? "null" : c->sequence);
	rb_sb_puts(b, "}\n");
}

json_t *
rb_delivery_object(const struct rb_delivery_fields *c, bool text, struct rb_sbuf *b)
{
	struct rb_lease l = { .lane = c->lane, .epoch = c->epoch, .claims = c->claims };
	char token[64];
	json_t *d = json_object();

	rb_lease_format(&l, token, sizeof token);
	/* with text, only the members a caller works with (the rest are in the
	 * line): each one costs an allocation or three */
	json_object_set_new(d, "event_id", json_string(c->event_id));
	json_object_set_new(d, "handler", json_string(c->handler));
	if (!text)
		json_object_set_new(d, "name", json_string(c->name));
	json_object_set_new(d, "key", c->key == NULL ? json_null() : json_string(c->key));
	if (!text) {
		json_object_set_new(d, "payload", json_or_null(c->payload));
		json_object_set_new(d, "headers", json_or_null(c->headers));
	}
	json_object_set_new(d, "attempt", json_integer(c->attempts + 1));
	json_object_set_new(d, "lease", json_string(token));
	if (!text)
		json_object_set_new(d, "created_at", json_string(c->created_at));
	json_object_set_new(d, "delivery_id", json_string(c->id));
	json_object_set_new(d, "lane", json_integer(c->lane));
	if (!text)
		json_object_set_new(d, "sequence", c->sequence == NULL ? json_null() :
		    json_integer(strtoll(c->sequence, NULL, 10)));
	if (text) {
		rb_delivery_line(c, token, b);
		json_object_set_new(d, RB_LINE_TEXT_KEY, json_stringn_nocheck(b->s, b->len));
	}
	return d;
}

struct rb_dl *
rb_dl_new(const struct rb_delivery_fields *c)
{
	size_t le = strlen(c->event_id) + 1, lh = strlen(c->handler) + 1;
	size_t ls = c->sequence != NULL ? strlen(c->sequence) + 1 : 0;
	size_t lc = c->created_at != NULL ? strlen(c->created_at) + 1 : 0;
	struct rb_dl *d = xmalloc(sizeof *d + le + lh + ls + lc);
	char *p = (char *)(d + 1);

	memset(d, 0, sizeof *d);
	d->id = strtoll(c->id, NULL, 10);
	d->lease = (struct rb_lease){ .lane = c->lane, .epoch = c->epoch, .claims = c->claims };
	d->addr = c->addr;
	d->attempt = c->attempts + 1;
	memcpy(p, c->event_id, le);
	d->event_id = p;
	p += le;
	memcpy(p, c->handler, lh);
	d->handler = p;
	p += lh;
	if (c->sequence != NULL) {
		memcpy(p, c->sequence, ls);
		d->sequence = p;
		p += ls;
	}
	if (c->created_at != NULL) {
		memcpy(p, c->created_at, lc);
		d->created_at = p;
	}
	return d;
}

void
rb_dl_fill(struct rb_dl *d, const struct rb_delivery_fields *c, struct rb_sbuf *b)
{
	size_t lk = c->key != NULL ? strlen(c->key) + 1 : 0;
	char token[64];

	rb_lease_format(&d->lease, token, sizeof token);
	rb_delivery_line(c, token, b);
	d->mem = xmalloc(lk + b->len + 1);
	if (c->key != NULL) {
		memcpy(d->mem, c->key, lk);
		d->key = d->mem;
	}
	memcpy(d->mem + lk, b->s, b->len);
	d->mem[lk + b->len] = '\0';
	d->text = d->mem + lk;
	d->tlen = b->len;
	d->fetched = true;
}

void
rb_dl_again(struct rb_dl *d, int attempts)
{
	static const char at[] = ",\"attempt\":", ca[] = "\",\"created_at\":";
	size_t lk = d->key != NULL ? strlen(d->key) + 1 : 0, a = 0, c = 0;
	const char *t = d->text;
	char token[64], num[32], *mem;
	struct rb_sbuf b;

	d->attempt = attempts + 1;
	d->lease.claims++;
	d->addr = 0;	/* (the failure rewrote its row) */
	if (!d->fetched)
		return;
	/* (the last attempt member: the payload and headers, written before
	 * it, may hold those words; nothing after it can but the lease) */
	for (size_t i = 0; i + sizeof at - 1 <= d->tlen; i++)
		if (memcmp(t + i, at, sizeof at - 1) == 0)
			a = i;
	for (size_t i = a; a > 0 && i + sizeof ca - 1 <= d->tlen; i++)
		if (memcmp(t + i, ca, sizeof ca - 1) == 0) {
			c = i;
			break;
		}
	if (a == 0 || c == 0)
		return;		/* (cannot happen: rb_delivery_line wrote it) */
	rb_lease_format(&d->lease, token, sizeof token);
	rb_sb_init(&b);
	rb_sb_putn(&b, t, a);
	rb_sb_puts(&b, at);
	rb_sb_putn(&b, num, rb_fmt_int(num, d->attempt));
	rb_sb_puts(&b, ",\"lease\":\"");
	rb_sb_puts(&b, token);
	rb_sb_putn(&b, t + c, d->tlen - c);
	mem = xmalloc(lk + b.len + 1);
	if (lk > 0)
		memcpy(mem, d->key, lk);
	memcpy(mem + lk, b.s, b.len);
	mem[lk + b.len] = '\0';
	free(d->mem);
	d->mem = mem;
	d->key = lk > 0 ? mem : NULL;
	d->text = mem + lk;
	d->tlen = b.len;
	free(b.s);
}

void
rb_dl_free(struct rb_dl *d)
{
	if (d == NULL)
		return;
	free(d->mem);
	free(d);
}

struct rb_result
rb_result_of(const struct rb_dl *d, enum rb_verdict verdict)
{
	return (struct rb_result){ .event_id = d->event_id, .handler = d->handler, .lease = d->lease,
	    .delivery_id = d->id, .addr = d->addr, .verdict = verdict, .retry_ms = -1, .outcome = RB_OUTCOME_LOST,
	    .attempts = -1 };
}

/* ---- what a store has to report ------------------------------------------ */

void
rb_evq_push(struct rb_evq *q, const struct rb_store_event *ev)
{
	if (q->n == 0)
		q->head = 0;
	if (q->head + q->n == q->cap) {
		if (q->head > 0) {
			memmove(q->v, q->v + q->head, q->n * sizeof *q->v);
			q->head = 0;
		} else {
			q->cap = q->cap == 0 ? 8 : q->cap * 2;
			q->v = xrealloc(q->v, q->cap * sizeof *q->v);
		}
	}
	q->v[q->head + q->n++] = *ev;
}

bool
rb_evq_pop(struct rb_evq *q, struct rb_store_event *ev)
{
	if (q->n == 0)
		return false;
	*ev = q->v[q->head++];
	q->n--;
	return true;
}

bool
rb_evq_take_last(struct rb_evq *q, enum rb_store_event_kind kind, struct rb_store_event *ev)
{
	for (size_t i = q->n; i-- > 0;) {
		struct rb_store_event *e = &q->v[q->head + i];

		if (e->kind != kind)
			continue;
		*ev = *e;
		memmove(e, e + 1, (q->n - i - 1) * sizeof *e);
		q->n--;
		return true;
	}
	return false;
}

void
rb_evq_clear(struct rb_evq *q)
{
	struct rb_store_event ev;

	while (rb_evq_pop(q, &ev)) {
		for (size_t i = 0; i < ev.n; i++)
			rb_dl_free(ev.v[i]);
		free(ev.v);
	}
}

void
rb_evq_free(struct rb_evq *q)
{
	rb_evq_clear(q);
	free(q->v);
	memset(q, 0, sizeof *q);
}

void
rb_evq_failed(struct rb_evq *q, enum rb_store_event_kind what, int dropped, const struct rb_error *err)
{
	struct rb_store_event ev = { .kind = RB_STORE_FAILED, .failed = what, .dropped = dropped, .err = *err };

	rb_evq_push(q, &ev);
}
