-- The end of the upgrade from relaybus 0.1.0 (upgrade_010_pg.sql), which
-- needs the tables and functions of schema_pg.sql: rb-setup runs it right
-- after that script, in the same transaction.  Nothing happens unless
-- upgrade_010_pg.sql upgraded something in this transaction.  @S@ as in
-- schema_pg.sql.
DO $upgrade$
BEGIN
    IF coalesce(current_setting('relaybus.upgrade_010', true), '') <> 'on' THEN
        RETURN;
    END IF;
    -- the 256 lanes of every handler that has deliveries (0.1.0 routed
    -- events in code: there are no subscriptions to seed them from)
    PERFORM @S@.relaybus_seed_lanes(h.handler)
       FROM (SELECT DISTINCT d.handler FROM @S@.relaybus_deliveries d) h;
    -- every key counter at least at the highest sequence its deliveries
    -- have, so that a key's next delivery comes after them whatever kept
    -- the counters in 0.1.0
    INSERT INTO @S@.relaybus_keys AS k (key, sequence)
    SELECT d.key, max(d.sequence) FROM @S@.relaybus_deliveries d
     WHERE d.key IS NOT NULL AND d.sequence IS NOT NULL GROUP BY d.key
    ON CONFLICT (key) DO UPDATE SET sequence = excluded.sequence WHERE k.sequence < excluded.sequence;
    PERFORM set_config('relaybus.upgrade_010', '', true);
END $upgrade$;
