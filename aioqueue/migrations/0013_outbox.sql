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

-- Write events of `stream`: keys[i] with payloads[i], in array order; return their ids. Every
-- way in (asyncpg, SQLAlchemy, psycopg, Django, SQL and triggers) writes through this function.
-- Locks each distinct key first, in sorted order (two batches sharing keys never deadlock), then
-- takes the ids; one NOTIFY per transaction wakes the relays (payload: the stream).
CREATE FUNCTION {schema}.publish_events(stream text, keys text[], payloads jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    problem text;
BEGIN
    problem := CASE
        WHEN publish_events.stream IS NULL OR publish_events.stream = '' THEN 'stream must be a non-empty name'
        WHEN length(publish_events.stream) > 200 THEN 'stream name is longer than 200 characters'
        WHEN keys IS NULL OR payloads IS NULL THEN 'keys and payloads must be arrays'
        WHEN coalesce(array_length(keys, 1), 0) <> coalesce(array_length(payloads, 1), 0)
            THEN format('%s keys for %s payloads', coalesce(array_length(keys, 1), 0),
                        coalesce(array_length(payloads, 1), 0))
        WHEN array_position(keys, NULL) IS NOT NULL
            THEN format('event %s of %s has no key', array_position(keys, NULL), array_length(keys, 1))
        WHEN array_position(payloads, NULL) IS NOT NULL
            THEN format('event %s of %s has no payload', array_position(payloads, NULL), array_length(keys, 1))
    END;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'aioqueue.publish_events: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The two-key form of the lock, its first key this schema's outbox: apart from the
    -- application's own advisory locks, which mostly take the one-key form.
    PERFORM pg_advisory_xact_lock(hashtext('{schema}.outbox'), hashtext(publish_events.stream || chr(31) || k.key))
    FROM (SELECT DISTINCT u.key FROM unnest(keys) AS u(key) ORDER BY u.key) AS k;
    RETURN QUERY
    INSERT INTO {schema}.outbox AS o (stream, key, payload)
    SELECT publish_events.stream, e.key, e.payload
    FROM unnest(keys, payloads) WITH ORDINALITY AS e(key, payload, ord)
    ORDER BY e.ord
    RETURNING o.id;
    PERFORM pg_notify('{schema}_outbox', publish_events.stream);
END;
$$;

-- One event, from SQL or a trigger: SELECT aioqueue.publish('orders', 'order-17', '{"paid": true}').
CREATE FUNCTION {schema}.publish(stream text, key text, payload jsonb) RETURNS bigint
LANGUAGE sql
AS $$SELECT {schema}.publish_events(stream, ARRAY[key], ARRAY[payload])$$;
