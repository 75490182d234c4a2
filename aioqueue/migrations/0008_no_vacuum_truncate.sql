-- Autovacuum never truncates the jobs table. Truncating the empty pages at its end needs an
-- ACCESS EXCLUSIVE lock on the table, which vacuum takes and gives up in turns with every
-- claim, outcome and enqueue for as long as it takes; in the soak (tests/test_faults_soak.py)
-- each truncation cut throughput to about a third for about a minute. A queue's table refills
-- the space at once (it is reused, never lost), so giving it back to the operating system
-- buys nothing. VACUUM (TRUNCATE) by hand still can.
ALTER TABLE {schema}.jobs SET (vacuum_truncate = false);
