-- A keyed claim reads jobs by index even before the table's first ANALYZE: claim_keyed() as in
-- 0042 (same arguments, same results), planned with enable_seqscan off, as claim_jobs() is.
--
-- Its plans are generic and made once a session. On a table of a few rows without statistics
-- (a new queue's first claims; autovacuum off, or not yet run), the take's UPDATE was planned as
-- a scan of the whole table and the check of the found jobs as a filtered read of the ready
-- index, and the session kept those plans after the table grew, until the next ANALYZE.

-- claim_keyed() changes: functions/claim_keyed.sql.
-- functions: 6d7741f277a2c2dad708393c3a09204ec3d3fa1e771f8fb8e4708c4f99088e4b
