-- Workflow figures for the metrics and the worker registry.
--
-- The groups not done yet and the sleeps and event waits still open are few (the work in
-- flight), however many groups and steps the tables have kept: two partial indexes hold only
-- those, so that counting them reads as many entries as there are, never the tables.
CREATE INDEX job_groups_open_idx ON {schema}.job_groups (closed) WHERE done_at IS NULL;
CREATE INDEX job_steps_open_idx ON {schema}.job_steps (kind) WHERE state IN ('waiting', 'received');

-- What each worker did so far (WorkerStats: claimed, succeeded, ..., steps stored), written by
-- its registry with each refresh. Workers of a previous release leave it empty.
ALTER TABLE {schema}.workers ADD COLUMN counts jsonb NOT NULL DEFAULT '{}';
