-- The keyed claim, faster: claim_keyed() as in 0018 (same arguments, so running workers of
-- 0018 call this one), with each key's turn read from jobs_partition_ready_idx whatever the
-- statistics say.
--
-- In 0018 the turn (a key's oldest ready jobs) ordered by run_at and id only, an order the
-- plain ready index also gives; with statistics taken while the queue held one key (a flood),
-- every key looked like the whole queue and the planner walked the ready index, filtering the
-- key out of every pending job: a claim cost the queue's length per key served.

-- claim_keyed() changes: functions/claim_keyed.sql.
