-- claim_keyed(queues, wanted, worker, lease_seconds, total, commit_mode): claim_jobs() for the
-- queues that are fair or have a per-key limit.
--
-- Within a queue: the highest priority with pending keyed jobs first; within a priority, keys in
-- turn (byte order, going round), starting after the key the last claim served; one job per
-- key per turn, its oldest ready one, read from jobs_partition_ready_idx whatever the
-- statistics say (with statistics taken while the queue held one key, the plain ready index
-- would look as good, and cost the queue's length per key served). A key at its concurrency
-- limit, or at its rate (key_rate_limit starts per key_rate_period seconds, counted in
-- key_starts), is passed over. The walk stops when the queue's share is claimed, when a whole
-- round took nothing, after one round under a per-key concurrency limit no greater than a
-- key's turn (each key gave in its turn all the room it had: another round would probe every
-- key again for nothing), or after a bounded number of key probes (the cursor moves, so the
-- next claim goes on from there): its cost follows the jobs claimed and the keys passed over,
-- never the number of pending keys or jobs. In a fair queue without limits, a claim that wants
-- more jobs than the circle has keys shares them in one take (want / keys each, from the cursor
-- round), and goes round again among the keys that gave a job, without walking them anew; a
-- pass after the cursor that found no key is skipped by the session's next claims for a
-- bounded time while no job is added and none of the newest is pending after it (see below).
-- Jobs without a key fill the room keys leave, from the head of the queue's ready order. The
-- jobs a claim took are marked running by their rows' addresses (ctid), as locked.
--
-- Claims of one queue run side by side (without a global limit, the caller does not lock the
-- queue's settings row), and a per-key limit holds by a lock per key: a job of a key is taken
-- only under a transaction-level advisory lock on (queue, key), tried without waiting (a key
-- another claim holds is passed over, as SKIP LOCKED passes over a row), and the key's running
-- jobs are counted in a statement that starts after the lock is held, so it sees what the
-- claims that held it before took (under a limit of 1 without a key rate: the one statement at
-- the end that marks the claim's jobs running, which takes a key's job only if none of the
-- key's is running; a pass is then its walk alone, a claim's fixed cost a few statements
-- fewer). Workers of releases before 0022 still lock the queue's row
-- first; they take turns among themselves and hold the per-key locks like the others. Under a
-- per-key limit (of concurrency or rate), one claim at a time starts from the cursor and moves
-- it; a claim that starts while it runs waits for it, 60 milliseconds at most, and then
-- goes on from where it left the cursor; one whose wait runs out starts at a point of the
-- circle drawn at random and leaves the cursor alone (following the first, it would find every
-- key it passed locked). The cursor moves unless a concurrent claim holds the queue's row,
-- which then moves it. A key-rate
-- limited queue's starts and its next wake-up are recorded through note_key_starts().
CREATE OR REPLACE FUNCTION {schema}.claim_keyed(
    queues        text[],
    wanted        int[],
    worker        text,
    lease_seconds float8,
    total         int,
    commit_mode   text
) RETURNS TABLE (
    id           bigint,
    queue        text,
    task         text,
    args         text,
    priority     int,
    attempts     int,
    max_attempts int,
    run_at       timestamptz,
    created_at   timestamptz
)
LANGUAGE plpgsql
SET jit = off
-- A queue's first claims may run before the table has statistics, and their generic plans last
-- the session: a scan of the whole table planned for a few rows would still run at a million.
SET enable_seqscan = off
-- Every statement below is planned once per session, not at each call: their parameters change
-- at every call (the cursor, the level, the keys), and custom plans cost more to make than the
-- statements cost to run; the plans hold whatever the values (the plan tests' table states).
SET plan_cache_mode = force_generic_plan
-- No sort: every statement below reads its order from an index (the walk, jobs_partition_ready_idx).
-- A generic plan made with statistics of a nearly empty table (a flood just drained) priced a
-- bitmap scan of the queue's pending jobs plus a sort at one row, and ran it at every key the
-- walk passed: 0.4 to 1.2 s a claim once thousands of keys had arrived.
SET enable_sort = off
AS $$
#variable_conflict use_column
DECLARE
    budget      int := coalesce($5, 0);
    q           text;
    want        int;
    per_key     int;
    key_rate    int;
    key_period  float8;
    seen_keys   text[] COLLATE "C";
    pass_seen   text[] COLLATE "C";
    start_key   text COLLATE "C";
    served      text COLLATE "C";
    lo          text COLLATE "C";
    hi          text COLLATE "C";
    last_key    text COLLATE "C";
    pass_ids    bigint[];
    pass_tids   tid[];
    pass_keys   text[] COLLATE "C";
    walked      int;
    walk_limit  int;
    walk_keys   text[] COLLATE "C";
    -- Of each key of a pass that may take a job, its oldest pending job at the level, as the
    -- walk found it (the job a turn of one takes, unless another claim took it since).
    cand_ids    bigint[];
    -- And where each of those jobs lies (its row's address, ctid): a job this claim locked stays
    -- there until it commits, and is marked running by it (a TID scan, no descent of jobs_pkey);
    -- under a limit of 1, where the walk read it (marked running there if still pending).
    cand_tids   tid[];
    -- And how many jobs each of them may give in its turn (its room, at most the turn).
    cand_room   int[];
    -- In a fair queue without limits, the place of each key's job in the index (its run_at; the
    -- id is cand_ids'), from which its turn reads: none before it is this claim's to take.
    cand_runs   timestamptz[];
    held_runs   timestamptz[];
    -- A fair queue's tail (see below): this session's note that no key after a key had a job
    -- pending at a level, as of a value of the job ids' sequence and until a time; the
    -- sequence's value and the time before this claim's first pass; whether it skips that pass.
    tail        text[];
    head_key    text COLLATE "C";
    head_run    timestamptz;
    head_id     bigint;
    tail_seq    bigint;
    tail_at     timestamptz;
    tail_skip   boolean;
    circle      int;
    -- A fair queue without limits (fair_only): the keys that gave a job in this circle, in the
    -- order it served them; and the keys a first pass found after the cursor, their turns left
    -- until the pass that wraps round has been walked (see below).
    fair_only   boolean;
    ring        text[] COLLATE "C";
    held        text[] COLLATE "C";
    held_ids    bigint[];
    held_tids   tid[];
    per_turn    int;
    circle_keys int;
    level       int;
    below       int;
    wrapped     boolean;
    probes      int;
    max_probes  int;
    before      int;
    -- The keys of a pass that may take a job, locked for this transaction (see below).
    cand_keys   text[] COLLATE "C";
    -- The class of the per-key advisory locks: this schema's keyed claims.
    key_class   CONSTANT int := hashtext('{schema}.claim_keyed');
    -- The jobs this call takes (locked, still pending until the one UPDATE at the end) and, in
    -- the queue at hand, the key of each: the per-key limit counts them beside the running ones.
    picked      bigint[] := '{}';
    picked_tids tid[] := '{}';
    -- Under a per-key limit of 1 (and no key rate), the jobs the walk found for the keys it
    -- locked, by their rows' addresses as the walk read them, taken at the end if still pending
    -- and their key still idle (see below); and the addresses of those it took.
    found       tid[] := '{}';
    taken       tid[];
    picked_keys text[] COLLATE "C" := '{}';
    -- Whether this claim holds the queue's turn (see below): only such a claim starts from the
    -- cursor and moves it.
    leader      boolean;
    -- Whether this call waited for, or holds, the lock of a queue before this one: it waits for
    -- no other (see below); how long it waits at most (a few claims' time: longer, a claim
    -- the machine's scheduler put aside would stall every other one; shorter, a claim queued
    -- behind two others runs out of it: at 5 ms, in the per-key benchmark's limit-1 drain on a
    -- loaded machine, 30 to 38% of the claims of 50 jobs started at random, and 47% once the
    -- workers' claims were of 100 (a turn holds twice as long), against 32% at 20 ms; and
    -- once claims were of ~150 (the buffer grown), at a load of 2 to 6, they walked 1.2 to 1.66
    -- keys a job at 20 ms, 1.0 to 1.22 at 60 ms, where the server spent 13 to 22% less CPU a
    -- job; the session may set aioqueue.keyed_claim_wait, as the tests do); the caller's
    -- lock_timeout, put back after.
    waited      boolean := false;
    claim_wait  text := coalesce(nullif(current_setting('aioqueue.keyed_claim_wait', true), ''), '60ms');
    lock_bound  text;
    row_wait    text;
    -- The first and last keys at the level, the first character at which they differ, and the
    -- codes of theirs there: the range a start point is drawn from.
    first_key   text COLLATE "C";
    final_key   text COLLATE "C";
    pos         int;
    lo_code     int;
    hi_code     int;
BEGIN
    -- Local to the caller's transaction (a SET clause above would end with the function).
    PERFORM set_config('synchronous_commit', coalesce($6, current_setting('synchronous_commit')), true);
    FOR i IN 1 .. coalesce(array_length($1, 1), 0) LOOP
        q := $1[i];
        want := least($2[i], budget);
        CONTINUE WHEN want IS NULL OR want <= 0;
        budget := budget - want;  -- given back below for what this queue does not take
        picked_keys := '{}';
        seen_keys := '{}';
        SELECT s.key_concurrency_limit, s.key_cursor, s.key_rate_limit, s.key_rate_period
        INTO per_key, start_key, key_rate, key_period
        FROM {schema}.queues AS s WHERE s.name = q;
        fair_only := per_key IS NULL AND key_rate IS NULL;
        -- Claims that lock keys and run at once would all start from the cursor, and each would
        -- probe every key the others had locked before it could lock one (1.5 such probes a job
        -- with four workers at a limit of 1): one claim at a time, the one holding this lock
        -- (held to the end of its transaction), starts from the cursor and moves it. The others
        -- wait for it, a bounded time (claim_wait), then go on from where the claim before them
        -- left the cursor: the keys ahead of it were served a round ago, so a claim walks
        -- nearly only keys it takes. Started at once at points drawn at random, the claims of
        -- four workers at a limit of 1 walked two keys a job (2.8 for those that did not start
        -- from the cursor), half of them taken by another claim: taking turns, 1.05, and a
        -- third less server CPU a job. A claim that waited in vain, or whose call
        -- holds the lock of a queue before this one (two calls waiting for each other's queue
        -- would wait out their bounds), starts at a point drawn at random among the queue's
        -- keys (below), as every claim but one did before.
        leader := fair_only
                  OR pg_try_advisory_xact_lock(hashtext('{schema}.claim_keyed.leader'), hashtext(q));
        IF NOT leader AND NOT waited THEN
            waited := true;
            lock_bound := current_setting('lock_timeout');
            BEGIN
                PERFORM set_config('lock_timeout', claim_wait, true);
                PERFORM pg_advisory_xact_lock(hashtext('{schema}.claim_keyed.leader'), hashtext(q));
                leader := true;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
            PERFORM set_config('lock_timeout', lock_bound, true);
            IF leader THEN
                -- Where the claim before this one left it (it committed before its lock was free).
                SELECT s.key_cursor INTO start_key FROM {schema}.queues AS s WHERE s.name = q;
            END IF;
        END IF;
        waited := waited OR (leader AND NOT fair_only);
        served := start_key;
        probes := 0;
        -- Keys passed over (at their limit, or with nothing ready) cost a probe each: enough
        -- for a full claim past a few hundred of them.
        max_probes := 4 * want + 256;
        below := 2147483647;
        <<levels>>
        LOOP
            -- The level, and its first entry in the keyed index: its first key's oldest pending
            -- job, where a fair queue's pass from the first key starts (below).
            SELECT j.priority, j.partition_key, j.run_at, j.id INTO level, head_key, head_run, head_id
            FROM {schema}.jobs AS j
            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q AND j.priority <= below
            ORDER BY j.priority DESC, j.partition_key, j.run_at, j.id LIMIT 1;
            EXIT levels WHEN level IS NULL;
            IF NOT leader AND below = 2147483647 THEN
                -- Not the leader: start after a point between the first and the last key at the
                -- top level, their common prefix and a character drawn between theirs that
                -- follow it (two index probes; keys of one prefix and a varying tail, as tenant
                -- or account names are, spread the claims across the circle). Keys that differ
                -- only past their 64th character or in a character beyond ASCII keep the cursor.
                SELECT (SELECT j.partition_key FROM {schema}.jobs AS j
                        WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                          AND j.priority = level
                        ORDER BY j.partition_key LIMIT 1),
                       (SELECT j.partition_key FROM {schema}.jobs AS j
                        WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                          AND j.priority = level
                        ORDER BY j.partition_key DESC LIMIT 1)
                INTO first_key, final_key;  -- one statement: a claim's fixed cost
                pos := 1;
                WHILE pos <= 64 AND substr(first_key, pos, 1) = substr(final_key, pos, 1) LOOP
                    pos := pos + 1;
                END LOOP;
                lo_code := greatest(1, ascii(substr(first_key, pos, 1)));  -- 0: the first key ends there
                hi_code := ascii(substr(final_key, pos, 1));
                IF pos <= 64 AND hi_code <= 127 AND hi_code > lo_code THEN
                    start_key := substr(first_key, 1, pos - 1)
                                 || chr(lo_code + floor(random() * (hi_code - lo_code + 1))::int);
                    served := start_key;
                END IF;
            END IF;
            -- A circle: the keys after the cursor to the last, then (wrapped) the first ones up
            -- to the cursor, in passes of at most `want` keys, one statement each.
            lo := coalesce(start_key, '');
            hi := NULL;
            wrapped := false;
            per_turn := 1;
            circle := 1;
            circle_keys := 0;
            ring := '{}';
            held := NULL;
            held_ids := NULL;
            held_tids := NULL;
            held_runs := NULL;
            LOOP
                EXIT levels WHEN want <= 0 OR probes >= max_probes;
                -- A pass walks until it has as many keys with room as it wants (below), so it
                -- may walk as far as the probes allow: passes are statements, and a claim of
                -- hundreds of jobs must not go on in passes of a few keys once its want runs low.
                walk_limit := max_probes - probes;
                IF circle > 1 AND fair_only THEN
                    -- A fair queue without limits goes round again only among the keys that gave
                    -- a job in the circle before (the others had none ready), in the same order:
                    -- no walk. Walked again, the circle would probe each key anew, and past the
                    -- last one probe the rest of the level, where a drained key's index entries
                    -- lie until a vacuum (a whole flood's, in the flood's own order, a claim).
                    cand_keys := ring;
                    cand_runs := NULL;
                    walk_keys := '{}';
                ELSIF fair_only THEN
                    tail_seq := NULL;
                    tail_skip := false;
                    IF circle = 1 AND NOT wrapped AND start_key IS NOT NULL THEN
                        -- The pass from the cursor: once only keys before it have jobs (a flood,
                        -- the first key, after the others drained), it reads every index entry
                        -- after the cursor to the end of the level, which the drained keys' jobs
                        -- left there until a vacuum (~1,000 pages behind 10,000 keys of 10), at
                        -- every claim. A pass that found no key notes it for this session, with
                        -- the job ids' sequence as it was before the pass; the next claims skip
                        -- the pass while the sequence has not moved (no job was added since: a
                        -- job added and committed since is found at once) and for a bounded time
                        -- (aioqueue.fair_tail_bound, 100 ms: a job that goes back to pending, by
                        -- a retry or an expired lease, or whose adding transaction had not
                        -- committed, is found by the first claim after it). Real time, not the
                        -- queue's clock: a test's frozen clock would keep the note for ever.
                        SELECT s.last_value, clock_timestamp() INTO tail_seq, tail_at FROM {schema}.jobs_id_seq AS s;
                        tail := nullif(current_setting('aioqueue.fair_tail', true), '')::text[];
                        tail_skip := coalesce(tail[1] = '{schema}' AND tail[2] = q AND tail[3] = level::text
                                     AND tail[4] = tail_seq::text AND start_key >= (tail[5] COLLATE "C")
                                     AND tail_at < tail[6]::timestamptz, false);
                        IF tail_skip THEN
                            -- Unless a job of the last 64 ids the sequence gave before the note
                            -- is pending after the cursor now: one its pass could not see, as
                            -- its adding transaction (which had taken its id, so the sequence
                            -- has not moved since) committed after the pass began, or one
                            -- another claim held locked then and left pending (a walk locks a
                            -- job added after its own transaction began: not yet due for it).
                            -- In the per-key benchmark's small keys' arrival, one batch in
                            -- three or four was passed over so, for up to the next batch or the
                            -- bound. A range of the primary key, at most 64 entries (killed
                            -- ones, once a flood drained the newest jobs: a page or two).
                            tail_skip := NOT EXISTS (
                                SELECT FROM (SELECT j.status, j.partition_key, j.queue, j.priority
                                             FROM {schema}.jobs AS j
                                             WHERE j.id > tail_seq - 64 AND j.id <= tail_seq
                                             ORDER BY j.id DESC LIMIT 64) AS j
                                WHERE j.status = 'pending' AND j.partition_key > start_key
                                  AND j.queue = q AND j.priority = level);
                        END IF;
                    END IF;
                    IF tail_skip THEN
                        cand_keys := '{}';
                        cand_ids := '{}';
                        cand_tids := '{}';
                        cand_runs := '{}';
                        walk_keys := '{}';
                    ELSE
                        -- A fair queue without limits: the walk takes each key's oldest job as it finds
                        -- it (locked, SKIP LOCKED: a job another claim holds is passed over for the
                        -- key's next one), so a turn of one job needs no statement of its own. Each
                        -- probe reads from the entry after the key before (a key's entries are in
                        -- the order of their run_at and id); a pass from the first key, from the
                        -- level's first pending entry, as the level's statement found it: the
                        -- entries before it, taken jobs' (a flood's drained part, until a vacuum),
                        -- are read once a claim, not again here.
                        WITH RECURSIVE walk(k, n, ok, got, id, run_at, tid) AS (
                            SELECT lo, 0, false, 0, NULL::bigint, NULL::timestamptz, NULL::tid
                            UNION ALL
                            SELECT x.k, w.n + 1, x.run_at <= {schema}.now(),
                                   w.got + (x.run_at <= {schema}.now())::int, x.id, x.run_at, x.tid
                            FROM walk AS w
                            CROSS JOIN LATERAL (
                                SELECT j.partition_key, j.id, j.run_at, j.ctid FROM {schema}.jobs AS j
                                WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                                  AND j.priority = level
                                  AND (j.partition_key, j.run_at, j.id)
                                      > (CASE WHEN w.n = 0 AND lo = '' THEN head_key ELSE w.k END,
                                         CASE WHEN w.n = 0 AND lo = '' THEN head_run ELSE 'infinity' END,
                                         CASE WHEN w.n = 0 AND lo = '' THEN head_id - 1 ELSE 9223372036854775807 END)
                                ORDER BY j.partition_key, j.run_at, j.id LIMIT 1
                                FOR UPDATE SKIP LOCKED) AS x(k, id, run_at, tid)
                            WHERE w.n < walk_limit AND w.got < want - coalesce(cardinality(held), 0)
                              AND (hi IS NULL OR x.k <= hi) AND (hi IS NULL OR w.k < hi)
                        )
                        SELECT coalesce(array_agg(w.k ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                               coalesce(array_agg(w.id ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                               coalesce(array_agg(w.run_at ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                               coalesce(array_agg(w.tid ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                               coalesce(array_agg(w.k ORDER BY w.n), '{}')
                        INTO cand_keys, cand_ids, cand_runs, cand_tids, walk_keys
                        FROM walk AS w
                        WHERE w.n > 0;
                        IF tail_seq IS NOT NULL AND cardinality(walk_keys) = 0 THEN
                            PERFORM set_config('aioqueue.fair_tail', ARRAY[
                                '{schema}', q, level::text, tail_seq::text, start_key,
                                (tail_at + coalesce(nullif(current_setting('aioqueue.fair_tail_bound', true), ''),
                                                    '100ms')::interval)::text]::text, false);
                        END IF;
                    END IF;
                ELSE
                    -- The keys in turn, one index probe each, and for each whether this claim may take
                    -- a job of it: a per-key limit leaves room in it (as this statement's snapshot
                    -- sees it) and this claim could lock it (no other claim takes a job of a locked
                    -- key until this one commits). Under no per-key limit, every key (jobs are locked
                    -- one by one, SKIP LOCKED, below). The walk stops once it has as many keys as the
                    -- claim wants (`got`): keys after those have no turn in this pass, and the next
                    -- pass, or claim, starts after the last key walked. The CASE keeps the lock last:
                    -- a key is locked only if it has room.
                    WITH RECURSIVE walk(k, n, ok, got, id, tid) AS (
                        SELECT lo, 0, false, 0, NULL::bigint, NULL::tid  -- where the pass starts: not a key of it
                        UNION ALL
                        SELECT x.k, w.n + 1, t.ok, w.got + t.ok::int, x.id, x.tid
                        FROM walk AS w
                        -- The next key, and its first entry at the level: its oldest pending job
                        -- (and where its row lies: a turn of one takes it there).
                        CROSS JOIN LATERAL (
                            SELECT j.partition_key, j.id, j.run_at, j.ctid FROM {schema}.jobs AS j
                            WHERE j.status = 'pending' AND j.partition_key IS NOT NULL AND j.queue = q
                              AND j.priority = level AND j.partition_key > w.k
                            ORDER BY j.partition_key, j.run_at, j.id LIMIT 1) AS x(k, id, run_at, tid)
                        CROSS JOIN LATERAL (SELECT CASE
                            -- Its oldest job is not due: none of its jobs is ready.
                            WHEN x.run_at > {schema}.now() THEN false
                            WHEN per_key IS NULL AND key_rate IS NULL THEN true
                            -- The key's running jobs, counted up to the limit (that is all it takes to
                            -- know its room), and this call's picks. Each count only under its limit:
                            -- without one, the arithmetic is NULL, but the count still ran (an index
                            -- probe per key walked, the key rate's at a concurrency limit of 1).
                            WHEN per_key IS NOT NULL
                                 AND per_key - coalesce(array_length(array_positions(picked_keys, x.k), 1), 0) - (
                                SELECT count(*) FROM (
                                    SELECT FROM {schema}.jobs AS r
                                    WHERE r.status = 'running' AND r.partition_key = x.k AND r.queue = q
                                    LIMIT per_key) AS r) <= 0 THEN false
                            -- The key's rate: its starts inside the window, and this call's picks.
                            WHEN key_rate IS NOT NULL
                                 AND key_rate - coalesce(array_length(array_positions(picked_keys, x.k), 1), 0) - (
                                SELECT count(*) FROM {schema}.key_starts AS r
                                WHERE r.queue = q AND r.partition_key = x.k
                                  AND r.started_at > {schema}.now() - make_interval(secs => key_period)) <= 0 THEN false
                            ELSE pg_try_advisory_xact_lock(key_class, hashtext(q || '/' || x.k)) END) AS t(ok)
                        -- A wrapped pass ends at the cursor (`hi`): tested on the key found, not in
                        -- the probe, where the generic plan made it a filter, not a bound of the
                        -- index scan: a probe past the last key before the cursor read every entry
                        -- to the end of the level (a flood's, and those drained keys left until a
                        -- vacuum: 101k buffers a claim). Tested here, before the key is locked.
                        -- And once a wrapped pass reached the cursor, no probe past it: on the key
                        -- before (a condition on `w` alone, tested before the probe runs), as a probe
                        -- past the cursor reads the entries after it to the next key with a job, or
                        -- to the end of the level (the killed entries of keys that drained, until a
                        -- vacuum: ~1,000 buffers a claim behind 10,000 drained keys of 10).
                        WHERE w.n < walk_limit AND w.got < want - coalesce(cardinality(held), 0)
                          AND (hi IS NULL OR x.k <= hi) AND (hi IS NULL OR w.k < hi)
                    )
                    SELECT coalesce(array_agg(w.k ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                           coalesce(array_agg(w.id ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                           coalesce(array_agg(w.tid ORDER BY w.n) FILTER (WHERE w.ok), '{}'),
                           coalesce(array_agg(w.k ORDER BY w.n), '{}')
                    INTO cand_keys, cand_ids, cand_tids, walk_keys
                    FROM walk AS w
                    WHERE w.n > 0;
                    cand_runs := NULL;
                END IF;
                walked := cardinality(walk_keys);
                last_key := walk_keys[walked];
                IF fair_only AND circle = 1 AND NOT wrapped AND start_key IS NOT NULL
                   AND walked < walk_limit AND cardinality(cand_keys) < want THEN
                    -- A fair queue without limits whose keys after the cursor are fewer than the
                    -- claim wants: the keys before it are walked first, and the whole circle
                    -- shares the claim in one take (a turn of want / keys each), rather than a
                    -- take of a job a key and a circle more. A flood alone was claimed in four
                    -- statements more, the first of them passing over every row of the flood
                    -- that another claim had just taken.
                    held := cand_keys;
                    held_ids := cand_ids;
                    held_tids := cand_tids;
                    held_runs := cand_runs;
                    probes := probes + walked + 1;
                    wrapped := true;
                    lo := '';
                    hi := start_key;
                    CONTINUE;
                ELSIF held IS NOT NULL THEN
                    cand_keys := held || cand_keys;
                    cand_ids := held_ids || cand_ids;
                    cand_tids := held_tids || cand_tids;
                    cand_runs := held_runs || cand_runs;
                    held := NULL;
                    -- The whole circle, if it has a key with a job due (none: the claim takes nothing).
                    IF walked < walk_limit AND cardinality(cand_keys) BETWEEN 1 AND want - 1 THEN
                        per_turn := ceil(want::numeric / cardinality(cand_keys))::int;
                    END IF;
                END IF;
                pass_seen := CASE WHEN key_rate IS NOT NULL THEN walk_keys END;
                IF circle = 1 AND per_key = 1 AND key_rate IS NULL THEN
                    -- Under a per-key limit of 1, a turn is the job the walk found for a key it
                    -- locked: no recount and no take per pass. They are checked once, at the
                    -- end of the claim, in a statement that starts after every lock was held:
                    -- still pending and due, and no job of the key running (one claim holds a
                    -- key's lock at a time, and sees what the claims that held it before took).
                    -- A key whose job another claim started since is then passed over, as the
                    -- recount would have.
                    pass_ids := cand_ids[1:want];
                    pass_keys := cand_keys[1:want];
                    found := found || cand_tids[1:want];
                ELSIF fair_only AND circle = 1 AND per_turn = 1 THEN
                    -- The walk's jobs, locked as it found them: a turn of one each.
                    pass_ids := cand_ids[1:want];
                    pass_tids := cand_tids[1:want];
                    pass_keys := cand_keys[1:want];
                ELSE
                    -- Each key's turn: as many jobs as the turn and its limit allow. A statement of its
                    -- own, after the walk, so its snapshot is taken after the keys were locked: it
                    -- sees every job that the claims that held them before took (a lock is released
                    -- only once its transaction is visible as committed), and counts them.
                    SELECT coalesce(array_agg(greatest(0, least(
                               per_turn,
                               CASE WHEN per_key IS NOT NULL THEN per_key - (
                                   SELECT count(*) FROM (
                                       SELECT FROM {schema}.jobs AS r
                                       WHERE r.status = 'running' AND r.partition_key = k.k AND r.queue = q
                                       LIMIT per_key) AS r
                               ) - coalesce(array_length(array_positions(picked_keys, k.k), 1), 0) END,
                               CASE WHEN key_rate IS NOT NULL THEN key_rate - (
                                   SELECT count(*) FROM {schema}.key_starts AS r
                                   WHERE r.queue = q AND r.partition_key = k.k
                                     AND r.started_at > {schema}.now() - make_interval(secs => key_period)
                               ) - coalesce(array_length(array_positions(picked_keys, k.k), 1), 0) END))
                           ORDER BY k.o), '{}')
                    INTO cand_room
                    FROM unnest(cand_keys) WITH ORDINALITY AS k(k, o);
                    -- The turns, the key's oldest ready jobs, stopping at what the claim wants. Under a
                    -- per-key limit of 1, in the first circle, a turn is the job the walk found, taken
                    -- by primary key if it is still pending: a claim that took it since filled the
                    -- key's one slot (one that holds it now holds the key's lock, which this claim
                    -- then could not have taken).
                    IF circle = 1 AND per_key = 1 THEN
                        SELECT coalesce(array_agg(t.id), '{}'), coalesce(array_agg(t.tid), '{}'),
                               coalesce(array_agg(t.k), '{}')
                        INTO pass_ids, pass_tids, pass_keys
                        FROM (SELECT k.k, c.id, c.tid
                              FROM unnest(cand_keys, cand_ids, cand_room) AS k(k, first_id, room)
                              CROSS JOIN LATERAL (
                                  SELECT c.id, c.ctid AS tid FROM {schema}.jobs AS c
                                  WHERE c.id = k.first_id AND c.status = 'pending' AND c.run_at <= {schema}.now()
                                  LIMIT k.room
                                  FOR UPDATE SKIP LOCKED) AS c
                              LIMIT want) AS t;
                    ELSE
                        SELECT coalesce(array_agg(t.id), '{}'), coalesce(array_agg(t.tid), '{}'),
                               coalesce(array_agg(t.k), '{}')
                        INTO pass_ids, pass_tids, pass_keys
                        FROM (SELECT k.k, c.id, c.tid
                              FROM unnest(cand_keys, cand_room, cand_runs, cand_ids) AS k(k, room, first_run, first_id)
                              CROSS JOIN LATERAL (
                                  SELECT c.id, c.ctid AS tid FROM {schema}.jobs AS c
                                  -- The key as a range of one, in the keyed index's order: an order no
                                  -- other index gives without a sort, whatever the statistics say (an
                                  -- equality would drop the key from the order, and statistics of few
                                  -- keys make one key look like the whole queue). In a fair queue's
                                  -- first circle, from the job the walk found and locked for the key:
                                  -- the jobs before it were taken, or locked by other claims, as the
                                  -- walk saw them, and their entries (the taken ones' until a vacuum:
                                  -- a flood's whole drained part) are not read a second time.
                                  WHERE c.status = 'pending' AND c.partition_key <= k.k
                                    AND (c.partition_key, c.run_at, c.id)
                                        >= (k.k, coalesce(k.first_run, '-infinity'),
                                            CASE WHEN k.first_run IS NULL THEN 0 ELSE k.first_id END)
                                    AND c.queue = q AND c.priority = level AND c.run_at <= {schema}.now()
                                    AND c.id <> ALL (picked)
                                  ORDER BY c.partition_key, c.run_at, c.id
                                  LIMIT k.room
                                  FOR UPDATE SKIP LOCKED) AS c
                              LIMIT want) AS t;
                    END IF;
                END IF;
                probes := probes + walked + 1;
                seen_keys := seen_keys || coalesce(pass_seen, '{}');
                IF (circle = 1 AND per_key = 1 AND key_rate IS NULL) IS NOT TRUE THEN
                    picked := picked || pass_ids;
                    picked_tids := picked_tids || pass_tids;
                END IF;
                picked_keys := picked_keys || pass_keys;
                want := want - cardinality(pass_ids);
                IF cardinality(pass_ids) > 0 AND circle = 1 AND per_key = 1 AND key_rate IS NULL THEN
                    -- Keys of the walk, in its order, a job each: no statement to count them.
                    served := pass_keys[cardinality(pass_keys)];
                    circle_keys := circle_keys + cardinality(pass_keys);
                ELSIF cardinality(pass_ids) > 0 THEN
                    -- In a fair queue without limits, the key of the last job taken: the pass went
                    -- in the circle's order (from the cursor, round past the last key, for a pass
                    -- of the whole circle). Under a limit, the greatest key the pass took.
                    served := CASE WHEN fair_only THEN pass_keys[cardinality(pass_keys)]
                                   ELSE (SELECT max(x) FROM unnest(pass_keys) AS x) END;
                    circle_keys := circle_keys + (SELECT count(DISTINCT x) FROM unnest(pass_keys) AS x);
                END IF;
                IF fair_only THEN
                    -- The keys that gave a job, in the order they were served: the next round's.
                    -- A round among the keys of the circle before is one pass.
                    ring := CASE WHEN circle = 1 THEN ring END
                            || ARRAY(SELECT p.k FROM unnest(pass_keys) WITH ORDINALITY AS p(k, o)
                                     GROUP BY p.k ORDER BY min(p.o));
                END IF;
                IF (walked >= walk_limit OR cardinality(cand_keys) >= want) AND NOT (fair_only AND circle > 1) THEN
                    lo := last_key;  -- more keys in this circle
                    CONTINUE;
                END IF;
                IF NOT wrapped AND start_key IS NOT NULL THEN
                    wrapped := true;  -- go round to the first key, up to the cursor
                    lo := '';
                    hi := start_key;
                    CONTINUE;
                END IF;
                -- A circle is done: another one, if it took anything, sharing what is left among
                -- the keys that had jobs to give; unless a per-key limit no greater than the turn
                -- gave each of them all the room it had (another circle would walk every key of
                -- the queue again for nothing, most of them at their limit).
                EXIT WHEN circle_keys = 0 OR per_key <= per_turn;
                per_turn := greatest(1, ceil(want::numeric / circle_keys)::int);
                circle := circle + 1;
                circle_keys := 0;
                lo := '';
                hi := NULL;
                wrapped := true;
                last_key := NULL;
            END LOOP;
            EXIT levels WHEN level = -2147483647;
            below := level - 1;
        END LOOP;
        IF probes >= max_probes THEN
            served := coalesce(last_key, served);  -- the next claim goes on from where this one stopped
        END IF;
        IF want > 0 THEN
            -- Jobs without a key, from the head of the ready order (a bounded window of it). The
            -- window's rows are told apart by their key as it reads them (an index scan, a row's
            -- key beside its entry); only those without one are looked up again, to be locked. The
            -- window's every row looked up again by primary key (its key was not in the
            -- window's index-only read) cost a claim that came up short in a queue of keyed jobs
            -- alone, as claims at a per-key limit often do, want + 256 descents of jobs_pkey for
            -- nothing: 750 buffers, three times the rest of the read.
            before := cardinality(picked);
            SELECT picked || coalesce(array_agg(c.id), '{}'), picked_tids || coalesce(array_agg(c.tid), '{}')
            INTO picked, picked_tids
            FROM (
                SELECT c.id, c.ctid AS tid FROM {schema}.jobs AS c
                WHERE c.id = ANY (ARRAY(
                    SELECT h.id FROM (
                        SELECT h.id, h.partition_key FROM {schema}.jobs AS h
                        WHERE h.status = 'pending' AND h.queue = q AND h.run_at <= {schema}.now()
                        ORDER BY h.priority DESC, h.run_at, h.id
                        LIMIT want + 256) AS h
                    WHERE h.partition_key IS NULL))
                  AND c.partition_key IS NULL AND c.status = 'pending'
                ORDER BY c.priority DESC, c.run_at, c.id
                LIMIT want
                FOR UPDATE SKIP LOCKED) AS c;
            want := want - (cardinality(picked) - before);
        END IF;
        budget := budget + want;
        IF leader AND served IS DISTINCT FROM start_key THEN
            -- Only the leader moves it (the others' keys lie elsewhere on the circle).
            -- Unless a concurrent claim holds the row (it moves the cursor): waiting for it would
            -- make the claims of a queue take turns again. Nor back: a claim that started from
            -- the same cursor and went further round the circle (past the keys this one locked)
            -- moved it there first, and the keys between are taken.
            UPDATE {schema}.queues AS s SET key_cursor = served
            WHERE s.name = (SELECT l.name FROM {schema}.queues AS l WHERE l.name = q FOR UPDATE SKIP LOCKED)
              AND (s.key_cursor IS NULL OR s.key_cursor = start_key
                   OR (served <= coalesce(start_key, ''), served)
                      > (s.key_cursor <= coalesce(start_key, ''), s.key_cursor COLLATE "C"));
        END IF;
        IF key_rate IS NOT NULL THEN
            PERFORM {schema}.note_key_starts(q, picked_keys, seen_keys, key_rate, key_period);
        END IF;
    END LOOP;
    IF cardinality(picked) > 0 THEN
        -- Every job this call took, locked (by the walk, a take or the fill) since: by the
        -- locked row's address, a TID scan, where their ids cost a descent of jobs_pkey each.
        RETURN QUERY
        UPDATE {schema}.jobs AS j
        SET status = 'running',
            attempts = j.attempts + 1,
            locked_at = {schema}.now(),
            locked_by = $3,
            lease_expires_at = {schema}.now() + make_interval(secs => $4)
        WHERE j.ctid = ANY (picked_tids)
        RETURNING j.id, j.queue, j.task, j.args::text, j.priority, j.attempts, j.max_attempts,
                  j.run_at, j.created_at;
    END IF;
    IF cardinality(found) > 0 THEN
        -- The jobs the walk found under a per-key limit of 1, if still pending and due and no
        -- job of their key is running: this statement starts after every key's lock was held
        -- (its key probed once: as a NOT EXISTS, the planner would read every running job of the
        -- table, in an anti-join). Each at the address the walk read it at (a TID scan, where an
        -- id costs a descent of jobs_pkey), and not locked first: no other claim takes a job of
        -- a key this one holds; a row changed since this statement's snapshot is checked again
        -- in its new version (EvalPlanQual), and one changed before it is not seen at its old
        -- address: left pending, never claimed twice. A row that another transaction holds (a
        -- cancel, an operator's statement) is waited for, 10 ms at most: then the block's
        -- subtransaction undoes what it did, and the jobs are taken each locked first, a held
        -- one passed over (SKIP LOCKED), as before 0048: a descent of jobs_pkey and a row lock
        -- (a WAL record) a job more.
        lock_bound := current_setting('lock_timeout');
        BEGIN
            row_wait := set_config('lock_timeout', '10ms', true);
            WITH t AS (
                UPDATE {schema}.jobs AS j
                SET status = 'running',
                    attempts = j.attempts + 1,
                    locked_at = {schema}.now(),
                    locked_by = $3,
                    lease_expires_at = {schema}.now() + make_interval(secs => $4)
                -- The status check written so that the ready indexes' predicate does not match
                -- it: a generic plan made with statistics of an emptied table read one of them
                -- whole (150,000 rows in the plan tests) in place of the rows' addresses.
                WHERE j.ctid = ANY (found) AND (j.status = 'pending') IS TRUE AND j.run_at <= {schema}.now()
                  AND (SELECT count(*) FROM (
                           SELECT FROM {schema}.jobs AS r
                           WHERE r.status = 'running' AND r.partition_key = j.partition_key AND r.queue = j.queue
                           LIMIT 1) AS r) = 0
                RETURNING j.ctid)
            SELECT coalesce(array_agg(t.ctid), '{}') INTO taken FROM t;
        EXCEPTION WHEN lock_not_available THEN
            WITH t AS (
                UPDATE {schema}.jobs AS j
                SET status = 'running',
                    attempts = j.attempts + 1,
                    locked_at = {schema}.now(),
                    locked_by = $3,
                    lease_expires_at = {schema}.now() + make_interval(secs => $4)
                WHERE j.ctid = ANY (ARRAY(
                    SELECT c.ctid FROM unnest(found) AS f(tid)
                    CROSS JOIN LATERAL (
                        SELECT c.ctid FROM {schema}.jobs AS c
                        WHERE c.ctid = f.tid AND (c.status = 'pending') IS TRUE AND c.run_at <= {schema}.now()
                          AND (SELECT count(*) FROM (
                                   SELECT FROM {schema}.jobs AS r
                                   WHERE r.status = 'running' AND r.partition_key = c.partition_key
                                     AND r.queue = c.queue
                                   LIMIT 1) AS r) = 0
                        FOR UPDATE SKIP LOCKED) AS c))
                RETURNING j.ctid)
            SELECT coalesce(array_agg(t.ctid), '{}') INTO taken FROM t;
        END;
        row_wait := set_config('lock_timeout', lock_bound, true);
        -- The rows as this claim left them (by their new addresses: its own, locked to its end).
        RETURN QUERY
        SELECT j.id, j.queue, j.task, j.args::text, j.priority, j.attempts, j.max_attempts,
               j.run_at, j.created_at
        FROM {schema}.jobs AS j
        WHERE j.ctid = ANY (taken);
    END IF;
END
$$;
