-- jobs_finished(ids, outcomes, groups, chained): jobs ids[i] finished with outcomes[i]
-- ('succeeded', 'dead' or 'cancelled'), in group groups[i] (or NULL), with dependants when
-- chained[i]. Counts their dependants down and wakes those at zero; cancels (recorded with the
-- reason) the dependants of a dependency that did not succeed, unless it may fail, and so on
-- down the graph; then counts the groups' outcomes and settles them. Rows are locked in id order
-- (dependants, then groups), so two finishers never wait on each other in a circle.
--
-- The common batch, members of a group that nothing waits for, costs little: the dependants'
-- lookup runs only when some finished row has dependants, and a group's row is updated once,
-- its counters returned by that update, so settle_group() is called only for a complete group.
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
