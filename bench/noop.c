/* SPDX-License-Identifier: MIT */
/*
 * noop: the bench's no-op handler.  Reads delivery lines on stdin and
 * writes each back with "ok":true appended (a result line for rb-complete
 * or rb-dispatch --pipe).  Every line is also appended to LOGDIR/h.PID with
 * the time it was handled in front: {"_ts":MICROSECONDS,...the line...},
 * which the harness reads to check exactness, key order and latency.
 * Output is flushed whenever no more input is waiting, so a stream of
 * lines is answered in chunks and a single line at once.
 *
 *   noop LOGDIR
 *
 * Two knobs for bench/run's curve and rss scenarios, from the environment
 * (which rb-dispatch --pipe passes on):
 *   NOOP_FAIL_FIRST=FILE  a delivery's first attempt ("attempt":1) fails
 *       (answered "ok":false, "retry_ms":0) and is logged to FILE instead
 *       of LOGDIR, every later attempt succeeds as usual
 *   NOOP_DELAY_MS=N       wait N ms before answering each chunk of input
 *       (a slow handler: the dispatcher fills its --concurrency)
 *
 * It keeps the handler contract of rb-claim --follow --chain (rb-claim(1)):
 * once a keyed line failed, the later lines of its key are answered
 * "release":true (and not logged) until the key comes round again (a line
 * whose sequence is not above the highest one failed or released).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char *out, *lg, *fl;
static size_t out_n, out_cap, lg_n, lg_cap, fl_n, fl_cap;
static int fail_first;
static const char fail_tail[] = ",\"ok\":false,\"error\":\"bench: first attempt\",\"retry_ms\":0}\n";
static const char release_tail[] = ",\"release\":true}\n";

/* The keys held back by a failure: open addressing, never shrinking. */
struct held { char *key; size_t klen; long long last; int on; };
static struct held *held;
static size_t nheld, capheld;

static size_t
key_hash(const char *k, size_t n)
{
	size_t h = 1469598103934665603ULL;

	while (n-- > 0)
		h = (h ^ (unsigned char)*k++) * 1099511628211ULL;
	return h;
}

static struct held *
held_find(const char *k, size_t n, int add)
{
	if (add && (nheld + 1) * 2 > capheld) {
		struct held *old = held;
		size_t oldcap = capheld;

		capheld = capheld == 0 ? 64 : capheld * 2;
		if ((held = calloc(capheld, sizeof *held)) == NULL) {
			perror("noop");
			exit(71);
		}
		for (size_t i = 0; i < oldcap; i++)
			if (old[i].key != NULL) {
				size_t j = key_hash(old[i].key, old[i].klen) & (capheld - 1);

				while (held[j].key != NULL)
					j = (j + 1) & (capheld - 1);
				held[j] = old[i];
			}
		free(old);
	}
	if (capheld == 0)
		return NULL;
	for (size_t j = key_hash(k, n) & (capheld - 1);; j = (j + 1) & (capheld - 1)) {
		if (held[j].key == NULL) {
			if (!add)
				return NULL;
			if ((held[j].key = malloc(n)) == NULL) {
				perror("noop");
				exit(71);
			}
			memcpy(held[j].key, k, n);
			held[j].klen = n;
			nheld++;
			return &held[j];
		}
		if (held[j].klen == n && memcmp(held[j].key, k, n) == 0)
			return &held[j];
	}
}

/* The line's "key" as written (its JSON string, quotes and all; NULL: none)
 * and "sequence" (the last member of a delivery line). */
static const char *
line_key(const char *s, size_t len, size_t *klen, long long *seq)
{
	const char *k = memmem(s, len, ",\"key\":\"", 8), *e, *q;

	if (k == NULL)
		return NULL;
	k += 7;
	for (e = k + 1; e < s + len && *e != '"'; e++)
		if (*e == '\\')
			e++;
	if (e >= s + len)
		return NULL;
	*klen = (size_t)(e + 1 - k);
	for (q = s + len - 1; q > e && *q != ':'; q--)
		;
	if (q <= e || q - s < 11 || memcmp(q - 11, ",\"sequence\"", 11) != 0)
		return NULL;
	*seq = strtoll(q + 1, NULL, 10);
	return k;
}

static void
put(char **b, size_t *n, size_t *cap, const char *s, size_t len)
{
	if (*n + len > *cap) {
		*cap = (*n + len) * 2;
		if ((*b = realloc(*b, *cap)) == NULL) {
			perror("noop");
			exit(71);
		}
	}
	memcpy(*b + *n, s, len);
	*n += len;
}

static void
drain(int fd, char *b, size_t *n)
{
	size_t off = 0;

	while (off < *n) {
		ssize_t w = write(fd, b + off, *n - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			perror("noop: write");
			exit(74);
		}
		off += (size_t)w;
	}
	*n = 0;
}

static void
line(const char *s, size_t len, long long ts)
{
	char pre[48];
	int k;

	while (len > 0 && (s[len - 1] == '\r' || s[len - 1] == ' '))
		len--;
	if (len < 2 || s[0] != '{' || s[len - 1] != '}')
		return;
	k = snprintf(pre, sizeof pre, "{\"_ts\":%lld,", ts);
	size_t klen = 0;
	long long seq = 0;
	const char *key = line_key(s, len, &klen, &seq);
	struct held *h = key != NULL ? held_find(key, klen, 0) : NULL;

	if (h != NULL && h->on) {
		if (seq > h->last) {
			/* behind a failure of its key: not run, given back */
			h->last = seq;
			put(&out, &out_n, &out_cap, s, len - 1);
			put(&out, &out_n, &out_cap, release_tail, strlen(release_tail));
			return;
		}
		h->on = 0;	/* (the key came round again) */
	}
	if (fail_first && memmem(s, len, "\"attempt\":1,", 12) != NULL) {
		if (key != NULL) {
			h = held_find(key, klen, 1);
			h->on = 1;
			h->last = seq;
		}
		put(&fl, &fl_n, &fl_cap, pre, (size_t)k);
		put(&fl, &fl_n, &fl_cap, s + 1, len - 1);
		put(&fl, &fl_n, &fl_cap, "\n", 1);
		put(&out, &out_n, &out_cap, s, len - 1);
		put(&out, &out_n, &out_cap, fail_tail, strlen(fail_tail));
		return;
	}
	put(&lg, &lg_n, &lg_cap, pre, (size_t)k);
	put(&lg, &lg_n, &lg_cap, s + 1, len - 1);
	put(&lg, &lg_n, &lg_cap, "\n", 1);
	put(&out, &out_n, &out_cap, s, len - 1);
	put(&out, &out_n, &out_cap, ",\"ok\":true}\n", 12);
}

int
main(int argc, char **argv)
{
	static char buf[1 << 20];
	size_t have = 0;
	char path[4096];
	const char *ff = getenv("NOOP_FAIL_FIRST"), *dl = getenv("NOOP_DELAY_MS");
	struct timespec delay = { 0, 0 };
	int logfd, failfd = -1;

	if (argc != 2) {
		fprintf(stderr, "usage: noop LOGDIR\n");
		return 64;
	}
	snprintf(path, sizeof path, "%s/h.%ld", argv[1], (long)getpid());
	if ((logfd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
		perror(path);
		return 73;
	}
	if (ff != NULL && *ff != '\0') {
		if ((failfd = open(ff, O_WRONLY | O_CREAT | O_APPEND, 0644)) < 0) {
			perror(ff);
			return 73;
		}
		fail_first = 1;
	}
	if (dl != NULL && atol(dl) > 0) {
		delay.tv_sec = atol(dl) / 1000;
		delay.tv_nsec = atol(dl) % 1000 * 1000000L;
	}
	for (;;) {
		ssize_t r = read(0, buf + have, sizeof buf - have);
		struct timespec t;
		long long ts;
		size_t start = 0;

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		have += (size_t)r;
		clock_gettime(CLOCK_REALTIME, &t);
		ts = (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
		for (size_t i = 0; i < have; i++) {
			if (buf[i] == '\n') {
				line(buf + start, i - start, ts);
				start = i + 1;
			}
		}
		memmove(buf, buf + start, have - start);
		have -= start;
		if (have == sizeof buf) {
			fprintf(stderr, "noop: line too long\n");
			return 65;
		}
		if (delay.tv_sec > 0 || delay.tv_nsec > 0)
			nanosleep(&delay, NULL);
		drain(logfd, lg, &lg_n);
		if (failfd >= 0)
			drain(failfd, fl, &fl_n);
		drain(1, out, &out_n);
	}
	if (have > 0) {
		struct timespec t;

		clock_gettime(CLOCK_REALTIME, &t);
		line(buf, have, (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000);
	}
	drain(logfd, lg, &lg_n);
	if (failfd >= 0)
		drain(failfd, fl, &fl_n);
	drain(1, out, &out_n);
	return 0;
}
