/* SPDX-License-Identifier: MIT */
/*
 * store_mongo_api.c: rb_mongo_complete (<rb_mongo.h>), a handler's
 * completion in its own MongoDB transaction: the success path of
 * rb-complete (store_mongo_complete.c, the same code) in the caller's
 * session.  (rb_mongo_publish is in store_mongo_publish.c.)
 */
#include "config.h"

#include <string.h>

#include "rb_exit.h"
#include "rb_mongo.h"
#include "rb_records.h"
#include "rb_store.h"
#include "rb_util.h"
#include "store_int.h"
#include "store_mongo_int.h"
#include "store_mongo_steps.h"

/* What rb_mongo_publish and rb_mongo_complete (function fn) check first:
 * the schema (NULL: the default, into *schema) and a session in a
 * transaction: 0, or -1 + err (64). */
int
mg_api_check(const char *fn, mongoc_client_session_t *cs, mongoc_database_t *db, const char **schema,
    struct rb_error *err)
{
	if (*schema == NULL)
		*schema = RB_DEFAULT_SCHEMA;
	if (!rb_ident_valid(*schema))
		return rb_seterr(err, RB_EXIT_USAGE, "invalid schema name");
	if (cs == NULL || db == NULL || !mongoc_client_session_in_transaction(cs))
		return rb_seterr(err, RB_EXIT_USAGE, "%s: the session must be in a transaction "
		    "(mongoc_client_session_start_transaction)", fn);
	return 0;
}

int
rb_mongo_complete(mongoc_client_session_t *cs, mongoc_database_t *db, const char *schema, const json_t *delivery,
    struct rb_error *err)
{
	struct mg_be be = { .db = db };
	struct rb_store st = { .be = &be, .url_redacted = (char *)"(the application's client)" };
	struct rb_result r;
	json_t *line;
	bson_error_t e;
	int rc;

	if (mg_api_check("rb_mongo_complete", cs, db, &schema, err) < 0)
		return -1;
	if (!json_is_object(delivery))
		return rb_seterr(err, RB_EXIT_DATAERR, "rb_mongo_complete: the delivery must be a JSON object");
	st.schema = (char *)schema;
	/* the delivery line (event_id, handler, lease, delivery_id) as a success */
	line = json_deep_copy(delivery);
	json_object_set_new(line, "ok", json_true());
	json_object_del(line, "completed");
	if (rb_result_parse(line, &r, err) < 0) {
		json_decref(line);
		return -1;
	}
	if (mg_ready(&st, "complete", err) < 0) {
		json_decref(line);
		return -1;
	}
	rc = mg_complete_in(&st, cs, &r, &e);
	json_decref(line);
	if (rc < 0)
		return mg_err(&st, &e, "complete", err);
	if (rc == 0)
		return rb_seterr(err, RB_EXIT_LOST, "rb_mongo_complete: the lease of %s of %s does not hold "
		    "(taken over, or completed already): abort the transaction", r.event_id, r.handler);
	return 0;
}
