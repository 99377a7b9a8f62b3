-- bench/hold-cursor.sql: a prototype of claim cursors (issue 25 item 3), loaded
-- by bench/hold-buffers into its own schema (@S@); not the store's claim.  A copy
-- of relaybus_lane_candidates and relaybus_claim_ids (libcommon/schema_pg.sql)
-- whose scans start at cursors the caller keeps: a time bound B from ticks
-- (p_tick_c, p_tick_x), per-lane cursors (p_ucur, p_kcur), per-key sequence
-- cursors (p_kk, p_ks) and, with p_g, one global cursor for the search of
-- free lanes, and with p_mine the lanes the caller holds instead of a pass over
-- every lane row.  The new cursors and lanes come back in rows without an id.  See
-- bench/README.md "Claim cursors, a prototype".
CREATE INDEX IF NOT EXISTS relaybus_deliveries_lane_kdue_idx ON @S@.relaybus_deliveries (handler, lane, available_at, id) WHERE key IS NOT NULL AND status = 'pending';
CREATE FUNCTION @S@.relaybus_lane_candidates_cur(
    p_handler text, p_lane smallint, p_now timestamptz, p_live bigint[], p_limit integer,
    p_chain integer, p_ucur timestamptz, p_kcur timestamptz, p_kk text[], p_ks bigint[])
RETURNS TABLE (id bigint, event_id text, claims integer, attempts integer, sequence bigint,
               created_at timestamptz, key text)
LANGUAGE sql STABLE AS $$
    (SELECT d.id, d.event_id, d.claims, d.attempts, d.sequence, coalesce(d.created_at, d.available_at) AS created_at,
            NULL::text AS key
       FROM @S@.relaybus_deliveries d
      WHERE d.handler = p_handler AND d.lane = p_lane AND d.status = 'pending' AND d.key IS NULL
        AND d.available_at <= p_now AND d.available_at >= p_ucur AND d.id NOT IN (SELECT v FROM unnest(p_live) v WHERE v IS NOT NULL)
      ORDER BY d.available_at, d.id
      LIMIT p_limit)
    UNION ALL
    (WITH heads AS MATERIALIZED (
        -- the keys with pending work at or past the lane's keyed cursor
        -- (lane_kdue), each key's head from lane_key
        SELECT k.key, hd.id, hd.available_at, k.ks
          FROM (SELECT u.key, coalesce((SELECT c.s FROM unnest(p_kk, p_ks) c(k, s) WHERE c.k = u.key LIMIT 1), -1) AS ks
                  FROM (SELECT DISTINCT x.key FROM (
                    -- (in lane_kdue's order and fenced: a DISTINCT alone is
                    -- planned on lane_key, which walks every entry of the lane)
                    SELECT d.key FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = p_lane AND d.key IS NOT NULL
                       AND d.status = 'pending' AND d.available_at >= p_kcur
                     ORDER BY d.available_at, d.id OFFSET 0) x) u) k
         CROSS JOIN LATERAL (
            SELECT d.id, d.available_at FROM @S@.relaybus_deliveries d
             WHERE d.handler = p_handler AND d.lane = p_lane AND d.key = k.key AND d.key IS NOT NULL
               AND d.status = 'pending' AND d.sequence >= k.ks
             ORDER BY d.sequence LIMIT 1) hd
         ORDER BY k.key
     )
     SELECT c.id, c.event_id, c.claims, c.attempts, c.sequence, c.created_at, h.key FROM heads h
      CROSS JOIN LATERAL (
        SELECT r.id, r.event_id, r.claims, r.attempts, r.sequence, r.created_at FROM (
            SELECT x.*, bool_and(x.available_at <= p_now) OVER (ORDER BY x.sequence) AS due
              FROM (SELECT d.id, d.event_id, d.claims, d.attempts, d.sequence,
                           coalesce(d.created_at, d.available_at) AS created_at, d.available_at
                      FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = p_lane AND d.key = h.key
                       AND d.key IS NOT NULL AND d.status = 'pending' AND d.sequence >= h.ks
                     ORDER BY d.sequence
                     LIMIT p_chain) x) r
         WHERE r.due
         ORDER BY r.sequence) c
      WHERE h.available_at <= p_now AND h.id NOT IN (SELECT v FROM unnest(p_live) v WHERE v IS NOT NULL)
     LIMIT p_limit)
    LIMIT p_limit
$$;

CREATE OR REPLACE FUNCTION @S@.relaybus_claim_ids_cur(
    p_handler text, p_owner text, p_batch integer, p_lease_ms bigint, p_max_attempts integer,
    p_live bigint[], p_search boolean, p_chain integer, p_live_lanes smallint[],
    p_holder bigint DEFAULT NULL, p_chain_early boolean DEFAULT false, p_holder_live boolean DEFAULT false,
    p_ucur timestamptz[] DEFAULT NULL, p_kcur timestamptz[] DEFAULT NULL,
    p_tick_c timestamptz[] DEFAULT NULL, p_tick_x xid8[] DEFAULT NULL,
    p_kk text[] DEFAULT '{}', p_ks bigint[] DEFAULT '{}', p_g timestamptz DEFAULT NULL,
    p_mine smallint[] DEFAULT NULL)
RETURNS TABLE (id bigint, event_id text, handler text, lane smallint, epoch bigint, claims integer,
               attempts integer, sequence bigint, created_at text)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_expires  timestamptz := v_now + p_lease_ms * interval '1 millisecond';
    v_held     smallint[];
    v_acquired smallint[] := '{}';
    v_new      smallint[];
    v_free     smallint[] := '{}';
    v_live     bigint[];
    v_picked   bigint[] := '{}';      -- the deliveries claimed ...
    v_plane    smallint[] := '{}';    -- ... and their lanes, element by element,
    v_pev      text[] := '{}';        -- ... event ids,
    v_pclaims  integer[] := '{}';     -- ... claims,
    v_patt     integer[] := '{}';     -- ... attempts,
    v_pseq     bigint[] := '{}';      -- ... sequences
    v_pkey     text[] := '{}';        -- ... keys
    v_key      text[];
    v_pcat     timestamptz[] := '{}'; -- ... and creation times
    v_ids      bigint[];
    v_lanes    smallint[];
    v_ev       text[];
    v_claims   integer[];
    v_att      integer[];
    v_seq      bigint[];
    v_cat      timestamptz[];
    v_take     integer := 4;
    v_start    integer := abs(hashtext(p_owner)) % 256;
    v_charged  smallint[] := '{}';
    v_cf       bigint[];                -- attempts a takeover charged, by lane (NULL: none)
    v_cb       bigint[];                -- ... and deliveries it buried
    v_nf       bigint;
    v_nb       bigint;
    v_used     smallint[];
    v_scanned  smallint[] := '{}';   -- held lanes read to the end in step 1
    v_mine     smallint[];           -- step 0: the lanes this owner held, ...
    v_holders  bigint[];             -- ... the other live holders' liveness locks,
    v_free0    smallint[];           -- ... the free and expired lanes
    v_nlanes   bigint;               -- ... and how many lane rows there are
    v_last     bigint;
    v_elanes   smallint[];
    v_epochs   bigint[];
    v_epoch    bigint[] := array_fill(-1::bigint, ARRAY[256], ARRAY[0]);  -- by lane (no NULLs: O(1) lookups)
    c_per_lane CONSTANT integer := 32;
    c_lane_max CONSTANT integer := 32;
    v_room     integer[] := array_fill(c_lane_max, ARRAY[256], ARRAY[0]);  -- by lane
    v_ls       bigint[];
    v_lsl      smallint[];
    v_lo       integer[] := array_fill(1, ARRAY[256], ARRAY[0]);
    v_lc       integer[];
    v_pk       bigint[];
    v_pkl      smallint[];
    v_po       integer[] := array_fill(1, ARRAY[256], ARRAY[0]);
    v_pc       integer[] := array_fill(0, ARRAY[256], ARRAY[0]);
    v_back     smallint[];
    c_grace    CONSTANT interval := interval '1500 milliseconds';
    l          record;
    r          record;
    v_tx       xid8;
    v_b        timestamptz;
    v_g        timestamptz := p_g;    -- the global cursor (p_g not NULL: the probe reads lane_gdue)
    v_seen     smallint[] := '{}';
    v_search   boolean := false;
    v_held0    smallint[];
    v_backed   smallint[] := '{}';
    v_ucur     timestamptz[] := array_fill('-infinity'::timestamptz, ARRAY[256], ARRAY[0]);
    v_kcur     timestamptz[] := array_fill('-infinity'::timestamptz, ARRAY[256], ARRAY[0]);
BEGIN
    -- the tick of this claim (the clock first), and the bound: the newest
    -- tick whose transaction, and every one with an older xid, has ended
    v_tx := pg_current_xact_id();
    SELECT coalesce(max(t.c), '-infinity') INTO v_b FROM unnest(p_tick_c, p_tick_x) t(c, x)
     WHERE t.x < pg_snapshot_xmin(pg_current_snapshot());
    IF p_ucur IS NOT NULL THEN
        FOR i IN 0 .. 255 LOOP
            v_ucur[i] := coalesce(p_ucur[i], '-infinity');
            v_kcur[i] := coalesce(p_kcur[i], '-infinity');
        END LOOP;
    END IF;
    -- p_mine (with p_g): the lanes this claimer holds, as the claim before
    -- handed them back (a third row without an id), instead of the pass over
    -- every lane row; every lane is then a candidate of the search (its
    -- lease is checked where it is locked), and the other holders'
    -- liveness is not probed (a real design would do that less often)
    FOR i IN 1 .. 2 LOOP
        EXIT WHEN p_mine IS NOT NULL AND p_g IS NOT NULL;
        SELECT coalesce(array_agg(y.lane) FILTER (WHERE y.lease_owner = p_owner
                                                    AND y.holder IS NOT DISTINCT FROM p_holder), '{}'),
               coalesce(array_agg(DISTINCT y.holder) FILTER (WHERE y.holder_live
                                                    AND y.holder IS DISTINCT FROM p_holder
                                                    AND y.lease_expires_at > v_now + c_grace), '{}'),
               coalesce(array_agg(y.lane) FILTER (WHERE y.lease_owner IS NULL OR y.lease_expires_at <= v_now), '{}'),
               count(*)
          INTO v_mine, v_holders, v_free0, v_nlanes
          FROM @S@.relaybus_lanes y
         WHERE y.handler = p_handler;
        EXIT WHEN v_nlanes >= 256;
        PERFORM @S@.relaybus_seed_lanes(p_handler);
    END LOOP;
    IF p_mine IS NOT NULL AND p_g IS NOT NULL THEN
        v_mine := p_mine;
        v_holders := '{}';
        v_free0 := ARRAY(SELECT g::smallint FROM generate_series(0, 255) g);
    END IF;
    v_held := '{}';
    IF cardinality(v_mine) > 0 THEN
        SELECT coalesce(array_agg(h.lane), '{}') INTO v_held FROM (
            SELECT x.lane FROM @S@.relaybus_lanes x
             WHERE x.handler = p_handler AND x.lane = ANY (v_mine) AND x.lease_owner = p_owner
               AND x.holder IS NOT DISTINCT FROM p_holder
             FOR NO KEY UPDATE) h;
    END IF;
    IF p_live IS NOT NULL THEN
        v_live := p_live;
    ELSE
        SELECT coalesce(array_agg(d.id), '{}') INTO v_live
          FROM @S@.relaybus_lanes x
         CROSS JOIN LATERAL unnest(x.in_flight) f(fid)
         CROSS JOIN LATERAL (SELECT dd.id FROM @S@.relaybus_deliveries dd
                              WHERE dd.id = f.fid AND dd.status = 'pending' OFFSET 0) d
         WHERE x.handler = p_handler AND x.lane = ANY (v_held);
    END IF;
    IF p_live_lanes IS NOT NULL THEN
        IF p_live IS NOT NULL THEN
            v_lc := array_fill(0, ARRAY[256], ARRAY[0]);
            SELECT coalesce(array_agg(u.i ORDER BY u.ln), '{}'), coalesce(array_agg(u.ln ORDER BY u.ln), '{}')
              INTO v_ls, v_lsl
              FROM unnest(p_live, p_live_lanes) u(i, ln)
             WHERE u.i IS NOT NULL AND u.ln >= 0 AND u.ln < 256;
        ELSE
            v_lsl := ARRAY(SELECT u.ln FROM unnest(p_live_lanes) u(ln) WHERE u.ln >= 0 AND u.ln < 256);
        END IF;
        FOR l IN SELECT u.ln, count(*) AS n, min(u.o) AS o FROM unnest(v_lsl) WITH ORDINALITY u(ln, o)
                  GROUP BY u.ln LOOP
            v_room[l.ln] := greatest(c_lane_max - l.n, 0);
            IF v_lc IS NOT NULL THEN
                v_lo[l.ln] := l.o;
                v_lc[l.ln] := l.n;
            END IF;
        END LOOP;
    END IF;
    IF cardinality(v_held) > 0 THEN
        SELECT coalesce(array_agg(t.id), '{}'), coalesce(array_agg(t.lane), '{}'), max(t.o),
               coalesce(array_agg(t.event_id), '{}'), coalesce(array_agg(t.claims), '{}'),
               coalesce(array_agg(t.attempts), '{}'), coalesce(array_agg(t.sequence), '{}'),
               coalesce(array_agg(t.created_at), '{}'), coalesce(array_agg(t.key), '{}')
          INTO v_picked, v_plane, v_last, v_pev, v_pclaims, v_patt, v_pseq, v_pcat, v_pkey
          FROM (SELECT c.*, hl.lane, hl.o FROM unnest(v_held) WITH ORDINALITY hl(lane, o)
                CROSS JOIN LATERAL @S@.relaybus_lane_candidates_cur(p_handler, hl.lane, v_now, v_live,
                    least(p_batch, c_per_lane, v_room[hl.lane]), p_chain, v_ucur[hl.lane], v_kcur[hl.lane], p_kk, p_ks) c
                LIMIT p_batch) t;
        v_held0 := v_held;
        v_scanned := CASE WHEN cardinality(v_picked) < p_batch THEN v_held
                          ELSE v_held[1:v_last - 1] END;
        FOR l IN
            SELECT g.ln,
                   (SELECT d.available_at FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = g.ln AND d.key IS NULL AND d.status = 'pending'
                       AND d.available_at >= v_ucur[g.ln] ORDER BY d.available_at, d.id LIMIT 1) AS ua,
                   (SELECT d.available_at FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = g.ln AND d.key IS NOT NULL AND d.status = 'pending'
                       AND d.available_at >= v_kcur[g.ln] ORDER BY d.available_at, d.id LIMIT 1) AS ka
              FROM unnest(v_held) g(ln)
        LOOP
            v_ucur[l.ln] := least(coalesce(l.ua, 'infinity'), v_b);
            v_kcur[l.ln] := least(coalesce(l.ka, 'infinity'), v_b);
        END LOOP;
    END IF;
    IF cardinality(v_picked) < p_batch AND (p_search OR cardinality(v_held) = 0) THEN
        FOR l IN SELECT u.holder FROM unnest(v_holders) u(holder) LOOP
            IF pg_try_advisory_xact_lock_shared(l.holder) THEN
                UPDATE @S@.relaybus_lanes x SET lease_expires_at = v_now + c_grace
                 WHERE x.handler = p_handler AND x.lane IN (
                        SELECT y.lane FROM @S@.relaybus_lanes y
                         WHERE y.handler = p_handler AND y.holder = l.holder AND y.holder_live
                           AND y.lease_expires_at > v_now + c_grace
                         FOR NO KEY UPDATE SKIP LOCKED);
            END IF;
        END LOOP;
        IF cardinality(v_held) > 0 THEN
            SELECT (v_start + max((h.ln - v_start + 256) % 256) + 1) % 256 INTO v_start
              FROM unnest(v_held) h(ln);
        END IF;
        SELECT coalesce(array_agg(u.ln ORDER BY (u.ln - v_start + 256) % 256), '{}') INTO v_free
          FROM unnest(v_free0) u(ln)
         WHERE NOT (u.ln = ANY (v_held));
    END IF;
    v_search := cardinality(v_free) > 0;
    IF p_g IS NOT NULL AND v_search THEN
        -- G is a lower bound of every lane's pending entries: of each lane's cursors too
        FOR i IN 0 .. 255 LOOP
            v_ucur[i] := greatest(v_ucur[i], v_g);
            v_kcur[i] := greatest(v_kcur[i], v_g);
        END LOOP;
    END IF;
    WHILE cardinality(v_picked) < p_batch AND cardinality(v_free) > 0 LOOP
        v_new := '{}';
        FOR l IN
            SELECT g.ln,
                   (SELECT d.available_at FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = g.ln AND d.key IS NULL AND d.status = 'pending'
                       AND d.available_at >= v_ucur[g.ln] ORDER BY d.available_at, d.id LIMIT 1) AS ua,
                   (SELECT d.available_at FROM @S@.relaybus_deliveries d
                     WHERE d.handler = p_handler AND d.lane = g.ln AND d.key IS NOT NULL AND d.status = 'pending'
                       AND d.available_at >= v_kcur[g.ln] ORDER BY d.available_at, d.id LIMIT 1) AS ka
              FROM unnest(v_free) WITH ORDINALITY g(ln, o)
             WHERE NOT (g.ln = ANY (v_held)) AND p_g IS NULL
            UNION ALL
            -- the global variant: the due entries of every lane from the
            -- global cursor, oldest first
            (SELECT d.lane, d.available_at, NULL FROM @S@.relaybus_deliveries d
              WHERE p_g IS NOT NULL AND d.handler = p_handler AND d.status = 'pending'
                AND d.available_at >= v_g AND d.available_at <= v_now
              ORDER BY d.available_at, d.id)
        LOOP
            IF p_g IS NULL THEN
                -- the lane's cursors: its first pending entry, at most the bound
                v_ucur[l.ln] := least(coalesce(l.ua, 'infinity'), v_b);
                v_kcur[l.ln] := least(coalesce(l.ka, 'infinity'), v_b);
                CONTINUE WHEN NOT coalesce(l.ua <= v_now OR l.ka <= v_now, false);
            ELSE
                CONTINUE WHEN l.ln = ANY (v_seen) OR l.ln = ANY (v_held) OR NOT (l.ln = ANY (v_free));
                v_seen := v_seen || l.ln;
            END IF;
            SELECT y.lane, y.lease_owner, y.in_flight, y.chain_early INTO r FROM @S@.relaybus_lanes y
             WHERE y.handler = p_handler AND y.lane = l.ln
               AND (y.lease_owner IS NULL OR y.lease_expires_at <= v_now)
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            IF r.lease_owner IS NOT NULL AND cardinality(r.in_flight) > 0 THEN
                WITH c AS (
                UPDATE @S@.relaybus_deliveries d
                   SET attempts = d.attempts + 1, claims = d.claims + 1,
                       status = CASE WHEN d.attempts + 1 >= p_max_attempts THEN 'dead' ELSE 'pending' END,
                       last_error = 'lease of ' || r.lease_owner || ' expired: attempt lost',
                       updated_at = v_now
                 WHERE d.id = ANY (r.in_flight) AND d.status = 'pending'
                   AND (d.key IS NULL OR r.chain_early IS NULL OR NOT EXISTS (
                        SELECT 1 FROM @S@.relaybus_deliveries e
                         WHERE e.handler = d.handler AND e.lane = d.lane AND e.key = d.key
                           AND e.status = 'pending' AND e.sequence < d.sequence
                           AND (NOT r.chain_early OR e.attempts > 0 OR NOT (e.id = ANY (r.in_flight)))
                         OFFSET 0))
                RETURNING d.status)
                SELECT count(*), count(*) FILTER (WHERE c.status = 'dead') INTO v_nf, v_nb FROM c;
                IF v_nf > 0 THEN
                    IF v_cf IS NULL THEN
                        v_cf := array_fill(0::bigint, ARRAY[256], ARRAY[0]);
                        v_cb := v_cf;
                    END IF;
                    v_cf[r.lane] := v_cf[r.lane] + v_nf;
                    v_cb[r.lane] := v_cb[r.lane] + v_nb;
                END IF;
                v_charged := v_charged || r.lane;
            END IF;
            v_new := v_new || r.lane;
            EXIT WHEN cardinality(v_new) >= v_take;
        END LOOP;
        EXIT WHEN cardinality(v_new) = 0;
        v_free := CASE WHEN cardinality(v_new) < v_take THEN '{}'
                       WHEN p_g IS NOT NULL THEN ARRAY(SELECT u FROM unnest(v_free) u WHERE NOT (u = ANY (v_new)))
                       ELSE coalesce(v_free[array_position(v_free, v_new[cardinality(v_new)]) + 1 : cardinality(v_free)], '{}') END;
        v_held := v_held || v_new;
        v_acquired := v_acquired || v_new;
        SELECT array_agg(t.id), array_agg(t.lane), array_agg(t.event_id), array_agg(t.claims),
               array_agg(t.attempts), array_agg(t.sequence), array_agg(t.created_at), array_agg(t.key)
          INTO v_ids, v_lanes, v_ev, v_claims, v_att, v_seq, v_cat, v_key
          FROM (SELECT c.*, hl.lane FROM unnest(v_new) hl(lane)
                CROSS JOIN LATERAL @S@.relaybus_lane_candidates_cur(p_handler, hl.lane, v_now, '{}',
                    least(p_batch - cardinality(v_picked), c_per_lane), p_chain, v_ucur[hl.lane], v_kcur[hl.lane], p_kk, p_ks) c
                LIMIT p_batch - cardinality(v_picked)) t;
        v_picked := v_picked || coalesce(v_ids, '{}');
        v_plane := v_plane || coalesce(v_lanes, '{}');
        v_pev := v_pev || coalesce(v_ev, '{}');
        v_pclaims := v_pclaims || coalesce(v_claims, '{}');
        v_patt := v_patt || coalesce(v_att, '{}');
        v_pseq := v_pseq || coalesce(v_seq, '{}');
        v_pkey := v_pkey || coalesce(v_key, '{}');
        v_pcat := v_pcat || coalesce(v_cat, '{}');
        v_take := v_take * 2;
    END LOOP;
    IF cardinality(v_picked) < p_batch AND cardinality(v_held) > 0
       AND EXISTS (SELECT 1 FROM unnest(v_plane) u(ln) GROUP BY u.ln HAVING count(*) >= c_per_lane) THEN
        FOR l IN SELECT u.ln, count(*) AS n FROM unnest(v_plane) u(ln) GROUP BY u.ln LOOP
            v_room[l.ln] := greatest(v_room[l.ln] - l.n, 0);
        END LOOP;
        SELECT array_agg(t.id), array_agg(t.lane), array_agg(t.event_id), array_agg(t.claims),
               array_agg(t.attempts), array_agg(t.sequence), array_agg(t.created_at), array_agg(t.key)
          INTO v_ids, v_lanes, v_ev, v_claims, v_att, v_seq, v_cat, v_key
          FROM (SELECT c.*, hl.lane FROM unnest(v_held) hl(lane)
                CROSS JOIN LATERAL @S@.relaybus_lane_candidates_cur(p_handler, hl.lane, v_now, v_live || v_picked,
                    least(p_batch - cardinality(v_picked), c_per_lane, v_room[hl.lane]), p_chain, v_ucur[hl.lane], v_kcur[hl.lane], p_kk, p_ks) c
                LIMIT p_batch - cardinality(v_picked)) t;
        v_picked := v_picked || coalesce(v_ids, '{}');
        v_plane := v_plane || coalesce(v_lanes, '{}');
        v_pev := v_pev || coalesce(v_ev, '{}');
        v_pclaims := v_pclaims || coalesce(v_claims, '{}');
        v_patt := v_patt || coalesce(v_att, '{}');
        v_pseq := v_pseq || coalesce(v_seq, '{}');
        v_pkey := v_pkey || coalesce(v_key, '{}');
        v_pcat := v_pcat || coalesce(v_cat, '{}');
    END IF;
    SELECT array_agg(u.i ORDER BY u.ln, u.o), array_agg(u.ln ORDER BY u.ln, u.o) INTO v_pk, v_pkl
      FROM unnest(v_picked, v_plane) WITH ORDINALITY u(i, ln, o);
    v_used := '{}';
    FOR l IN SELECT u.ln, count(*) AS n, min(u.o) AS o FROM unnest(v_pkl) WITH ORDINALITY u(ln, o)
              GROUP BY u.ln LOOP
        v_used := v_used || l.ln;
        v_po[l.ln] := l.o;
        v_pc[l.ln] := l.n;
    END LOOP;
    WITH w AS (
        UPDATE @S@.relaybus_lanes x
           SET epoch = CASE WHEN x.lane = ANY (v_acquired) THEN x.epoch + 1 ELSE x.epoch END,
               lease_owner = p_owner,
               holder = p_holder,
               holder_live = p_holder_live,
               chain_early = p_chain_early,
               lease_expires_at = v_expires,
               failed = x.failed + coalesce(v_cf[x.lane], 0),
               buried = x.buried + coalesce(v_cb[x.lane], 0),
               in_flight = CASE WHEN x.lane = ANY (v_acquired) THEN '{}'::bigint[]
                                WHEN v_lc IS NULL THEN
                                    ARRAY(SELECT f FROM unnest(x.in_flight) f WHERE f = ANY (v_live))
                                WHEN v_lc[x.lane] = 0 THEN '{}'::bigint[]
                                ELSE ARRAY(SELECT f FROM unnest(x.in_flight) f
                                            WHERE f = ANY (v_ls[v_lo[x.lane] : v_lo[x.lane] + v_lc[x.lane] - 1])) END
                           || v_pk[v_po[x.lane] : v_po[x.lane] + v_pc[x.lane] - 1]
         WHERE x.handler = p_handler AND x.lane = ANY (v_used)
        RETURNING x.lane, x.epoch)
    SELECT array_agg(w.lane), array_agg(w.epoch) INTO v_elanes, v_epochs FROM w;
    FOR i IN 1 .. coalesce(cardinality(v_elanes), 0) LOOP
        v_epoch[v_elanes[i]] := v_epochs[i];
    END LOOP;
    IF cardinality(v_charged) > 0 THEN
        UPDATE @S@.relaybus_lanes x
           SET epoch = x.epoch + 1, lease_owner = NULL, holder = NULL, holder_live = NULL,
               lease_expires_at = NULL, in_flight = '{}',
               failed = x.failed + coalesce(v_cf[x.lane], 0), buried = x.buried + coalesce(v_cb[x.lane], 0)
         WHERE x.handler = p_handler AND x.lane = ANY (v_charged) AND NOT (x.lane = ANY (v_used));
    END IF;
    v_back := ARRAY(SELECT u FROM unnest(v_scanned) u WHERE NOT (u = ANY (v_used)));
    IF cardinality(v_back) > 0 THEN
        WITH b AS (
        UPDATE @S@.relaybus_lanes x
           SET lease_owner = NULL, holder = NULL, holder_live = NULL, lease_expires_at = NULL, in_flight = '{}'
         WHERE x.handler = p_handler AND x.lane = ANY (v_back) AND x.lease_owner = p_owner
           AND x.holder IS NOT DISTINCT FROM p_holder
           AND CASE WHEN v_lc IS NULL THEN NOT (x.in_flight && v_live)
                    ELSE v_lc[x.lane] = 0
                         OR NOT (x.in_flight && v_ls[v_lo[x.lane] : v_lo[x.lane] + v_lc[x.lane] - 1]) END
        RETURNING x.lane)
        SELECT coalesce(array_agg(b.lane), '{}') INTO v_backed FROM b;
    END IF;
    -- (the lanes this claimer holds now: those it wrote, and those it held
    -- and did not hand back)
    RETURN QUERY SELECT NULL::bigint, ARRAY(SELECT DISTINCT u FROM unnest(coalesce(v_used, '{}') || coalesce(v_held0, '{}')) u
                                             WHERE u = ANY (v_used) OR NOT (u = ANY (v_backed)))::text,
                        NULL::text, -2::smallint, NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, NULL::text;
    RETURN QUERY
        SELECT u.i, u.ev, p_handler, u.ln, v_epoch[u.ln], u.cl, u.att, u.seq, @S@.relaybus_ts(u.cat)
          FROM unnest(v_picked, v_pev, v_plane, v_pclaims, v_patt, v_pseq, v_pcat) u(i, ev, ln, cl, att, seq, cat)
         WHERE v_epoch[u.ln] >= 0;
    -- (the prototype's way to hand back the cursors and the tick: one row without an id)
    IF p_g IS NOT NULL AND v_search THEN
        SELECT least(coalesce(min(f.a), 'infinity'), v_b) INTO v_g FROM (
            SELECT d.available_at AS a FROM @S@.relaybus_deliveries d
             WHERE d.handler = p_handler AND d.status = 'pending' AND d.available_at >= p_g
             ORDER BY d.available_at, d.id LIMIT 1) f;
    END IF;
    -- the keys' cursors: the lowest sequence a key's picks start at (its
    -- head: the lowest pending), else what it was
    RETURN QUERY SELECT NULL::bigint, array_agg(m.k ORDER BY m.k)::text, array_agg(m.s ORDER BY m.k)::text, -1::smallint,
                        NULL::bigint, NULL::integer, NULL::integer, NULL::bigint, v_g::text
      FROM (SELECT coalesce(a.k, b.k) AS k, greatest(a.s, b.s) AS s
              FROM unnest(p_kk, p_ks) a(k, s)
              FULL JOIN (SELECT u.k, min(u.s) AS s FROM unnest(v_pkey, v_pseq) u(k, s) WHERE u.k IS NOT NULL GROUP BY u.k) b
                ON a.k = b.k) m;
    RETURN QUERY SELECT NULL::bigint, v_ucur::text, v_kcur::text, NULL::smallint, NULL::bigint, NULL::integer,
                        NULL::integer, v_tx::text::bigint, v_now::text;
END $$;

