/* SPDX-License-Identifier: MIT */
/*
 * slowop: bench/recovery's --pipe handler.  Reads delivery lines on stdin,
 * one at a time; for each, sleeps MS milliseconds (the handler's work),
 * writes the line back with "ok":true appended and flushes, and appends
 * "EVENT_ID PUBLISH_US HANDLED_US" to LOGDIR/h.PID (PUBLISH_US: the
 * payload's "t", 0 when it has none; HANDLED_US: the time it answered).
 *
 *   slowop LOGDIR MS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long
now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

int
main(int argc, char **argv)
{
	char path[4096], *line = NULL;
	size_t cap = 0;
	ssize_t n;
	FILE *lg;
	long ms;
	struct timespec pause;

	if (argc != 3) {
		fprintf(stderr, "usage: slowop LOGDIR MS\n");
		return 64;
	}
	ms = atol(argv[2]);
	pause.tv_sec = ms / 1000;
	pause.tv_nsec = (ms % 1000) * 1000000L;
	snprintf(path, sizeof path, "%s/h.%ld", argv[1], (long)getpid());
	if ((lg = fopen(path, "a")) == NULL) {
		perror(path);
		return 73;
	}
	while ((n = getline(&line, &cap, stdin)) > 0) {
		const char *id, *t;
		char ev[256] = "";
		size_t len;

		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
			line[--n] = '\0';
		if (n < 2 || line[0] != '{' || line[n - 1] != '}')
			continue;
		if (ms > 0)
			nanosleep(&pause, NULL);
		if ((id = strstr(line, "\"event_id\":\"")) != NULL) {
			id += 12;
			len = strcspn(id, "\"");
			if (len >= sizeof ev)
				len = sizeof ev - 1;
			memcpy(ev, id, len);
			ev[len] = '\0';
		}
		t = strstr(line, "\"t\":");
		line[n - 1] = '\0';
		printf("%s,\"ok\":true}\n", line);
		fflush(stdout);
		fprintf(lg, "%s %lld %lld\n", ev[0] ? ev : "-", t ? atoll(t + 4) : 0LL, now_us());
		fflush(lg);
	}
	free(line);
	fclose(lg);
	return 0;
}
