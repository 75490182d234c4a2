-- Per-key rate limits: at most key_rate_limit jobs of one partition key started per
-- key_rate_period seconds (a sliding window in the queue's clock), across every worker, checked
-- in the keyed claim beside the per-key concurrency limit.
--
-- Each start of a job of a key-rate limited queue is a row of key_starts, counted per key in
-- the claim; the workers' upkeep deletes the rows that left their queue's window (and all the
-- rows of a queue whose key rate was cleared), so the table holds about one window's starts.

ALTER TABLE {schema}.queues
    -- At most key_rate_limit starts per key in any key_rate_period seconds (NULL: no key rate);
    -- like a per-key concurrency limit, it makes the queue's claims take keys in turn.
    ADD COLUMN key_rate_limit int CHECK (key_rate_limit >= 0),
    ADD COLUMN key_rate_period double precision CHECK (key_rate_period > 0),
    -- When the earliest key the last keyed claim held back for its rate gets room again (NULL:
    -- none held back): what an idle worker of the queue wakes for (next_wakeup).
    ADD COLUMN key_rate_wake timestamptz,
    ADD CONSTRAINT queues_key_rate_check CHECK ((key_rate_limit IS NULL) = (key_rate_period IS NULL));

-- One row per start of a job of a key-rate limited queue.
CREATE TABLE {schema}.key_starts (
    queue         text        NOT NULL,
    partition_key text        COLLATE "C" NOT NULL,
    started_at    timestamptz NOT NULL
);
-- A key's starts inside its window: what the claim counts (a range of the index per key).
CREATE INDEX key_starts_key_idx ON {schema}.key_starts (queue, partition_key, started_at);
-- The starts that left their window: what the upkeep deletes, oldest first. Not led by the
-- queue, so that the claim's count of one key's starts has no index but the key's to read.
CREATE INDEX key_starts_age_idx ON {schema}.key_starts (started_at);

-- claim_keyed() as in 0022 (same arguments, so running workers of earlier releases call this
-- one), and a key with a rate limit is held to it: a key's turn takes no more jobs than its
-- room, the limit less its starts inside the window (and the jobs this call took of it), and
-- only under its advisory lock, as under a per-key concurrency limit, so that a claim counts
-- the starts the claims that held the key before it recorded. The jobs taken
-- of such a queue are recorded in key_starts, and the queue's key_rate_wake set to when the
-- first key that the walk saw at its limit gets room again.

-- claim_keyed() changes: functions/claim_keyed.sql.
