-- resume_workflows(ids): the jobs ids were dead and are pending again (`retry_dead` calls it
-- for those that have dependants or a group). Restores from the archive, down the graph, the
-- dependants their deaths cancelled, to wait again (each keeps its id, queue, task, arguments,
-- priority, group, max_attempts and partition key; a row archived before migration 0021 gets
-- max_attempts of 5, or its attempts and one more); then counts the retried and the restored
-- members out of their groups' failed and cancelled, reopening the groups that had settled.
-- Job rows are locked before group rows, groups once and in id order, as jobs_finished() does.
CREATE OR REPLACE FUNCTION {schema}.resume_workflows(ids bigint[]) RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    retried bigint[] := ids;
    restored bigint[];
    all_restored bigint[] := '{}';
BEGIN
    LOOP
        WITH back AS (
            DELETE FROM {schema}.jobs_done AS a
            WHERE a.status = 'cancelled' AND a.reason LIKE 'dependency % did not succeed'
              AND a.id IN (SELECT d.job_id FROM {schema}.job_deps AS d
                           WHERE d.depends_on = ANY (ids) AND NOT d.may_fail)
            RETURNING a.id, a.queue, a.task, a.args, a.priority, a.attempts, a.dedup_key, a.created_at, a.group_id,
                      a.max_attempts, a.partition_key
        ),
        inserted AS (
            INSERT INTO {schema}.jobs AS j
                (id, queue, task, args, status, priority, attempts, max_attempts, dedup_key, archive, created_at,
                 group_id, has_dependants, waiting_for, partition_key)
            OVERRIDING SYSTEM VALUE
            SELECT b.id, b.queue, b.task, b.args, 'waiting', b.priority, b.attempts,
                   coalesce(b.max_attempts, greatest(5, b.attempts + 1)),
                   b.dedup_key, true, b.created_at, b.group_id,
                   EXISTS (SELECT FROM {schema}.job_deps AS d WHERE d.depends_on = b.id),
                   (SELECT count(*) FROM {schema}.job_deps AS d
                    LEFT JOIN {schema}.jobs_done AS a ON a.id = d.depends_on AND a.status = 'succeeded'
                    WHERE d.job_id = b.id AND a.id IS NULL),
                   b.partition_key
            FROM back AS b
            RETURNING j.id
        )
        SELECT array_agg(i.id) INTO restored FROM inserted AS i;
        EXIT WHEN restored IS NULL;
        all_restored := all_restored || restored;
        ids := restored;
    END LOOP;
    -- Groups last, locked in id order (as jobs_finished() does), each written once.
    PERFORM FROM {schema}.job_groups AS s
    WHERE s.id IN (SELECT j.group_id FROM {schema}.jobs AS j
                   WHERE j.id = ANY (retried || all_restored) AND j.group_id IS NOT NULL)
    ORDER BY s.id
    FOR UPDATE;
    UPDATE {schema}.job_groups AS s
    SET failed = greatest(0, s.failed - c.failed), cancelled = greatest(0, s.cancelled - c.cancelled),
        done_at = NULL
    FROM (
        SELECT j.group_id, count(*) FILTER (WHERE j.id = ANY (retried))::int AS failed,
               count(*) FILTER (WHERE j.id = ANY (all_restored))::int AS cancelled
        FROM {schema}.jobs AS j
        WHERE j.id = ANY (retried || all_restored) AND j.group_id IS NOT NULL
        GROUP BY j.group_id
    ) AS c
    WHERE s.id = c.group_id;
    RETURN cardinality(all_restored);
END;
$$;
