-- Key-rate wake-ups are not lost between two claims of one queue.
--
-- claim_keyed of 0024 set the queue's key_rate_wake only when no concurrent claim held the
-- queue's row (SKIP LOCKED), from what its own snapshot saw. Two workers woken at a window's
-- opening could then lose the wake-up: one takes the key's next job and would set the next
-- opening; the other, whose snapshot lacks that start, takes nothing and clears the wake-up;
-- the first finds the row locked and skips its update; both wait for their poll. Now the
-- update waits for the row (only for a key-rate limited queue, at the end of a claim, in the
-- queues' order, as every claim takes them) and reads the starts afresh once it has it, so the
-- later of two claims sees the earlier one's starts and sets the wake-up both would.
--
-- The recording is a function of its own, note_key_starts, so that a later change to it
-- replaces only it; claim_keyed is restated to call it (same arguments as in 0024, so running
-- workers of earlier releases call this one).

-- New: note_key_starts(), defined in functions/note_key_starts.sql.

-- claim_keyed() as in 0024, recording a key-rate limited queue's starts through note_key_starts.
-- Defined in functions/claim_keyed.sql.
