-- release_stranded(max_jobs): settle up to max_jobs waiting jobs whose dependencies all
-- finished without calling jobs_finished() (finished by a worker of the previous release),
-- oldest first: ready when each succeeded or may fail, else cancelled as jobs_finished() does
-- (and their own dependants and groups with them). Returns how many it settled.
CREATE OR REPLACE FUNCTION {schema}.release_stranded(max_jobs int) RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    n int;
    sent bigint;
    s_ids bigint[];
    s_culprits bigint[];
    ids bigint[];
    groups bigint[];
    chained boolean[];
BEGIN
    SELECT array_agg(w.id ORDER BY w.id), array_agg(
               (SELECT min(d.depends_on) FROM {schema}.job_deps AS d
                LEFT JOIN {schema}.jobs_done AS a ON a.id = d.depends_on
                WHERE d.job_id = w.id AND NOT d.may_fail AND a.status IS DISTINCT FROM 'succeeded')
               ORDER BY w.id)
    INTO s_ids, s_culprits
    FROM (
        SELECT j.id FROM {schema}.jobs AS j
        WHERE j.status = 'waiting' AND j.waiting_for IS NOT NULL
          AND NOT EXISTS (SELECT FROM {schema}.job_deps AS d JOIN {schema}.jobs AS l ON l.id = d.depends_on
                          WHERE d.job_id = j.id AND l.status <> 'dead')
        ORDER BY j.id
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) AS w;
    IF s_ids IS NULL THEN
        RETURN 0;
    END IF;
    n := cardinality(s_ids);
    WITH woken AS (
        UPDATE {schema}.jobs AS j SET status = 'pending', waiting_for = 0,
                                      run_at = greatest(j.run_at, {schema}.now())
        FROM unnest(s_ids, s_culprits) AS s(id, culprit) WHERE j.id = s.id AND s.culprit IS NULL
        RETURNING j.queue
    )
    SELECT count(pg_notify('{schema}_jobs', q.queue)) INTO sent FROM (SELECT DISTINCT w.queue FROM woken AS w) AS q;
    SELECT array_agg(g.id), array_agg(g.group_id), array_agg(g.has_dependants) INTO ids, groups, chained
    FROM {schema}.cancel_waiting(s_ids, s_culprits) AS g;
    IF ids IS NOT NULL THEN
        PERFORM {schema}.jobs_finished(ids, array_fill('cancelled'::text, ARRAY[cardinality(ids)]), groups, chained);
    END IF;
    RETURN n;
END;
$$;
