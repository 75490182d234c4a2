-- The archive, partitioned by finish time, so that retention drops a day whole instead of
-- deleting its rows one by one (and vacuum never walks a day it is about to lose).
--
-- jobs_done becomes a table partitioned by range of finished_at: a partition a day (UTC days,
-- by the queue's clock), named jobs_done_YYYYMMDD and created ahead by the workers' maintenance
-- (archive_partitions()); jobs_done_default takes a row no day covers (the days ahead were
-- not made, or a test moved the clock), so an archiving statement never fails for want of one.
--
-- Upgrading keeps the archive in place. The table as it was is renamed jobs_done_legacy and
-- attached, with its indexes, as the partition of everything that finished before the next
-- UTC midnight (or after its newest row, if that is later); the days after it are new
-- partitions. Locks, held until this migration's transaction commits: ACCESS EXCLUSIVE on the
-- old table, which ATTACH PARTITION reads once, sequentially, to check the bound (no index is
-- built or rewritten, no row moves). Meanwhile the archive's readers (get_job, result(),
-- listings) and the statements that archive (a succeeded job of an archiving task, a
-- cancellation, and, because the statement names the table, every completion) wait; claims,
-- enqueues and heartbeats do not. docs/howto/archive.md gives the measured length.
--
-- No primary key: a partitioned table's unique index must hold the partition key, which a
-- lookup by id does not know. The id is unique already: it is the jobs row's identity, and the
-- statement that writes the archive row deletes that jobs row. Every partition has an index on
-- id (jobs_done_id_idx, declared on the parent only, so the old table keeps its unique
-- jobs_done_legacy_pkey for it and nothing is built); a lookup by id reads each partition's.

LOCK TABLE {schema}.jobs_done IN ACCESS EXCLUSIVE MODE;

ALTER TABLE {schema}.jobs_done RENAME TO jobs_done_legacy;
ALTER INDEX {schema}.jobs_done_pkey RENAME TO jobs_done_legacy_pkey;
ALTER INDEX {schema}.jobs_done_finished_at_idx RENAME TO jobs_done_legacy_finished_at_idx;
ALTER INDEX {schema}.jobs_done_list_status_idx RENAME TO jobs_done_legacy_list_status_idx;
ALTER INDEX {schema}.jobs_done_list_queue_idx RENAME TO jobs_done_legacy_list_queue_idx;
ALTER INDEX {schema}.jobs_done_list_task_idx RENAME TO jobs_done_legacy_list_task_idx;
ALTER INDEX {schema}.jobs_done_group_idx RENAME TO jobs_done_legacy_group_idx;

CREATE TABLE {schema}.jobs_done (
    LIKE {schema}.jobs_done_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS
) PARTITION BY RANGE (finished_at);

DO $migration$
DECLARE
    upper_bound timestamptz := date_trunc('day', greatest(
        {schema}.now(), (SELECT max(finished_at) FROM {schema}.jobs_done_legacy)) AT TIME ZONE 'UTC')
        AT TIME ZONE 'UTC' + interval '1 day';
BEGIN
    EXECUTE format(
        'ALTER TABLE {schema}.jobs_done ATTACH PARTITION {schema}.jobs_done_legacy '
        'FOR VALUES FROM (MINVALUE) TO (%L)', upper_bound);
END
$migration$;

-- Declared on the parent, these find the old table's equal indexes and attach them.
CREATE INDEX jobs_done_list_status_idx ON {schema}.jobs_done (status, id);
CREATE INDEX jobs_done_list_queue_idx ON {schema}.jobs_done (queue, status, id);
CREATE INDEX jobs_done_list_task_idx ON {schema}.jobs_done (task, status, id);
CREATE INDEX jobs_done_group_idx ON {schema}.jobs_done (group_id, id) WHERE group_id IS NOT NULL;
-- ON ONLY: every partition made from now on gets it; the old table answers with its pkey.
CREATE INDEX jobs_done_id_idx ON ONLY {schema}.jobs_done (id);

CREATE TABLE {schema}.jobs_done_default PARTITION OF {schema}.jobs_done DEFAULT;
-- Rows here (and in the old table) are pruned one by one, oldest first, through this.
CREATE INDEX jobs_done_default_finished_at_idx ON {schema}.jobs_done_default (finished_at);

-- New: archive_partitions(), defined in functions/archive_partitions.sql.

-- New: archive_retire(), defined in functions/archive_retire.sql.

-- The partitions of the days from the old table's bound to two days after today, as the workers'
-- maintenance makes them ahead (archive_partitions(2)); the default partition is new and empty,
-- so no row moves into them.
DO $migration$
DECLARE
    today timestamptz := date_trunc('day', {schema}.now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    day timestamptz := date_trunc('day', greatest(
        {schema}.now(), (SELECT max(finished_at) FROM {schema}.jobs_done_legacy)) AT TIME ZONE 'UTC')
        AT TIME ZONE 'UTC' + interval '1 day';
    part text;
BEGIN
    WHILE day <= today + interval '2 days' LOOP
        part := 'jobs_done_' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.jobs_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
        EXECUTE format('ALTER TABLE {schema}.jobs_done ATTACH PARTITION {schema}.%I FOR VALUES FROM (%L) TO (%L)',
                       part, day, day + interval '1 day');
        day := day + interval '1 day';
    END LOOP;
END
$migration$;
