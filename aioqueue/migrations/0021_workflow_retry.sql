-- Workflows (migrations 0014, 0015): retrying a dead job resumes its whole workflow, groups
-- included; one lock order for every workflow statement; less work per finished batch.
--
-- Groups: retrying a dead member (or restoring a member its death cancelled) takes it out of
-- its group's failed (cancelled) count and reopens the group if it had settled (done_at back
-- to NULL). Once every member finished again the group settles again and enqueues the callbacks
-- that apply and that it has not enqueued yet: each kind at most once, ever. So a group that
-- settled with a failure (on_failure and on_complete enqueued) enqueues on_success when the
-- retried members succeed; a group never enqueues a callback twice.
--
-- Dependants: the archive now keeps a cancelled dependant's max_attempts and partition key,
-- so the retry restores them as they were enqueued (rows archived before this migration get
-- the former fallback: max_attempts of 5 or its attempts and one more, no key).
--
-- Locks: every workflow statement now takes job rows before group rows, groups in id order,
-- as jobs_finished() does: resume_workflows() (a retry) locks its groups once, after the job
-- rows; add_dependencies() (an enqueue) locks the dependencies' rows before its group's row.
-- So an enqueue, a retry and the statements that finish members never wait in a circle.
--
-- Workers of the previous release call these functions by the same signatures and get the new
-- bodies; their own archive writes name their columns, and leave the new ones NULL.

ALTER TABLE {schema}.jobs_done
    ADD COLUMN max_attempts int,
    ADD COLUMN partition_key text COLLATE "C";

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

-- resume_workflows(ids): the jobs ids were dead and are pending again. Restores, down the
-- graph, the dependants their deaths cancelled; then counts the retried and the restored
-- members out of their groups' failed and cancelled, reopening the groups that had settled.
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

-- add_dependencies(job_ids, deps, names, may_fail, gid): as in migration 0014, with the rows
-- locked in the order the statements that finish jobs lock them: the dependencies' rows (in id
-- order) before the group's row. (Before, the group's row came first: an enqueue joining group
-- g and waiting for a member d held g and waited for d while d's finish held d and waited for
-- g, a deadlock.) A group that does not keep results no longer looks at the new rows again.
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

-- jobs_finished(ids, outcomes, groups, chained): as in migration 0014, with less work for the
-- common batch, members of a group that nothing waits for: the dependants' lookup runs only
-- when some finished row has dependants, and a group's row is updated once, its counters
-- returned by that update, so settle_group() is called only for a group that is complete.
CREATE OR REPLACE FUNCTION {schema}.jobs_finished(ids bigint[], outcomes text[], groups bigint[], chained boolean[])
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    all_outcomes text[] := outcomes;
    all_groups bigint[] := groups;
    hit_ids bigint[];
    hit_n int[];
    hit_culprit bigint[];
    grp bigint;
    s_n int;
    f_n int;
    c_n int;
    complete boolean;
    n int := 0;
BEGIN
    WHILE true = ANY (chained) LOOP
        SELECT array_agg(h.job_id ORDER BY h.job_id), array_agg(h.n ORDER BY h.job_id),
               array_agg(h.culprit ORDER BY h.job_id)
        INTO hit_ids, hit_n, hit_culprit
        FROM (
            SELECT d.job_id, count(*)::int AS n,
                   min(u.id) FILTER (WHERE u.outcome <> 'succeeded' AND NOT d.may_fail) AS culprit
            FROM unnest(ids, outcomes, chained) AS u(id, outcome, chained)
            JOIN {schema}.job_deps AS d ON d.depends_on = u.id
            WHERE u.chained
            GROUP BY d.job_id
        ) AS h;
        EXIT WHEN hit_ids IS NULL;
        PERFORM FROM {schema}.jobs AS j WHERE j.id = ANY (hit_ids) ORDER BY j.id FOR UPDATE;
        WITH h AS (
            SELECT * FROM unnest(hit_ids, hit_n, hit_culprit) AS h(id, n, culprit)
        ),
        woken AS (
            UPDATE {schema}.jobs AS j
            SET waiting_for = j.waiting_for - h.n,
                status = CASE WHEN j.waiting_for - h.n <= 0 THEN 'pending' ELSE 'waiting' END,
                run_at = CASE WHEN j.waiting_for - h.n <= 0 THEN greatest(j.run_at, {schema}.now())
                              ELSE j.run_at END
            FROM h
            WHERE j.id = h.id AND j.status = 'waiting' AND h.culprit IS NULL
            RETURNING j.queue, j.status
        ),
        notified AS (
            SELECT pg_notify('{schema}_jobs', q.queue)
            FROM (SELECT DISTINCT w.queue FROM woken AS w WHERE w.status = 'pending') AS q
        )
        SELECT count(*) INTO n FROM notified;
        SELECT coalesce(array_agg(g.id), '{}'), coalesce(array_agg('cancelled'::text), '{}'),
               coalesce(array_agg(g.group_id), '{}'), coalesce(array_agg(g.has_dependants), '{}')
        INTO ids, outcomes, groups, chained
        FROM {schema}.cancel_waiting(hit_ids, hit_culprit) AS g;
        all_outcomes := all_outcomes || outcomes;
        all_groups := all_groups || groups;
    END LOOP;

    n := 0;
    FOR grp, s_n, f_n, c_n IN
        SELECT u.member_of, count(*) FILTER (WHERE u.outcome = 'succeeded'),
               count(*) FILTER (WHERE u.outcome = 'dead'), count(*) FILTER (WHERE u.outcome = 'cancelled')
        FROM unnest(all_groups, all_outcomes) AS u(member_of, outcome)
        WHERE u.member_of IS NOT NULL
        GROUP BY u.member_of
        ORDER BY u.member_of
    LOOP
        UPDATE {schema}.job_groups AS s
        SET succeeded = s.succeeded + s_n, failed = s.failed + f_n, cancelled = s.cancelled + c_n
        WHERE s.id = grp
        RETURNING s.closed AND s.done_at IS NULL AND s.succeeded + s.failed + s.cancelled >= s.total
        INTO complete;
        IF complete THEN
            n := n + {schema}.settle_group(grp);
        END IF;
    END LOOP;
    RETURN n;
END;
$$;
