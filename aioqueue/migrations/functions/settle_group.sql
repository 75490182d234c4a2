-- settle_group(gid): if group gid is closed and every member finished, mark it done and enqueue
-- its callbacks (on_success when every member succeeded, on_failure otherwise, on_complete
-- always). Returns how many it enqueued. Only the first call that finds it complete does. A
-- group reopened by a retry settles again, and enqueues only the callbacks it has not enqueued
-- before: each kind at most once, ever.
CREATE OR REPLACE FUNCTION {schema}.settle_group(gid bigint) RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    g {schema}.job_groups;
    cb_kind text;
    spec jsonb;
    n int := 0;
    new_id bigint;
    into_queue text;
BEGIN
    UPDATE {schema}.job_groups AS s SET done_at = {schema}.now()
    WHERE s.id = gid AND s.closed AND s.done_at IS NULL
      AND s.succeeded + s.failed + s.cancelled >= s.total
    RETURNING s.* INTO g;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR cb_kind, spec IN SELECT e.key, e.value FROM jsonb_each(g.callbacks) AS e ORDER BY e.key LOOP
        CONTINUE WHEN cb_kind = 'on_success' AND g.failed + g.cancelled > 0;
        CONTINUE WHEN cb_kind = 'on_failure' AND g.failed + g.cancelled = 0;
        -- Settled before, and reopened by a retry: what it enqueued then is not enqueued again.
        CONTINUE WHEN EXISTS (SELECT FROM {schema}.group_callbacks AS c WHERE c.group_id = gid AND c.kind = cb_kind);
        into_queue := coalesce(spec ->> 'queue', {schema}.task_queue(spec ->> 'task'), 'default');
        INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, archive)
        VALUES (into_queue, spec ->> 'task', coalesce(spec -> 'args', '{}'::jsonb),
                coalesce((spec ->> 'priority')::int, 0), coalesce((spec ->> 'max_attempts')::int, 5),
                coalesce((spec ->> 'archive')::boolean, true))
        RETURNING id INTO new_id;
        INSERT INTO {schema}.group_callbacks (group_id, kind, job_id) VALUES (gid, cb_kind, new_id);
        PERFORM pg_notify('{schema}_jobs', into_queue);
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;
