-- Partition keys: a key per job (a tenant, a user, an account) and per-queue settings that make
-- the queue's claim take keys in turn and hold each key to a concurrency limit.
--
-- A queue without these settings claims exactly as before, through claim_jobs(): the new
-- indexes hold only jobs that have a key, so jobs without one write no entry in them.

-- "C" collation: keys are compared byte by byte, the same on every server, and cheaply.
ALTER TABLE {schema}.jobs ADD COLUMN partition_key text COLLATE "C";

-- The keyed claim walks this index: per queue and priority, the next key after the last one
-- served (one probe per key, however many jobs a key has), then that key's oldest ready job.
CREATE INDEX jobs_partition_ready_idx ON {schema}.jobs (queue, priority DESC, partition_key, run_at, id)
    WHERE status = 'pending' AND partition_key IS NOT NULL;

-- How many jobs of a key run now: what a per-key concurrency limit is checked against.
CREATE INDEX jobs_partition_running_idx ON {schema}.jobs (queue, partition_key)
    WHERE status = 'running' AND partition_key IS NOT NULL;

ALTER TABLE {schema}.queues
    -- Claim keys in turn (round robin) rather than first in, first out.
    ADD COLUMN fair boolean NOT NULL DEFAULT false,
    -- At most this many running jobs per key (NULL: no per-key limit); implies fair.
    ADD COLUMN key_concurrency_limit int CHECK (key_concurrency_limit >= 0),
    -- The key served last: the next claim starts after it.
    ADD COLUMN key_cursor text COLLATE "C";

-- claim_keyed(queues, wanted, worker, lease_seconds, total, commit_mode): claim_jobs() for the
-- queues that are fair or have a per-key limit (the caller has locked their settings rows, see
-- lock_queues, so claims on them take turns and each sees the others' running jobs).
--
-- Within a queue: the highest priority with pending keyed jobs first; within a priority, keys in
-- turn (byte order, going round), starting after the key the last claim served; one job per
-- key per turn, its oldest ready one; a key at its concurrency limit is passed over. The walk
-- stops when the queue's share is claimed, when a whole round took nothing, or after a bounded
-- number of key probes (the cursor moves, so the next claim goes on from there): its cost
-- follows the jobs claimed and the keys passed over, never the number of pending keys or jobs.
-- Jobs without a key fill the room keys leave, from the head of the queue's ready order.
CREATE FUNCTION {schema}.claim_keyed(
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
                        WHERE c.status = 'pending' AND c.partition_key = w.k AND c.queue = q
                          AND c.priority = level AND c.run_at <= {schema}.now() AND c.id <> ALL (picked)
                        ORDER BY c.run_at, c.id
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

-- What is wrong with a partition key given to add_job() or add_jobs() (NULL: nothing, or no
-- key), as Python's check_partition_key() words it.
CREATE FUNCTION {schema}.partition_key_problem(partition_key text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
SELECT CASE
    WHEN partition_key IS NULL THEN NULL
    WHEN partition_key = '' THEN 'partition key must be a non-empty str, got '''''
    WHEN char_length(partition_key) > 255 THEN
        format('partition key is %s characters long; the limit is 255', char_length(partition_key))
    WHEN octet_length(partition_key) > 1000 THEN
        format('partition key is %s bytes in UTF-8; the limit is 1000', octet_length(partition_key))
END
$$;

-- add_job() and add_jobs() as in 0012, with a partition key (add_job's new last parameter,
-- add_jobs' 'partition_key'). add_job() is dropped first: a new parameter makes a new function.
DROP FUNCTION {schema}.add_job(text, jsonb, text, int, timestamptz, float8, int, text);
CREATE FUNCTION {schema}.add_job(
    task          text,
    args          jsonb       DEFAULT '{}',
    queue         text        DEFAULT NULL,
    priority      int         DEFAULT 0,
    run_at        timestamptz DEFAULT NULL,
    delay_seconds float8      DEFAULT 0,
    max_attempts  int         DEFAULT 5,
    dedup_key     text        DEFAULT NULL,
    partition_key text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
    due timestamptz;
    problem text;
    into_queue text := coalesce(add_job.queue, {schema}.task_queue(add_job.task));
BEGIN
    problem := {schema}.job_problem(add_job.task, add_job.args, into_queue, add_job.priority,
                                    add_job.run_at, add_job.delay_seconds, add_job.max_attempts,
                                    add_job.dedup_key);
    problem := coalesce(problem, {schema}.partition_key_problem(add_job.partition_key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'aioqueue.add_job: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The `enqueue` statement's insert: a live job with the same dedup key is returned instead.
    INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, dedup_key, archive,
                                    partition_key)
    VALUES (into_queue, add_job.task, add_job.args, add_job.priority,
            coalesce(add_job.run_at, {schema}.now()) + make_interval(secs => add_job.delay_seconds),
            add_job.max_attempts, add_job.dedup_key, false, add_job.partition_key)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET dedup_key = EXCLUDED.dedup_key
    RETURNING j.id, j.run_at INTO job_id, due;

    -- As the `enqueue` statement: a job ready now wakes its queue's workers; a later one tells
    -- them when it is due ('seconds queue'), so they wake on time.
    IF due > {schema}.now() THEN
        PERFORM pg_notify('{schema}_due', extract(epoch FROM due - {schema}.now())::text || ' ' || into_queue);
    ELSE
        PERFORM pg_notify('{schema}_jobs', into_queue);
    END IF;
    RETURN job_id;
END;
$$;

CREATE OR REPLACE FUNCTION {schema}.add_jobs(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job jsonb;
    bad_at bigint;
    problem text;
    known CONSTANT text[] := ARRAY['task', 'args', 'queue', 'priority', 'run_at', 'delay_seconds', 'max_attempts',
                                   'dedup_key', 'partition_key'];
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'aioqueue.add_jobs: jobs must be a JSON array of job objects, got %',
            coalesce(jsonb_typeof(jobs), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The first refused job in array order: the scan stops there (no sort, LIMIT 1), so a later
    -- job's value that cannot even be cast is not reached first. CASE keeps the checks' order.
    BEGIN
        SELECT c.ord, c.problem INTO bad_at, problem
        FROM (
            SELECT e.ord, CASE
                WHEN jsonb_typeof(e.value) <> 'object' THEN
                    format('each job must be a JSON object, got %s', jsonb_typeof(e.value))
                -- What is left of the job without its known keys: '{}' unless it has another one.
                WHEN e.value - known <> '{}' THEN
                    format('unknown key %s in a job (known: task, args, queue, priority, run_at, delay_seconds, '
                           'max_attempts, dedup_key, partition_key)',
                           quote_literal((SELECT k.key FROM jsonb_object_keys(e.value - known) AS k(key) LIMIT 1)))
                WHEN jsonb_typeof(e.value->'partition_key') NOT IN ('string', 'null') THEN
                    format('partition_key must be a string, got %s', jsonb_typeof(e.value->'partition_key'))
                WHEN {schema}.partition_key_problem(e.value->>'partition_key') IS NOT NULL THEN
                    {schema}.partition_key_problem(e.value->>'partition_key')
                ELSE {schema}.job_problem(
                    e.value->>'task',
                    coalesce(e.value->'args', '{}'),
                    coalesce(e.value->>'queue', {schema}.task_queue(e.value->>'task')),
                    coalesce((e.value->>'priority')::int, 0),
                    (e.value->>'run_at')::timestamptz,
                    coalesce((e.value->>'delay_seconds')::float8, 0),
                    coalesce((e.value->>'max_attempts')::int, 5),
                    e.value->>'dedup_key')
            END AS problem
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
            OFFSET 0
        ) AS c
        WHERE c.problem IS NOT NULL
        LIMIT 1;
    EXCEPTION WHEN data_exception THEN
        -- A value that is not of its type ('priority': "high"): the first job that has one,
        -- named, with the cast's own error and SQLSTATE.
        FOR job, bad_at IN SELECT e.value, e.ord FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
                           ORDER BY e.ord LOOP
            BEGIN
                PERFORM (job->>'priority')::int, (job->>'run_at')::timestamptz,
                        (job->>'delay_seconds')::float8, (job->>'max_attempts')::int;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'aioqueue.add_jobs: job % of %: %', bad_at, jsonb_array_length(jobs), SQLERRM
                    USING ERRCODE = SQLSTATE;
            END;
        END LOOP;
        RAISE;
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'aioqueue.add_jobs: job % of %: %', bad_at, jsonb_array_length(jobs), problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF EXISTS (SELECT FROM jsonb_array_elements(jobs) AS e(value) WHERE e.value->>'dedup_key' IS NOT NULL) THEN
        -- Only the first job of each key is written (a key may repeat within the batch, which one
        -- INSERT ... ON CONFLICT DO UPDATE cannot take twice); a key naming a live job returns
        -- that job, as add_job() does. Each job's id comes back at its position: a keyed job's
        -- by its key; the others, new rows inserted in input order, by their rank among those.
        RETURN QUERY
        WITH input AS (
            SELECT e.value, e.ord, e.value->>'dedup_key' AS key,
                   min(e.ord) OVER (PARTITION BY e.value->>'dedup_key') AS first_of_key,
                   row_number() OVER (PARTITION BY e.value->>'dedup_key' IS NULL ORDER BY e.ord) AS nth
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
        ),
        ins AS (
            INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, dedup_key, archive,
                                            partition_key)
            SELECT coalesce(i.value->>'queue', {schema}.task_queue(i.value->>'task')),
                   i.value->>'task',
                   coalesce(i.value->'args', '{}'),
                   coalesce((i.value->>'priority')::int, 0),
                   coalesce((i.value->>'run_at')::timestamptz, {schema}.now())
                       + make_interval(secs => coalesce((i.value->>'delay_seconds')::float8, 0)),
                   coalesce((i.value->>'max_attempts')::int, 5),
                   i.key,
                   false,
                   i.value->>'partition_key'
            FROM input AS i
            WHERE i.key IS NULL OR i.ord = i.first_of_key
            ORDER BY i.ord
            ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
            DO UPDATE SET dedup_key = EXCLUDED.dedup_key
            RETURNING j.id, j.queue, j.run_at, j.dedup_key
        ),
        fresh AS (
            SELECT ins.id, row_number() OVER (ORDER BY ins.id) AS nth FROM ins WHERE ins.dedup_key IS NULL
        ),
        notified AS (
            SELECT count(CASE WHEN w.due IS NOT NULL
                              THEN pg_notify('{schema}_due', extract(epoch FROM w.due - {schema}.now())::text || ' ' || w.queue)
                              ELSE pg_notify('{schema}_jobs', w.queue) END) AS n
            FROM (SELECT DISTINCT ins.queue, CASE WHEN ins.run_at > {schema}.now() THEN ins.run_at END AS due FROM ins) AS w
        )
        SELECT coalesce(k.id, f.id)
        FROM input AS i
        LEFT JOIN ins AS k ON k.dedup_key = i.key
        LEFT JOIN fresh AS f ON i.key IS NULL AND f.nth = i.nth
        CROSS JOIN notified
        ORDER BY i.ord;
        RETURN;
    END IF;

    RETURN QUERY
    WITH ins AS (
        INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive, partition_key)
        SELECT coalesce(e.value->>'queue', {schema}.task_queue(e.value->>'task')),
               e.value->>'task',
               coalesce(e.value->'args', '{}'),
               coalesce((e.value->>'priority')::int, 0),
               coalesce((e.value->>'run_at')::timestamptz, {schema}.now())
                   + make_interval(secs => coalesce((e.value->>'delay_seconds')::float8, 0)),
               coalesce((e.value->>'max_attempts')::int, 5),
               false,
               e.value->>'partition_key'
        FROM jsonb_array_elements(jobs) AS e(value)
        RETURNING j.id, j.queue, j.run_at
    ),
    -- add_job()'s NOTIFYs, once per queue (ready jobs) and per queue and due time (later ones):
    -- PostgreSQL would fold the repeats of one transaction anyway.
    notified AS (
        SELECT count(CASE WHEN w.due IS NOT NULL
                          THEN pg_notify('{schema}_due', extract(epoch FROM w.due - {schema}.now())::text || ' ' || w.queue)
                          ELSE pg_notify('{schema}_jobs', w.queue) END) AS n
        FROM (SELECT DISTINCT ins.queue, CASE WHEN ins.run_at > {schema}.now() THEN ins.run_at END AS due FROM ins) AS w
    )
    SELECT ins.id FROM ins, notified ORDER BY ins.id;
END;
$$;
