-- The queue's clock: one function, `{schema}.now()`, that every time aioqueue acts on is read
-- from (when a job is due, a lease's end, a retry's backoff, a periodic slot, a rate window,
-- retention). It is the transaction's now(): a SQL function of one SELECT, STABLE like now()
-- itself, so the planner puts its body in place of every call (inlines it) and the statements
-- run as they would with now(). aioqueue.testing moves a test's clock by redefining this
-- function in the test's own schema (CREATE OR REPLACE, which every session's cached plans
-- notice); production never does. pg_catalog is named inside: a search_path that puts this
-- schema first must not make the function call itself. The worker registry (`workers`,
-- `tasks.seen_at`) stays on the wall clock: it says whether processes are alive.
--
-- Migration 0012 creates it too, with this body: the columns' defaults it sets call it.
CREATE OR REPLACE FUNCTION {schema}.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$SELECT pg_catalog.now()$$;

COMMENT ON FUNCTION {schema}.now() IS
    'The time aioqueue schedules by: the transaction''s now(). Tests move it (aioqueue.testing).';
