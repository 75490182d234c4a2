-- Why a job with these values would be refused (NULL: it is fine): the limits of
-- aioqueue/_checks.py and _payload.py, the one definition of the checks add_job() and
-- add_jobs() make. A NULL queue (none given, none recorded) is refused with what to do.
CREATE OR REPLACE FUNCTION {schema}.job_problem(
    task          text,
    args          jsonb,
    queue         text,
    priority      int,
    run_at        timestamptz,
    delay_seconds float8,
    max_attempts  int,
    dedup_key     text
) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    -- text cannot hold NUL and jsonb refuses \u0000, so NUL never gets this far.
    RETURN CASE
        WHEN task IS NULL OR length(task) = 0 OR length(task) > 255 THEN
            format('task must be a name of 1 to 255 characters, got %s (%s characters)',
                   coalesce(quote_literal(left(task, 40)), 'NULL'), coalesce(length(task), 0))
        WHEN queue IS NULL THEN
            format('task %s has no known queue: no worker that serves it has recorded one (table '
                   '{schema}.tasks); pass its queue (queue => ..., or "queue" in add_jobs), or start a '
                   'worker that serves it', quote_literal(task))
        WHEN length(queue) = 0 OR length(queue) > 255 THEN
            format('queue must be a name of 1 to 255 characters, got %s (%s characters)',
                   quote_literal(left(queue, 40)), length(queue))
        WHEN args IS NULL OR jsonb_typeof(args) <> 'object' THEN
            format('args of task %s must be a JSON object of keyword arguments, got %s',
                   quote_literal(task), coalesce(jsonb_typeof(args), 'NULL'))
        WHEN octet_length(args::text) > 1048576 THEN
            format('args of task %s are %s bytes as JSON, over the limit of 1048576',
                   quote_literal(task), octet_length(args::text))
        WHEN priority IS NULL THEN
            'priority must be an int, got NULL'
        WHEN delay_seconds IS NULL OR NOT (delay_seconds BETWEEN 0 AND 315360000) THEN
            format('delay_seconds must be 0 to ten years in seconds, got %s', coalesce(delay_seconds::text, 'NULL'))
        WHEN max_attempts IS NULL OR NOT (max_attempts BETWEEN 1 AND 10000) THEN
            format('max_attempts must be an int from 1 to 10000, got %s', coalesce(max_attempts::text, 'NULL'))
        WHEN run_at IS NOT NULL AND NOT isfinite(run_at) THEN
            format('run_at must be a finite time, got %s', run_at)
        WHEN dedup_key IS NOT NULL
             AND (length(dedup_key) = 0 OR length(dedup_key) > 1000 OR octet_length(dedup_key) > 2000) THEN
            format('dedup_key must be 1 to 1000 characters and at most 2000 bytes, got %s characters',
                   length(dedup_key))
    END;
END;
$$;

COMMENT ON FUNCTION {schema}.job_problem(text, jsonb, text, int, timestamptz, float8, int, text) IS
    'Why add_job() would refuse a job with these values, or NULL: the one definition of its checks.';
