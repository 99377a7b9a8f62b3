-- The lane hash, run by rb-setup before upgrade_010_pg.sql and schema_pg.sql
-- (the upgrade from 0.1.0 fills the lanes of existing deliveries with it,
-- the publish functions the lanes of new ones).  @S@ as in schema_pg.sql.
-- rb_lane() in rb_util.c is the same function in C.
CREATE SCHEMA IF NOT EXISTS @S@;

-- The lane of a delivery: FNV-1a (32 bit) of the key or event id, mod 256.
-- Only the low 8 bits of the state matter for the result, so the loop keeps
-- those: (h xor b) * 16777619 mod 256 = (h xor b) * 0x93 mod 256, h0 = 0xc5.
-- Every name in it is qualified (pg_catalog's functions, operators and
-- type), so that it binds the same whatever the caller's search_path, and
-- it has no SET search_path of its own: that clause cost a third of its
-- time, 1.2 of 4.5 us an event of a publish batch (bench/README.md).
-- (It runs as its caller, never as a definer.)
CREATE OR REPLACE FUNCTION @S@.relaybus_lane(p_text text) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b pg_catalog.bytea := pg_catalog.convert_to(p_text, 'UTF8');
    h integer := 197;
BEGIN
    FOR i IN 0 .. pg_catalog.length(b) OPERATOR(pg_catalog.-) 1 LOOP
        h := ((h OPERATOR(pg_catalog.#) pg_catalog.get_byte(b, i)) OPERATOR(pg_catalog.*) 147)
             OPERATOR(pg_catalog.&) 255;
    END LOOP;
    RETURN h;
END $$;

-- The lane of a text that ends in six lowercase hex digits, from the state
-- of the hash before them: for 0 <= p_n < 16^6,
--   relaybus_lane(t || lpad(to_hex(p_n), 6, '0')) = relaybus_lane_tail(relaybus_lane(t), p_n)
-- (FNV-1a runs byte by byte, and its state mod 256 is the lane itself).
-- relaybus_publish_batch names the events of a batch that have no id
-- with one random UUID whose last six digits are each one's position, and
-- hashes the UUID's first 30 characters once: per event this costs six
-- steps in one expression, not 36 steps of a loop and a UUID of its own
-- (4.1 and 2.9 us an event; bench/README.md, "A batch's ids from one
-- UUID").  LANGUAGE sql with one expression: the planner inlines it into
-- the publish statement (no call an event); every name qualified, no SET
-- clause (which would stop the inlining), as relaybus_lane.
CREATE OR REPLACE FUNCTION @S@.relaybus_lane_tail(p_h integer, p_n bigint) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT (((((((((((((((((((p_h
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, ((p_n OPERATOR(pg_catalog.>>) 20) OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255)
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, ((p_n OPERATOR(pg_catalog.>>) 16) OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255)
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, ((p_n OPERATOR(pg_catalog.>>) 12) OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255)
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, ((p_n OPERATOR(pg_catalog.>>) 8) OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255)
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, ((p_n OPERATOR(pg_catalog.>>) 4) OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255)
    OPERATOR(pg_catalog.#) pg_catalog.get_byte('0123456789abcdef'::pg_catalog.bytea, (p_n OPERATOR(pg_catalog.&) 15)::integer))
        OPERATOR(pg_catalog.*) 147) OPERATOR(pg_catalog.&) 255))::smallint
$$;
