-- Partition keys: a key per job (a tenant, a user, an account) and per-queue settings that make
-- the queue's claim take keys in turn and hold each key to a concurrency limit.
--
-- A queue without these settings claims exactly as before, through claim_jobs(): the new
-- indexes hold only jobs that have a key, so jobs without one write no entry in them.

-- "C" collation: keys are compared byte by byte, the same on every server, and cheaply.
ALTER TABLE {schema}.jobs ADD COLUMN partition_key text COLLATE "C";

-- The keyed claim walks this index: per queue and priority, the next key after the last one
-- served (one probe per key, however many jobs a key has), then that key's oldest ready job.
CREATE INDEX jobs_partition_ready_idx ON {schema}.jobs (queue, priority DESC, partition_key, run_at, id)
    WHERE status = 'pending' AND partition_key IS NOT NULL;

-- How many jobs of a key run now: what a per-key concurrency limit is checked against.
CREATE INDEX jobs_partition_running_idx ON {schema}.jobs (queue, partition_key)
    WHERE status = 'running' AND partition_key IS NOT NULL;

ALTER TABLE {schema}.queues
    -- Claim keys in turn (round robin) rather than first in, first out.
    ADD COLUMN fair boolean NOT NULL DEFAULT false,
    -- At most this many running jobs per key (NULL: no per-key limit); implies fair.
    ADD COLUMN key_concurrency_limit int CHECK (key_concurrency_limit >= 0),
    -- The key served last: the next claim starts after it.
    ADD COLUMN key_cursor text COLLATE "C";

-- New: claim_keyed(), defined in functions/claim_keyed.sql.

-- New: partition_key_problem(), defined in functions/partition_key_problem.sql.

-- add_job() and add_jobs() as in 0012, with a partition key (add_job's new last parameter,
-- add_jobs' 'partition_key'). A new parameter makes a new function: functions/add_job.sql
-- drops the signature before this one, just before it creates this one.
-- Defined in functions/add_job.sql and functions/add_jobs.sql.
