-- add_jobs() writes a batch in one INSERT. It called add_job() once per job: a plan, an insert
-- and a NOTIFY each, far costlier than enqueue_many's one statement for the same rows.
-- The checks move into job_problem(), which add_job() and add_jobs() both ask, so a job is
-- refused for the same reasons, with the same words, whichever way it comes. Nothing about a
-- stored job changes: same rows, same ids in the order given, same NOTIFYs.

-- Why a job with these values would be refused (NULL: it is fine): the limits of
-- aioqueue/checks.py and payload.py, as add_job() has always checked them.
CREATE FUNCTION {schema}.job_problem(
    task          text,
    args          jsonb,
    queue         text,
    priority      int,
    run_at        timestamptz,
    delay_seconds float8,
    max_attempts  int,
    dedup_key     text
) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- text cannot hold NUL and jsonb refuses \u0000, so NUL never gets this far.
    RETURN CASE
        WHEN task IS NULL OR length(task) = 0 OR length(task) > 255 THEN
            format('task must be a name of 1 to 255 characters, got %s (%s characters)',
                   coalesce(quote_literal(left(task, 40)), 'NULL'), coalesce(length(task), 0))
        WHEN queue IS NULL OR length(queue) = 0 OR length(queue) > 255 THEN
            format('queue must be a name of 1 to 255 characters, got %s (%s characters)',
                   coalesce(quote_literal(left(queue, 40)), 'NULL'), coalesce(length(queue), 0))
        WHEN args IS NULL OR jsonb_typeof(args) <> 'object' THEN
            format('args of task %s must be a JSON object of keyword arguments, got %s',
                   quote_literal(task), coalesce(jsonb_typeof(args), 'NULL'))
        WHEN octet_length(args::text) > 1048576 THEN
            format('args of task %s are %s bytes as JSON, over the limit of 1048576',
                   quote_literal(task), octet_length(args::text))
        WHEN priority IS NULL THEN
            'priority must be an int, got NULL'
        WHEN delay_seconds IS NULL OR NOT (delay_seconds BETWEEN 0 AND 315360000) THEN
            format('delay_seconds must be 0 to ten years in seconds, got %s', coalesce(delay_seconds::text, 'NULL'))
        WHEN max_attempts IS NULL OR NOT (max_attempts BETWEEN 1 AND 10000) THEN
            format('max_attempts must be an int from 1 to 10000, got %s', coalesce(max_attempts::text, 'NULL'))
        WHEN run_at IS NOT NULL AND NOT isfinite(run_at) THEN
            format('run_at must be a finite time, got %s', run_at)
        WHEN dedup_key IS NOT NULL
             AND (length(dedup_key) = 0 OR length(dedup_key) > 1000 OR octet_length(dedup_key) > 2000) THEN
            format('dedup_key must be 1 to 1000 characters and at most 2000 bytes, got %s characters',
                   length(dedup_key))
    END;
END;
$$;

COMMENT ON FUNCTION {schema}.job_problem(text, jsonb, text, int, timestamptz, float8, int, text) IS
    'Why add_job() would refuse a job with these values, or NULL: the one definition of its checks.';

CREATE OR REPLACE FUNCTION {schema}.add_job(
    task          text,
    args          jsonb       DEFAULT '{}',
    queue         text        DEFAULT 'default',
    priority      int         DEFAULT 0,
    run_at        timestamptz DEFAULT NULL,
    delay_seconds float8      DEFAULT 0,
    max_attempts  int         DEFAULT 5,
    dedup_key     text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
    due timestamptz;
    problem text;
BEGIN
    problem := {schema}.job_problem(add_job.task, add_job.args, add_job.queue, add_job.priority,
                                    add_job.run_at, add_job.delay_seconds, add_job.max_attempts,
                                    add_job.dedup_key);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'aioqueue.add_job: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The `enqueue` statement's insert: a live job with the same dedup key is returned instead.
    INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, dedup_key, archive)
    VALUES (add_job.queue, add_job.task, add_job.args, add_job.priority,
            coalesce(add_job.run_at, now()) + make_interval(secs => add_job.delay_seconds),
            add_job.max_attempts, add_job.dedup_key, false)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET dedup_key = EXCLUDED.dedup_key
    RETURNING j.id, j.run_at INTO job_id, due;

    -- As the `enqueue` statement: a job ready now wakes its queue's workers; a later one tells
    -- them when it is due ('seconds queue'), so they wake on time.
    IF due > now() THEN
        PERFORM pg_notify('{schema}_due', extract(epoch FROM due - now())::text || ' ' || add_job.queue);
    ELSE
        PERFORM pg_notify('{schema}_jobs', add_job.queue);
    END IF;
    RETURN job_id;
END;
$$;

-- The bulk form. Every job is checked first, in the order given, and the first refused one
-- names its position; then, unless some job carries a dedup key, one INSERT writes them all, in
-- array order (a lone function scan feeds it, so the identity values follow the input), and one
-- NOTIFY goes out per queue and due time. Jobs with dedup keys keep add_job()'s way, one at a
-- time: a key may repeat within the batch, which a single INSERT ... ON CONFLICT cannot take.
CREATE OR REPLACE FUNCTION {schema}.add_jobs(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job jsonb;
    bad_at bigint;
    problem text;
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
                WHEN u.key IS NOT NULL THEN
                    format('unknown key %s in a job (known: task, args, queue, priority, run_at, delay_seconds, '
                           'max_attempts, dedup_key)', quote_literal(u.key))
                ELSE {schema}.job_problem(
                    e.value->>'task',
                    coalesce(e.value->'args', '{}'),
                    coalesce(e.value->>'queue', 'default'),
                    coalesce((e.value->>'priority')::int, 0),
                    (e.value->>'run_at')::timestamptz,
                    coalesce((e.value->>'delay_seconds')::float8, 0),
                    coalesce((e.value->>'max_attempts')::int, 5),
                    e.value->>'dedup_key')
            END AS problem
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
            LEFT JOIN LATERAL (
                SELECT k.key FROM jsonb_object_keys(CASE jsonb_typeof(e.value) WHEN 'object' THEN e.value END) AS k(key)
                WHERE k.key NOT IN ('task', 'args', 'queue', 'priority', 'run_at', 'delay_seconds', 'max_attempts',
                                    'dedup_key')
                LIMIT 1
            ) AS u ON true
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
        FOR job IN SELECT e.value FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord) ORDER BY e.ord LOOP
            RETURN NEXT {schema}.add_job(
                task          => job->>'task',
                args          => coalesce(job->'args', '{}'),
                queue         => coalesce(job->>'queue', 'default'),
                priority      => coalesce((job->>'priority')::int, 0),
                run_at        => (job->>'run_at')::timestamptz,
                delay_seconds => coalesce((job->>'delay_seconds')::float8, 0),
                max_attempts  => coalesce((job->>'max_attempts')::int, 5),
                dedup_key     => job->>'dedup_key'
            );
        END LOOP;
        RETURN;
    END IF;

    RETURN QUERY
    WITH ins AS (
        INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive)
        SELECT coalesce(e.value->>'queue', 'default'),
               e.value->>'task',
               coalesce(e.value->'args', '{}'),
               coalesce((e.value->>'priority')::int, 0),
               coalesce((e.value->>'run_at')::timestamptz, now())
                   + make_interval(secs => coalesce((e.value->>'delay_seconds')::float8, 0)),
               coalesce((e.value->>'max_attempts')::int, 5),
               false
        FROM jsonb_array_elements(jobs) AS e(value)
        RETURNING j.id, j.queue, j.run_at
    ),
    -- add_job()'s NOTIFYs, once per queue (ready jobs) and per queue and due time (later ones):
    -- PostgreSQL would fold the repeats of one transaction anyway.
    notified AS (
        SELECT count(CASE WHEN w.due IS NOT NULL
                          THEN pg_notify('{schema}_due', extract(epoch FROM w.due - now())::text || ' ' || w.queue)
                          ELSE pg_notify('{schema}_jobs', w.queue) END) AS n
        FROM (SELECT DISTINCT ins.queue, CASE WHEN ins.run_at > now() THEN ins.run_at END AS due FROM ins) AS w
    )
    SELECT ins.id FROM ins, notified ORDER BY ins.id;
END;
$$;

COMMENT ON FUNCTION {schema}.add_jobs(jsonb) IS
    'Enqueue many aioqueue jobs from a JSON array of objects (add_job''s argument names as keys); return their ids in order.';
