-- add_jobs() writes a batch with dedup keys in one statement too: 0009 wrote such a batch one
-- job at a time through add_job(), at several times the cost of a batch without keys. What a
-- caller sees is unchanged: the same checks and errors, the ids in the order given (a repeated
-- key returns the first job's id, a key naming a live job returns that job), the same NOTIFYs.

-- The bulk form, as in 0009 (every job checked first, in the order given; the first refused one
-- named by its position), except that a batch with dedup keys is written in one statement too,
-- and that a job's unknown keys are found by taking the known ones away (one operator), not by
-- listing its keys in a subquery per job (a third of the checks' time).
-- Defined in functions/add_jobs.sql.
