-- Make the partitions of the days from today (the queue's clock, UTC) to `ahead` days after it
-- that no partition covers yet, moving into each the rows the default partition holds for its
-- day. Returns how many it made. One caller at a time (a transaction-level advisory lock;
-- the others return 0 at once); lock_timeout bounds the wait for the default partition.
CREATE OR REPLACE FUNCTION {schema}.archive_partitions(ahead int) RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    today timestamptz := date_trunc('day', {schema}.now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    covered timestamptz;
    day timestamptz;
    part text;
    made int := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('aioqueue.archive.' || '{schema}')) THEN
        RETURN 0;
    END IF;
    -- The end of the newest bounded partition: every day before it is covered (or retired).
    SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz)
    INTO covered
    FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = '{schema}.jobs_done'::regclass;
    day := greatest(today, coalesce(covered, today));
    WHILE day <= today + make_interval(days => ahead) LOOP
        part := 'jobs_done_' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
        PERFORM set_config('lock_timeout', '2s', true);
        EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.jobs_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
        EXECUTE format(
            'WITH moved AS (DELETE FROM {schema}.jobs_done_default AS d '
            'WHERE d.finished_at >= %L AND d.finished_at < %L RETURNING d.*) '
            'INSERT INTO {schema}.%I SELECT * FROM moved', day, day + interval '1 day', part);
        EXECUTE format('ALTER TABLE {schema}.jobs_done ATTACH PARTITION {schema}.%I FOR VALUES FROM (%L) TO (%L)',
                       part, day, day + interval '1 day');
        made := made + 1;
        day := day + interval '1 day';
    END LOOP;
    RETURN made;
END
$$;
