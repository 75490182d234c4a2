-- add_jobs() writes a batch in one INSERT. It called add_job() once per job: a plan, an insert
-- and a NOTIFY each, far costlier than enqueue_many's one statement for the same rows.
-- The checks move into job_problem(), which add_job() and add_jobs() both ask, so a job is
-- refused for the same reasons, with the same words, whichever way it comes. Nothing about a
-- stored job changes: same rows, same ids in the order given, same NOTIFYs.

-- New: job_problem(), defined in functions/job_problem.sql.

-- add_job() changes: functions/add_job.sql.

-- The bulk form. Every job is checked first, in the order given, and the first refused one
-- names its position; then, unless some job carries a dedup key, one INSERT writes them all, in
-- array order (a lone function scan feeds it, so the identity values follow the input), and one
-- NOTIFY goes out per queue and due time. Jobs with dedup keys keep add_job()'s way, one at a
-- time: a key may repeat within the batch, which a single INSERT ... ON CONFLICT cannot take.
-- Defined in functions/add_jobs.sql.
