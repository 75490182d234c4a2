-- Per-queue, per-minute counts of succeeded jobs, for the throughput that `aioqueue status`
-- reports. The completer adds to it in its batched `complete` statement; maintenance prunes
-- rows older than an hour. `shard` spreads concurrent completers (keyed by backend pid) over
-- several rows, so busy workers do not queue up on one hot row lock.
CREATE TABLE {schema}.queue_stats (
    queue      text        NOT NULL,
    minute     timestamptz NOT NULL,
    shard      smallint    NOT NULL,
    succeeded  bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, minute, shard)
) WITH (fillfactor = 50);

-- Tiny and updated all the time: vacuum early and without throttling, like jobs.
ALTER TABLE {schema}.queue_stats SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_cost_delay = 0
);
