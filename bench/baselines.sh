# bench/baselines.sh: the baselines' tables, filled from a preloaded
# relaybus schema (sourced by bench/run and bench/drain-cost).
#
# baseline_sql SCHEMA KIND TPL prints the SQL that makes KIND's table(s) in
# SCHEMA (which exists) and copies TPL's deliveries into them, in id order:
#   fused     the plain-SQL limit (sqlloop fused): one queue row a delivery,
#             the payload in it
#   txlock    the minimal at-least-once outbox (sqlloop txlock): relaybus's
#             shape, an events table and a delivery row per handler without
#             the payload
#   rowlease  relaybus 0.1.0 (sqlloop rowlease): one row per delivery
#             rewritten by claim and completion, with its status/due-time
#             index and its lease index
baseline_sql() {  # schema kind tpl
  case $2 in
    fused) echo "CREATE TABLE $1.q (id bigserial PRIMARY KEY, event_id text NOT NULL, handler text NOT NULL, key text,
            payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
          INSERT INTO $1.q (event_id, handler, key, payload)
            SELECT d.event_id, d.handler, d.key, e.payload FROM $3.relaybus_deliveries d
              JOIN $3.relaybus_events e ON e.id = d.event_id ORDER BY d.id;" ;;
    txlock) echo "CREATE TABLE $1.events (id text PRIMARY KEY, name text NOT NULL, key text, payload jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now());
          CREATE TABLE $1.deliveries (id bigserial PRIMARY KEY, event_id text NOT NULL, handler text NOT NULL, key text,
            created_at timestamptz NOT NULL DEFAULT now());
          INSERT INTO $1.events (id, name, key, payload) SELECT id, name, key, payload FROM $3.relaybus_events;
          INSERT INTO $1.deliveries (event_id, handler, key)
            SELECT d.event_id, d.handler, d.key FROM $3.relaybus_deliveries d ORDER BY d.id;" ;;
    rowlease) echo "CREATE TABLE $1.rl (id bigserial PRIMARY KEY, event_id text NOT NULL, handler text NOT NULL, key text,
            payload jsonb NOT NULL, status text NOT NULL DEFAULT 'pending', attempts integer NOT NULL DEFAULT 0,
            lease_owner text, lease_expires_at timestamptz, available_at timestamptz NOT NULL DEFAULT now(),
            completed_at timestamptz, last_error text, created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now(), UNIQUE (event_id, handler));
          CREATE INDEX rl_status_due_idx ON $1.rl (status, available_at, id);
          CREATE INDEX rl_lease_idx ON $1.rl (lease_expires_at) WHERE status = 'processing';
          INSERT INTO $1.rl (event_id, handler, key, payload)
            SELECT d.event_id, d.handler, d.key, e.payload FROM $3.relaybus_deliveries d
              JOIN $3.relaybus_events e ON e.id = d.event_id ORDER BY d.id;" ;;
    *) echo "baseline_sql: unknown kind '$2'" >&2; return 1 ;;
  esac
}
