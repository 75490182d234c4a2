-- Workflows (migrations 0014, 0015): retrying a dead job resumes its whole workflow, groups
-- included; one lock order for every workflow statement; less work per finished batch.
--
-- Groups: retrying a dead member (or restoring a member its death cancelled) takes it out of
-- its group's failed (cancelled) count and reopens the group if it had settled (done_at back
-- to NULL). Once every member finished again the group settles again and enqueues the callbacks
-- that apply and that it has not enqueued yet: each kind at most once, ever. So a group that
-- settled with a failure (on_failure and on_complete enqueued) enqueues on_success when the
-- retried members succeed; a group never enqueues a callback twice.
--
-- Dependants: the archive now keeps a cancelled dependant's max_attempts and partition key,
-- so the retry restores them as they were enqueued (rows archived before this migration get
-- the former fallback: max_attempts of 5 or its attempts and one more, no key).
--
-- Locks: every workflow statement now takes job rows before group rows, groups in id order,
-- as jobs_finished() does: resume_workflows() (a retry) locks its groups once, after the job
-- rows; add_dependencies() (an enqueue) locks the dependencies' rows before its group's row.
-- So an enqueue, a retry and the statements that finish members never wait in a circle.
--
-- Workers of the previous release call these functions by the same signatures and get the new
-- bodies; their own archive writes name their columns, and leave the new ones NULL.

ALTER TABLE {schema}.jobs_done
    ADD COLUMN max_attempts int,
    ADD COLUMN partition_key text COLLATE "C";

-- settle_group() changes: functions/settle_group.sql.

-- cancel_waiting() changes: functions/cancel_waiting.sql.

-- resume_workflows(ids): the jobs ids were dead and are pending again. Restores, down the
-- graph, the dependants their deaths cancelled; then counts the retried and the restored
-- members out of their groups' failed and cancelled, reopening the groups that had settled.
-- Defined in functions/resume_workflows.sql.

-- add_dependencies(job_ids, deps, names, may_fail, gid): as in migration 0014, with the rows
-- locked in the order the statements that finish jobs lock them: the dependencies' rows (in id
-- order) before the group's row. (Before, the group's row came first: an enqueue joining group
-- g and waiting for a member d held g and waited for d while d's finish held d and waited for
-- g, a deadlock.) A group that does not keep results no longer looks at the new rows again.
-- Defined in functions/add_dependencies.sql.

-- jobs_finished(ids, outcomes, groups, chained): as in migration 0014, with less work for the
-- common batch, members of a group that nothing waits for: the dependants' lookup runs only
-- when some finished row has dependants, and a group's row is updated once, its counters
-- returned by that update, so settle_group() is called only for a group that is complete.
-- Defined in functions/jobs_finished.sql.
