-- Retention: drop every partition that ends at or before now() - `retention` (DROP TABLE: a
-- catalog change, whatever its size), and delete, oldest first, up to `batch` rows older than
-- that from each of the two partitions without a day (the old table and the default one).
-- A day's rows therefore live at least `retention`, and at most a day longer. The drop waits
-- at most a second for the parent's lock (in-flight archive writes hold it briefly); a drop
-- that could not get it is left to the next pass. Returns (partitions dropped, rows deleted).
CREATE OR REPLACE FUNCTION {schema}.archive_retire(retention interval, batch int,
                                        OUT dropped int, OUT deleted bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff timestamptz := {schema}.now() - retention;
    part record;
    n bigint;
BEGIN
    dropped := 0;
    deleted := 0;
    IF NOT pg_try_advisory_xact_lock(hashtext('aioqueue.archive.' || '{schema}')) THEN
        RETURN;
    END IF;
    FOR part IN
        SELECT c.relname,
               (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz AS upper_bound
        FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.jobs_done'::regclass
    LOOP
        IF part.upper_bound IS NOT NULL AND part.upper_bound <= cutoff THEN
            BEGIN
                PERFORM set_config('lock_timeout', '1s', true);
                EXECUTE format('DROP TABLE {schema}.%I', part.relname);
                dropped := dropped + 1;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        ELSIF part.relname IN ('jobs_done_legacy', 'jobs_done_default') THEN
            EXECUTE format(
                'DELETE FROM {schema}.%I AS d WHERE d.ctid = ANY (ARRAY('
                'SELECT o.ctid FROM {schema}.%I AS o WHERE o.finished_at < $1 '
                'ORDER BY o.finished_at LIMIT $2 FOR UPDATE SKIP LOCKED))', part.relname, part.relname)
            USING cutoff, batch;
            GET DIAGNOSTICS n = ROW_COUNT;
            deleted := deleted + n;
        END IF;
    END LOOP;
END
$$;
