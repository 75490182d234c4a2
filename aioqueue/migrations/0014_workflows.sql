-- Workflows: jobs that wait for other jobs, and groups of jobs with callbacks.
--
-- A job that waits is in status 'waiting', which no ready index holds, so the claim never reads
-- it; `waiting_for` counts its dependencies not yet finished. The statements that finish jobs
-- (complete, fail, finish_cancelled, cancel, reap_expired) call jobs_finished() for the rows
-- they finish that have dependants or a group, in their own transaction: it counts the
-- dependants down, makes ready those at zero (and NOTIFYs their queues), cancels those whose
-- dependency did not succeed (unless that dependency may fail), and settles groups. Plain jobs
-- have neither, and their batches call nothing.
--
-- jobs_finished() is a VOLATILE plpgsql function: each of its statements takes a new snapshot,
-- so it sees a dependant that committed while the finishing statement waited on the dependency's
-- row lock (enqueueing a dependant locks its dependencies' rows to mark them, see
-- add_dependencies()); the finishing statement itself, whose snapshot is older, could not.
--
-- Workers of the previous release do not call it: a dependency they finish leaves its dependants
-- waiting until release_stranded() (run by the new workers' maintenance) counts again.

ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_status_check
    CHECK (status IN ('pending', 'running', 'dead', 'waiting')) NOT VALID;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_status_check;

ALTER TABLE {schema}.jobs
    ADD COLUMN waiting_for int,
    ADD COLUMN has_dependants boolean NOT NULL DEFAULT false,
    ADD COLUMN group_id bigint;

ALTER TABLE {schema}.jobs_done
    ADD COLUMN group_id bigint,
    ADD COLUMN reason text;

-- A group's members, live and archived (its counts and its callbacks' upstream results).
CREATE INDEX jobs_group_idx ON {schema}.jobs (group_id, status) WHERE group_id IS NOT NULL;
CREATE INDEX jobs_done_group_idx ON {schema}.jobs_done (group_id, id) WHERE group_id IS NOT NULL;
-- Waiting jobs, for operators and the stranded-dependants sweep.
CREATE INDEX jobs_waiting_idx ON {schema}.jobs (id) WHERE status = 'waiting';

-- Edges of the graph: job `job_id` waits for `depends_on`. `name` and `position` are how its
-- handler reads that dependency's result; `may_fail`: it runs even if that dependency does not
-- succeed.
CREATE TABLE {schema}.job_deps (
    depends_on bigint  NOT NULL,
    job_id     bigint  NOT NULL,
    name       text,
    position   int     NOT NULL,
    may_fail   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (depends_on, job_id)
);
CREATE INDEX job_deps_job_idx ON {schema}.job_deps (job_id, position);

-- Groups: counters in one row, written by the statements that finish members (the row lock
-- makes concurrent finishers take turns). `results`: members are archived with their results
-- (for the callbacks to read), whatever their tasks say. `callbacks` maps a kind (on_success, on_failure,
-- on_complete) to the job to enqueue then: {task, args, queue, priority, max_attempts, archive}.
CREATE TABLE {schema}.job_groups (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text,
    total      int         NOT NULL DEFAULT 0,
    succeeded  int         NOT NULL DEFAULT 0,
    failed     int         NOT NULL DEFAULT 0,
    cancelled  int         NOT NULL DEFAULT 0,
    closed     boolean     NOT NULL DEFAULT false,
    results    boolean     NOT NULL DEFAULT false,
    callbacks  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT {schema}.now(),
    done_at    timestamptz
);

-- The callbacks a group enqueued: one per kind, ever (the second guard of exactly once, after
-- the row lock and done_at).
CREATE TABLE {schema}.group_callbacks (
    group_id bigint NOT NULL,
    kind     text   NOT NULL,
    job_id   bigint NOT NULL,
    PRIMARY KEY (group_id, kind)
);
CREATE INDEX group_callbacks_job_idx ON {schema}.group_callbacks (job_id);

-- settle_group(gid): if group gid is closed and every member finished, mark it done and enqueue
-- its callbacks (on_success when every member succeeded, on_failure otherwise, on_complete
-- always). Returns how many it enqueued. Only the first call that finds it complete does.
CREATE FUNCTION {schema}.settle_group(gid bigint) RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    g {schema}.job_groups;
    kind text;
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
    FOR kind, spec IN SELECT e.key, e.value FROM jsonb_each(g.callbacks) AS e ORDER BY e.key LOOP
        CONTINUE WHEN kind = 'on_success' AND g.failed + g.cancelled > 0;
        CONTINUE WHEN kind = 'on_failure' AND g.failed + g.cancelled = 0;
        into_queue := coalesce(spec ->> 'queue', {schema}.task_queue(spec ->> 'task'), 'default');
        INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, archive)
        VALUES (into_queue, spec ->> 'task', coalesce(spec -> 'args', '{}'::jsonb),
                coalesce((spec ->> 'priority')::int, 0), coalesce((spec ->> 'max_attempts')::int, 5),
                coalesce((spec ->> 'archive')::boolean, true))
        RETURNING id INTO new_id;
        INSERT INTO {schema}.group_callbacks (group_id, kind, job_id) VALUES (gid, kind, new_id);
        PERFORM pg_notify('{schema}_jobs', into_queue);
        n := n + 1;
    END LOOP;
    RETURN n;
END;
$$;

-- cancel_waiting(ids, culprits): cancel the waiting jobs ids[i] whose culprits[i] is not NULL
-- (the dependency that did not succeed): archived as cancelled with that reason, result waiters
-- woken. Returns those it cancelled, for jobs_finished() to follow down the graph.
CREATE FUNCTION {schema}.cancel_waiting(ids bigint[], culprits bigint[])
RETURNS TABLE (id bigint, group_id bigint, has_dependants boolean)
LANGUAGE sql
AS $$
    WITH gone AS (
        DELETE FROM {schema}.jobs AS j USING unnest(ids, culprits) AS c(id, culprit)
        WHERE j.id = c.id AND j.status = 'waiting' AND c.culprit IS NOT NULL
        RETURNING j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.dedup_key, j.created_at,
                  j.group_id, j.has_dependants, c.culprit
    ),
    archived AS (
        INSERT INTO {schema}.jobs_done
            (id, queue, task, args, status, priority, attempts, dedup_key, created_at, group_id, reason)
        SELECT g.id, g.queue, g.task, g.args, 'cancelled', g.priority, g.attempts, g.dedup_key,
               g.created_at, g.group_id, 'dependency ' || g.culprit || ' did not succeed'
        FROM gone AS g
    ),
    notified AS (
        SELECT pg_notify('{schema}_done', '') WHERE EXISTS (SELECT FROM gone)
    )
    SELECT g.id, g.group_id, g.has_dependants FROM gone AS g, (SELECT count(*) FROM notified) AS x
$$;

-- jobs_finished(ids, outcomes, groups, chained): jobs ids[i] finished with outcomes[i]
-- ('succeeded', 'dead' or 'cancelled'), in group groups[i] (or NULL), with dependants when
-- chained[i]. Counts their dependants down and wakes those at zero; cancels (recorded with the
-- reason) the dependants of a dependency that did not succeed, unless it may fail, and so on
-- down the graph; then counts the groups' outcomes and settles them. Rows are locked in id order
-- (dependants, then groups), so two finishers never wait on each other in a circle.
CREATE FUNCTION {schema}.jobs_finished(ids bigint[], outcomes text[], groups bigint[], chained boolean[])
RETURNS int
LANGUAGE plpgsql
AS $$
DECLARE
    all_outcomes text[] := '{}';
    all_groups bigint[] := '{}';
    hit_ids bigint[];
    hit_n int[];
    hit_culprit bigint[];
    grp bigint;
    n int := 0;
BEGIN
    LOOP
        all_outcomes := all_outcomes || outcomes;
        all_groups := all_groups || groups;
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
        EXIT WHEN cardinality(ids) = 0;
    END LOOP;

    n := 0;
    FOR grp IN SELECT DISTINCT g FROM unnest(all_groups) AS g WHERE g IS NOT NULL ORDER BY 1 LOOP
        UPDATE {schema}.job_groups AS s
        SET succeeded = s.succeeded + c.succeeded, failed = s.failed + c.failed,
            cancelled = s.cancelled + c.cancelled
        FROM (
            SELECT count(*) FILTER (WHERE u.outcome = 'succeeded') AS succeeded,
                   count(*) FILTER (WHERE u.outcome = 'dead') AS failed,
                   count(*) FILTER (WHERE u.outcome = 'cancelled') AS cancelled
            FROM unnest(all_groups, all_outcomes) AS u(member_of, outcome)
            WHERE u.member_of = grp
        ) AS c
        WHERE s.id = grp;
        n := n + {schema}.settle_group(grp);
    END LOOP;
    RETURN n;
END;
$$;

-- add_dependencies(job_ids, deps, names, may_fail, gid): the jobs job_ids, just inserted
-- (pending) in this transaction, wait for the jobs deps (with names[i] and may_fail[i]) and/or
-- are counted in group gid's total (the enqueue wrote their group_id). A dependency still live
-- is marked (has_dependants, archive: its result is kept for its dependants) under its row
-- lock; one already finished must have succeeded (or may fail) and be in the archive. Anything else raises, naming the job, and the caller's
-- transaction writes nothing.
CREATE FUNCTION {schema}.add_dependencies(job_ids bigint[], deps bigint[], names text[], may_fail boolean[],
                                          gid bigint)
RETURNS int
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    open_n int := 0;
    live_ids bigint[];
    bad record;
BEGIN
    IF gid IS NOT NULL THEN
        UPDATE {schema}.job_groups AS s SET total = s.total + cardinality(job_ids)
        WHERE s.id = gid AND NOT s.closed;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'aioqueue: group % does not exist or is closed', gid
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- The enqueue wrote group_id already (no second version of every row); a group that
        -- keeps results archives its members.
        UPDATE {schema}.jobs AS j SET archive = true
        FROM {schema}.job_groups AS s
        WHERE j.id = ANY (job_ids) AND s.id = gid AND s.results AND NOT j.archive;
    END IF;
    IF cardinality(deps) = 0 THEN
        RETURN 0;
    END IF;
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
    RETURN open_n;
END;
$$;

-- release_stranded(max_jobs): settle up to max_jobs waiting jobs whose dependencies all
-- finished without calling jobs_finished() (finished by a worker of the previous release),
-- oldest first: ready when each succeeded or may fail, else cancelled as jobs_finished() does
-- (and their own dependants and groups with them). Returns how many it settled.
CREATE FUNCTION {schema}.release_stranded(max_jobs int) RETURNS int
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
