-- Record the starts of a keyed claim of queue q (one row per job taken, of the keys `started`)
-- and set the queue's key_rate_wake to when the first of the keys the claim walked (`walked`)
-- that is at its rate gets room again (a wake-up still ahead is kept: the walk may have
-- stopped before an earlier claim's key). The update waits for the queue's row and reads the
-- starts afresh once it has it, so the later of two claims sees the earlier one's starts and
-- sets the wake-up both would. A function of its own, called by claim_keyed(), so that a
-- change to the recording replaces only it.
CREATE OR REPLACE FUNCTION {schema}.note_key_starts(
    q          text,
    started    text[],
    walked     text[],
    key_rate   int,
    key_period float8
) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    rate_wake timestamptz;
BEGIN
    INSERT INTO {schema}.key_starts (queue, partition_key, started_at)
    SELECT q, k, {schema}.now() FROM unnest(started) AS k;
    -- Wait for a concurrent claim of this queue that holds the row (it commits or rolls back
    -- soon: this is the end of a claim); the statements below then see its starts.
    PERFORM FROM {schema}.queues AS s WHERE s.name = q FOR UPDATE;
    rate_wake := (
        SELECT min(o.at) FROM (SELECT DISTINCT k FROM unnest(walked) AS k) AS s
        CROSS JOIN LATERAL (
            SELECT min(r.started_at) + make_interval(secs => key_period) AS at
            FROM {schema}.key_starts AS r
            WHERE r.queue = q AND r.partition_key = s.k
              AND r.started_at > {schema}.now() - make_interval(secs => key_period)
            HAVING count(*) >= key_rate
        ) AS o);
    rate_wake := least(rate_wake, (SELECT s.key_rate_wake FROM {schema}.queues AS s
                                   WHERE s.name = q AND s.key_rate_wake > {schema}.now()));
    UPDATE {schema}.queues AS s SET key_rate_wake = rate_wake
    WHERE s.name = q AND s.key_rate_wake IS DISTINCT FROM rate_wake;
END
$$;
