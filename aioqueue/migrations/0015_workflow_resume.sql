-- Retrying a dead job resumes its workflow (see migration 0014): the dependants a dead job had
-- cancelled, and theirs down the graph, come back from the archive to wait again, and the
-- groups count the retried member and the restored ones as not finished. `retry_dead` calls
-- resume_workflows() for the retried jobs that have dependants or a group.
--
-- A restored dependant keeps its id, queue, task, arguments, priority and group; the archive
-- does not keep max_attempts, so it gets the default (5), or its attempts and one more.

-- New: resume_workflows(), defined in functions/resume_workflows.sql.
