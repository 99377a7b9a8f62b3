-- Optional completion history (rb-setup --completion-history): one
-- append-only insert per completion, never updated.
CREATE TABLE IF NOT EXISTS @S@.relaybus_completions (
    event_id     text NOT NULL,
    handler      text NOT NULL,
    attempts     integer NOT NULL,
    completed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS relaybus_completions_completed_at_idx
    ON @S@.relaybus_completions (completed_at);
