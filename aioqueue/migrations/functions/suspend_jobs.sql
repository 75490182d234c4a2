-- suspend_jobs(ids, attempts, commit_mode): the completer's write for handlers that stopped at a
-- sleep or an event wait. Each claim still held (id, attempt, running) goes back to pending
-- without spending an attempt (max_attempts + 1, as reschedule), its lease cleared, due now if
-- an event already reached one of its waits, else at the earliest wake_at of its open
-- sleeps and waits. The rows are locked first and the steps read by a second statement, with a
-- fresh snapshot: an event whose send_event() held a job's row lock before this is seen
-- committed; one that comes after finds the job pending and moves its run_at itself. Returns
-- the suspended jobs. Wakes as reschedule does.
CREATE OR REPLACE FUNCTION {schema}.suspend_jobs(ids bigint[], attempts int[], commit_mode text)
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
