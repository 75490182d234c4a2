-- cancel_waiting(ids, culprits): cancel the waiting jobs ids[i] whose culprits[i] is not NULL
-- (the dependency that did not succeed): archived as cancelled with that reason, keeping
-- their max_attempts and partition key for a retry to restore, result waiters woken. Returns
-- those it cancelled, for jobs_finished() to follow down the graph.
CREATE OR REPLACE FUNCTION {schema}.cancel_waiting(ids bigint[], culprits bigint[])
RETURNS TABLE (id bigint, group_id bigint, has_dependants boolean)
LANGUAGE sql
AS $$
    WITH gone AS (
        DELETE FROM {schema}.jobs AS j USING unnest(ids, culprits) AS c(id, culprit)
        WHERE j.id = c.id AND j.status = 'waiting' AND c.culprit IS NOT NULL
        RETURNING j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.dedup_key, j.created_at,
                  j.group_id, j.has_dependants, c.culprit, j.max_attempts, j.partition_key
    ),
    archived AS (
        INSERT INTO {schema}.jobs_done
            (id, queue, task, args, status, priority, attempts, dedup_key, created_at, group_id, reason,
             max_attempts, partition_key)
        SELECT g.id, g.queue, g.task, g.args, 'cancelled', g.priority, g.attempts, g.dedup_key,
               g.created_at, g.group_id, 'dependency ' || g.culprit || ' did not succeed',
               g.max_attempts, g.partition_key
        FROM gone AS g
    ),
    notified AS (
        SELECT pg_notify('{schema}_done', '') WHERE EXISTS (SELECT FROM gone)
    )
    SELECT g.id, g.group_id, g.has_dependants FROM gone AS g, (SELECT count(*) FROM notified) AS x
$$;
