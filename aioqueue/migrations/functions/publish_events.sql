-- Write events of `stream`: keys[i] with payloads[i], in array order; return their ids. Every
-- way in (asyncpg, SQLAlchemy, psycopg, Django, SQL and triggers) writes through this function.
-- Locks each distinct key first, in sorted order (two batches sharing keys never deadlock), then
-- takes the ids; one NOTIFY per transaction wakes the relays (payload: the stream).
CREATE OR REPLACE FUNCTION {schema}.publish_events(stream text, keys text[], payloads jsonb[]) RETURNS SETOF bigint
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
