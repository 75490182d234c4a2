-- The keyed claim, faster: claim_keyed() as in 0018 (same arguments, so running workers of
-- 0018 call this one), with each key's turn read from jobs_partition_ready_idx whatever the
-- statistics say.
--
-- In 0018 the turn (a key's oldest ready jobs) ordered by run_at and id only, an order the
-- plain ready index also gives; with statistics taken while the queue held one key (a flood),
-- every key looked like the whole queue and the planner walked the ready index, filtering the
-- key out of every pending job: a claim cost the queue's length per key served.

CREATE OR REPLACE FUNCTION {schema}.claim_keyed(
    queues        text[],
    wanted        int[],
    worker        text,
    lease_seconds float8,
    total         int,
    commit_mode   text
) RETURNS TABLE (
    id           bigint,
    queue        text,
    task         text,
    args         text,
    priority     int,
    attempts     int,
    max_attempts int,
    run_at       timestamptz,
    created_at   timestamptz
)
LANGUAGE plpgsql
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    budget      int := coalesce($5, 0);
    q           text;
    want        int;
    per_key     int;
    start_key   text COLLATE "C";
    served      text COLLATE "C";
    lo          text COLLATE "C";
    hi          text COLLATE "C";
    last_key    text COLLATE "C";
    pass_ids    bigint[];
    pass_keys   text[] COLLATE "C";
    walked      int;
    walk_limit  int;
    per_turn    int;
    circle_keys int;
    level       int;
    below       int;
    wrapped     boolean;
    probes      int;
    max_probes  int;
    before      int;
    -- The jobs this call takes (locked, still pending until the one UPDATE at the end) and, in
    -- the queue at hand, the key of each: the per-key limit counts them beside the running ones.
    picked      bigint[] := '{}';
    picked_keys text[] COLLATE "C" := '{}';
BEGIN
    -- Local to the caller's transaction (a SET clause above would end with the function).
    PERFORM set_config('synchronous_commit', coalesce($6, current_setting('synchronous_commit')), true);
    FOR i IN 1 .. coalesce(array_length($1, 1), 0) LOOP
        q := $1[i];
        want := least($2[i], budget);
        CONTINUE WHEN want IS NULL OR want <= 0;
        budget := budget - want;  -- given back below for what this queue does not take
        picked_keys := '{}';
        SELECT s.key_concurrency_limit, s.key_cursor INTO per_key, start_key
        FROM {schema}.queues AS s WHERE s.name = q;
        served := start_key;
        probes := 0;
        -- Keys passed over (at their limit, or with nothing ready) cost a probe each: enough
        -- for a full claim past a few hundred of them.
        max_probes := 4 * want + 256;
        below := 2147483647;
        <<levels>>
        LOOP
            SELECT j.priority INTO level FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q AND j.priority <= below
            ORDER BY j.priority DESC LIMIT 1;
            EXIT levels WHEN level IS NULL;
            -- A circle: the keys after the cursor to the last, then (wrapped) the first ones up
            -- to the cursor, in passes of at most `want` keys, one statement each.
            lo := coalesce(start_key, '');
            hi := NULL;
            wrapped := false;
            per_turn := 1;
            circle_keys := 0;
            LOOP
                EXIT levels WHEN want <= 0 OR probes >= max_probes;
                walk_limit := least(want, max_probes - probes);
                WITH RECURSIVE walk(k, n) AS (
                    SELECT (SELECT j.partition_key FROM {schema}.jobs AS j
                            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                              AND j.priority = level AND j.partition_key > lo AND (hi IS NULL OR j.partition_key <= hi)
                            ORDER BY j.partition_key LIMIT 1), 1
                    UNION ALL
                    SELECT (SELECT j.partition_key FROM {schema}.jobs AS j
                            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                              AND j.priority = level AND j.partition_key > w.k AND (hi IS NULL OR j.partition_key <= hi)
                            ORDER BY j.partition_key LIMIT 1), w.n + 1
                    FROM walk AS w
                    WHERE w.k IS NOT NULL AND w.n < walk_limit
                ),
                -- Each key's turn: its oldest ready jobs, as many as the turn and its limit allow.
                turns AS (
                    SELECT w.k, c.id
                    FROM walk AS w
                    CROSS JOIN LATERAL (
                        SELECT c.id FROM {schema}.jobs AS c
                        -- The key as a range of one, in the keyed index's order: an order no other
                        -- index gives without a sort, whatever the statistics say (an equality would
                        -- drop the key from the order, and statistics of few keys make one key look
                        -- like the whole queue).
                        WHERE c.status = 'pending' AND c.partition_key >= w.k AND c.partition_key <= w.k
                          AND c.queue = q AND c.priority = level AND c.run_at <= {schema}.now()
                          AND c.id <> ALL (picked)
                        ORDER BY c.partition_key, c.run_at, c.id
                        LIMIT CASE WHEN per_key IS NULL THEN per_turn ELSE greatest(0, least(per_turn, per_key - (
                            SELECT count(*) FROM {schema}.jobs AS r
                            WHERE r.status = 'running' AND r.partition_key = w.k AND r.queue = q
                        ) - coalesce(array_length(array_positions(picked_keys, w.k), 1), 0))) END
                        FOR UPDATE SKIP LOCKED
                    ) AS c
                    WHERE w.k IS NOT NULL
                )
                SELECT coalesce(array_agg(t.id), '{}'), coalesce(array_agg(t.k), '{}'),
                       (SELECT count(w.k) FROM walk AS w), (SELECT max(w.k) FROM walk AS w)
                INTO pass_ids, pass_keys, walked, last_key
                FROM turns AS t;
                probes := probes + walked + 1;
                picked := picked || pass_ids;
                picked_keys := picked_keys || pass_keys;
                want := want - cardinality(pass_ids);
                IF cardinality(pass_ids) > 0 THEN
                    served := (SELECT max(x) FROM unnest(pass_keys) AS x);
                    circle_keys := circle_keys + (SELECT count(DISTINCT x) FROM unnest(pass_keys) AS x);
                END IF;
                IF walked >= walk_limit THEN
                    lo := last_key;  -- more keys in this circle
                    CONTINUE;
                END IF;
                IF NOT wrapped AND start_key IS NOT NULL THEN
                    wrapped := true;  -- go round to the first key, up to the cursor
                    lo := '';
                    hi := start_key;
                    CONTINUE;
                END IF;
                -- A circle is done: another one, if it took anything, sharing what is left among
                -- the keys that had jobs to give.
                EXIT WHEN circle_keys = 0;
                per_turn := greatest(1, ceil(want::numeric / circle_keys)::int);
                circle_keys := 0;
                lo := '';
                hi := NULL;
                wrapped := true;
                last_key := NULL;
            END LOOP;
            EXIT levels WHEN level = -2147483647;
            below := level - 1;
        END LOOP;
        IF probes >= max_probes THEN
            served := coalesce(last_key, served);  -- the next claim goes on from where this one stopped
        END IF;
        IF want > 0 THEN
            -- Jobs without a key, from the head of the ready order (a bounded window of it).
            before := cardinality(picked);
            picked := picked || ARRAY(
                SELECT c.id FROM {schema}.jobs AS c
                WHERE c.id = ANY (ARRAY(
                    SELECT h.id FROM {schema}.jobs AS h
                    WHERE h.status = 'pending' AND h.queue = q AND h.run_at <= {schema}.now()
                    ORDER BY h.priority DESC, h.run_at, h.id
                    LIMIT want + 256))
                  AND c.partition_key IS NULL AND c.status = 'pending'
                ORDER BY c.priority DESC, c.run_at, c.id
                LIMIT want
                FOR UPDATE SKIP LOCKED);
            want := want - (cardinality(picked) - before);
        END IF;
        budget := budget + want;
        IF served IS DISTINCT FROM start_key THEN
            UPDATE {schema}.queues AS s SET key_cursor = served WHERE s.name = q;
        END IF;
    END LOOP;
    RETURN QUERY
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_at = {schema}.now(),
        locked_by = $3,
        lease_expires_at = {schema}.now() + make_interval(secs => $4)
    WHERE j.id = ANY (picked)
    RETURNING j.id, j.queue, j.task, j.args::text, j.priority, j.attempts, j.max_attempts,
              j.run_at, j.created_at;
END
$$;
