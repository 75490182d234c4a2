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

-- Job listings, newest first, by keyset on id: by status, by queue and status, by task and
-- status. Running rows stay out: a claim moves a row to running and these indexes would cost it
-- three more index entries; running jobs are few (at most the workers' slots), so their listing
-- reads jobs_lease_idx and sorts.
CREATE INDEX jobs_list_status_idx ON {schema}.jobs (status, id) WHERE status <> 'running';
CREATE INDEX jobs_list_queue_idx ON {schema}.jobs (queue, status, id) WHERE status <> 'running';
CREATE INDEX jobs_list_task_idx ON {schema}.jobs (task, status, id) WHERE status <> 'running';

-- The same listings over the archive.
CREATE INDEX jobs_done_list_status_idx ON {schema}.jobs_done (status, id);
CREATE INDEX jobs_done_list_queue_idx ON {schema}.jobs_done (queue, status, id);
CREATE INDEX jobs_done_list_task_idx ON {schema}.jobs_done (task, status, id);
