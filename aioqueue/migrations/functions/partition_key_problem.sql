-- What is wrong with a partition key given to add_job() or add_jobs() (NULL: nothing, or no
-- key), as Python's check_partition_key() words it.
CREATE OR REPLACE FUNCTION {schema}.partition_key_problem(partition_key text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
SELECT CASE
    WHEN partition_key IS NULL THEN NULL
    WHEN partition_key = '' THEN 'partition key must be a non-empty str, got '''''
    WHEN char_length(partition_key) > 255 THEN
        format('partition key is %s characters long; the limit is 255', char_length(partition_key))
    WHEN octet_length(partition_key) > 1000 THEN
        format('partition key is %s bytes in UTF-8; the limit is 1000', octet_length(partition_key))
END
$$;
