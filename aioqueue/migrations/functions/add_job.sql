-- Enqueue from SQL: triggers, other languages and psql write jobs through add_job() and
-- add_jobs(). They check what Python's enqueue checks (job_problem() and
-- partition_key_problem(), the limits of aioqueue/_checks.py and _payload.py), write the row
-- the `enqueue` statement writes, with the same dedup behaviour, and send the same NOTIFY
-- (delivered at commit). Every value is a parameter: no SQL is built from input. Without a
-- queue, a job goes to the queue its task's workers recorded (task_queue()), and is refused,
-- naming the task, while none has.
--
-- A new parameter makes a new function: the signature before the partition key (migrations
-- 0004 to 0017) is dropped here, just before the one that replaces it, so that a database
-- migrated one version at a time keeps a callable add_job() at every step.
DROP FUNCTION IF EXISTS {schema}.add_job(text, jsonb, text, int, timestamptz, float8, int, text);

CREATE OR REPLACE FUNCTION {schema}.add_job(
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
