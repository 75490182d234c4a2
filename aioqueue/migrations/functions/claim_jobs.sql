-- The claim's locking core as a function, so that each connection plans it once.
--
-- As a prepared statement the claim was planned again at every execution (a quarter to a third
-- of an idle worker's wake-up): the server prices its generic plan above the custom ones,
-- because it cannot see the batch sizes, and so never switches. Inside this function the plan
-- is made once per connection and kept (plan_cache_mode = force_generic_plan, for this
-- function only). The plan is the same shape either way: the batch sizes never change which
-- index is read, only the estimate (tests/integration/test_query_plan.py guards it in every
-- table state). JIT stays off inside it: that estimate, high with a million pending jobs,
-- would otherwise make the server compile the claim at every execution (milliseconds, for a
-- statement that runs in a fraction of one). And no sequential scan: a plan kept from a claim
-- made while the table was nearly empty (an idle worker, whatever the statistics) found the
-- claimed rows for the UPDATE by reading the whole table and testing each row against every
-- id picked, and kept doing so through the next burst until an ANALYZE: a claim of 1,000 jobs
-- of a burst of 200,000 took 750 ms instead of 7.5 ms. Every read here has an index (or, for
-- the UPDATE, the rows' addresses).
--
-- claim_jobs(queues, wanted, worker, lease_seconds, total, commit_mode): lock up to wanted[i]
-- ready jobs of queues[i] (at most `total` in all) in claim order, on the queue's clock,
-- skipping rows other workers hold and queues that are paused, and mark them running under
-- `worker`'s lease of `lease_seconds`, one attempt more. commit_mode: see the commit_mode
-- fragment of queries.sql ('off': this transaction's commit does not wait for its WAL flush;
-- NULL: the session's). The function's one query is what test_query_plan.py reads and
-- explains: keep it the only RETURN QUERY, its values the positional parameters $1 to $5.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(
    queues        text[],
    wanted        int[],
    worker        text,
    lease_seconds float8,
    total         int,
    commit_mode   text
) RETURNS TABLE (
    id           bigint,
    queue        text,
    task         text,
    args         text,
    priority     int,
    attempts     int,
    max_attempts int,
    run_at       timestamptz,
    created_at   timestamptz
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    -- Local to the caller's transaction (a SET clause above would end with the function).
    PERFORM set_config('synchronous_commit', coalesce($6, current_setting('synchronous_commit')), true);
    RETURN QUERY
    WITH wanted AS (
        SELECT w.queue, w.n
        FROM unnest($1::text[], $2::int[]) AS w(queue, n)
        WHERE NOT EXISTS (SELECT FROM {schema}.queues AS s WHERE s.name = w.queue AND s.paused)
    ),
    -- MATERIALIZED stops the planner from re-running the locking subquery, which could lock
    -- more rows than the limit.
    picked AS MATERIALIZED (
        SELECT c.ctid
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT j.ctid, j.id, j.priority, j.run_at
            FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.queue = wanted.queue AND j.run_at <= {schema}.now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT wanted.n
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT $5
    )
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        locked_at = {schema}.now(),
        locked_by = $3,
        lease_expires_at = {schema}.now() + make_interval(secs => $4)
    -- By the locked rows' addresses (ctid): a TID scan, no descent of the primary key per row
    -- (4% of the server's instructions for a claimed and completed job, in claims of 1,000),
    -- never a hash join over a scan of the whole table. A row locked here cannot move before
    -- this UPDATE; one that another transaction changed after this statement's snapshot was
    -- locked in its new version, which this snapshot does not see: that row is left pending
    -- (its lock ends with the transaction) and claimed next time, never claimed twice.
    WHERE j.ctid = ANY (ARRAY(SELECT picked.ctid FROM picked))
    RETURNING j.id, j.queue, j.task, j.args::text, j.priority, j.attempts, j.max_attempts,
              j.run_at, j.created_at;
END
$$;
