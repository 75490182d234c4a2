-- Every job's run_at lies in 0001-01-01 to 9999-12-31 23:59:59.999999 UTC, the instants every
-- client (Python's datetime, asyncpg) can read back: a row outside it would break every listing
-- that shows it. aioqueue's own enqueues stop a long delay at the last instant; this refuses
-- what another writer (add_job() given a far run_at, plain SQL) would store beyond either end.
-- NOT VALID: rows already stored are not scanned (the check is instant on a large table);
-- every row written from now on is checked.
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_run_at_within_year_1_to_9999
    CHECK (run_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00') NOT VALID;
