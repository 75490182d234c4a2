-- Enqueue from SQL: triggers, other languages and psql write jobs through these functions.
-- They check what Python's enqueue checks (the limits of aioqueue/checks.py and payload.py),
-- write the row the `enqueue` statement writes, with the same dedup behaviour, and send the
-- same NOTIFY (delivered at commit). Every value is a parameter: no SQL is built from input.

CREATE FUNCTION {schema}.add_job(
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
BEGIN
    -- text cannot hold NUL and jsonb refuses \u0000, so NUL never gets this far.
    IF add_job.task IS NULL OR length(add_job.task) = 0 OR length(add_job.task) > 255 THEN
        RAISE EXCEPTION 'aioqueue.add_job: task must be a name of 1 to 255 characters, got % (% characters)',
            coalesce(quote_literal(left(add_job.task, 40)), 'NULL'), coalesce(length(add_job.task), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.queue IS NULL OR length(add_job.queue) = 0 OR length(add_job.queue) > 255 THEN
        RAISE EXCEPTION 'aioqueue.add_job: queue must be a name of 1 to 255 characters, got % (% characters)',
            coalesce(quote_literal(left(add_job.queue, 40)), 'NULL'), coalesce(length(add_job.queue), 0)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.args IS NULL OR jsonb_typeof(add_job.args) <> 'object' THEN
        RAISE EXCEPTION 'aioqueue.add_job: args of task % must be a JSON object of keyword arguments, got %',
            quote_literal(add_job.task), coalesce(jsonb_typeof(add_job.args), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(add_job.args::text) > 1048576 THEN
        RAISE EXCEPTION 'aioqueue.add_job: args of task % are % bytes as JSON, over the limit of 1048576',
            quote_literal(add_job.task), octet_length(add_job.args::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.priority IS NULL THEN
        RAISE EXCEPTION 'aioqueue.add_job: priority must be an int, got NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.delay_seconds IS NULL OR NOT (add_job.delay_seconds BETWEEN 0 AND 315360000) THEN
        RAISE EXCEPTION 'aioqueue.add_job: delay_seconds must be 0 to ten years in seconds, got %',
            coalesce(add_job.delay_seconds::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.max_attempts IS NULL OR NOT (add_job.max_attempts BETWEEN 1 AND 10000) THEN
        RAISE EXCEPTION 'aioqueue.add_job: max_attempts must be an int from 1 to 10000, got %',
            coalesce(add_job.max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.run_at IS NOT NULL AND NOT isfinite(add_job.run_at) THEN
        RAISE EXCEPTION 'aioqueue.add_job: run_at must be a finite time, got %', add_job.run_at
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF add_job.dedup_key IS NOT NULL AND (
        length(add_job.dedup_key) = 0 OR length(add_job.dedup_key) > 1000 OR octet_length(add_job.dedup_key) > 2000
    ) THEN
        RAISE EXCEPTION 'aioqueue.add_job: dedup_key must be 1 to 1000 characters and at most 2000 bytes, got % characters',
            length(add_job.dedup_key)
            USING ERRCODE = 'invalid_parameter_value';
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

COMMENT ON FUNCTION {schema}.add_job(text, jsonb, text, int, timestamptz, float8, int, text) IS
    'Enqueue one aioqueue job (in the caller''s transaction) and wake the workers of its queue; return its id.';

-- The bulk form: a JSON array of objects with add_job's argument names as keys (task required).
-- Returns the ids in the order given. PostgreSQL folds the repeated NOTIFYs of one transaction
-- (same channel and payload) into one.
CREATE FUNCTION {schema}.add_jobs(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job jsonb;
    unknown text;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'aioqueue.add_jobs: jobs must be a JSON array of job objects, got %',
            coalesce(jsonb_typeof(jobs), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR job IN SELECT e.value FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord) ORDER BY e.ord LOOP
        IF jsonb_typeof(job) <> 'object' THEN
            RAISE EXCEPTION 'aioqueue.add_jobs: each job must be a JSON object, got %', jsonb_typeof(job)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT k INTO unknown FROM jsonb_object_keys(job) AS k
        WHERE k NOT IN ('task', 'args', 'queue', 'priority', 'run_at', 'delay_seconds', 'max_attempts', 'dedup_key')
        LIMIT 1;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'aioqueue.add_jobs: unknown key % in a job (known: task, args, queue, priority, run_at, delay_seconds, max_attempts, dedup_key)',
                quote_literal(unknown)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
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
END;
$$;

COMMENT ON FUNCTION {schema}.add_jobs(jsonb) IS
    'Enqueue many aioqueue jobs from a JSON array of objects (add_job''s argument names as keys); return their ids in order.';
