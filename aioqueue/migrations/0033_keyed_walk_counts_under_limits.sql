-- The keyed claim's walk counts a key's running jobs only under a per-key concurrency limit,
-- and its recent starts only under a key rate: claim_keyed() as in 0032 (same arguments).
--
-- Each count stood in an arithmetic that is NULL without its limit, so the walk passed over
-- nothing for it, but the count ran all the same: at a concurrency limit of 1 without a key
-- rate, a probe of key_starts for every key walked (and of the running jobs, for a fair queue
-- without limits).

-- claim_keyed() changes: functions/claim_keyed.sql.
-- functions: 5d0ebb9ac4ba6bb7f08b5fd34de111135ea597bebab919a3623960f6dda9a626
