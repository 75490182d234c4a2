-- Retrying a dead job resumes its workflow (see migration 0014): the dependants a dead job had
-- cancelled, and theirs down the graph, come back from the archive to wait again, and the
-- groups count the retried member and the restored ones as not finished. `retry_dead` calls
-- resume_workflows() for the retried jobs that have dependants or a group.
--
-- A restored dependant keeps its id, queue, task, arguments, priority and group; the archive
-- does not keep max_attempts, so it gets the default (5), or its attempts and one more.

-- resume_workflows(ids): the jobs ids were dead and are pending again.
CREATE FUNCTION {schema}.resume_workflows(ids bigint[]) RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    restored bigint[];
    n int := 0;
BEGIN
    -- The retried members are no longer failed, in groups not settled yet.
    UPDATE {schema}.job_groups AS s SET failed = s.failed - c.n
    FROM (SELECT j.group_id, count(*)::int AS n FROM {schema}.jobs AS j
          WHERE j.id = ANY (ids) AND j.group_id IS NOT NULL GROUP BY j.group_id) AS c
    WHERE s.id = c.group_id AND s.done_at IS NULL;
    LOOP
        WITH back AS (
            DELETE FROM {schema}.jobs_done AS a
            WHERE a.status = 'cancelled' AND a.reason LIKE 'dependency % did not succeed'
              AND a.id IN (SELECT d.job_id FROM {schema}.job_deps AS d
                           WHERE d.depends_on = ANY (ids) AND NOT d.may_fail)
            RETURNING a.id, a.queue, a.task, a.args, a.priority, a.attempts, a.dedup_key, a.created_at, a.group_id
        ),
        inserted AS (
            INSERT INTO {schema}.jobs AS j
                (id, queue, task, args, status, priority, attempts, max_attempts, dedup_key, archive, created_at,
                 group_id, has_dependants, waiting_for)
            OVERRIDING SYSTEM VALUE
            SELECT b.id, b.queue, b.task, b.args, 'waiting', b.priority, b.attempts, greatest(5, b.attempts + 1),
                   b.dedup_key, true, b.created_at, b.group_id,
                   EXISTS (SELECT FROM {schema}.job_deps AS d WHERE d.depends_on = b.id),
                   (SELECT count(*) FROM {schema}.job_deps AS d
                    LEFT JOIN {schema}.jobs_done AS a ON a.id = d.depends_on AND a.status = 'succeeded'
                    WHERE d.job_id = b.id AND a.id IS NULL)
            FROM back AS b
            RETURNING j.id, j.group_id
        ),
        regrouped AS (
            UPDATE {schema}.job_groups AS s SET cancelled = s.cancelled - c.n
            FROM (SELECT i.group_id, count(*)::int AS n FROM inserted AS i
                  WHERE i.group_id IS NOT NULL GROUP BY i.group_id) AS c
            WHERE s.id = c.group_id AND s.done_at IS NULL
        )
        SELECT array_agg(i.id) INTO restored FROM inserted AS i;
        EXIT WHEN restored IS NULL;
        n := n + cardinality(restored);
        ids := restored;
    END LOOP;
    RETURN n;
END;
$$;
