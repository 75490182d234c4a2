"""Keyed claims side by side: claims of a queue with per-key settings and no global limit run at
once in every worker (no queue-wide lock); a key that one claim is taking is passed over by the
others, and what that claim took counts against the key's limit in every claim after it."""

from __future__ import annotations

import time
from typing import Any, cast

import anyio
import asyncpg

import aioqueue
from aioqueue._config import WorkerConfig
from aioqueue._producer import Producer
from tests.support.helpers import add_keyed_jobs, eventually, running
from tests.support.plans import explain_nested, nodes, scans

CLAIM = ("SELECT j.partition_key FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[$1::int], 'w', 30, $1::int, NULL)"
         " AS c JOIN aioqueue.jobs AS j ON j.id = c.id")
CLAIM_IDS = "SELECT c.id FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[$1::int], 'w', 30, $1::int, NULL) AS c"


async def most_running_of_one_key(db: asyncpg.Connection) -> int | None:
    """The most jobs of one key running at once (None: none running)."""
    return cast(int | None, await db.fetchval(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM aioqueue.jobs WHERE status = 'running'"
        " GROUP BY partition_key) AS r"))


async def test_claims_of_a_keyed_queue_do_not_wait_for_the_queues_row(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """The queue's settings row stays locked by another transaction (as a claim of a queue with a
    global limit holds it): the keyed queue's worker claims and runs its jobs all the same."""
    ran: list[str] = []

    @q.task(queue="tenants")
    async def work(key: str) -> None:
        ran.append(key)

    await q.set_key_limits("tenants", concurrency=1)
    for key in ("a", "b", "c"):
        await work.options(partition_key=key).enqueue_many([{"key": key}] * 2)
    holder = await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT FROM aioqueue.queues WHERE name = 'tenants' FOR UPDATE")
            async with running(q.worker(concurrency=3, poll_interval=0.05)):
                await eventually(lambda: len(ran) == 6, timeout=20, what="every job, the row locked")
    finally:
        await holder.close()
    assert sorted(ran) == ["a", "a", "b", "b", "c", "c"]


async def test_a_key_an_open_claim_holds_is_passed_over_then_counted(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", concurrency=1)
    await work.options(partition_key="a").enqueue_many([{}] * 3)
    await work.options(partition_key="b").enqueue_many([{}] * 3)
    other = await asyncpg.connect(dsn)
    try:
        tr = other.transaction()
        await tr.start()
        first = [r["partition_key"] for r in await other.fetch(CLAIM, 1)]
        assert len(first) == 1
        [taken] = first
        # The open claim holds its key: another claim takes the other key only.
        with anyio.fail_after(10):
            second = [r["partition_key"] for r in await db.fetch(CLAIM, 5)]
        assert second == [k for k in ("a", "b") if k != taken]
        await tr.commit()
        # Committed, its running job counts: both keys are at their limit of 1.
        assert await db.fetch(CLAIM, 5) == []
    finally:
        await other.close()
    running_now = await db.fetch(
        "SELECT partition_key, count(*) AS n FROM aioqueue.jobs WHERE status = 'running' GROUP BY 1 ORDER BY 1")
    assert [(r["partition_key"], r["n"]) for r in running_now] == [("a", 1), ("b", 1)]


async def test_a_keyed_claim_takes_no_more_than_it_asks_for(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A fair queue of three keys, a claim of 10: a turn each, then turns of several jobs per key
    for the rest, which stop at the 10th job (the claim of migration 0026 took 12)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    for key in ("a", "b", "c"):
        await work.options(partition_key=key).enqueue_many([{}] * 20)
    taken = [r["partition_key"] for r in await db.fetch(CLAIM, 10)]
    assert len(taken) == 10
    assert set(taken) == {"a", "b", "c"}
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'running'") == 10


async def jobs_of_keys_at_limit_one(q: aioqueue.Queue, keys: list[str], each: int) -> None:
    """Queue "tenants" under a per-key limit of 1, ``each`` no-op jobs of each of ``keys``."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", concurrency=1)
    for key in keys:
        await work.options(partition_key=key).enqueue_many([{}] * each)


async def two_jobs_of_a_and_z_keys(q: aioqueue.Queue) -> None:
    """Queue "tenants" under a per-key limit of 1, two jobs each of keys a-01..a-09, z-01..z-09."""
    await jobs_of_keys_at_limit_one(q, [f"{p}-{i:02d}" for p in ("a", "z") for i in range(1, 10)], 2)


async def test_a_claim_beside_another_starts_away_from_the_keys_it_holds(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Under a per-key limit, a claim that runs while another claim of the queue stays open
    waits for it a bounded time (see the next test), then starts at a point drawn between the
    first and the last key (here: after a letter from a to z), not from the cursor, where the
    first one holds every key it took: it takes keys of the far end, none of the first one's,
    and the limit holds. Both claims of 0029 started from the cursor, so the second took the
    keys right after the first one's."""

    await two_jobs_of_a_and_z_keys(q)
    other = await asyncpg.connect(dsn)
    try:
        async with other.transaction():
            first = sorted(r["partition_key"] for r in await other.fetch(CLAIM, 3))
            assert first == ["a-01", "a-02", "a-03"]
            await db.execute("SELECT setseed(0.5)")  # the draw: a letter after 'a'
            with anyio.fail_after(10):
                second = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3))
        assert second == ["z-01", "z-02", "z-03"]
        # The cursor is the first claim's: the next claim, alone, goes on after a-03.
        assert await db.fetchval("SELECT key_cursor FROM aioqueue.queues WHERE name = 'tenants'") == "a-03"
        assert sorted(r["partition_key"] for r in await db.fetch(CLAIM, 2)) == ["a-04", "a-05"]
    finally:
        await other.close()
    assert await most_running_of_one_key(db) == 1


LEADER = "SELECT pg_advisory_xact_lock(hashtext('aioqueue.claim_keyed.leader'), hashtext('tenants'))"
WAITING = ("SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
           " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")


async def test_a_claim_waits_for_the_claim_before_it_and_goes_on_where_it_left_the_cursor(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Under a per-key limit, a claim that starts while another claim of the queue runs waits
    for it (a few milliseconds at most; here longer, so that a loaded machine cannot make it
    start at random as in the test above), then starts from the cursor as that claim left it,
    read after the wait: the keys ahead of it, none of those the other took. Claims of 0033
    started at once at a point drawn at random, and walked keys the others had taken (two
    keys a job in the per-key benchmark). The other claim here is a transaction that holds
    the queue's claim lock and moves the cursor past a-03; it commits once the claim waits."""

    await two_jobs_of_a_and_z_keys(q)
    other = await asyncpg.connect(dsn)
    try:
        held = other.transaction()
        await held.start()
        await other.execute(LEADER)
        await other.execute("UPDATE aioqueue.queues SET key_cursor = 'a-03' WHERE name = 'tenants'")

        async def commit_once_waited() -> None:
            await eventually(lambda: other.fetchval(WAITING), what="the claim to wait for the other")
            await held.commit()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(commit_once_waited)
                async with db.transaction():
                    await db.execute("SET LOCAL aioqueue.keyed_claim_wait = '15s'")
                    taken = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3))
    finally:
        await other.close()
    assert taken == ["a-04", "a-05", "a-06"]
    assert await db.fetchval("SELECT key_cursor FROM aioqueue.queues WHERE name = 'tenants'") == "a-06"
    assert await most_running_of_one_key(db) == 1


async def test_a_claim_waits_up_to_sixty_milliseconds_for_its_turn(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Under a per-key limit, a claim waits for the claim before it 60 ms at most (the session's
    default; 0036 waited 5 ms, 0038 to 0045 20 ms: on a loaded machine the claims queued behind
    two others ran out of it, and those walked at random, past keys the others held), then
    starts at random. The other claim here holds the queue's claim lock for as long as the test
    runs: the claim returns only once its wait ran out, as in the first test of the two above."""

    await two_jobs_of_a_and_z_keys(q)
    other = await asyncpg.connect(dsn)
    try:
        async with other.transaction():
            await other.execute(LEADER)
            # The session's first claims plan their statements (milliseconds on a loaded
            # machine): made first, and undone.
            warm_up = db.transaction()
            await warm_up.start()
            await db.execute("SET LOCAL aioqueue.keyed_claim_wait = '1ms'")
            await db.fetch(CLAIM, 3)
            await warm_up.rollback()
            await db.execute("SELECT setseed(0.5)")  # the draw: a letter after 'a'
            started = time.monotonic()
            with anyio.fail_after(10):
                taken = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3))
            waited = time.monotonic() - started
    finally:
        await other.close()
    assert waited >= 0.059, waited
    assert taken == ["z-01", "z-02", "z-03"]


async def test_a_claim_at_a_limit_of_one_checks_the_jobs_it_found_in_its_update(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """Under a per-key limit of 1, a pass of the claim is its walk: the jobs it found are checked
    (still pending, no job of their key running) in the one UPDATE that marks them running, a
    claim's fixed cost. 0031 counted the keys' running jobs again and took their jobs in two
    statements more per pass, and counted the keys served in two more."""

    await jobs_of_keys_at_limit_one(q, ["a", "b", "c", "d"], 2)
    await db.execute("UPDATE aioqueue.jobs SET status = 'running' WHERE id = "
                     "(SELECT min(id) FROM aioqueue.jobs WHERE partition_key = 'b')")
    ran = await explain_nested(db, CLAIM, 3)
    texts = [str(p.get("Query Text", "")) for p in ran]
    # The claim's own statement, and inside the function: the commit mode, the queue's settings,
    # the level, the walk, the cursor, the UPDATE and the read of the rows it marked (0031: 11;
    # 0032 to 0047: 7, the UPDATE returned them, but locked each row first).
    assert len(ran) <= 8, texts
    async with db.transaction():
        assert sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3)) == ["a", "c", "d"]
    assert await most_running_of_one_key(db) == 1


async def test_a_claim_at_a_limit_of_one_marks_the_jobs_where_its_walk_found_them(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """Under a per-key limit of 1, the UPDATE that marks the found jobs running reads each row at
    the address the walk read it at (a TID scan) and locks none first: no descent of the
    primary key and no row lock (a WAL record) a job, as until 0048."""

    # Enough rows, and their statistics, that a scan of the table is not the cheaper plan.
    await jobs_of_keys_at_limit_one(q, ["a", "b", "c"], 500)
    await db.execute("ANALYZE aioqueue.jobs")
    ran = await explain_nested(db, CLAIM, 3)
    takes = [p for p in ran if str(p.get("Query Text", "")).lstrip().startswith("WITH t AS")
             and "UPDATE" in str(p.get("Query Text", ""))]
    assert len(takes) == 1, [p.get("Query Text") for p in ran]
    read = [s for s in scans(takes[0], executed=True) if s.relation == "jobs"]
    # The rows' own read (Tid Scan), and inside the check: the running index.
    assert ("Tid Scan", None) in [(s.node_type, s.index_name) for s in read], read
    assert {s.index_name for s in read} == {None, "jobs_partition_running_idx"}, read
    assert all(n["Node Type"] != "LockRows" for n in nodes(takes[0])), takes[0]
    async with db.transaction():
        assert sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3)) == ["a", "b", "c"]
    assert await most_running_of_one_key(db) == 1


async def test_a_claim_at_a_limit_of_one_passes_over_a_job_another_transaction_holds(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Another transaction holds the row of key b's oldest job (an operator's statement, a
    cancel under way) for as long as it likes: the claim, which marks the jobs its walk found
    without locking them first, waits for the row 10 ms at most, then takes them each locked
    first and passes over the held one. It takes a's and c's jobs at once, b's stays pending and
    is taken once the row is free, and no key ever runs two."""

    await jobs_of_keys_at_limit_one(q, ["a", "b", "c"], 2)
    held = await db.fetchval("SELECT min(id) FROM aioqueue.jobs WHERE partition_key = 'b'")
    holder = await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            await holder.execute("SELECT FROM aioqueue.jobs WHERE id = $1 FOR UPDATE", held)
            with anyio.fail_after(10):
                taken = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3))
            assert taken == ["a", "c"]
            assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", held) == "pending"
    finally:
        await holder.close()
    assert [r["id"] for r in await db.fetch(CLAIM_IDS, 3)] == [held]
    assert await most_running_of_one_key(db) == 1


async def test_claims_at_a_limit_of_one_side_by_side_never_run_two_jobs_of_a_key(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Claims of three sessions at once, round after round, some of them the queue's leader and
    the others (their wait for it cut to a millisecond) starting at random, while jobs finish in
    between: no key ever has two jobs running. The leader marks the jobs its walk found without
    locking their rows first; a claim that starts at random holds the keys it takes, as the
    leader does, and checks their running jobs once it holds them."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", concurrency=1)
    await add_keyed_jobs(db, work.name, range(1, 31), 8)
    sessions = [await asyncpg.connect(dsn, server_settings={"aioqueue.keyed_claim_wait": "1ms"})
                for _ in range(3)]
    try:
        for _ in range(25):
            async with anyio.create_task_group() as tg:
                for session in sessions:
                    tg.start_soon(session.fetch, CLAIM_IDS, 7)
            assert await most_running_of_one_key(db) == 1
            # Half the running jobs finish: their keys come round again.
            await db.execute("DELETE FROM aioqueue.jobs WHERE id IN (SELECT id FROM aioqueue.jobs"
                             " WHERE status = 'running' ORDER BY random() LIMIT 10)")
    finally:
        for session in sessions:
            await session.close()


async def test_a_walk_counts_a_keys_jobs_only_under_the_limit_that_needs_them(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """The walk counts each key's recent starts only under a key rate, and its running jobs only
    under a concurrency limit: 0032 counted both for every key walked, the result of the one
    without its limit unused (a probe of key_starts per key at a concurrency limit of 1)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    for key in ("a", "b", "c"):
        await work.options(partition_key=key).enqueue()

    async def indexes_read() -> set[str | None]:
        ran = await explain_nested(db, CLAIM, 3)
        return {s.index_name for plan in ran for s in scans(plan, executed=True)}

    await q.set_key_limits("tenants", concurrency=1)
    read = await indexes_read()
    assert "jobs_partition_running_idx" in read and "key_starts_key_idx" not in read, read
    await q.set_key_limits("tenants", rate=(10, 60.0))
    read = await indexes_read()
    assert "key_starts_key_idx" in read and "jobs_partition_running_idx" not in read, read


async def test_a_worker_whose_limits_are_per_key_claims_without_the_global_limits(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """A worker whose limited queues have per-key settings and none a global limit claims with
    claim_keyed_timed: the keyed queues through claim_keyed, the others beside them, and a queue
    paused or given a global limit since the worker read its limits nothing (it claims that one
    with claim_timed once it reads them again)."""
    for queue in ("tenants", "plain", "capped", "paused"):
        @q.task(queue=queue, name=f"work_{queue}")
        async def work() -> None:
            pass

        for key in ("a", "a", "b") if queue == "tenants" else (None, None):
            await work.options(partition_key=key).enqueue()
    await q.set_key_limits("tenants", concurrency=1)
    queues = ["capped", "paused", "plain", "tenants"]
    sent: list[str] = []

    class Statements:  # the worker's statements, the claims it binds noted
        def __getattr__(self, name: str) -> Any:
            return getattr(q.database.statements, name)

        def claim(self, **kwargs: Any) -> Any:
            bound = q.database.statements.claim(**kwargs)
            sent.append(bound.sql)
            return bound

    class Database:
        statements = Statements()

        def __getattr__(self, name: str) -> Any:
            return getattr(q.database, name)

    producer = Producer(cast(Any, Database()), WorkerConfig(name="w", lease=60), queues=queues)
    assert len(await producer.claim(10)) == 8  # tenants's keys a and b, and two jobs of each other queue
    assert sent == [q.queries.claim_keyed_timed]  # the limits it read: tenants's, per key
    await db.execute("UPDATE aioqueue.jobs SET status = 'pending', lease_expires_at = NULL")
    await q.set_limits("capped", concurrency=5)
    await q.pause("paused")
    row = await db.fetchrow(q.queries.claim_keyed_timed, queues, [10] * 4, "w", 60.0, 40, "off")
    assert row is not None and row["claimed_at"] is not None  # the claim's database time
    claimed = await db.fetch("SELECT queue, partition_key FROM aioqueue.jobs WHERE id = ANY($1::bigint[])",
                             row["id"])
    assert sorted((r["queue"], r["partition_key"] or "") for r in claimed) == [
        ("plain", ""), ("plain", ""), ("tenants", "a"), ("tenants", "b")]
    producer.take_limits(await db.fetch(q.queries.limited_queues, queues))
    await producer.claim(10)
    assert sent[-1] == q.queries.claim_timed  # a global limit: the queue's row is locked first


async def test_fair_claims_side_by_side_take_each_job_once(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Four claims at a time of a fair queue, all from one cursor, racing for the same keys'
    first jobs: each job is taken by one claim, and every job is taken."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    for key in range(40):
        await work.options(partition_key=f"k{key:02d}").enqueue_many([{}] * 5)
    conns = [await asyncpg.connect(dsn) for _ in range(4)]
    taken: list[int] = []

    async def claims(conn: asyncpg.Connection) -> None:
        while rows := await conn.fetch(CLAIM_IDS, 7):
            taken.extend(r["id"] for r in rows)

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for conn in conns:
                    tg.start_soon(claims, conn)
    finally:
        for conn in conns:
            await conn.close()
    assert len(taken) == len(set(taken)) == 200
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'running'") == 200


async def test_a_keyed_claim_passes_over_a_key_with_no_job_due(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A key whose oldest job is not due has no turn, in a fair queue as under a per-key limit;
    the key after it has its turn all the same (and its second in the next circle)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await work.options(partition_key="a", delay=3600).enqueue()
    await work.options(partition_key="b").enqueue_many([{}] * 2)
    for fair, limit in ((True, None), (False, 2)):
        await q.set_key_limits("tenants", concurrency=limit, fair=fair)
        tr = db.transaction()
        await tr.start()
        try:
            assert sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3)) == ["b", "b"]
        finally:
            await tr.rollback()


async def test_a_fair_claim_of_more_than_a_turn_a_key_goes_round_from_the_cursor(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """Three keys, the cursor at b, a claim of 5: the share goes from the key after the cursor
    round (c and a get two, b one: one take of two a key, in the order c, a, b), and the cursor
    stays at b, the key of the take's last job. (Until 0035 the second turns went from the first
    key, a and b, and c got one.)"""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    for key in ("a", "b", "c"):
        await work.options(partition_key=key).enqueue_many([{}] * 10)
    await db.execute("UPDATE aioqueue.queues SET key_cursor = 'b' WHERE name = 'tenants'")
    taken = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 5))
    assert taken == ["a", "a", "b", "c", "c"]
    assert await db.fetchval("SELECT key_cursor FROM aioqueue.queues WHERE name = 'tenants'") == "b"


async def test_a_fair_claim_past_the_cursor_with_no_job_due_takes_nothing(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """Keys whose jobs are not due, on both sides of the cursor: the claim's whole circle has no
    key to share it among, and takes nothing (0035 divided by that number of keys)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    for key in ("a", "c"):
        await work.options(partition_key=key, delay=3600).enqueue()
    await db.execute("UPDATE aioqueue.queues SET key_cursor = 'b' WHERE name = 'tenants'")
    assert await db.fetch(CLAIM, 5) == []


async def test_a_fair_claim_that_wraps_round_stops_at_the_cursor(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A flood after the cursor and no key before it: the claim wraps round to the first key and
    stops at the cursor, reading a few index entries, not every entry of the flood (until 0039
    the wrapped pass's bound was a filter of its probe, which read the flood's entries to the
    end of the level at every claim)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    await work.options(partition_key="z").enqueue_many([{}] * 3000)
    await db.execute("UPDATE aioqueue.queues SET key_cursor = 'm' WHERE name = 'tenants'")
    async with db.transaction():
        assert [r["partition_key"] for r in await db.fetch(CLAIM, 10)] == ["z"] * 10
        read = await db.fetchval(
            "SELECT pg_stat_get_xact_tuples_returned('aioqueue.jobs_partition_ready_idx'::regclass)")
    assert 10 <= read < 100


async def test_a_fair_claim_past_drained_keys_reads_their_entries_once(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """One key left after 1,000 drained keys that sort after it (the fair drain's flood-alone
    state, before a vacuum): the claim's pass from the cursor reads the drained keys' index
    entries to the end of the level, and its pass that wraps round stops at the cursor, where
    until 0040 it probed past it, reading them all a second time."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    await work.options(partition_key="f").enqueue_many([{}] * 300)
    await add_keyed_jobs(db, work.name, range(1000, 2000), 3)
    await db.execute("DELETE FROM aioqueue.jobs WHERE partition_key <> 'f'")
    await db.execute("UPDATE aioqueue.queues SET key_cursor = 'f' WHERE name = 'tenants'")
    blocks = "SELECT pg_stat_get_xact_blocks_fetched('aioqueue.jobs_partition_ready_idx'::regclass)"
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            before = await conn.fetchval(blocks)
            assert await conn.fetch(
                "SELECT FROM aioqueue.jobs WHERE status = 'pending' AND partition_key IS NOT NULL"
                " AND queue = 'tenants' AND priority = 0 AND partition_key > 'f'"
                " ORDER BY queue, priority DESC, partition_key, run_at, id LIMIT 1") == []
            drained = await conn.fetchval(blocks) - before  # one read of the drained keys' entries
            before = await conn.fetchval(blocks)
            assert [r["partition_key"] for r in await conn.fetch(CLAIM, 10)] == ["f"] * 10
            read = await conn.fetchval(blocks) - before
    finally:
        await conn.close()
    assert drained >= 20
    assert read < drained + 10


async def test_a_fair_claim_takes_each_keys_job_in_its_walk(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A fair queue without limits, a claim of 100 over 200 keys: a turn of one job is the job
    the walk found for its key, locked as it was found, one index probe a key (until 0041, a
    statement after the walk probed each key again to take its job: twice as many entries)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    await add_keyed_jobs(db, work.name, range(1000, 1200), 2)
    returned = "SELECT pg_stat_get_xact_tuples_returned('aioqueue.jobs_partition_ready_idx'::regclass)"
    async with db.transaction():
        before = await db.fetchval(returned)
        taken = sorted(r["partition_key"] for r in await db.fetch(CLAIM, 100))
        read = await db.fetchval(returned) - before
    assert taken == [f"k{k}" for k in range(1000, 1100)]
    assert 100 <= read <= 110


async def test_a_keyed_claim_reads_the_jobs_table_by_index_before_its_first_analyze(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """A queue's first keyed claims run on a table without statistics: its plans (made once a
    session, generic) read jobs by index all the same, never a scan of the whole table, which
    such a plan would keep reading after the table grows, until the next ANALYZE (0042 updated
    the found jobs by a scan of the table and checked them by a filtered read of the ready index,
    on a table of a few rows that had not been analysed)."""

    await jobs_of_keys_at_limit_one(q, ["a", "b", "c"], 2)
    assert await db.fetchval(
        "SELECT reltuples < 0 FROM pg_class WHERE oid = 'aioqueue.jobs'::regclass"), "analysed"
    ran = await explain_nested(db, CLAIM, 3)
    inside = [p for p in ran if "claim_keyed(" not in str(p.get("Query Text", ""))]  # not the test's join
    seq = [str(p.get("Query Text", "")) for p in inside
           if any(s.relation == "jobs" and s.node_type == "Seq Scan" for s in scans(p, executed=False))]
    assert seq == [], seq
    async with db.transaction():
        assert sorted(r["partition_key"] for r in await db.fetch(CLAIM, 3)) == ["a", "b", "c"]


async def test_a_short_keyed_claim_looks_up_again_only_the_jobs_without_a_key(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """A claim at a per-key limit that comes up short fills its room with jobs without a key, read
    from a window at the head of the queue's ready order: only the window's jobs without a key
    are looked up again by primary key (to be locked), not every job of the window (0043: a
    descent of jobs_pkey for each of the window's 202 jobs, to find 2)."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", concurrency=1)
    await work.options(partition_key="a").enqueue_many([{}] * 200)
    await work.enqueue_many([{}] * 2)  # behind the keyed ones, inside the window of 9 + 256
    await db.execute("ANALYZE aioqueue.jobs")
    ran = await explain_nested(db, CLAIM_IDS, 10)
    fill = [p for p in ran if "partition_key IS NULL" in str(p.get("Query Text", ""))
            and "LIMIT want + 256" in str(p.get("Query Text", ""))]
    assert len(fill) == 1, [p.get("Query Text") for p in ran]
    looked_up = sum(
        int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0))
        for n in nodes(fill[0]) if n.get("Index Name") == "jobs_pkey")
    assert looked_up == 2, [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in nodes(fill[0])]
    async with db.transaction():
        taken = await db.fetch(CLAIM, 10)
    assert sorted(r["partition_key"] or "" for r in taken) == ["", "", "a"]
