-- Where a job enqueued by name without a queue goes: to the queue of the workers that serve its
-- task, as they recorded it in `tasks` when they started. Before, such a job went to 'default',
-- where a worker that registered the task on another queue never looks: it stayed pending and
-- nothing said why. add_job() and add_jobs() now look the queue up when none is given (the
-- Python statements do the same), and refuse the job, naming the task, when no worker has
-- recorded one. A job given a queue is written exactly as before.

-- One row per task a worker has served: written by each worker as it starts (aioqueue/registry.py,
-- with its own row in `workers`), the last one to start winning when two disagree. Never
-- deleted: a task no worker serves any more keeps the queue its jobs went to.
CREATE TABLE {schema}.tasks (
    name    text        PRIMARY KEY,
    queue   text        NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {schema}.tasks IS
    'The queue of each task, as the workers that serve it recorded it when they started.';

-- New: task_queue(), defined in functions/task_queue.sql.

-- job_problem() as in 0009, except that a NULL queue (none given, none recorded) is refused
-- with what to do about it.
-- Defined in functions/job_problem.sql.

-- add_job() as in 0009, with no default queue: none given (or NULL) means the task's recorded one.
-- A parameter's default can change in place, so callers and grants are untouched.
-- Defined in functions/add_job.sql.

-- add_jobs() as in 0010, except that a job without a "queue" goes to its task's recorded one
-- (looked up once per such job, in the checks and in the insert; a job with a queue pays nothing).
-- Defined in functions/add_jobs.sql.
