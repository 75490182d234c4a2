-- Enqueue from SQL: triggers, other languages and psql write jobs through these functions.
-- They check what Python's enqueue checks (the limits of aioqueue/checks.py and payload.py),
-- write the row the `enqueue` statement writes, with the same dedup behaviour, and send the
-- same NOTIFY (delivered at commit). Every value is a parameter: no SQL is built from input.

-- New: add_job(), defined in functions/add_job.sql.

-- New: add_jobs(), defined in functions/add_jobs.sql.
