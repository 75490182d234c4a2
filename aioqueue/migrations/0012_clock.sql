-- The queue's clock: one function, `{schema}.now()`, that every time aioqueue acts on is read
-- from (when a job is due, a lease's end, a retry's backoff, a periodic slot, a rate window,
-- retention). It is the transaction's now(), as before: a SQL function of one SELECT, STABLE
-- like now() itself, so the planner puts its body in place of every call (inlines it) and the
-- statements run exactly as they did. aioqueue.testing moves a test's clock by redefining this
-- function in the test's own schema (CREATE OR REPLACE, which every session's cached plans
-- notice); production never does. pg_catalog is named inside: a search_path that puts this
-- schema first must not make the function call itself.
--
-- The statements of aioqueue/queries.sql call it from this version on; the functions of earlier
-- migrations that read now() are redefined below with the same bodies, the clock replaced, and
-- the defaults of the columns that hold due and finish times read it too. The worker registry
-- (`workers`, `tasks.seen_at`) stays on the wall clock: it says whether processes are alive,
-- which real seconds decide.

CREATE FUNCTION {schema}.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$SELECT pg_catalog.now()$$;

COMMENT ON FUNCTION {schema}.now() IS
    'The time aioqueue schedules by: the transaction''s now(). Tests move it (aioqueue.testing).';

ALTER TABLE {schema}.jobs
    ALTER COLUMN run_at SET DEFAULT {schema}.now(),
    ALTER COLUMN created_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.jobs_done ALTER COLUMN finished_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.queues ALTER COLUMN updated_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.periodic ALTER COLUMN updated_at SET DEFAULT {schema}.now();

-- claim_jobs() as in 0007, on the queue's clock.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(
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
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    -- Local to the caller's transaction (a SET clause above would end with the function).
    PERFORM set_config('synchronous_commit', coalesce($6, current_setting('synchronous_commit')), true);
    RETURN QUERY
    WITH wanted AS (
        SELECT w.queue, w.n
        FROM unnest($1::text[], $2::int[]) AS w(queue, n)
        WHERE NOT EXISTS (SELECT FROM {schema}.queues AS s WHERE s.name = w.queue AND s.paused)
    ),
    -- MATERIALIZED stops the planner from re-running the locking subquery, which could lock
    -- more rows than the limit.
    picked AS MATERIALIZED (
        SELECT c.id
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at
            FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.queue = wanted.queue AND j.run_at <= {schema}.now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT wanted.n
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT $5
    )
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_at = {schema}.now(),
        locked_by = $3,
        lease_expires_at = {schema}.now() + make_interval(secs => $4)
    -- By primary key, never a hash join over a scan of the whole table.
    WHERE j.id = ANY (ARRAY(SELECT picked.id FROM picked))
    RETURNING j.id, j.queue, j.task, j.args::text, j.priority, j.attempts, j.max_attempts,
              j.run_at, j.created_at;
END
$$;

-- add_job() and add_jobs() as in 0011, on the queue's clock.
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
            coalesce(add_job.run_at, {schema}.now()) + make_interval(secs => add_job.delay_seconds),
            add_job.max_attempts, add_job.dedup_key, false)
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
                   coalesce((i.value->>'run_at')::timestamptz, {schema}.now())
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
        INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive)
        SELECT coalesce(e.value->>'queue', {schema}.task_queue(e.value->>'task')),
               e.value->>'task',
               coalesce(e.value->'args', '{}'),
               coalesce((e.value->>'priority')::int, 0),
               coalesce((e.value->>'run_at')::timestamptz, {schema}.now())
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
                          THEN pg_notify('{schema}_due', extract(epoch FROM w.due - {schema}.now())::text || ' ' || w.queue)
                          ELSE pg_notify('{schema}_jobs', w.queue) END) AS n
        FROM (SELECT DISTINCT ins.queue, CASE WHEN ins.run_at > {schema}.now() THEN ins.run_at END AS due FROM ins) AS w
    )
    SELECT ins.id FROM ins, notified ORDER BY ins.id;
END;
$$;
