-- send_event(name, key, payload): deliver an event to every job waiting for `name` (and `key`:
-- NULL matches only waits without a key) at the time of the call, and not past its timeout, in the caller's
-- transaction. Each wait reached becomes 'received' with the payload, and its job, if pending,
-- is due now; its queue's workers are woken when the transaction commits (NOTIFY), and not at
-- all if it rolls back. An event no job waits for is not kept. Returns how many waits it reached.
CREATE OR REPLACE FUNCTION {schema}.send_event(name text, key text DEFAULT NULL, payload jsonb DEFAULT 'null')
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
