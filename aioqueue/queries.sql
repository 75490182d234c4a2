-- Every statement aioqueue sends, named. `{schema}` is the validated schema name; every value
-- is a $n parameter. The loader (queries.py) turns each block into a field of `Queries`.
--
-- Time is the queue's clock, `{schema}.now()` (migration 0012): the transaction's now(), inlined
-- by the planner, which tests move (aioqueue.testing). Only the worker registry, which tells live
-- processes from dead ones by real seconds, and the migrations table, which exists before the
-- clock does, read the wall clock, as `pg_catalog.now()`; tests/test_testing_kit.py holds every
-- other statement to the queue's clock.

-- name: create_schema
-- Migrations, first step: the schema itself.
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_migrations_table
-- Migrations, second step: the table that records which versions are applied (stamped by the
-- wall clock: the queue's clock is created by a migration).
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- name: migration_lock
-- Migrations take turns per schema: a transaction-scoped advisory lock on key $1.
SELECT pg_advisory_xact_lock($1);

-- name: function_checks
-- Migrations, around the function files: $1 'off' leaves their bodies unchecked until called
-- (a body may name a function of a file applied after it), 'on' checks again; this
-- transaction only.
SELECT set_config('check_function_bodies', $1, true);

-- name: schema_exists
-- Whether the migrations table exists ($1: its qualified name); false before the first migrate.
SELECT to_regclass($1) IS NOT NULL;

-- name: schema_version
-- The newest migration applied (0: none).
SELECT coalesce(max(m.version), 0) FROM {schema}.migrations AS m;

-- name: record_migration
-- Record that version $1, named $2, is applied.
INSERT INTO {schema}.migrations (version, name) VALUES ($1, $2);

-- name: notify
-- Send payload $2 on channel $1 (as part of the caller's transaction: delivered at commit).
SELECT pg_notify($1, $2);

-- name: ping
-- Is the connection alive? The listener's keep-alive.
SELECT 1;

-- name: database_identity
-- Which database this connection reaches, as the server says: its name and the start of the
-- server process (public to every role, and the same through a pooler), then where the server
-- took the connection (for messages only). Reads nothing, so it may run in a caller's transaction.
SELECT current_database(), pg_postmaster_start_time(), host(inet_server_addr()), inet_server_port();

-- name: enqueue
-- Insert one job and wake the workers of its queue; a live job with the same dedup key is
-- returned instead of a new one. `inserted` tells which happened. The parameters come in the
-- order of enqueue_many's: $1 queue (NULL: the task's recorded one, see queue_of), $2 task, $3
-- priority, $4 run_at, $5 delay, $6 max_attempts, $7 archive, $8 args, $9 dedup key, $10
-- channel, $12 the group it joins (workflows; NULL: none), $13 its partition key (NULL: none).
-- No row when the job has no queue: nothing was written.
WITH {queue_of},
ins AS (
    INSERT INTO {schema}.jobs AS j
        (queue, task, args, priority, run_at, max_attempts, dedup_key, archive, group_id, partition_key)
    SELECT q.queue, $2, $8::jsonb, $3, {run_at}, $6, $9, $7, $12::bigint, $13::text
    FROM q WHERE q.queue IS NOT NULL
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET dedup_key = EXCLUDED.dedup_key
    RETURNING j.id, (j.xmax = 0) AS inserted, j.run_at
)
-- A job ready now wakes its queue's workers (channel $10, payload: the queue); a delayed one
-- tells them when it is due (channel $11, payload: 'seconds queue'), so they wake on time.
SELECT ins.id, ins.inserted,
       CASE WHEN ins.run_at > {schema}.now()
            THEN pg_notify($11, extract(epoch FROM ins.run_at - {schema}.now())::text || ' ' || q.queue)
            ELSE pg_notify($10, q.queue) END::text AS notified
FROM ins, q;

-- name: enqueue_many
-- Insert many jobs of one task in one statement, in the order given, and send one NOTIFY.
-- $8 is one JSON array of the jobs' arguments: one parameter parsed once, which costs the
-- server no more than an array of texts cast row by row, and lets the caller encode the batch
-- as one string. The rows are inserted in array order (a lone function scan feeds the INSERT,
-- so the identity values, drawn one by one from the sequence, rise with the input), and their
-- ids come back as one bigint[] in that order: one value the driver decodes in one go, where
-- a row per id costs the client more than the rest of the call. No dedup key here (see
-- enqueue_many_keyed), so no ON CONFLICT arbiter either: with one, every row would take the
-- speculative insertion path. $11: the group the jobs join (workflows; NULL: none); $12: their
-- partition key (NULL: none).
WITH {queue_of},
ins AS (
    INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive, group_id,
                                    partition_key)
    SELECT (SELECT q.queue FROM q), $2, t.args, $3, (SELECT {run_at}), $6, $7, $11::bigint, $12::text
    FROM jsonb_array_elements($8::jsonb) AS t(args)
    WHERE (SELECT q.queue FROM q) IS NOT NULL
    RETURNING j.id
),
{notified_batch}
SELECT array_agg(ins.id ORDER BY ins.id) FROM ins, (SELECT count(*) FROM notified) AS n;

-- name: enqueue_many_keyed
-- enqueue_many for a batch in which some jobs have a dedup key ($11: one key or NULL per
-- element of $8, no key twice: the caller sends only the first job of a key). A key that names
-- a live job returns that job, as in enqueue. The ids of the jobs without a key come back in
-- input order (they are new rows, inserted in order); those with a key, beside their keys. $12:
-- the group the jobs join (workflows; NULL: none); $13: their partition key (NULL: none).
WITH {queue_of},
ins AS (
    INSERT INTO {schema}.jobs AS j (queue, task, args, priority, run_at, max_attempts, archive, dedup_key, group_id,
                                    partition_key)
    SELECT (SELECT q.queue FROM q), $2, t.args, $3, (SELECT {run_at}), $6, $7, t.key, $12::bigint, $13::text
    FROM ROWS FROM (jsonb_array_elements($8::jsonb), unnest($11::text[])) AS t(args, key)
    WHERE (SELECT q.queue FROM q) IS NOT NULL
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET dedup_key = EXCLUDED.dedup_key
    RETURNING j.id, j.dedup_key
),
{notified_batch}
SELECT array_agg(ins.id ORDER BY ins.id) FILTER (WHERE ins.dedup_key IS NULL),
       array_agg(ins.dedup_key) FILTER (WHERE ins.dedup_key IS NOT NULL),
       array_agg(ins.id) FILTER (WHERE ins.dedup_key IS NOT NULL)
FROM ins, (SELECT count(*) FROM notified) AS n;

-- fragment: notified_batch
-- A batch's one NOTIFY, as enqueue sends it: on the jobs channel ($9) or, for delayed jobs,
-- the due one ($10); none when the batch has no queue (and so wrote nothing).
notified AS (
    SELECT CASE WHEN c.run_at > {schema}.now()
                THEN pg_notify($10, extract(epoch FROM c.run_at - {schema}.now())::text || ' ' || q.queue)
                ELSE pg_notify($9, q.queue) END
    FROM (SELECT {run_at} AS run_at) AS c, q
    WHERE q.queue IS NOT NULL
)

-- fragment: queue_of
-- The queue of the job(s) of task $2: $1 if given, else the one the task's workers recorded
-- (task_queue(), as add_job() looks it up), else NULL: the job is not written, and the caller
-- refuses the call. Looked up once per statement, and only when $1 is NULL (coalesce stops at
-- the first value that is not NULL).
q AS (SELECT coalesce($1::text, {schema}.task_queue($2::text)) AS queue)

-- fragment: run_at
-- When a job enqueued with run_at $4 and delay $5 (seconds) becomes due. asyncpg sends
-- 0001-01-01 00:00 UTC and 9999-12-31 23:59:59.999999 UTC, the ends of the run_at range, as
-- -infinity and infinity: store the instants themselves. A delay past the last of them stops
-- there (a later instant would be one no client could read back).
LEAST(CASE $4::timestamptz WHEN '-infinity' THEN '0001-01-01 00:00:00+00'
                           WHEN 'infinity' THEN '9999-12-31 23:59:59.999999+00'
                           ELSE coalesce($4::timestamptz, {schema}.now()) END
      + make_interval(secs => $5),
      '9999-12-31 23:59:59.999999+00')

-- fragment: commit_mode
-- True, once it has set how the statement's own transaction commits (a one-time filter, run
-- once before any row). The parameter given where it is used is 'off' by default: the commit
-- then returns without waiting for its WAL to reach disk (it is still atomic, and visible to
-- everyone at once). Claims and outcomes only: losing one in a server crash makes its job run
-- again (a lost claim leaves it pending, a lost outcome leaves it running until its lease is
-- reaped), which at-least-once allows; an enqueue or a user's write never uses this. NULL
-- (the worker option durable_claims) keeps the session's setting.
(SELECT set_config('synchronous_commit', coalesce({arg}::text, current_setting('synchronous_commit')), true))
    IS NOT NULL

-- name: claim
-- Claim up to n ready jobs per queue (at most $5 in all): limited_claim, its jobs
-- (claimed_columns).
{limited_claim}
SELECT {claimed_columns(c)} FROM claimed AS c;

-- name: claim_timed
-- The claim of a worker (arguments as in claim) as one row (claimed_arrays): its jobs' columns
-- as arrays, and the claim's database time in claimed_at: what next_wakeup compares due times
-- and key-rate wake-ups against (exactly: the claim's now() is the time its transaction started).
{limited_claim}
SELECT {claimed_arrays(c)} FROM claimed AS c;

-- fragment: claimed_columns
-- A claim's columns, those of claim_jobs (as {arg}) but for the two timestamps, sent as seconds
-- since the epoch (float8: exact to the microsecond from the year 1685 to 2255): a worker
-- decodes thousands of claimed rows a second, and builds the datetime of a job's run_at or
-- created_at only if its handler reads it (decoding timestamptz is most of the client's cost
-- of a claimed row).
{arg}.id, {arg}.queue, {arg}.task, {arg}.args, {arg}.priority, {arg}.attempts, {arg}.max_attempts,
date_part('epoch', {arg}.run_at) AS run_at, date_part('epoch', {arg}.created_at) AS created_at

-- fragment: claimed_arrays
-- The one row of a worker's claim: each of claimed_columns (of the claimed rows, as {arg}) as an
-- array, in no particular order (NULL if none was claimed), and the claim's database time in
-- claimed_at (epoch seconds). One row rather than a row a job: a worker builds no record a job,
-- thousands of objects a claim that its collector would count and walk.
array_agg({arg}.id) AS id, array_agg({arg}.queue) AS queue, array_agg({arg}.task) AS task,
array_agg({arg}.args) AS args, array_agg({arg}.priority) AS priority,
array_agg({arg}.attempts) AS attempts, array_agg({arg}.max_attempts) AS max_attempts,
array_agg(date_part('epoch', {arg}.run_at)) AS run_at,
array_agg(date_part('epoch', {arg}.created_at)) AS created_at,
date_part('epoch', {schema}.now()) AS claimed_at

-- fragment: limited_claim
-- Claim up to n ready jobs per queue (at most $5 in all) through claim_jobs (migration 0007),
-- which locks them with FOR UPDATE SKIP LOCKED and marks them running under a lease ($6: the
-- commit mode, see commit_mode). A queue's row in `queues` may pause it or cap it: at most
-- concurrency_limit running and rate_limit claimed per rate_period, across all workers (the
-- caller locks those queues' rows first, in the same transaction, see lock_queues). A queue
-- that is fair or has a per-key limit (of concurrency or rate) is claimed by claim_keyed
-- (migrations 0018, 0020, 0022, 0024, 0025 and 0026), first, and the others by claim_jobs with the room left.
WITH settings AS MATERIALIZED (
    SELECT s.name, s.paused, s.concurrency_limit, s.rate_limit, s.rate_period, s.recent_starts,
           s.fair OR s.key_concurrency_limit IS NOT NULL OR s.key_rate_limit IS NOT NULL AS keyed
    FROM {schema}.queues AS s
    WHERE s.name = ANY($1::text[])
),
wanted AS (
    SELECT w.queue,
           CASE WHEN s.paused THEN 0 ELSE greatest(0, least(
               w.n,
               CASE WHEN s.concurrency_limit IS NOT NULL THEN s.concurrency_limit - (
                   SELECT count(*) FROM {schema}.jobs AS r
                   WHERE r.status = 'running' AND r.queue = w.queue) END,
               CASE WHEN s.rate_limit IS NOT NULL THEN s.rate_limit - (
                   SELECT count(*) FROM unnest(s.recent_starts) AS t(at)
                   WHERE t.at > {schema}.now() - make_interval(secs => s.rate_period)) END
           )) END AS n,
           coalesce(s.keyed, false) AS keyed
    FROM unnest($1::text[], $2::int[]) AS w(queue, n)
    LEFT JOIN settings AS s ON s.name = w.queue
    -- A queue asked for nothing is not claimed. Written as a range, which the planner puts at
    -- one row, as a custom plan sees the worker's one queue (rather than the ten it assumes of
    -- an array parameter): the generic plan then costs no more than a custom one, and the
    -- prepared statement keeps it, where it planned every claim anew (a third of a millisecond,
    -- a tenth of the server's time in the per-key limit 1 drain of the benchmark).
    WHERE w.n BETWEEN 1 AND 2147483647
),
{keyed_then_plain},
started AS (
    UPDATE {schema}.queues AS s
    SET recent_starts = ARRAY(
            SELECT t.at FROM unnest(s.recent_starts) AS t(at)
            WHERE t.at > {schema}.now() - make_interval(secs => s.rate_period)
        ) || array_fill({schema}.now(), ARRAY[n.claimed::int])
    FROM (SELECT c.queue, count(*) AS claimed FROM claimed AS c GROUP BY c.queue) AS n
    WHERE s.name = n.queue AND s.rate_limit IS NOT NULL
)

-- name: claim_unlimited
-- The claim when none of the queues $1 has a global limit, the common case (arguments as in
-- claim): claim_jobs alone, without the limits' arithmetic. A paused queue is still skipped.
SELECT {claimed_columns(c)}
FROM {schema}.claim_jobs($1::text[], $2::int[], $3::text, $4::float8, $5::int, $6::text) AS c;

-- name: claim_unlimited_timed
-- A worker's claim_unlimited as the one row of claim_timed (claimed_arrays).
SELECT {claimed_arrays(c)}
FROM {schema}.claim_jobs($1::text[], $2::int[], $3::text, $4::float8, $5::int, $6::text) AS c;

-- fragment: keyed_then_plain
-- The CTEs `keyed` and `claimed` of a claim whose CTE `wanted` gives, per queue, how many jobs
-- to claim (n) and whether the queue is fair or has a per-key limit (keyed): the keyed queues
-- through claim_keyed, first, and the others through claim_jobs with the room left (arguments
-- as in claim).
keyed AS MATERIALIZED (
    SELECT c.*
    FROM (SELECT array_agg(w.queue ORDER BY w.queue, w.n) AS queues,
                 array_agg(w.n::int ORDER BY w.queue, w.n) AS n
          FROM wanted AS w WHERE w.keyed HAVING count(*) > 0) AS a
    CROSS JOIN LATERAL {schema}.claim_keyed(a.queues, a.n, $3::text, $4::float8, $5::int, $6::text) AS c
),
claimed AS MATERIALIZED (
    SELECT * FROM keyed
    UNION ALL
    SELECT c.*
    FROM (SELECT array_agg(w.queue ORDER BY w.queue, w.n) AS queues,
                 array_agg(w.n::int ORDER BY w.queue, w.n) AS n
          FROM wanted AS w WHERE NOT w.keyed HAVING count(*) > 0) AS a
    CROSS JOIN LATERAL {schema}.claim_jobs(a.queues, a.n, $3::text, $4::float8,
                                           $5::int - (SELECT count(*) FROM keyed)::int, $6::text) AS c
)

-- name: claim_keyed_timed
-- The claim of a worker whose limited queues have per-key settings and none a global limit
-- (arguments and the one row as in claim_timed): limited_claim without the global limits'
-- arithmetic and bookkeeping, which took a fifth of a keyed claim of 50 jobs and most of the
-- time to plan it (0.9 of 1 ms; each connection plans a prepared statement's first five
-- executions anew). A queue that has a global limit, or is paused, claims nothing here: the
-- worker learns of a global limit when it reads its queues' limits again (limited_queues) and
-- then claims with claim_timed, which locks the queue's row first.
WITH wanted AS (
    SELECT w.queue, w.n,
           coalesce(s.fair OR s.key_concurrency_limit IS NOT NULL OR s.key_rate_limit IS NOT NULL, false) AS keyed
    FROM unnest($1::text[], $2::int[]) AS w(queue, n)
    LEFT JOIN {schema}.queues AS s ON s.name = w.queue
    -- As a range: see limited_claim.
    WHERE w.n BETWEEN 1 AND 2147483647
      AND s.paused IS NOT TRUE AND s.concurrency_limit IS NULL AND s.rate_limit IS NULL
),
{keyed_then_plain}
SELECT {claimed_arrays(c)} FROM claimed AS c;

-- name: next_wakeup
-- When the producer should look again without being told, in seconds from now (NULL: no
-- reason before its poll): the earliest pending job of the queues $1 that was not due when our
-- last claim ran (negative: due meanwhile, so look at once), and,
-- for their rate-limited queues with ready jobs, when the oldest claim leaves the full window,
-- and for their key-rate limited queues, when the key the last keyed claim held back for its
-- rate gets room (set by claim_keyed; one set after our last claim started and passed: look at
-- once; one that passed before it, that claim saw). Our last claim's time: $3, its database
-- time (claim_timed, claim_unlimited_timed), else $2 seconds ago (a claim that told none; that
-- is late by as long as this statement took to start, and a job due in between is missed).
WITH since AS (
    SELECT coalesce($3::timestamptz, {schema}.now() - make_interval(secs => $2)) AS at
),
due AS (
    SELECT min(c.run_at) AS at
    FROM unnest($1::text[]) AS w(queue)
    CROSS JOIN LATERAL (
        SELECT j.run_at FROM {schema}.jobs AS j
        WHERE j.status = 'pending' AND j.queue = w.queue AND j.run_at > (SELECT since.at FROM since)
        ORDER BY j.run_at
        LIMIT 1
    ) AS c
),
rate AS (
    SELECT min(w.oldest + make_interval(secs => s.rate_period)) AS at
    FROM {schema}.queues AS s
    CROSS JOIN LATERAL (
        SELECT min(t.at) AS oldest, count(*) AS n FROM unnest(s.recent_starts) AS t(at)
        WHERE t.at > {schema}.now() - make_interval(secs => s.rate_period)
    ) AS w
    WHERE s.name = ANY($1::text[]) AND NOT s.paused AND s.rate_limit IS NOT NULL AND w.n >= s.rate_limit
),
key_rate AS (
    SELECT min(s.key_rate_wake) AS at
    FROM {schema}.queues AS s
    WHERE s.name = ANY($1::text[]) AND NOT s.paused AND s.key_rate_limit IS NOT NULL
      AND s.key_rate_wake > (SELECT since.at FROM since)
)
SELECT extract(epoch FROM least((SELECT at FROM due), (SELECT at FROM rate), (SELECT at FROM key_rate))
               - {schema}.now())::float8;

-- name: ready_jobs
-- Whether any job of the queues $1 is ready now (pending, due, its queue not paused): what
-- run_until_empty() waits for when a limit holds its claims back.
SELECT EXISTS (
    SELECT FROM unnest($1::text[]) AS w(queue)
    WHERE NOT EXISTS (SELECT FROM {schema}.queues AS s WHERE s.name = w.queue AND s.paused)
      AND EXISTS (SELECT FROM {schema}.jobs AS j
                  WHERE j.status = 'pending' AND j.queue = w.queue AND j.run_at <= {schema}.now())
);

-- name: lock_queues
-- Lock the rows of the queues among $1 with a global limit (see limited_queues), in name order,
-- so that claims on them take turns and each sees the others' claims (the claim that follows
-- gets a fresh snapshot).
SELECT s.name FROM {schema}.queues AS s
WHERE s.name = ANY($1::text[]) AND {globally_limited}
ORDER BY s.name
FOR UPDATE;

-- name: limited_queues
-- Which of the queues $1 have a global limit or per-key settings (the producer claims those
-- with `claim`), whether a global limit (it locks those first, see lock_queues), and whether a
-- rate, global or per key (a claim such a rate cut short tells when to look again: see
-- next_wakeup; a concurrency limit wakes the workers itself when a slot frees), and whether a
-- per-key concurrency limit (a job buffered holds its key's slot: the producer buffers less).
-- Per-key settings alone need no lock of the queue: claim_keyed locks keys (migration 0022).
{limited_queue_rows};

-- name: limited_queues_at_version
-- A worker's first read, one round trip before its first claim: the schema's version (as
-- schema_version) beside each row of limited_queues, or beside NULLs when no queue is limited.
SELECT v.version, l.*
FROM (SELECT coalesce(max(m.version), 0) FROM {schema}.migrations AS m) AS v(version)
LEFT JOIN LATERAL ({limited_queue_rows}) AS l ON true;

-- fragment: limited_queue_rows
SELECT s.name, {globally_limited} AS locked,
       s.rate_limit IS NOT NULL OR s.key_rate_limit IS NOT NULL AS rated,
       s.key_concurrency_limit IS NOT NULL AS key_limited
FROM {schema}.queues AS s
WHERE s.name = ANY($1::text[]) AND {limited}

-- fragment: globally_limited
-- A queue row `s` with a global concurrency or rate limit: its claims take turns.
(s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL)

-- fragment: limited
-- A queue row `s` claimed by `claim` rather than claim_unlimited: one with a global limit, or
-- fair, or with a per-key limit (of concurrency or rate).
({globally_limited} OR s.fair OR s.key_concurrency_limit IS NOT NULL OR s.key_rate_limit IS NOT NULL)

-- name: set_paused
-- Pause or resume a queue; resuming wakes its workers.
WITH upserted AS (
    INSERT INTO {schema}.queues AS s (name, paused) VALUES ($1, $2)
    ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = {schema}.now()
    RETURNING s.name
)
SELECT u.name, CASE WHEN NOT $2 THEN pg_notify($3, u.name)::text END AS notified FROM upserted AS u;

-- name: set_limits
-- Set (or clear, with NULL) a queue's global concurrency and rate limits.
INSERT INTO {schema}.queues AS s (name, concurrency_limit, rate_limit, rate_period)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO UPDATE
SET concurrency_limit = EXCLUDED.concurrency_limit,
    rate_limit = EXCLUDED.rate_limit,
    rate_period = EXCLUDED.rate_period,
    updated_at = {schema}.now()
RETURNING s.name;

-- name: queue_settings
-- Every queue that has settings.
SELECT s.name, s.paused, s.concurrency_limit, s.rate_limit, s.rate_period, s.fair, s.key_concurrency_limit,
       s.key_rate_limit, s.key_rate_period
FROM {schema}.queues AS s
ORDER BY s.name;

-- name: set_key_limits
-- Set a queue's per-key settings: whether its claims take keys in turn ($2), its per-key
-- concurrency limit ($3, NULL: none) and rate limit ($5 starts per $6 seconds, NULL: none);
-- wakes its workers ($4), since a raised limit frees slots.
WITH upserted AS (
    INSERT INTO {schema}.queues AS s (name, fair, key_concurrency_limit, key_rate_limit, key_rate_period)
    VALUES ($1, $2, $3, $5, $6)
    ON CONFLICT (name) DO UPDATE
    SET fair = EXCLUDED.fair, key_concurrency_limit = EXCLUDED.key_concurrency_limit,
        key_rate_limit = EXCLUDED.key_rate_limit, key_rate_period = EXCLUDED.key_rate_period,
        key_rate_wake = NULL, updated_at = {schema}.now()
    RETURNING s.name
)
SELECT u.name, pg_notify($4, u.name)::text AS notified FROM upserted AS u;

-- name: cancel
-- Cancel a job: a pending one is moved to the archive as cancelled at once; a running one is
-- flagged and its worker told through NOTIFY on channel $2 (its poll is the backstop). Whoever
-- waits for the result of a job cancelled here is woken on channel $3.
WITH finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = $1 AND j.status IN ('pending', 'waiting')
    RETURNING {cancelled_columns}
),
{archived_as_cancelled},
flagged AS (
    UPDATE {schema}.jobs AS j
    SET cancel_requested = true
    WHERE j.id = $1 AND j.status = 'running'
    RETURNING j.id
),
notified AS (
    SELECT pg_notify($2, f.id::text) FROM flagged AS f
    UNION ALL
    SELECT pg_notify($3, '') WHERE EXISTS (SELECT FROM archived)
)
SELECT (SELECT count(*) FROM archived) AS cancelled,
       (SELECT count(*) FROM flagged) AS requested,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM flowed) AS notified;

-- name: cancel_requests
-- Which of the jobs $1 (held by this worker under attempts $2) have a cancel request.
-- Looked up one by one, by primary key, as in complete (LATERAL, never a join).
SELECT h.id, h.attempts
FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[])) AS h(id, attempts)
CROSS JOIN LATERAL (
    SELECT FROM {schema}.jobs AS j
    WHERE j.id = h.id AND j.attempts = h.attempts AND j.cancel_requested
      AND j.status || '' = 'running'  -- see claimed_rows
    OFFSET 0  -- keeps the planner from flattening this into a join
) AS j;

-- name: finish_cancelled
-- Record running jobs whose handlers were cancelled on request: moved to the archive as
-- cancelled. Fenced by the claim like complete; wakes result waiters ($4) and, for queues with
-- a concurrency limit, the workers waiting for the freed slot ($3). $5: the commit mode.
WITH claims AS MATERIALIZED (
    -- The batch's claims as the keys of one jsonb object: see complete.
    SELECT jsonb_object_agg(d.id || ':' || d.attempts, true) AS inputs
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[])) AS d(id, attempts)
),
finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE {claimed_rows}
    RETURNING {cancelled_columns}
),
{archived_as_cancelled},
notified AS (
    {slots_freed($3)}
    UNION ALL
    SELECT pg_notify($4, '') WHERE EXISTS (SELECT FROM finished)
)
SELECT count(*) + (SELECT count(*) FROM flowed) FROM notified WHERE {commit_mode($5)};

-- fragment: cancelled_columns
-- What a cancelled job keeps in the archive, as the DELETE that removes it returns it.
j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.dedup_key, j.created_at, j.group_id,
j.has_dependants, 'cancelled' AS status, j.progress

-- fragment: archived_as_cancelled
-- Move the `finished` jobs (see cancelled_columns) to the archive as cancelled; a row each.
archived AS (
    INSERT INTO {schema}.jobs_done
        (id, queue, task, args, status, priority, attempts, dedup_key, created_at, group_id, progress)
    SELECT r.id, r.queue, r.task, r.args, 'cancelled', r.priority, r.attempts, r.dedup_key, r.created_at,
           r.group_id, r.progress
    FROM finished AS r
    RETURNING id
),
{flowed}

-- name: database_now
-- The queue's clock: every schedule is computed from it, never from the worker's.
SELECT {schema}.now();

-- name: periodic_last_slot
-- Lock a periodic task's row and read its newest enqueued slot (no row: never seen).
SELECT p.last_slot FROM {schema}.periodic AS p WHERE p.name = $1 FOR UPDATE;

-- name: periodic_record_slot
-- Record slot $2 as the newest enqueued (or, for a new task, the starting point).
INSERT INTO {schema}.periodic AS p (name, last_slot) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET last_slot = EXCLUDED.last_slot, updated_at = {schema}.now()
WHERE p.last_slot < EXCLUDED.last_slot;

-- fragment: slots_freed
-- Wake (on the channel given where it is used) the workers of every queue with a concurrency
-- limit that the `finished` jobs free a slot of, so a claim the limit held back goes at once,
-- in any process. Unlimited queues send nothing.
SELECT pg_notify({arg}, q.name)
FROM {schema}.queues AS q
WHERE (q.concurrency_limit IS NOT NULL OR q.key_concurrency_limit IS NOT NULL)
  AND q.name IN (SELECT f.queue FROM finished AS f)

-- fragment: retries_due
-- Tell every worker of a queue when its earliest retry in this batch is due ('seconds queue').
SELECT pg_notify($11, extract(epoch FROM d.first - {schema}.now())::text || ' ' || d.queue)
FROM (SELECT f.queue, min(f.run_at) AS first FROM finished AS f WHERE f.status = 'pending' GROUP BY f.queue) AS d

-- fragment: flowed
-- Workflows (migration 0014): the `finished` jobs (with columns id, status, group_id and
-- has_dependants) that have dependants or a group are handed to jobs_finished() in this
-- transaction, which wakes or cancels their dependants and settles their groups. A batch of
-- plain jobs calls nothing (the aggregate over no row is filtered out by HAVING).
flowed AS (
    SELECT {schema}.jobs_finished(array_agg(f.id), array_agg(f.status::text), array_agg(f.group_id),
                                  array_agg(f.has_dependants))
    FROM finished AS f
    WHERE (f.has_dependants OR f.group_id IS NOT NULL) AND f.status IN ('succeeded', 'dead', 'cancelled')
    HAVING count(*) > 0
)

-- fragment: claimed_rows
-- The rows of jobs (as `j`) a finishing statement writes: those of the batch's ids ($1), each
-- found by primary key, that still run under one of the batch's claims ($2 their attempts).
-- When every claim of the batch is at the same attempt (the common batch: first attempts) that
-- is the row's attempt; else the row's claim ('id:attempt') is a key of the statement's
-- `claims` object (see complete), which is then the only time the object is built for the
-- fence (a third of complete's cost at 1,000 rows: text keys made and sought per row). A row
-- changed since the statement's snapshot (a heartbeat renewed it) is checked again before it
-- is written. `|| ''` keeps the planner on the primary key, off jobs_lease_idx: statistics
-- taken while nothing ran make that index look empty.
j.id = ANY ((SELECT $1::text::bigint[])::bigint[])
AND coalesce(j.attempts = (SELECT CASE WHEN min(a) = max(a) THEN min(a) END FROM unnest((SELECT $2::text::int[])) AS a),
             (SELECT c.inputs FROM claims AS c) ? (j.id || ':' || j.attempts))
AND j.status || '' = 'running'

-- fragment: claim_released
-- The end of an UPDATE that puts the `claimed_rows` of a batch back to pending or dead: the
-- claim's lease and holder cleared, the rows returned for the wake-ups.
lease_expires_at = NULL,
    locked_at = NULL,
    locked_by = NULL
WHERE {claimed_rows}
RETURNING j.id, j.queue, j.status, j.run_at, j.group_id, j.has_dependants

-- name: complete
-- Finish succeeded jobs: delete them, moving those that keep an archive into jobs_done in
-- the same statement. Fenced: only rows still running under the same claim (id, attempts).
-- `counted` adds them to the throughput counters of `queue_status`: a row per queue, minute
-- and shard (backend pid mod 8, so concurrent completers rarely share a row lock), upserted
-- in queue order so two completers lock their rows in the same order. $6: the commit mode.
WITH claims AS MATERIALIZED (
    -- Each claim's result keyed by the claim, 'id:attempt', in one jsonb object computed once,
    -- if ever: only archived jobs read their result, and the fence reads the keys only in a
    -- batch of mixed attempts (see claimed_rows). The DELETE finds its rows by `id = ANY ($1)`, one primary-key lookup per claim, and keeps
    -- those whose own claim is a key (a batch may also hold an older attempt's outcome of the
    -- same job), so the batch is never joined to jobs. (As a join, statistics taken while the
    -- table was nearly empty made the planner scan the whole table once per claim, slowly
    -- enough for leases to expire.) The arrays come through subqueries, as the object does, so
    -- the planner can count neither and price one scan of the table below many lookups. fail,
    -- reschedule and finish_cancelled do the same.
    SELECT jsonb_object_agg(d.id || ':' || d.attempts, d.result) AS inputs
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[]), (SELECT $3::text[])) AS d(id, attempts, result)
),
finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE {claimed_rows}
    RETURNING j.id, j.queue, j.task, j.args, j.priority, j.attempts, j.dedup_key, j.archive, j.created_at,
              CASE WHEN j.archive THEN (SELECT c.inputs FROM claims AS c) ->> (j.id || ':' || j.attempts) END AS result,
              j.group_id, j.has_dependants, 'succeeded' AS status, j.progress
),
archived AS (
    INSERT INTO {schema}.jobs_done
        (id, queue, task, args, status, priority, attempts, result, dedup_key, created_at, group_id, progress)
    SELECT f.id, f.queue, f.task, f.args, 'succeeded', f.priority, f.attempts,
           f.result::jsonb, f.dedup_key, f.created_at, f.group_id, f.progress
    FROM finished AS f
    WHERE f.archive
),
{flowed},
counted AS (
    INSERT INTO {schema}.queue_stats AS s (queue, minute, shard, succeeded)
    SELECT f.queue, date_trunc('minute', {schema}.now()), pg_backend_pid() % 8, count(*)
    FROM finished AS f
    GROUP BY f.queue
    ORDER BY f.queue
    ON CONFLICT (queue, minute, shard) DO UPDATE SET succeeded = s.succeeded + EXCLUDED.succeeded
),
notified AS (
    -- Wake whoever waits for a result (channel $4), once per batch that archived any, and the
    -- workers waiting for a freed slot of a queue with a concurrency limit (channel $5).
    SELECT pg_notify($4, '') WHERE EXISTS (SELECT FROM finished AS f WHERE f.archive)
    UNION ALL
    {slots_freed($5)}
)
-- `flowed` (0 or 1): whether the batch woke dependants or groups, which may have made jobs ready.
SELECT count(*), (SELECT count(*) FROM notified) + (SELECT count(*) FROM flowed) AS notified,
       (SELECT count(*) FROM flowed) AS flowed
FROM finished WHERE {commit_mode($6)};

-- name: fail
-- Record failed attempts: back to pending after an exponential backoff with jitter computed
-- here from database time, or dead when attempts are spent or the handler asked for it.
-- $4 is an explicit delay in seconds (NULL: use the backoff of $6..$9). Fenced like complete.
-- Wakes: the workers of a limited queue whose slot freed ($10), every worker of a queue about
-- the earliest retry's due time ($11, 'seconds queue'), and result waiters of dead jobs ($12).
-- $13: the commit mode.
WITH claims AS MATERIALIZED (
    -- Each claim's inputs keyed by the claim: see complete.
    SELECT jsonb_object_agg(f.id || ':' || f.attempts, jsonb_build_object(
               'error', f.error, 'delay', f.delay, 'dead', f.dead,
               'base', f.base, 'factor', f.factor, 'max_delay', f.max_delay, 'jitter', f.jitter)) AS inputs
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[]), (SELECT $3::text[]), (SELECT $4::float8[]),
                (SELECT $5::bool[]),
                (SELECT $6::float8[]), (SELECT $7::float8[]), (SELECT $8::float8[]), (SELECT $9::float8[]))
         AS f(id, attempts, error, delay, dead, base, factor, max_delay, jitter)
),
finished AS (
UPDATE {schema}.jobs AS j
SET (status, run_at, last_error) = (
        SELECT CASE WHEN f.dead OR j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
               CASE
                   WHEN f.dead OR j.attempts >= j.max_attempts THEN j.run_at
                   ELSE {schema}.now() + make_interval(secs => coalesce(
                       f.delay,
                       least(f.max_delay,
                             f.base * power(f.factor, least(j.attempts - 1, 64))
                             * (1 + f.jitter * (2 * random() - 1)))))
               END,
               f.error
        FROM jsonb_to_record((SELECT c.inputs FROM claims AS c) -> (j.id || ':' || j.attempts))
             AS f(error text, delay float8, dead bool, base float8, factor float8, max_delay float8, jitter float8)
    ),
    {claim_released}
),
notified AS (
    {slots_freed($10)}
    UNION ALL
    {retries_due}
    UNION ALL
    SELECT pg_notify($12, '') WHERE EXISTS (SELECT FROM finished AS f WHERE f.status = 'dead')
),
{flowed}
SELECT f.id, f.status, (SELECT count(*) FROM notified) + (SELECT count(*) FROM flowed) AS notified
FROM finished AS f
WHERE {commit_mode($13)};

-- name: reschedule
-- Put running jobs back to pending after a delay without spending an attempt (snooze, an
-- interrupted shutdown, a job claimed but never started). Attempts never go down, so they stay
-- a fence; max_attempts goes up by one instead. Wakes as fail does ($5 freed slots of limited
-- queues and jobs due now, $6 the earliest later due time per queue). $7: the commit mode.
WITH claims AS MATERIALIZED (
    -- Each claim's inputs keyed by the claim: see complete.
    SELECT jsonb_object_agg(r.id || ':' || r.attempts, jsonb_build_object('delay', r.delay, 'note', r.note)) AS inputs
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[]), (SELECT $3::float8[]), (SELECT $4::text[]))
         AS r(id, attempts, delay, note)
),
finished AS (
UPDATE {schema}.jobs AS j
SET status = 'pending',
    (run_at, last_error) = (
        SELECT {schema}.now() + make_interval(secs => r.delay), coalesce(r.note, j.last_error)
        FROM jsonb_to_record((SELECT c.inputs FROM claims AS c) -> (j.id || ':' || j.attempts))
             AS r(delay float8, note text)
    ),
    max_attempts = j.max_attempts + 1,
    {claim_released}
),
notified AS (
    SELECT pg_notify($5, q.queue)
    FROM (SELECT DISTINCT f.queue FROM finished AS f WHERE f.run_at <= {schema}.now()) AS q
    UNION ALL
    {slots_freed($5)}
    UNION ALL
    SELECT pg_notify($6, extract(epoch FROM d.first - {schema}.now())::text || ' ' || d.queue)
    FROM (SELECT f.queue, min(f.run_at) AS first FROM finished AS f WHERE f.run_at > {schema}.now() GROUP BY f.queue) AS d
)
SELECT f.id, (SELECT count(*) FROM notified) AS notified FROM finished AS f WHERE {commit_mode($7)};

-- name: write_progress
-- Store the progress that handlers reported (aioqueue.set_progress, migration 0019): for each
-- claim (id $1, attempt $2) its latest value $3 (a JSON object), stamped with the queue's time.
-- Fenced like complete: a value from an attempt that no longer holds its job is dropped, so a
-- reaped attempt never overwrites the new attempt's progress, nor a finished job's. $4: the
-- commit mode. Returns how many jobs it wrote.
WITH claims AS MATERIALIZED (
    -- Each claim's value keyed by the claim: see complete.
    SELECT jsonb_object_agg(p.id || ':' || p.attempts, p.progress::jsonb) AS inputs
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[]), (SELECT $3::text[])) AS p(id, attempts, progress)
),
written AS (
    UPDATE {schema}.jobs AS j
    SET progress = ((SELECT c.inputs FROM claims AS c) -> (j.id || ':' || j.attempts))
                   || jsonb_build_object('at', {schema}.now())
    WHERE {claimed_rows}
    RETURNING j.id
)
SELECT count(*) FROM written WHERE {commit_mode($4)};

-- name: extend_leases
-- Heartbeat: push out the leases of every claim (id $1, attempt $2) this worker holds; returns
-- the claims it still holds, so the caller learns which it lost. Fenced by the claim, so a lease
-- that expired but was not reaped yet is renewed only for the attempt that still holds the row.
-- It never waits for a row lock (SKIP LOCKED): a row another transaction holds is being written
-- by this worker's completer (its outcome) or by the reaper or an operator, and the heartbeat
-- takes row locks in no set order, so waiting could deadlock with a completer writing
-- thousands of outcomes. A skipped row is renewed at the next beat if it is still held; it is
-- reported held while it still matches the claim in this statement's snapshot.
WITH held AS (
    -- Each claim looked up by primary key, one by one, as in complete (LATERAL, never a join):
    -- whether its row still matches in this statement's snapshot (then it is held), and whether
    -- it could be locked now (then its lease is renewed).
    SELECT h.id, h.attempts, f.id IS NOT NULL AS free
    FROM unnest((SELECT $1::text::bigint[]), (SELECT $2::text::int[])) AS h(id, attempts)
    CROSS JOIN LATERAL (
        SELECT FROM {schema}.jobs AS j
        WHERE j.id = h.id AND j.attempts = h.attempts AND j.status || '' = 'running'  -- see claimed_rows
        OFFSET 0  -- keeps the planner from flattening this into a join
    ) AS j
    LEFT JOIN LATERAL (
        SELECT r.id FROM {schema}.jobs AS r
        WHERE r.id = h.id AND r.attempts = h.attempts AND r.status || '' = 'running'
        FOR UPDATE OF r SKIP LOCKED
    ) AS f ON true
),
renewed AS (
    UPDATE {schema}.jobs AS j
    SET lease_expires_at = {schema}.now() + make_interval(secs => $3)
    WHERE j.id = ANY (ARRAY(SELECT h.id FROM held AS h WHERE h.free))
)
SELECT h.id, h.attempts FROM held AS h;

-- name: reap_expired
-- Return running jobs whose lease expired (their worker died or stalled) to pending, or to
-- dead when their attempts are spent; wake the workers of their queues.
WITH expired AS MATERIALIZED (
    SELECT j.id
    FROM {schema}.jobs AS j
    WHERE j.status = 'running' AND j.lease_expires_at < {schema}.now()
    ORDER BY j.lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
        run_at = {schema}.now(),
        last_error = 'LeaseExpired: worker ' || coalesce(j.locked_by, '?')
                     || ' stopped renewing its lease (it crashed, hung or lost its connection)',
        lease_expires_at = NULL,
        locked_at = NULL,
        locked_by = NULL
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.queue, j.status, j.group_id, j.has_dependants
),
finished AS (SELECT * FROM reaped),
{flowed},
notified AS (
    -- Every queue that got a job back, or a slot freed (a limited queue), is woken ($2), and
    -- whoever waits for the result of a job that went dead ($3).
    SELECT pg_notify($2, q.queue) FROM (SELECT DISTINCT r.queue FROM reaped AS r) AS q
    UNION ALL
    SELECT pg_notify($3, '') WHERE EXISTS (SELECT FROM reaped AS r WHERE r.status = 'dead')
)
SELECT r.id, r.status, (SELECT count(*) FROM notified) + (SELECT count(*) FROM flowed) AS notified
FROM reaped AS r;

-- name: prune_archive
-- Retention (see archive_retire in migration 0016): drop the archive's partitions that ended
-- more than $1 seconds ago, delete up to $2 such rows from each of those without a day.
SELECT r.dropped, r.deleted FROM {schema}.archive_retire(make_interval(secs => $1), $2) AS r;

-- name: archive_partitions
-- Make the archive's partitions from today to $1 days ahead that are missing; how many.
SELECT {schema}.archive_partitions($1);

-- name: vacuum_candidates
-- The queue's tables whose dead rows (the server's statistics: VACUUM resets the count) passed
-- $1 and a fifth of their live rows, most first: each as a qualified name the server quoted,
-- and whether this role may VACUUM it (it, or the database, is owned by a role it belongs to;
-- a superuser belongs to every role).
SELECT format('%I.%I', t.schemaname, t.relname) AS target, t.n_dead_tup AS dead,
       pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE') AS allowed
FROM pg_catalog.pg_stat_user_tables AS t
JOIN pg_catalog.pg_class AS c ON c.oid = t.relid
JOIN pg_catalog.pg_database AS d ON d.datname = current_database()
WHERE t.schemaname = '{schema}' AND t.n_dead_tup >= greatest($1::bigint, t.n_live_tup / 5)
ORDER BY t.n_dead_tup DESC;

-- name: vacuum_table
-- VACUUM one table ({table}: a name vacuum_candidates returned), outside any transaction.
-- SKIP_LOCKED: a table another worker (or autovacuum) is vacuuming is skipped at once, not
-- waited for, so workers take turns on the lock VACUUM takes anyway (a session's advisory lock
-- would not survive a transaction pooler).
VACUUM (SKIP_LOCKED) {table};

-- name: get_job
-- One job by id, live or archived.
SELECT j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority, j.attempts,
       j.max_attempts, j.run_at, j.created_at, j.last_error, j.dedup_key,
       NULL::text AS result, NULL::timestamptz AS finished_at, j.progress::text AS progress
FROM {schema}.jobs AS j WHERE j.id = $1
UNION ALL
SELECT d.id, d.queue, d.task, d.args::text, d.status, d.priority, d.attempts,
       d.attempts, d.created_at, d.created_at, NULL, d.dedup_key,
       d.result::text, d.finished_at, d.progress::text
FROM {schema}.jobs_done AS d WHERE d.id = $1
LIMIT 1;

-- name: list_dead
-- Dead jobs, newest first, optionally of one queue.
SELECT j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority, j.attempts,
       j.max_attempts, j.run_at, j.created_at, j.last_error, j.dedup_key,
       NULL::text AS result, NULL::timestamptz AS finished_at, j.progress::text AS progress
FROM {schema}.jobs AS j
WHERE j.status = 'dead' AND ($1::text IS NULL OR j.queue = $1)
ORDER BY j.id DESC
LIMIT $2;

-- name: retry_dead
-- Send dead jobs back to pending now, with as many attempts again as they had: max_attempts
-- grows rather than attempts shrinking, so attempts stay a fence. $1 NULL means every dead
-- job (of queue $2 when given). A retried job's workflow resumes (resume_workflows(),
-- migration 0015): the dependants it cancelled wait again, its group counts it as not finished.
WITH retried AS (
    UPDATE {schema}.jobs AS j
    SET status = 'pending',
        run_at = {schema}.now(),
        max_attempts = j.attempts + j.max_attempts
    FROM (
        SELECT d.id FROM {schema}.jobs AS d
        WHERE d.status = 'dead'
          AND ($1::bigint[] IS NULL OR d.id = ANY($1))
          AND ($2::text IS NULL OR d.queue = $2)
        ORDER BY d.id  -- two retries of overlapping sets lock in one order
        FOR UPDATE
    ) AS dead
    WHERE j.id = dead.id
    RETURNING j.id, j.queue, j.group_id, j.has_dependants
),
resumed AS (
    SELECT {schema}.resume_workflows(array_agg(r.id)) AS n
    FROM retried AS r
    WHERE r.has_dependants OR r.group_id IS NOT NULL
    HAVING count(*) > 0
)
SELECT r.id, r.queue FROM retried AS r WHERE (SELECT count(*) FROM resumed) >= 0;

-- name: purge_dead
-- Delete dead jobs; $1 NULL means every dead job (of queue $2 when given).
DELETE FROM {schema}.jobs AS j
WHERE j.status = 'dead'
  AND ($1::bigint[] IS NULL OR j.id = ANY($1))
  AND ($2::text IS NULL OR j.queue = $2)
RETURNING j.id;

-- name: queue_status
-- Per queue: how many jobs wait, how many of those are ready now, are running, are dead, wait
-- for other jobs (workflows), how long the oldest ready job has waited, and how many jobs succeeded in the last 60 seconds
-- (the current minute's count plus the part of the previous minute's still inside the window).
WITH live AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.status = 'pending') AS pending,
           count(*) FILTER (WHERE j.status = 'pending' AND j.run_at <= {schema}.now()) AS ready,
           count(*) FILTER (WHERE j.status = 'pending' AND j.run_at > {schema}.now()) AS scheduled,
           count(*) FILTER (WHERE j.status = 'running') AS running,
           count(*) FILTER (WHERE j.status = 'dead') AS dead,
           count(*) FILTER (WHERE j.status = 'waiting') AS waiting,
           extract(epoch FROM {schema}.now() - min(j.run_at) FILTER (
               WHERE j.status = 'pending' AND j.run_at <= {schema}.now()))::float8 AS oldest_ready_age
    FROM {schema}.jobs AS j
    GROUP BY j.queue
),
done AS (
    SELECT s.queue,
           sum(s.succeeded * CASE
               WHEN s.minute = date_trunc('minute', {schema}.now()) THEN 1.0
               ELSE 1.0 - extract(epoch FROM {schema}.now() - date_trunc('minute', {schema}.now())) / 60.0
           END) AS completed
    FROM {schema}.queue_stats AS s
    WHERE s.minute >= date_trunc('minute', {schema}.now()) - interval '1 minute'
    GROUP BY s.queue
)
SELECT queue,
       coalesce(live.pending, 0) AS pending,
       coalesce(live.ready, 0) AS ready,
       coalesce(live.scheduled, 0) AS scheduled,
       coalesce(live.running, 0) AS running,
       coalesce(live.dead, 0) AS dead,
       coalesce(live.waiting, 0) AS waiting,
       live.oldest_ready_age,
       round(coalesce(done.completed, 0))::bigint AS completed_last_minute
FROM live FULL JOIN done USING (queue)
ORDER BY queue;

-- name: prune_key_starts
-- Maintenance: delete up to $1 rows of key_starts (migration 0024) that no claim counts any
-- more: starts that left their queue's key-rate window, and every start of a queue without a
-- key rate now. Oldest first, from the index on started_at.
DELETE FROM {schema}.key_starts AS k
WHERE k.ctid = ANY (ARRAY(
    SELECT r.ctid
    FROM {schema}.key_starts AS r
    LEFT JOIN {schema}.queues AS s ON s.name = r.queue
    WHERE r.started_at <= coalesce({schema}.now() - make_interval(secs => s.key_rate_period), 'infinity')
    ORDER BY r.started_at
    LIMIT $1));

-- name: prune_queue_stats
-- Maintenance: drop throughput counters older than $1 seconds.
DELETE FROM {schema}.queue_stats AS s
WHERE s.minute < date_trunc('minute', {schema}.now()) - make_interval(secs => $1);

-- name: register_worker
-- The worker registry's one statement per interval: insert worker $1's row, or refresh its
-- last_seen, delete the rows of workers silent for more than $7 seconds (they crashed), and
-- record the queue ($9) of each task the worker serves ($8), which a job enqueued by name
-- without a queue goes to (queue_of). The worker sends its tasks until this has succeeded
-- once, empty arrays after. In name order, so workers starting together lock rows in one order.
-- $10: what the worker did so far (its WorkerStats, a JSON object), kept in its row. On the wall clock: the registry tells live processes from dead ones by the real seconds
-- between their beats, whatever time a test gives the queue.
WITH expired AS (
    DELETE FROM {schema}.workers AS w
    WHERE w.last_seen < pg_catalog.now() - make_interval(secs => $7) AND w.name <> $1
),
recorded AS (
    INSERT INTO {schema}.tasks AS t (name, queue)
    SELECT s.name, s.queue FROM unnest($8::text[], $9::text[]) AS s(name, queue)
    ORDER BY s.name
    ON CONFLICT (name) DO UPDATE SET queue = EXCLUDED.queue, seen_at = pg_catalog.now()
)
INSERT INTO {schema}.workers AS w (name, host, pid, queues, concurrency, version, counts)
VALUES ($1, $2, $3, $4::text[], $5, $6, $10::jsonb)
ON CONFLICT (name) DO UPDATE SET last_seen = pg_catalog.now(), counts = EXCLUDED.counts
RETURNING w.started_at;

-- name: unregister_worker
-- A worker stops cleanly: its row goes at once. The commit does not wait for its WAL flush
-- ($2: 'off'): it is the last statement of a worker's run, and a server crash that lost it
-- would only leave a row that expires like a crashed worker's.
DELETE FROM {schema}.workers AS w WHERE w.name = $1 AND {commit_mode($2)};

-- name: list_workers
-- Live workers (seen in the last $1 seconds of the wall clock, as register_worker counts them),
-- oldest first, with how many jobs each runs and what it did so far (counts, as of its last refresh).
SELECT w.name, w.host, w.pid, w.queues, w.concurrency, w.version, w.started_at, w.last_seen,
       (SELECT count(*) FROM {schema}.jobs AS j
        WHERE j.status = 'running' AND j.locked_by = w.name) AS running,
       w.counts::text AS counts
FROM {schema}.workers AS w
WHERE w.last_seen >= pg_catalog.now() - make_interval(secs => $1)
ORDER BY w.started_at, w.name;

-- name: list_periodic
-- Every periodic task's newest enqueued slot.
SELECT p.name, p.last_slot, p.updated_at FROM {schema}.periodic AS p ORDER BY p.name;

-- name: without_jit
-- For the rest of the transaction, no JIT compilation: a statement that reads a bounded number
-- of index entries can still be estimated (for want of statistics on tiny tables and recursive
-- CTEs) to cost enough to be compiled, and compiling takes far longer than running it.
SET LOCAL jit = off;

-- fragment: queues_with
-- The queues that have jobs of one status, as the recursive CTE with_STATUS: a skip scan of
-- the status's partial index (one probe per queue, never a read of a queue's jobs). The status
-- is a word in this file, `{queues_with(pending)}`, so that each use names its index's
-- predicate as a constant the planner can match.
with_{arg}(queue) AS (
    (SELECT j.queue FROM {schema}.jobs AS j WHERE j.status = '{arg}' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.status = '{arg}' AND j.queue > l.queue
            ORDER BY j.queue LIMIT 1)
    FROM with_{arg} AS l
    WHERE l.queue IS NOT NULL
)

-- name: queue_overview
-- The dashboard's queues page: every queue that has jobs, settings or recent throughput (and
-- the queues $1), with counts bounded at $2 so that a deep backlog costs a bounded number of
-- index entries, never a scan. The queues with pending jobs come from a skip scan of
-- jobs_ready_idx, those with dead jobs from one of jobs_dead_idx (one probe per queue each);
-- each queue's pending priorities from a skip scan of jobs_ready_idx, so that ready (run_at <=
-- now) and scheduled are range reads of that index per priority, and the oldest ready job is
-- the first entry of a priority. Each bounded count is ordered as its index is, so that no plan
-- prefers a scan that a LIMIT would cut short only when rows match early (a count of none would
-- read the whole table).
WITH RECURSIVE {queues_with(pending)},
{queues_with(dead)},
names AS (
    SELECT l.queue FROM with_pending AS l WHERE l.queue IS NOT NULL
    UNION SELECT l.queue FROM with_dead AS l WHERE l.queue IS NOT NULL
    UNION SELECT r.queue FROM {schema}.jobs AS r WHERE r.status = 'running'
    UNION SELECT s.name FROM {schema}.queues AS s
    UNION SELECT st.queue FROM {schema}.queue_stats AS st
    UNION SELECT k.queue FROM unnest($1::text[]) AS k(queue)
),
pending AS (
    SELECT n.queue,
           least($2, sum(per.ready)) AS ready,
           least($2, sum(per.scheduled)) AS scheduled,
           min(per.oldest_ready) AS oldest_ready
    FROM names AS n
    CROSS JOIN LATERAL (
        WITH RECURSIVE prio(priority) AS (
            (SELECT j.priority FROM {schema}.jobs AS j
             WHERE j.status = 'pending' AND j.queue = n.queue
             ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM {schema}.jobs AS j
                    WHERE j.status = 'pending' AND j.queue = n.queue AND j.priority < p.priority
                    ORDER BY j.priority DESC LIMIT 1)
            FROM prio AS p
            WHERE p.priority IS NOT NULL
        )
        SELECT
            (SELECT count(*) FROM (
                SELECT FROM {schema}.jobs AS j
                WHERE j.status = 'pending' AND j.queue = n.queue AND j.priority = p.priority
                  AND j.run_at <= {schema}.now()
                ORDER BY j.run_at
                LIMIT $2) AS x) AS ready,
            (SELECT count(*) FROM (
                SELECT FROM {schema}.jobs AS j
                WHERE j.status = 'pending' AND j.queue = n.queue AND j.priority = p.priority
                  AND j.run_at > {schema}.now()
                ORDER BY j.run_at
                LIMIT $2) AS x) AS scheduled,
            (SELECT j.run_at FROM {schema}.jobs AS j
             WHERE j.status = 'pending' AND j.queue = n.queue AND j.priority = p.priority
               AND j.run_at <= {schema}.now()
             ORDER BY j.priority DESC, j.run_at
             LIMIT 1) AS oldest_ready
        FROM prio AS p
        WHERE p.priority IS NOT NULL
    ) AS per
    GROUP BY n.queue
)
SELECT n.queue,
       coalesce(p.ready, 0) AS ready,
       coalesce(p.scheduled, 0) AS scheduled,
       (SELECT count(*) FROM {schema}.jobs AS r WHERE r.status = 'running' AND r.queue = n.queue) AS running,
       (SELECT count(*) FROM (
           SELECT FROM {schema}.jobs AS d WHERE d.status = 'dead' AND d.queue = n.queue
           ORDER BY d.id LIMIT $2) AS x) AS dead,
       extract(epoch FROM {schema}.now() - p.oldest_ready)::float8 AS oldest_ready_age,
       coalesce(s.paused, false) AS paused, s.concurrency_limit, s.rate_limit, s.rate_period
FROM names AS n
LEFT JOIN pending AS p ON p.queue = n.queue
LEFT JOIN {schema}.queues AS s ON s.name = n.queue
ORDER BY n.queue;

-- name: queue_throughput
-- Jobs succeeded per queue and minute over the last $1 minutes, and the database's clock.
SELECT s.queue, s.minute, sum(s.succeeded)::bigint AS succeeded, {schema}.now() AS now
FROM {schema}.queue_stats AS s
WHERE s.minute >= date_trunc('minute', {schema}.now()) - make_interval(mins => $1)
GROUP BY s.queue, s.minute
ORDER BY s.queue, s.minute;

-- fragment: listed_columns
j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority, j.attempts, j.max_attempts,
j.run_at, j.created_at, left(j.last_error, 500) AS last_error, j.partition_key

-- fragment: page_of_candidates
-- The rest of a listing, after its `candidates` (at most $6 rows, newest first, read through
-- an index that matches them exactly or, for pending jobs, the primary key): the first $7 that
-- match the filters left (`matched`, which reads the candidates only as far as it needs), and
-- the page's jobs (looked up by primary key, or the matched rows themselves). $8: only the jobs
-- of this partition key (NULL: any; the archive keeps no key, so none of it matches). `scanned` and `scanned_to` say how far the read went when the
-- page came up short (then every candidate was read; otherwise they are 0 and NULL, and nothing
-- more is read), so a caller continues a sparse search from there. The one-row `s` keeps that
-- summary when nothing matched. No ORDER BY over the candidates: they come out of their
-- (single, ordered) index scan, or a merge of the partitions' ordered scans, newest first, and
-- a sort would read all $6.
matched AS MATERIALIZED (
    SELECT c.* FROM candidates AS c
    WHERE c.status = $1
      AND ($2::text IS NULL OR c.queue = $2)
      AND ($3::text IS NULL OR c.task = $3)
      AND ($5::jsonb IS NULL OR c.args @> $5::jsonb)
      AND ($8::text IS NULL OR c.partition_key = $8)
    LIMIT $7
),
s AS (
    SELECT count(*) AS scanned, min(c.id) AS scanned_to FROM candidates AS c
    WHERE (SELECT count(*) FROM matched) < $7
)

-- fragment: live_candidates
-- What the listings of live jobs read of a job (j): each of list_jobs' branches, and
-- list_running_jobs, filters these rows through an index of its own.
SELECT j.id, j.status, j.queue, j.task, j.args, j.partition_key
FROM {schema}.jobs AS j

-- name: list_jobs
-- A page of pending or dead jobs (status $1), newest first, below keyset $4 (an id; NULL: the
-- top), optionally of queue $2, task $3, with arguments containing $5, of partition key $8 (see
-- page_of_candidates).
-- Pending jobs have no listing index (an enqueue pays for none): their candidates are the
-- newest $6 rows of the primary key, whatever their status, filtered after. Dead jobs are read
-- through the dead-only index that matches the filter (queue: jobs_dead_idx; else task:
-- jobs_dead_task_idx; else jobs_dead_list_idx). One branch runs; the others stop at their
-- one-time filter. The keyset is `id < coalesce($4, max)`, an index condition in any plan.
WITH candidates AS MATERIALIZED (
    ({live_candidates}
     WHERE $1::text = 'pending' AND j.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY j.id DESC
     LIMIT $6)
    UNION ALL
    ({live_candidates}
     WHERE $1::text = 'dead' AND j.status = 'dead' AND j.queue = $2
       AND j.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY j.id DESC
     LIMIT $6)
    UNION ALL
    ({live_candidates}
     WHERE $1::text = 'dead' AND $2::text IS NULL AND j.status = 'dead' AND j.task = $3
       AND j.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY j.id DESC
     LIMIT $6)
    UNION ALL
    ({live_candidates}
     WHERE $1::text = 'dead' AND $2::text IS NULL AND $3::text IS NULL AND j.status = 'dead'
       AND j.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY j.id DESC
     LIMIT $6)
),
{page_of_live_jobs};

-- fragment: page_of_live_jobs
-- The end of a listing of live jobs: the page of the candidates (see page_of_candidates), with
-- the columns every listing shows.
{page_of_candidates}
SELECT s.scanned, s.scanned_to, {listed_columns}, j.locked_by, NULL::timestamptz AS finished_at
FROM s
LEFT JOIN (matched AS m JOIN {schema}.jobs AS j ON j.id = m.id) ON true
ORDER BY j.id DESC

-- name: list_running_jobs
-- list_jobs for running jobs: few (at most the workers' slots), read through jobs_lease_idx
-- and sorted.
WITH candidates AS MATERIALIZED (
    {live_candidates}
    WHERE j.status = 'running'
      AND ($2::text IS NULL OR j.queue = $2)
      AND ($3::text IS NULL OR j.task = $3)
      AND ($8::text IS NULL OR j.partition_key = $8)
      AND j.id < coalesce($4::bigint, 9223372036854775807)
      AND $1::text = 'running'
    ORDER BY j.id DESC
    LIMIT $6
),
{page_of_live_jobs};

-- fragment: archive_candidates
-- What list_archived_jobs reads of an archived job (d): each of its branches filters these
-- rows through an index of its own.
SELECT d.id, d.status, d.queue, d.task, d.args, NULL::text AS partition_key, d.priority, d.attempts,
       d.created_at, d.finished_at
FROM {schema}.jobs_done AS d

-- name: list_archived_jobs
-- list_jobs over the archive: succeeded or cancelled jobs (status $1), read through the
-- jobs_done index that matches the filter (queue: jobs_done_list_queue_idx; else task:
-- jobs_done_list_task_idx; else jobs_done_list_status_idx); a task filter with a queue one
-- is applied to the candidates. The page is the matched candidates, which carry every column
-- it shows: looked up by id again, each row would probe every partition's id index.
WITH candidates AS MATERIALIZED (
    ({archive_candidates}
     WHERE d.status = $1 AND d.queue = $2
       AND d.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY d.id DESC
     LIMIT $6)
    UNION ALL
    ({archive_candidates}
     WHERE $2::text IS NULL AND d.status = $1 AND d.task = $3
       AND d.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY d.id DESC
     LIMIT $6)
    UNION ALL
    ({archive_candidates}
     WHERE $2::text IS NULL AND $3::text IS NULL AND d.status = $1
       AND d.id < coalesce($4::bigint, 9223372036854775807)
     ORDER BY d.id DESC
     LIMIT $6)
),
{page_of_candidates}
SELECT s.scanned, s.scanned_to, j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority,
       j.attempts, j.attempts AS max_attempts, j.created_at AS run_at, j.created_at,
       NULL::text AS last_error, NULL::text AS partition_key, NULL::text AS locked_by, j.finished_at
FROM s
LEFT JOIN matched AS j ON true
ORDER BY j.id DESC;

-- name: get_job_detail
-- One job by id, live or archived, with its lease and the worker that holds it.
SELECT j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority, j.attempts,
       j.max_attempts, j.run_at, j.created_at, j.last_error, j.dedup_key,
       NULL::text AS result, NULL::timestamptz AS finished_at,
       j.lease_expires_at, j.locked_at, j.locked_by, j.cancel_requested, j.progress::text AS progress
FROM {schema}.jobs AS j WHERE j.id = $1
UNION ALL
SELECT d.id, d.queue, d.task, d.args::text, d.status, d.priority, d.attempts,
       d.attempts, d.created_at, d.created_at, NULL, d.dedup_key,
       d.result::text, d.finished_at, NULL, NULL, NULL, false, d.progress::text
FROM {schema}.jobs_done AS d WHERE d.id = $1
LIMIT 1;

-- name: cancel_jobs
-- cancel for many jobs $1: pending ones are archived as cancelled at once, running ones are
-- flagged and their workers told on channel $2; whoever waits for the result of a job cancelled
-- here is woken on channel $3, as by cancel. Returns each job touched and what happened.
WITH finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status IN ('pending', 'waiting')
    RETURNING {cancelled_columns}
),
{archived_as_cancelled},
flagged AS (
    UPDATE {schema}.jobs AS j
    SET cancel_requested = true
    WHERE j.id = ANY($1::bigint[]) AND j.status = 'running'
    RETURNING j.id
),
notified AS (
    SELECT pg_notify($2, f.id::text) FROM flagged AS f
    UNION ALL
    SELECT pg_notify($3, '') WHERE EXISTS (SELECT FROM archived)
)
SELECT a.id, 'cancelled' AS outcome FROM archived AS a
UNION ALL
SELECT f.id, 'requested' FROM flagged AS f
WHERE (SELECT count(*) FROM notified) + (SELECT count(*) FROM flowed) >= 0;

-- name: delete_jobs
-- Delete jobs $1 for good: live ones that are not running (cancel those first), and archived
-- ones. Returns their ids.
WITH live AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY($1::bigint[]) AND j.status <> 'running'
    RETURNING j.id
),
archived AS (
    DELETE FROM {schema}.jobs_done AS d
    WHERE d.id = ANY($1::bigint[])
    RETURNING d.id
)
SELECT l.id FROM live AS l
UNION ALL
SELECT a.id FROM archived AS a;

-- name: find_jobs
-- aioqueue.testing's view of the live jobs of status $1 (of task $2 and queue $3 when given),
-- oldest first, with get_job's columns. For a test's tables: it reads them whole.
SELECT j.id, j.queue, j.task, j.args::text AS args, j.status, j.priority, j.attempts,
       j.max_attempts, j.run_at, j.created_at, j.last_error, j.dedup_key,
       NULL::text AS result, NULL::timestamptz AS finished_at, j.progress::text AS progress
FROM {schema}.jobs AS j
WHERE j.status = $1 AND ($2::text IS NULL OR j.task = $2) AND ($3::text IS NULL OR j.queue = $3)
ORDER BY j.id;

-- name: clock_state
-- aioqueue.testing: the queue's time and the wall clock's, both of this transaction (so their
-- difference is the clock's offset exactly), and whether the queue's clock stands still (its
-- body reads no wall clock: see redefine_clock).
SELECT {schema}.now() AS now, pg_catalog.now() AS wall,
       strpos(p.prosrc, 'pg_catalog.now()') = 0 AS frozen
FROM pg_catalog.pg_proc AS p
WHERE p.oid = '{schema}.now()'::regprocedure;

-- name: set_clock
-- aioqueue.testing, first of two statements in one transaction: what redefine_clock writes,
-- kept in this transaction's settings, where it reads them (DDL takes no parameters). $1: the
-- offset from the wall clock in microseconds; $2: the instant the clock stands at, or NULL for a
-- clock that runs. The instant goes as ISO 8601 in UTC, which every session reads the same way.
SELECT set_config('aioqueue.clock_offset', $1::bigint::text, true),
       set_config('aioqueue.clock_frozen_at',
                  coalesce(to_char($2::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), ''),
                  true);

-- name: redefine_clock
-- aioqueue.testing: redefine {schema}.now() as set_clock said: the wall clock moved by the
-- offset, or one instant; with neither, the body migration 0012 gives it. CREATE OR REPLACE
-- keeps the function's identity (its grants, the column defaults that call it), and every
-- session's cached plans that inlined it are planned again at their next run. The values are
-- cast to their types here, so nothing but a number or a timestamp reaches the body.
DO $clock$
DECLARE
    offset_us bigint := current_setting('aioqueue.clock_offset')::bigint;
    frozen_at timestamptz := nullif(current_setting('aioqueue.clock_frozen_at'), '')::timestamptz;
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION {schema}.now() RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS %L',
        CASE WHEN frozen_at IS NOT NULL
                 THEN format('SELECT %L::timestamptz',
                             to_char(frozen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
             WHEN offset_us = 0 THEN 'SELECT pg_catalog.now()'
             ELSE format('SELECT pg_catalog.now() + %L::interval', offset_us || ' microseconds') END);
END
$clock$;

-- name: wake_due
-- aioqueue.testing, after the clock moved: tell the workers of every queue with pending jobs to
-- look now and ask again when their next job is due (on channel $1, payload '0 queue').
SELECT count(pg_notify($1, '0 ' || q.queue))
FROM (SELECT DISTINCT j.queue FROM {schema}.jobs AS j WHERE j.status = 'pending') AS q;

-- name: publish_events
-- The outbox's way in (migration 0013): write events of stream $1, keys $2 and JSON payloads $3
-- (text, one per key), in the caller's transaction; one row per event with its id, in order.
SELECT e.id FROM {schema}.publish_events($1, $2::text[], $3::text[]::jsonb[]) AS e(id);

-- name: relay_read
-- A relay's one statement per batch of stream $1: take or renew the stream's lease for relay $2
-- ($3 seconds, on the wall clock: it says which process lives), and only if it holds the lease,
-- read the stream's oldest $4 events, with their ages in seconds. Always a row: `leader` says
-- whether the lease is held (the event columns are NULL when there is no event).
WITH lease AS (
    INSERT INTO {schema}.outbox_relays AS r (stream, holder, expires_at)
    VALUES ($1, $2, pg_catalog.now() + make_interval(secs => $3))
    ON CONFLICT (stream) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE r.holder = EXCLUDED.holder OR r.expires_at < pg_catalog.now()
    RETURNING r.stream
)
SELECT EXISTS (SELECT FROM lease) AS leader, e.id, e.key, e.payload, e.created_at,
       extract(epoch FROM pg_catalog.now() - e.created_at)::float8 AS age
FROM (SELECT) AS one
LEFT JOIN LATERAL (
    SELECT o.id, o.key, o.payload::text AS payload, o.created_at
    FROM {schema}.outbox AS o
    WHERE o.stream = $1 AND EXISTS (SELECT FROM lease)
    ORDER BY o.id
    LIMIT $4
) AS e ON true
ORDER BY e.id;

-- name: relay_ack
-- The stream took events $2 of stream $1: delete them and count them on the stream's lease row.
WITH gone AS (
    DELETE FROM {schema}.outbox AS o WHERE o.id = ANY ($2::bigint[]) RETURNING o.id
)
UPDATE {schema}.outbox_relays AS r SET published = r.published + (SELECT count(*) FROM gone)
WHERE r.stream = $1;

-- name: relay_release
-- Relay $2 stops cleanly: its lease on stream $1 ends now, so a standby relay takes over at once.
UPDATE {schema}.outbox_relays AS r SET expires_at = pg_catalog.now()
WHERE r.stream = $1 AND r.holder = $2;

-- name: outbox_status
-- Per stream with events or a relay: events waiting, the oldest one's age in seconds (the
-- relay's lag; 0 when none waits), events published so far, and the relay holding the lease
-- while it is held. Counts the waiting events: its cost follows the backlog.
SELECT s.stream,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(extract(epoch FROM pg_catalog.now() - w.oldest)::float8, 0.0) AS lag,
       coalesce(r.published, 0) AS published,
       CASE WHEN r.expires_at > pg_catalog.now() THEN r.holder END AS relay
FROM (SELECT o.stream FROM {schema}.outbox AS o GROUP BY o.stream
      UNION SELECT r.stream FROM {schema}.outbox_relays AS r) AS s
LEFT JOIN (SELECT o.stream, count(*) AS waiting, min(o.created_at) AS oldest
           FROM {schema}.outbox AS o GROUP BY o.stream) AS w ON w.stream = s.stream
LEFT JOIN {schema}.outbox_relays AS r ON r.stream = s.stream
ORDER BY s.stream;

-- name: drop_schema
-- aioqueue.testing: drop a test's schema and everything in it, once the test is over.
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: add_dependencies
-- Workflows: the jobs $1, just inserted in this transaction, wait for the jobs $2 (named $3,
-- each may fail where $4) and join group $5 (NULL: none); see add_dependencies() in migration
-- 0014. Raises, naming the dependency or group, when one cannot be waited for.
SELECT {schema}.add_dependencies($1::bigint[], $2::bigint[], $3::text[], $4::boolean[], $5::bigint);

-- name: open_group
-- A new open group named $1 with callbacks $2 (kind -> job, see job_groups), its members'
-- results kept when $3; returns its id.
INSERT INTO {schema}.job_groups (name, callbacks, results) VALUES ($1, $2::jsonb, $3) RETURNING id;

-- name: close_group
-- Close group $1: it takes no more members. NULL when there is no such group. The caller
-- settles it next (settle_group), in a statement of its own that sees it closed.
UPDATE {schema}.job_groups AS s SET closed = true WHERE s.id = $1 RETURNING s.id;

-- name: settle_group
-- Enqueue group $1's callbacks if it is closed and every member finished (once, ever).
SELECT {schema}.settle_group($1);

-- name: group_counts
-- Group $1 in one row: its counters, members running now (jobs_group_idx), and the callbacks it
-- enqueued (kind -> job id). Pending members are the rest of the total.
SELECT s.id, s.name, s.total, s.succeeded, s.failed, s.cancelled, s.closed, s.created_at, s.done_at,
       s.results,
       (SELECT count(*) FROM {schema}.jobs AS j WHERE j.group_id = s.id AND j.status = 'running') AS running,
       (SELECT count(*) FROM {schema}.jobs AS j WHERE j.group_id = s.id AND j.status = 'dead') AS dead,
       (SELECT jsonb_object_agg(c.kind, c.job_id)::text FROM {schema}.group_callbacks AS c
        WHERE c.group_id = s.id) AS callbacks,
       s.callbacks::text AS callback_specs
FROM {schema}.job_groups AS s
WHERE s.id = $1;

-- name: list_groups
-- Groups, newest first, below keyset $1 (NULL: the top), at most $2.
SELECT s.id, s.name, s.total, s.succeeded, s.failed, s.cancelled, s.closed, s.created_at, s.done_at
FROM {schema}.job_groups AS s
WHERE s.id < coalesce($1::bigint, 9223372036854775807)
ORDER BY s.id DESC
LIMIT $2;

-- name: upstream_results
-- What job $1 reads downstream, in position order: its dependencies (position, name, id,
-- status, result), or, for a group's callback, the group's members in id order (archived, or
-- dead and still live).
SELECT d.position::bigint AS position, d.name, d.depends_on AS id,
       coalesce(a.status, l.status, 'gone') AS status, a.result::text AS result
FROM {schema}.job_deps AS d
LEFT JOIN {schema}.jobs_done AS a ON a.id = d.depends_on
LEFT JOIN {schema}.jobs AS l ON l.id = d.depends_on
WHERE d.job_id = $1
UNION ALL
SELECT row_number() OVER (ORDER BY m.id), NULL, m.id, m.status, m.result
FROM {schema}.group_callbacks AS c
CROSS JOIN LATERAL (
    SELECT a.id, a.status, a.result::text AS result FROM {schema}.jobs_done AS a WHERE a.group_id = c.group_id
    UNION ALL
    SELECT l.id, l.status, NULL FROM {schema}.jobs AS l WHERE l.group_id = c.group_id AND l.status = 'dead'
) AS m
WHERE c.job_id = $1
ORDER BY 1;

-- name: workflow_of
-- The workflow job $1 belongs to: every job linked to it by dependencies, either way and
-- transitively (so a diamond's other branch too), at most $2 jobs, each with its status (live
-- or archived) and edges. UNION on the id alone ends the walk once no new job turns up.
WITH RECURSIVE linked(id) AS (
    SELECT $1::bigint
    UNION
    SELECT n.id FROM linked AS l
    CROSS JOIN LATERAL (
        SELECT d.depends_on AS id FROM {schema}.job_deps AS d WHERE d.job_id = l.id
        UNION ALL
        SELECT d.job_id FROM {schema}.job_deps AS d WHERE d.depends_on = l.id
    ) AS n
),
nodes AS (SELECT id FROM linked LIMIT $2)
SELECT n.id, coalesce(j.task, a.task) AS task, coalesce(j.queue, a.queue) AS queue,
       coalesce(j.status, a.status, 'gone') AS status, coalesce(j.group_id, a.group_id) AS group_id,
       a.reason,
       (SELECT array_agg(d.depends_on ORDER BY d.position) FROM {schema}.job_deps AS d WHERE d.job_id = n.id)
           AS depends_on
FROM nodes AS n
LEFT JOIN {schema}.jobs AS j ON j.id = n.id
LEFT JOIN {schema}.jobs_done AS a ON a.id = n.id
ORDER BY n.id;

-- name: release_stranded
-- Settle up to $1 waiting jobs whose dependencies were finished by workers of a release before
-- workflows (see release_stranded() in migration 0014); returns how many.
SELECT {schema}.release_stranded($1);

-- name: load_steps
-- Every step job $1's handler stored (docs/howto/durable-steps.md), read once when a run of the
-- handler reaches its first step, and by the operator views; `now` is the queue's clock.
SELECT s.name, s.occurrence, s.kind, s.state, s.result::text AS result, s.wake_at, s.event, s.event_key,
       s.created_at, s.updated_at, {schema}.now() AS now
FROM {schema}.job_steps AS s
WHERE s.job_id = $1
ORDER BY s.created_at, s.name, s.occurrence;

-- fragment: step_held
-- The claim a step's write is fenced by: job $1 still running as attempt $2, its row locked
-- FOR SHARE until the write's transaction ends, so the reaper cannot hand the job to another
-- worker between the check and the commit (it waits, or skips the row until the next pass).
held AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = $1 AND j.attempts = $2 AND j.status = 'running'
    FOR SHARE
)

-- name: record_step
-- Store a step of job $1 (attempt $2): name $3, occurrence $4, kind $5, state $6, result $7
-- (JSON text), waking at $8 or, when $8 is NULL, $9 seconds from now (NULL: no wake time), for
-- event $10 with key $11. Returns nothing when the claim is no longer held or the step is
-- already stored (then another attempt of the job runs: the claim is lost too).
WITH {step_held}
INSERT INTO {schema}.job_steps AS s (job_id, name, occurrence, kind, state, result, wake_at, event, event_key)
SELECT h.id, $3, $4, $5, $6, $7::jsonb,
       coalesce($8::timestamptz, {schema}.now() + make_interval(secs => $9::float8)), $10, $11
FROM held AS h
ON CONFLICT (job_id, name, occurrence) DO NOTHING
RETURNING s.state, s.result::text AS result, s.wake_at, {schema}.now() AS now;

-- name: settle_step
-- Move on a sleep or event wait of job $1 (attempt $2), name $3, occurrence $4, as far as it
-- can go now: a received event is taken ('done'), an open wait past its wake time ends
-- ('done' for a sleep, 'timed_out' for an event). Returns its state after (and the event's
-- payload); nothing when the claim is no longer held.
WITH {step_held}
UPDATE {schema}.job_steps AS s
SET state = CASE
        WHEN s.state = 'received' THEN 'done'
        WHEN s.state = 'waiting' AND s.wake_at <= {schema}.now() THEN
            CASE WHEN s.kind = 'sleep' THEN 'done' ELSE 'timed_out' END
        ELSE s.state
    END,
    updated_at = {schema}.now()
FROM held AS h
WHERE s.job_id = h.id AND s.name = $3 AND s.occurrence = $4
RETURNING s.state, s.result::text AS result, s.wake_at, {schema}.now() AS now;

-- name: suspend
-- The completer's write for handlers that stopped at a sleep or an event wait: see
-- suspend_jobs() (claims $1, $2; $3: the commit mode).
SELECT count(*) FROM {schema}.suspend_jobs((SELECT $1::text::bigint[]), (SELECT $2::text::int[]), $3::text);

-- name: send_event
-- Deliver event $1 with key $2 and JSON payload $3 to the jobs waiting for it: see send_event().
SELECT {schema}.send_event($1::text, $2::text, $3::jsonb);

-- name: list_waits
-- Open sleeps and event waits (and events received but not yet taken), the soonest to wake
-- first, at most $1; $2: only those of this event name (NULL: all).
SELECT s.job_id, j.queue, j.task, s.name, s.occurrence, s.kind, s.state, s.event, s.event_key, s.wake_at,
       s.created_at
FROM {schema}.job_steps AS s
LEFT JOIN {schema}.jobs AS j ON j.id = s.job_id
WHERE s.state IN ('waiting', 'received') AND ($2::text IS NULL OR s.event = $2::text)
ORDER BY s.wake_at, s.job_id
LIMIT $1;

-- name: prune_steps
-- Retention: delete the steps of up to $1 jobs that are neither live nor archived any more.
WITH gone AS (
    SELECT DISTINCT s.job_id FROM {schema}.job_steps AS s
    WHERE NOT EXISTS (SELECT FROM {schema}.jobs AS j WHERE j.id = s.job_id)
      AND NOT EXISTS (SELECT FROM {schema}.jobs_done AS d WHERE d.id = s.job_id)
    LIMIT $1
)
DELETE FROM {schema}.job_steps AS s USING gone WHERE s.job_id = gone.job_id;

-- name: index_reads_only
-- For the rest of the transaction: no JIT (see without_jit), and neither sequential nor bitmap
-- scans, which read every row or entry that matches before a LIMIT cuts them short. Each read of
-- busiest_keys is bounded only as an ordered walk of an index, and a planner without statistics
-- (a table just filled) could pick either.
SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true);

-- name: busiest_keys
-- The busiest partition keys of queue $1: at most $2 keys with the most running and pending
-- jobs, each with its running jobs (exact: jobs_partition_running_idx holds only running jobs,
-- at most the workers' slots) and its pending and ready jobs, each counted up to $3 (a range of
-- jobs_partition_ready_idx per priority). Counting every key's jobs would read every pending
-- job, so the keys counted are a bounded set of candidates, the $5 of most weight among: every
-- key with a running job, the keys of the pending jobs among the newest $4 (the primary key,
-- newest first: the keys arriving now), the keys of the queue's $4 first pending jobs in the
-- ready order (jobs_ready_idx: the keys waiting longest, a flood that arrived earlier), and the
-- column's most common values in the table's statistics (ANALYZE's sample). The cost is the
-- running jobs, 2 x $4 rows, and at most $3 index entries per candidate and priority, however
-- many keys wait.
WITH RECURSIVE running AS (
    SELECT r.partition_key AS key, count(*) AS running
    FROM {schema}.jobs AS r
    WHERE r.status = 'running' AND r.partition_key IS NOT NULL AND r.queue = $1
    GROUP BY r.partition_key
),
recent AS (
    SELECT n.partition_key AS key, count(*) AS seen
    FROM (SELECT j.partition_key, j.queue, j.status FROM {schema}.jobs AS j ORDER BY j.id DESC LIMIT $4) AS n
    WHERE n.partition_key IS NOT NULL AND n.queue = $1 AND n.status = 'pending'
    GROUP BY n.partition_key
),
oldest AS (
    SELECT o.partition_key AS key, count(*) AS seen
    FROM (SELECT j.partition_key FROM {schema}.jobs AS j
          WHERE j.status = 'pending' AND j.queue = $1
          ORDER BY j.priority DESC, j.run_at, j.id
          LIMIT $4) AS o
    WHERE o.partition_key IS NOT NULL
    GROUP BY o.partition_key
),
common AS (
    SELECT v.key, v.freq * greatest(c.reltuples, 0) AS share
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS ns ON ns.oid = c.relnamespace
    JOIN pg_catalog.pg_stats AS s
      ON s.schemaname = ns.nspname AND s.tablename = c.relname AND s.attname = 'partition_key' AND NOT s.inherited
    CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(key, freq)
    WHERE c.oid = '{schema}.jobs'::regclass
),
candidates AS (
    SELECT w.key FROM (
        SELECT r.key, r.running::float8 AS weight FROM running AS r
        UNION ALL SELECT n.key, n.seen::float8 FROM recent AS n
        UNION ALL SELECT o.key, o.seen::float8 FROM oldest AS o
        UNION ALL SELECT m.key, m.share FROM common AS m
    ) AS w
    GROUP BY w.key
    ORDER BY sum(w.weight) DESC, w.key
    LIMIT $5
),
-- The priorities of the queue's pending keyed jobs: one probe of the index each (ordered as
-- jobs_partition_ready_idx, so that jobs without a key, in jobs_ready_idx, are never read).
levels(priority) AS (
    (SELECT j.priority FROM {schema}.jobs AS j
     WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = $1
     ORDER BY j.priority DESC, j.partition_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = $1 AND j.priority < l.priority
            ORDER BY j.priority DESC, j.partition_key LIMIT 1)
    FROM levels AS l
    WHERE l.priority IS NOT NULL
),
counted AS (
    SELECT c.key, coalesce(r.running, 0) AS running,
           least($3, coalesce(sum(x.pending), 0))::bigint AS pending,
           least($3, coalesce(sum(x.ready), 0))::bigint AS ready
    FROM candidates AS c
    LEFT JOIN running AS r ON r.key = c.key
    LEFT JOIN LATERAL (
        SELECT count(*) AS pending, count(*) FILTER (WHERE p.run_at <= {schema}.now()) AS ready
        FROM levels AS l
        CROSS JOIN LATERAL (
            SELECT j.run_at FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = $1
              AND j.priority = l.priority AND j.partition_key = c.key
            ORDER BY j.run_at
            LIMIT $3
        ) AS p
        WHERE l.priority IS NOT NULL
        GROUP BY l.priority
    ) AS x ON true
    GROUP BY c.key, r.running
)
SELECT k.key, k.running, k.pending, k.ready
FROM counted AS k
WHERE k.running > 0 OR k.pending > 0
ORDER BY k.running + k.pending DESC, k.key
LIMIT $2;

-- name: workflow_status
-- Workflow figures in one row, each an index-only count of work in flight (migration 0023): groups
-- not done, open (taking members) or closed (waiting for members to finish); jobs waiting for
-- other jobs (jobs_waiting_idx); sleeps and event waits still open (a received event not yet
-- taken counts as a wait).
SELECT (SELECT count(*) FROM {schema}.job_groups AS g WHERE g.done_at IS NULL AND NOT g.closed) AS groups_open,
       (SELECT count(*) FROM {schema}.job_groups AS g WHERE g.done_at IS NULL AND g.closed) AS groups_closed,
       (SELECT count(*) FROM {schema}.jobs AS j WHERE j.status = 'waiting') AS waiting,
       (SELECT count(*) FROM {schema}.job_steps AS s
        WHERE s.state IN ('waiting', 'received') AND s.kind = 'sleep') AS sleeping,
       (SELECT count(*) FROM {schema}.job_steps AS s
        WHERE s.state IN ('waiting', 'received') AND s.kind = 'event') AS awaiting_event;
