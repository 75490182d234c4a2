-- The queue's clock: one function, `{schema}.now()`, that every time aioqueue acts on is read
-- from (when a job is due, a lease's end, a retry's backoff, a periodic slot, a rate window,
-- retention). It is the transaction's now(), as before: a SQL function of one SELECT, STABLE
-- like now() itself, so the planner puts its body in place of every call (inlines it) and the
-- statements run exactly as they did. aioqueue.testing moves a test's clock by redefining this
-- function in the test's own schema (CREATE OR REPLACE, which every session's cached plans
-- notice); production never does. pg_catalog is named inside: a search_path that puts this
-- schema first must not make the function call itself.
--
-- The statements of aioqueue/queries.sql call it from this version on; the functions of earlier
-- migrations that read now() are redefined with the same bodies, the clock replaced, and
-- the defaults of the columns that hold due and finish times read it too. The worker registry
-- (`workers`, `tasks.seen_at`) stays on the wall clock: it says whether processes are alive,
-- which real seconds decide.

CREATE FUNCTION {schema}.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$SELECT pg_catalog.now()$$;

COMMENT ON FUNCTION {schema}.now() IS
    'The time aioqueue schedules by: the transaction''s now(). Tests move it (aioqueue.testing).';

ALTER TABLE {schema}.jobs
    ALTER COLUMN run_at SET DEFAULT {schema}.now(),
    ALTER COLUMN created_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.jobs_done ALTER COLUMN finished_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.queues ALTER COLUMN updated_at SET DEFAULT {schema}.now();
ALTER TABLE {schema}.periodic ALTER COLUMN updated_at SET DEFAULT {schema}.now();

-- claim_jobs() as in 0007, on the queue's clock.
-- Defined in functions/claim_jobs.sql.

-- add_job() and add_jobs() as in 0011, on the queue's clock.
-- Defined in functions/add_job.sql and functions/add_jobs.sql.
