-- The in-place upgrade of a relaybus 0.1.0 (row-lease) schema, the seed's
-- "Upgrading from 0.1.0", mapped onto this schema (relaybus(7), UPGRADING
-- FROM 0.1.0).  rb-setup runs it in the set-up's transaction, under its
-- advisory lock, after lane_pg.sql and before schema_pg.sql, which then
-- creates what 0.1.0 did not have (lanes, subscriptions, the version
-- table, the new indexes and functions); upgrade_010_post_pg.sql follows
-- schema_pg.sql.  It does something only while deliveries still have the
-- lease_token column, the marker of a 0.1.0 table, and removes that
-- column: a second run finds no marker and changes nothing.  Any failure
-- rolls back the whole set-up.  @S@ as in schema_pg.sql.
DO $upgrade$
DECLARE
    r record;
    -- on a terminal (rb-setup sets relaybus.progress): a line per long step
    v_progress boolean := coalesce(current_setting('relaybus.progress', true), '') = 'on';
    v_n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = to_regclass('@S@.relaybus_deliveries')
                      AND attname = 'lease_token' AND NOT attisdropped) THEN
        RETURN;
    END IF;
    -- for upgrade_010_post_pg.sql, in this transaction only
    PERFORM set_config('relaybus.upgrade_010', 'on', true);
    IF v_progress THEN
        PERFORM set_config('client_min_messages', 'notice', true);
        SELECT count(*) INTO v_n FROM @S@.relaybus_deliveries;
        RAISE NOTICE 'relaybus progress: upgrading % deliveries: 1/4 events remember their handlers', v_n;
    END IF;

    -- 1. events remember every handler they ever had a delivery for,
    -- completed ones included, so that nothing completed under 0.1.0 runs
    -- again when its event id is published again
    ALTER TABLE @S@.relaybus_events ADD COLUMN IF NOT EXISTS handlers text[] NOT NULL DEFAULT '{}';
    UPDATE @S@.relaybus_events e SET handlers = h.handlers
      FROM (SELECT d.event_id, array_agg(DISTINCT d.handler ORDER BY d.handler) AS handlers
              FROM @S@.relaybus_deliveries d GROUP BY d.event_id) h
     WHERE e.id = h.event_id;

    -- 2. the 0.1.0 indexes, before the rewrite below would rebuild them
    -- (dead_idx comes back from schema_pg.sql as (updated_at, id))
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_status_created_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_handler_created_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_due_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_due_unkeyed_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_due_keyed_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_key_sequence_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_completed_idx;
    DROP INDEX IF EXISTS @S@.relaybus_deliveries_dead_idx;
    -- deliveries have no foreign key to events here (schema_pg.sql says why)
    FOR r IN SELECT c.conname FROM pg_constraint c
              WHERE c.conrelid = '@S@.relaybus_deliveries'::regclass AND c.contype = 'f' LOOP
        EXECUTE format('ALTER TABLE @S@.relaybus_deliveries DROP CONSTRAINT %I', r.conname);
    END LOOP;

    IF v_progress THEN
        RAISE NOTICE 'relaybus progress: upgrading % deliveries: 2/4 the deliveries rewritten with their lanes (% s so far)',
            v_n, round(extract(epoch FROM clock_timestamp() - now())::numeric, 1);
    END IF;
    -- 3. deliveries, in one rewrite of the table (every row written once,
    -- no dead versions left behind): the lane, with the hash new deliveries
    -- get; processing becomes pending with its attempts (0.1.0 counted the
    -- attempt at the claim, as a lost lease counts it here); a completed
    -- delivery keeps its row, with its completion time as updated_at; the
    -- lease columns go
    ALTER TABLE @S@.relaybus_deliveries
        ADD COLUMN lane smallint,
        ADD COLUMN claims integer NOT NULL DEFAULT 0;
    ALTER TABLE @S@.relaybus_deliveries
        DROP CONSTRAINT IF EXISTS relaybus_deliveries_status_check,
        ALTER COLUMN lane TYPE smallint USING @S@.relaybus_lane(coalesce(key, event_id)),
        ALTER COLUMN lane SET NOT NULL,
        ADD CONSTRAINT relaybus_deliveries_lane_check CHECK (lane >= 0 AND lane < 256),
        ALTER COLUMN status TYPE text
            USING (CASE status WHEN 'processing' THEN 'pending' ELSE status END),
        -- 'completed' only for the rows 0.1.0 left; new completions delete
        ADD CONSTRAINT relaybus_deliveries_status_check
            CHECK (status IN ('pending', 'dead', 'completed')),
        ALTER COLUMN updated_at TYPE timestamptz
            USING (CASE WHEN status = 'completed' THEN coalesce(completed_at, updated_at)
                        ELSE updated_at END),
        DROP COLUMN lease_owner,
        DROP COLUMN lease_token,
        DROP COLUMN lease_expires_at,
        DROP COLUMN completed_at,
        SET (autovacuum_vacuum_scale_factor = 0.02);
    -- rb-admin purge --completed-older-than deletes the old completed rows
    -- through this index; rb-admin list and stats see them too
    IF v_progress THEN
        RAISE NOTICE 'relaybus progress: upgrading % deliveries: 3/4 the index of completed rows (% s so far)',
            v_n, round(extract(epoch FROM clock_timestamp() - now())::numeric, 1);
    END IF;
    CREATE INDEX IF NOT EXISTS relaybus_deliveries_completed_010_idx
        ON @S@.relaybus_deliveries (updated_at, id) WHERE status = 'completed';
    -- (schema_pg.sql runs next: the new indexes are most of what is left)
    IF v_progress THEN
        RAISE NOTICE 'relaybus progress: upgrading % deliveries: 4/4 the new indexes, lanes and functions (% s so far)',
            v_n, round(extract(epoch FROM clock_timestamp() - now())::numeric, 1);
        PERFORM set_config('client_min_messages', 'warning', true);
    END IF;
END $upgrade$;
