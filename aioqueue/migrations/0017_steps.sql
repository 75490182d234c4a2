-- Durable steps, sleeps and event waits inside a handler (aioqueue.step, aioqueue.sleep,
-- aioqueue.wait_for_event; docs/howto/durable-steps.md).
--
-- One row per step a job's handler reached, keyed by the job, the step's name and its
-- occurrence (the n-th call of that name in one run of the handler, from 1):
--   kind 'step':  state 'done', result = what the step returned (JSON).
--   kind 'sleep': state 'waiting' until the handler passes it after wake_at, then 'done'.
--   kind 'event': state 'waiting' (wake_at = its timeout), 'received' when an event reached it
--                 (result = the event's payload), 'done' once the handler took it, or
--                 'timed_out'.
-- No foreign key to jobs: the statements that finish plain jobs stay as they are (no trigger,
-- no lookup here per finished job). Rows whose job is in neither jobs nor jobs_done are pruned
-- with the archive (prune_steps).
--
-- A sleeping or waiting job is an ordinary pending job whose run_at is when it wakes (the
-- sleep's end, the wait's timeout), as a snoozed one: the due-time wake-ups already wake it on
-- time, and a previous release's workers, which know nothing of this table, run it as they run
-- any job. No column of jobs and no job status is added.

CREATE TABLE {schema}.job_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    occurrence  int         NOT NULL CHECK (occurrence >= 1),
    kind        text        NOT NULL CHECK (kind IN ('step', 'sleep', 'event')),
    state       text        NOT NULL CHECK (state IN ('done', 'waiting', 'received', 'timed_out')),
    result      jsonb,
    wake_at     timestamptz,
    event       text,
    event_key   text,
    created_at  timestamptz NOT NULL DEFAULT {schema}.now(),
    updated_at  timestamptz NOT NULL DEFAULT {schema}.now(),
    PRIMARY KEY (job_id, name, occurrence)
);

-- send_event() reads only this: the waits still open for an event name (and key).
CREATE INDEX job_steps_waiting_idx ON {schema}.job_steps (event, event_key)
    WHERE state = 'waiting' AND kind = 'event';

-- New: suspend_jobs(), defined in functions/suspend_jobs.sql.

-- New: send_event(), defined in functions/send_event.sql.
