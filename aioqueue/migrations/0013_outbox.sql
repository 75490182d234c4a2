-- The outbox: events an application writes in its own transaction, for a relay to publish to a
-- stream (Redis Streams, Kafka) in commit order per key. A rolled-back transaction leaves no
-- row, so it publishes nothing. A row lives from its commit until the relay has published it,
-- then the relay deletes it: like `jobs`, the table holds only what is still to do.
--
-- Commit order per key: an event's id comes from a sequence, and sequence order is not commit
-- order when transactions overlap (one takes id 7, another id 8 and commits first). publish()
-- below takes a transaction-scoped advisory lock on each of its keys before it takes ids, so
-- two transactions writing one key run one after the other from that point to their commits:
-- the second takes its ids only after the first has committed (or rolled back). Per key, id
-- order is then commit order, and the relay, which reads in id order, publishes in commit
-- order. Transactions writing different keys never wait for each other.
CREATE TABLE {schema}.outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream     text        NOT NULL,
    key        text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
-- The relay reads one stream's events oldest first.
CREATE INDEX outbox_stream_idx ON {schema}.outbox (stream, id);
-- Written and emptied all day, like jobs: vacuum it often and never take the exclusive lock that
-- gives pages back.
ALTER TABLE {schema}.outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    vacuum_truncate = false
);

-- One relay publishes a stream at a time: the holder of its lease, renewed with every batch it
-- reads. Another relay takes over once the lease has expired (its holder died or hangs).
CREATE TABLE {schema}.outbox_relays (
    stream     text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    published  bigint      NOT NULL DEFAULT 0
);

-- New: publish_events(), defined in functions/publish_events.sql.

-- New: publish(), defined in functions/publish.sql.
