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
