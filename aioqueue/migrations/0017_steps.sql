-- Durable steps, sleeps and event waits inside a handler (aioqueue.step, aioqueue.sleep,
-- aioqueue.wait_for_event; docs/howto/durable-steps.md).
--
-- One row per step a job's handler reached, keyed by the job, the step's name and its
-- occurrence (the n-th call of that name in one run of the handler, from 1):
--   kind 'step':  state 'done', result = what the step returned (JSON).
--   kind 'sleep': state 'waiting' until the handler passes it after wake_at, then 'done'.
--   kind 'event': state 'waiting' (wake_at = its timeout), 'received' when an event reached it
--                 (result = the event's payload), 'done' once the handler took it, or
--                 'timed_out'.
-- No foreign key to jobs: the statements that finish plain jobs stay as they are (no trigger,
-- no lookup here per finished job). Rows whose job is in neither jobs nor jobs_done are pruned
-- with the archive (prune_steps).
--
-- A sleeping or waiting job is an ordinary pending job whose run_at is when it wakes (the
-- sleep's end, the wait's timeout), as a snoozed one: the due-time wake-ups already wake it on
-- time, and a previous release's workers, which know nothing of this table, run it as they run
-- any job. No column of jobs and no job status is added.

CREATE TABLE {schema}.job_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    occurrence  int         NOT NULL CHECK (occurrence >= 1),
    kind        text        NOT NULL CHECK (kind IN ('step', 'sleep', 'event')),
    state       text        NOT NULL CHECK (state IN ('done', 'waiting', 'received', 'timed_out')),
    result      jsonb,
    wake_at     timestamptz,
    event       text,
    event_key   text,
    created_at  timestamptz NOT NULL DEFAULT {schema}.now(),
    updated_at  timestamptz NOT NULL DEFAULT {schema}.now(),
    PRIMARY KEY (job_id, name, occurrence)
);

-- send_event() reads only this: the waits still open for an event name (and key).
CREATE INDEX job_steps_waiting_idx ON {schema}.job_steps (event, event_key)
    WHERE state = 'waiting' AND kind = 'event';

-- suspend_jobs(ids, attempts, commit_mode): the completer's write for handlers that stopped at a
-- sleep or an event wait. Each claim still held (id, attempt, running) goes back to pending
-- without spending an attempt (max_attempts + 1, as reschedule), its lease cleared, due now if
-- an event already reached one of its waits, else at the earliest wake_at of its open
-- sleeps and waits. The rows are locked first and the steps read by a second statement, with a
-- fresh snapshot: an event whose send_event() held a job's row lock before this is seen
-- committed; one that comes after finds the job pending and moves its run_at itself. Returns
-- the suspended jobs. Wakes as reschedule does.
CREATE FUNCTION {schema}.suspend_jobs(ids bigint[], attempts int[], commit_mode text)
RETURNS TABLE (id bigint, queue text, run_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    held bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', coalesce(commit_mode, current_setting('synchronous_commit')), true);
    SELECT array_agg(l.id) INTO held FROM (
        SELECT j.id
        FROM {schema}.jobs AS j
        JOIN unnest(suspend_jobs.ids, suspend_jobs.attempts) AS c(id, attempts) ON c.id = j.id AND c.attempts = j.attempts
        WHERE j.status = 'running'
        ORDER BY j.id
        FOR UPDATE OF j
    ) AS l;
    RETURN QUERY
    WITH suspended AS (
        UPDATE {schema}.jobs AS j
        SET status = 'pending',
            run_at = coalesce(
                (SELECT CASE WHEN bool_or(s.state = 'received') THEN {schema}.now()
                             ELSE min(s.wake_at) FILTER (WHERE s.state = 'waiting') END
                 FROM {schema}.job_steps AS s WHERE s.job_id = j.id),
                {schema}.now()),
            max_attempts = j.max_attempts + 1,
            lease_expires_at = NULL,
            locked_at = NULL,
            locked_by = NULL
        WHERE j.id = ANY (held)
        RETURNING j.id, j.queue, j.run_at
    ),
    notified AS (
        SELECT pg_notify('{schema}_jobs', q.queue)
        FROM (SELECT DISTINCT s.queue FROM suspended AS s WHERE s.run_at <= {schema}.now()) AS q
        UNION ALL
        SELECT pg_notify('{schema}_due', extract(epoch FROM d.first - {schema}.now())::text || ' ' || d.queue)
        FROM (SELECT s.queue, min(s.run_at) AS first FROM suspended AS s
              WHERE s.run_at > {schema}.now() GROUP BY s.queue) AS d
    )
    SELECT s.id, s.queue, s.run_at FROM suspended AS s WHERE (SELECT count(*) FROM notified) >= 0;
END;
$$;

-- send_event(name, key, payload): deliver an event to every job waiting for `name` (and `key`:
-- NULL matches only waits without a key) at the time of the call, and not past its timeout, in the caller's
-- transaction. Each wait reached becomes 'received' with the payload, and its job, if pending,
-- is due now; its queue's workers are woken when the transaction commits (NOTIFY), and not at
-- all if it rolls back. An event no job waits for is not kept. Returns how many waits it reached.
CREATE FUNCTION {schema}.send_event(name text, key text DEFAULT NULL, payload jsonb DEFAULT 'null')
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    reached int;
BEGIN
    IF name IS NULL OR name = '' THEN
        RAISE EXCEPTION 'aioqueue.send_event: the event name must be a non-empty string'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH received AS (
        UPDATE {schema}.job_steps AS s
        SET state = 'received', result = coalesce(send_event.payload, 'null'), updated_at = {schema}.now()
        WHERE s.state = 'waiting' AND s.kind = 'event'
          AND s.event = send_event.name AND s.event_key IS NOT DISTINCT FROM send_event.key
          -- A wait past its timeout is over, though its handler has not run yet to see it.
          AND s.wake_at > {schema}.now()
        RETURNING s.job_id
    ),
    -- Every job reached is locked, whatever its status: a handler about to stop at this wait
    -- is suspended after this commits (suspend_jobs reads the steps after locking the row).
    woken AS (
        UPDATE {schema}.jobs AS j
        SET run_at = CASE WHEN j.status = 'pending' THEN least(j.run_at, {schema}.now()) ELSE j.run_at END
        WHERE j.id IN (SELECT r.job_id FROM received AS r)
        RETURNING j.queue, j.status
    ),
    notified AS (
        SELECT pg_notify('{schema}_jobs', q.queue)
        FROM (SELECT DISTINCT w.queue FROM woken AS w WHERE w.status = 'pending') AS q
    )
    SELECT count(*) INTO reached FROM received WHERE (SELECT count(*) FROM notified) >= 0;
    RETURN reached;
END;
$$;
