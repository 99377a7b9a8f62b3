/* SPDX-License-Identifier: MIT */
/*
 * mongo_race: the C completion (rb_mongo_complete: rb-complete's success
 * transaction, store_mongo_complete.c, in a session of this program) and a
 * takeover of the same lane, in a chosen order (tests/store_mongo.bats).
 *
 *	mongo_race URL SCHEMA LINE before|after COMMAND...
 *
 * LINE is the delivery line of rb-claim; COMMAND (an rb-claim that takes
 * the lane over) runs in between:
 *   before: the completion has read and deleted the delivery in its open
 *           transaction when COMMAND starts; it commits while COMMAND waits
 *   after:  the transaction has its snapshot (a read) when COMMAND runs to
 *           the end; then the completion runs in it
 * Prints "completion committed; takeover charged nothing" or "completion
 * conflicted; takeover charged N" (N: the delivery's attempts), or what
 * else happened.  Exit 0 unless it could not run.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rb_mongo.h>

static pid_t
spawn(char **argv)
{
	pid_t p = fork();

	if (p == 0) {
		freopen("/dev/null", "w", stdout);
		freopen("/dev/null", "w", stderr);
		execvp(argv[0], argv);
		_exit(127);
	}
	return p;
}

/* the delivery's attempts outside any transaction; -1 gone */
static int64_t
attempts_of(mongoc_database_t *db, const char *schema, const char *ev, const char *h)
{
	char name[200];
	mongoc_collection_t *c;
	bson_t *q = BCON_NEW("eventId", BCON_UTF8(ev), "handler", BCON_UTF8(h));
	mongoc_cursor_t *cur;
	const bson_t *d;
	int64_t n = -1;
	bson_iter_t it;

	snprintf(name, sizeof name, "%s.deliveries", schema);
	c = mongoc_database_get_collection(db, name);
	cur = mongoc_collection_find_with_opts(c, q, NULL, NULL);
	if (mongoc_cursor_next(cur, &d))
		n = bson_iter_init_find(&it, d, "attempts") ? bson_iter_as_int64(&it) : 0;
	mongoc_cursor_destroy(cur);
	mongoc_collection_destroy(c);
	bson_destroy(q);
	return n;
}

int
main(int argc, char **argv)
{
	struct rb_error err = { 0 };
	json_error_t je;
	json_t *line;
	mongoc_client_t *client;
	mongoc_database_t *db;
	mongoc_client_session_t *cs;
	bson_error_t e;
	const char *schema, *ev, *h;
	int rc = 0, st;
	pid_t p;

	if (argc < 6 || (strcmp(argv[4], "before") != 0 && strcmp(argv[4], "after") != 0)) {
		fprintf(stderr, "usage: mongo_race URL SCHEMA LINE before|after COMMAND...\n");
		return 64;
	}
	if ((line = json_loads(argv[3], 0, &je)) == NULL) {
		fprintf(stderr, "mongo_race: LINE: %s\n", je.text);
		return 65;
	}
	schema = argv[2];
	ev = json_string_value(json_object_get(line, "event_id"));
	h = json_string_value(json_object_get(line, "handler"));
	mongoc_init();
	client = mongoc_client_new(argv[1]);
	db = mongoc_client_get_default_database(client);
	if (client == NULL || db == NULL || ev == NULL || h == NULL ||
	    (cs = mongoc_client_start_session(client, NULL, &e)) == NULL ||
	    !mongoc_client_session_start_transaction(cs, NULL, &e)) {
		fprintf(stderr, "mongo_race: cannot start a transaction\n");
		return 69;
	}
	if (strcmp(argv[4], "before") == 0) {
		struct timespec ts = { 1, 500000000 };

		if (rb_mongo_complete(cs, db, schema, line, &err) < 0) {
			fprintf(stderr, "mongo_race: the lease does not hold before the race: %s\n", err.msg);
			return 70;
		}
		p = spawn(argv + 5);
		nanosleep(&ts, NULL);
		if (waitpid(p, &st, WNOHANG) == p) {
			fprintf(stderr, "mongo_race: the takeover did not wait for the open completion\n");
			return 70;
		}
		if (!mongoc_client_session_commit_transaction(cs, NULL, &e)) {
			printf("completion conflicted while the takeover waited: %s\n", e.message);
			kill(p, SIGTERM);
		}
		waitpid(p, &st, 0);
		if (attempts_of(db, schema, ev, h) < 0)
			printf("completion committed; takeover charged nothing\n");
		else
			printf("completion committed; but the delivery is still there\n");
	} else {
		char name[200];
		mongoc_collection_t *lc;
		bson_t q = BSON_INITIALIZER, opts = BSON_INITIALIZER;
		mongoc_cursor_t *cur;
		const bson_t *d;

		/* the snapshot: a read in the transaction */
		snprintf(name, sizeof name, "%s.lanes", schema);
		lc = mongoc_database_get_collection(db, name);
		mongoc_client_session_append(cs, &opts, &e);
		cur = mongoc_collection_find_with_opts(lc, &q, &opts, NULL);
		mongoc_cursor_next(cur, &d);
		mongoc_cursor_destroy(cur);
		mongoc_collection_destroy(lc);
		bson_destroy(&q);
		bson_destroy(&opts);
		p = spawn(argv + 5);
		waitpid(p, &st, 0);
		if (rb_mongo_complete(cs, db, schema, line, &err) < 0) {
			mongoc_client_session_abort_transaction(cs, NULL);
			printf("completion conflicted; takeover charged %lld\n",
			    (long long)attempts_of(db, schema, ev, h));
		} else if (!mongoc_client_session_commit_transaction(cs, NULL, &e))
			printf("completion conflicted at commit; takeover charged %lld\n",
			    (long long)attempts_of(db, schema, ev, h));
		else
			printf("completion committed after a takeover: both won\n");
	}
	mongoc_client_session_destroy(cs);
	mongoc_database_destroy(db);
	mongoc_client_destroy(client);
	json_decref(line);
	mongoc_cleanup();
	return rc;
}
