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

-- New: settle_group(), defined in functions/settle_group.sql.

-- New: cancel_waiting(), defined in functions/cancel_waiting.sql.

-- New: jobs_finished(), defined in functions/jobs_finished.sql.

-- New: add_dependencies(), defined in functions/add_dependencies.sql.

-- New: release_stranded(), defined in functions/release_stranded.sql.
