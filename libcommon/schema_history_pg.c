/* generated from schema_history_pg.sql by sql2c.sh: do not edit */
extern const char rb_schema_history_pg_sql[];
const char rb_schema_history_pg_sql[] =
"-- Optional completion history (rb-setup --completion-history): one\n"
"-- append-only insert per completion, never updated.\n"
"CREATE TABLE IF NOT EXISTS @S@.relaybus_completions (\n"
"    event_id     text NOT NULL,\n"
"    handler      text NOT NULL,\n"
"    attempts     integer NOT NULL,\n"
"    completed_at timestamptz NOT NULL DEFAULT now()\n"
");\n"
"CREATE INDEX IF NOT EXISTS relaybus_completions_completed_at_idx\n"
"    ON @S@.relaybus_completions (completed_at);\n"
;
