-- Progress while a job runs (aioqueue.set_progress): the latest value its handler reported, as
-- one jsonb document {"fraction", "message", "data", "attempt", "keep", "at"}, written by the
-- worker's completer in batches, fenced by the claim like an outcome. A later attempt shows it
-- only when it was reported with keep (the readers apply that rule: the claim never touches it).
--
-- Nullable and without a default, so adding them rewrites neither table, and the statements of
-- workers of the release before, which name their columns, go on as they were.
ALTER TABLE {schema}.jobs ADD COLUMN progress jsonb;

-- The archive keeps the last progress of the jobs it keeps (every partition gets the column).
ALTER TABLE {schema}.jobs_done ADD COLUMN progress jsonb;
