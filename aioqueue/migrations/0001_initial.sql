-- The working table, its archive, and the indexes each query reads.
-- `{schema}` is replaced by the validated schema name; nothing else is interpolated.

CREATE TABLE {schema}.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    task             text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'dead')),
    priority         int         NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempts         int         NOT NULL DEFAULT 0,
    max_attempts     int         NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    dedup_key        text,
    lease_expires_at timestamptz,
    locked_at        timestamptz,
    locked_by        text,
    last_error       text,
    archive          boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- The claim reads only this: pending rows, in the order it takes them.
CREATE INDEX jobs_ready_idx ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';

-- The reaper reads only running rows, oldest lease first.
CREATE INDEX jobs_lease_idx ON {schema}.jobs (lease_expires_at)
    WHERE status = 'running';

-- Operators list dead jobs per queue.
CREATE INDEX jobs_dead_idx ON {schema}.jobs (queue, id)
    WHERE status = 'dead';

-- A dedup key is unique among jobs that are waiting or running; it frees when the job ends.
CREATE UNIQUE INDEX jobs_dedup_key_idx ON {schema}.jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running');

-- Small table, many updates and deletes: vacuum early and without throttling.
ALTER TABLE {schema}.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- Finished jobs, for tasks that keep them. Append-only; retention prunes it by age.
CREATE TABLE {schema}.jobs_done (
    id           bigint      PRIMARY KEY,
    queue        text        NOT NULL,
    task         text        NOT NULL,
    args         jsonb       NOT NULL,
    status       text        NOT NULL CHECK (status IN ('succeeded', 'cancelled')),
    priority     int         NOT NULL,
    attempts     int         NOT NULL,
    result       jsonb,
    dedup_key    text,
    created_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_done_finished_at_idx ON {schema}.jobs_done (finished_at);
