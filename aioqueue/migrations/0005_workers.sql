-- The registry of live workers, and the indexes the dashboard's job listings read.

-- One row per running worker, written by its registry (aioqueue/registry.py): inserted at start,
-- its last_seen refreshed once per interval, deleted on a clean stop. A crashed worker's row is
-- ignored by readers once it is stale and deleted by the next registry that refreshes.
CREATE TABLE {schema}.workers (
    name        text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         int         NOT NULL,
    queues      text[]      NOT NULL,
    concurrency int         NOT NULL,
    version     text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);

-- Job listings, newest first, by keyset on id. Only dead rows get listing indexes of their own
-- (by id here, by task here, by queue: jobs_dead_idx of 0001): dead rows are few and each is
-- written once, when its job dies. Pending rows enter none: an enqueue (and a retry back to
-- pending) writes only jobs_ready_idx, the primary key and, with a dedup key, jobs_dedup_key_idx,
-- so the dashboard costs the enqueue nothing. Pending listings walk the primary key newest first
-- and read a bounded number of rows per page; running jobs are few (at most the workers'
-- slots), and their listing reads jobs_lease_idx and sorts.
CREATE INDEX jobs_dead_list_idx ON {schema}.jobs (id) WHERE status = 'dead';
CREATE INDEX jobs_dead_task_idx ON {schema}.jobs (task, id) WHERE status = 'dead';

-- The archive's listings: by status, by queue and status, by task and status. jobs_done is
-- written only by the completion of archiving tasks (and by cancels), never by an enqueue.
CREATE INDEX jobs_done_list_status_idx ON {schema}.jobs_done (status, id);
CREATE INDEX jobs_done_list_queue_idx ON {schema}.jobs_done (queue, status, id);
CREATE INDEX jobs_done_list_task_idx ON {schema}.jobs_done (task, status, id);
