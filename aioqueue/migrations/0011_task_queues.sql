-- Where a job enqueued by name without a queue goes: to the queue of the workers that serve its
-- task, as they recorded it in `tasks` when they started. Before, such a job went to 'default',
-- where a worker that registered the task on another queue never looks: it stayed pending and
-- nothing said why. add_job() and add_jobs() now look the queue up when none is given (the
-- Python statements do the same), and refuse the job, naming the task, when no worker has
-- recorded one. A job given a queue is written exactly as before.

-- One row per task a worker has served: written by each worker as it starts (aioqueue/registry.py,
-- with its own row in `workers`), the last one to start winning when two disagree. Never
-- deleted: a task no worker serves any more keeps the queue its jobs went to.
CREATE TABLE {schema}.tasks (
    name    text        PRIMARY KEY,
    queue   text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {schema}.tasks IS
    'The queue of each task, as the workers that serve it recorded it when they started.';

-- The queue a job of `task` goes to when the caller names none, or NULL when no worker has
-- recorded one: the one definition of the lookup, for add_job(), add_jobs() and the enqueue
-- statements of aioqueue/queries.sql.
CREATE FUNCTION {schema}.task_queue(task text) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT t.queue FROM {schema}.tasks AS t WHERE t.name = task
$$;

-- job_problem() as in 0009, except that a NULL queue (none given, none recorded) is refused
-- with what to do about it.
CREATE OR REPLACE FUNCTION {schema}.job_problem(
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
        WHEN queue IS NULL THEN
            format('task %s has no known queue: no worker that serves it has recorded one (table '
                   '{schema}.tasks); pass its queue (queue => ..., or "queue" in add_jobs), or start a '
                   'worker that serves it', quote_literal(task))
        WHEN length(queue) = 0 OR length(queue) > 255 THEN
            format('queue must be a name of 1 to 255 characters, got %s (%s characters)',
                   quote_literal(left(queue, 40)), length(queue))
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

-- add_job() as in 0009, with no default queue: none given (or NULL) means the task's recorded one.
-- A parameter's default can change in place, so callers and grants are untouched.
CREATE OR REPLACE FUNCTION {schema}.add_job(
    task          text,
    args          jsonb       DEFAULT '{}',
    queue         text        DEFAULT NULL,
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
    into_queue text := coalesce(add_job.queue, {schema}.task_queue(add_job.task));
BEGIN
    problem := {schema}.job_problem(add_job.task, add_job.args, into_queue, add_job.priority,
                                    add_job.run_at, add_job.delay_seconds, add_job.max_attempts,
                                    add_job.dedup_key);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'aioqueue.add_job: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The `enqueue` statement's insert: a live job with the same dedup key is returned instead.
    INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, dedup_key, archive)
    VALUES (into_queue, add_job.task, add_job.args, add_job.priority,
            coalesce(add_job.run_at, now()) + make_interval(secs => add_job.delay_seconds),
            add_job.max_attempts, add_job.dedup_key, false)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET dedup_key = EXCLUDED.dedup_key
    RETURNING j.id, j.run_at INTO job_id, due;

    -- As the `enqueue` statement: a job ready now wakes its queue's workers; a later one tells
    -- them when it is due ('seconds queue'), so they wake on time.
    IF due > now() THEN
        PERFORM pg_notify('{schema}_due', extract(epoch FROM due - now())::text || ' ' || into_queue);
    ELSE
        PERFORM pg_notify('{schema}_jobs', into_queue);
    END IF;
    RETURN job_id;
END;
$$;

-- add_jobs() as in 0010, except that a job without a "queue" goes to its task's recorded one
-- (looked up once per such job, in the checks and in the insert; a job with a queue pays nothing).
CREATE OR REPLACE FUNCTION {schema}.add_jobs(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job jsonb;
    bad_at bigint;
    problem text;
    known CONSTANT text[] := ARRAY['task', 'args', 'queue', 'priority', 'run_at', 'delay_seconds', 'max_attempts',
                                   'dedup_key'];
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
                           'max_attempts, dedup_key)',
                           quote_literal((SELECT k.key FROM jsonb_object_keys(e.value - known) AS k(key) LIMIT 1)))
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
            INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, dedup_key, archive)
            SELECT coalesce(i.value->>'queue', {schema}.task_queue(i.value->>'task')),
                   i.value->>'task',
                   coalesce(i.value->'args', '{}'),
                   coalesce((i.value->>'priority')::int, 0),
                   coalesce((i.value->>'run_at')::timestamptz, now())
                       + make_interval(secs => coalesce((i.value->>'delay_seconds')::float8, 0)),
                   coalesce((i.value->>'max_attempts')::int, 5),
                   i.key,
                   false
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
                              THEN pg_notify('{schema}_due', extract(epoch FROM w.due - now())::text || ' ' || w.queue)
                              ELSE pg_notify('{schema}_jobs', w.queue) END) AS n
            FROM (SELECT DISTINCT ins.queue, CASE WHEN ins.run_at > now() THEN ins.run_at END AS due FROM ins) AS w
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
        INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive)
        SELECT coalesce(e.value->>'queue', {schema}.task_queue(e.value->>'task')),
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

COMMENT ON FUNCTION {schema}.add_job(text, jsonb, text, int, timestamptz, float8, int, text) IS
    'Enqueue one aioqueue job; without a queue, it goes to the queue the task''s workers recorded.';
