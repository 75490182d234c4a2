-- add_dependencies(job_ids, deps, names, may_fail, gid): the jobs job_ids, just inserted
-- (pending) in this transaction, wait for the jobs deps (with names[i] and may_fail[i]) and/or
-- are counted in group gid's total (the enqueue wrote their group_id). A dependency still live
-- is marked (has_dependants, archive: its result is kept for its dependants) under its row
-- lock; one already finished must have succeeded (or may fail) and be in the archive. Anything
-- else raises, naming the job, and the caller's transaction writes nothing.
--
-- Rows are locked in the order the statements that finish jobs lock them: the dependencies'
-- rows (in id order) before the group's row, so an enqueue joining group g and waiting for a
-- member d never holds g while d's finish holds d and waits for g. A group that does not keep
-- results does not look at the new rows again.
CREATE OR REPLACE FUNCTION {schema}.add_dependencies(job_ids bigint[], deps bigint[], names text[],
                                                     may_fail boolean[], gid bigint)
RETURNS int
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    open_n int := 0;
    live_ids bigint[];
    bad record;
    keep boolean;
BEGIN
    IF cardinality(deps) > 0 THEN
        WITH marked AS (
            UPDATE {schema}.jobs AS j SET has_dependants = true, archive = true
            FROM (SELECT j2.id FROM {schema}.jobs AS j2 WHERE j2.id = ANY (deps) ORDER BY j2.id FOR UPDATE) AS l
            WHERE j.id = l.id
            RETURNING j.id, j.status
        )
        SELECT array_agg(m.id), count(*) FILTER (WHERE m.status <> 'dead')
        INTO live_ids, open_n
        FROM marked AS m;
        SELECT d.dep, j.status INTO bad
        FROM unnest(deps, may_fail) AS d(dep, may_fail)
        JOIN {schema}.jobs AS j ON j.id = d.dep
        WHERE j.status = 'dead' AND NOT d.may_fail
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'aioqueue: dependency % is dead (retry it first, or let it fail)', bad.dep
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- A new statement, so a new snapshot: it sees a dependency archived while its row was locked.
        SELECT d.dep, a.status INTO bad
        FROM unnest(deps, may_fail) AS d(dep, may_fail)
        LEFT JOIN {schema}.jobs_done AS a ON a.id = d.dep
        WHERE NOT (d.dep = ANY (coalesce(live_ids, '{}')))
          AND (a.id IS NULL OR (a.status <> 'succeeded' AND NOT d.may_fail))
        LIMIT 1;
        IF FOUND THEN
            IF bad.status IS NULL THEN
                RAISE EXCEPTION 'aioqueue: dependency % does not exist or is gone (finished without archive, or deleted)', bad.dep
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            RAISE EXCEPTION 'aioqueue: dependency % was %', bad.dep, bad.status
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO {schema}.job_deps (depends_on, job_id, name, position, may_fail)
        SELECT d.dep, t.id, d.name, d.pos, d.may_fail
        FROM unnest(job_ids) AS t(id)
        CROSS JOIN unnest(deps, names, may_fail) WITH ORDINALITY AS d(dep, name, may_fail, pos);
        IF open_n > 0 THEN
            UPDATE {schema}.jobs AS j SET status = 'waiting', waiting_for = open_n WHERE j.id = ANY (job_ids);
        END IF;
    END IF;
    IF gid IS NOT NULL THEN
        UPDATE {schema}.job_groups AS s SET total = s.total + cardinality(job_ids)
        WHERE s.id = gid AND NOT s.closed
        RETURNING s.results INTO keep;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'aioqueue: group % does not exist or is closed', gid
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- The enqueue wrote group_id already (no second version of every row); a group that
        -- keeps results archives its members.
        IF keep THEN
            UPDATE {schema}.jobs AS j SET archive = true WHERE j.id = ANY (job_ids) AND NOT j.archive;
        END IF;
    END IF;
    RETURN open_n;
END;
$$;
