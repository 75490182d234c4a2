-- The bulk form of add_job(): a JSON array of objects with add_job's argument names as keys
-- (task required), written in one statement, dedup keys included. The same checks and errors
-- as add_job(); the ids in the order given (a repeated key returns the first job's id, a key
-- naming a live job returns that job). PostgreSQL folds the repeated NOTIFYs of one transaction
-- (same channel and payload) into one.
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

COMMENT ON FUNCTION {schema}.add_jobs(jsonb) IS
    'Enqueue many aioqueue jobs from a JSON array of objects (add_job''s argument names as keys); return their ids in order.';
