-- The queue a job of `task` goes to when the caller names none, or NULL when no worker has
-- recorded one: the one definition of the lookup, for add_job(), add_jobs() and the enqueue
-- statements of aioqueue/queries.sql.
CREATE OR REPLACE FUNCTION {schema}.task_queue(task text) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT t.queue FROM {schema}.tasks AS t WHERE t.name = task
$$;
