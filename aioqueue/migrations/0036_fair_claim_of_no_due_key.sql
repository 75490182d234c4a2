-- A fair claim whose circle has no key with a job due takes nothing: claim_keyed() as in 0035
-- (same arguments).
--
-- 0035 shared a fair queue's claim among the keys of its whole circle when they were fewer
-- than the claim wanted, and divided by their number: with no key due on either side of the
-- cursor (a fair queue whose keyed jobs are all scheduled later), every claim of the queue
-- failed with a division by zero.

-- claim_keyed() changes: functions/claim_keyed.sql.
-- functions: 0c0213f590bca840af4a19394c19e0411733d55316092d06cffa48cd9567595e
