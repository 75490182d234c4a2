"""A fair queue's tail: once only keys before the cursor have jobs (a flood, after the other keys
drained), a claim whose pass from the cursor found no key notes it in its session, and the
session's next claims skip that pass while no job was added and for a bounded time
(`aioqueue.fair_tail_bound`) and no job of the newest ids is pending past the cursor; what they
read, and that a job after the cursor is still found."""

from __future__ import annotations

import anyio
import asyncpg

import aioqueue
from tests.support.helpers import add_keyed_jobs

CLAIM = ("SELECT c.id, j.partition_key FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[$1::int], 'w', 30, $1::int,"
         " NULL) AS c JOIN aioqueue.jobs AS j ON j.id = c.id ORDER BY c.id")
# Pages read of the two indexes a keyed claim reads its keys and levels from.
BLOCKS = ("SELECT pg_stat_get_xact_blocks_fetched('aioqueue.jobs_partition_ready_idx'::regclass)"
          " + pg_stat_get_xact_blocks_fetched('aioqueue.jobs_ready_idx'::regclass)")


async def flood_alone(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """Key 'f' with 300 jobs pending behind 3,000 of its own that drained, and 1,000 keys after
    it that drained (3 jobs each), their entries left in the indexes (no vacuum); cursor 'f'."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    await work.options(partition_key="f").enqueue_many([{}] * 3300)
    await add_keyed_jobs(db, work.name, range(1000, 2000), 3)
    await db.execute(
        "DELETE FROM aioqueue.jobs WHERE partition_key <> 'f'"
        " OR id < (SELECT min(id) + 3000 FROM aioqueue.jobs WHERE partition_key = 'f')")
    await db.execute("UPDATE aioqueue.queues SET key_cursor = 'f' WHERE name = 'tenants'")


async def claim(conn: asyncpg.Connection, n: int) -> tuple[list[str], int]:
    """One claim of ``n`` in its own transaction, committed: its jobs' keys and the pages read."""
    async with conn.transaction():
        before = await conn.fetchval(BLOCKS)
        keys = [r["partition_key"] for r in await conn.fetch(CLAIM, n)]
        return keys, await conn.fetchval(BLOCKS) - before


async def test_a_fair_claim_after_one_that_found_no_key_past_the_cursor_reads_no_drained_entry(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """A claim's pass from the cursor found no key: the session's next claim skips it (the 1,000
    drained keys' entries), and reads the flood key's drained part once, for its level, not in
    its walk and take again (until 0045, the next claim read the drained keys' entries again,
    and the flood's drained part three times)."""
    await flood_alone(q, db)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET aioqueue.fair_tail_bound = '1h'")
        async with conn.transaction():
            before = await conn.fetchval(BLOCKS)
            assert await conn.fetch(  # one read of the drained keys' entries
                "SELECT FROM aioqueue.jobs WHERE status = 'pending' AND partition_key IS NOT NULL"
                " AND queue = 'tenants' AND priority = 0 AND partition_key > 'f'"
                " ORDER BY queue, priority DESC, partition_key, run_at, id LIMIT 1") == []
            drained = await conn.fetchval(BLOCKS) - before
            before = await conn.fetchval(BLOCKS)
            await conn.fetch(  # one read of the flood's drained part, to its first pending job
                "SELECT FROM aioqueue.jobs WHERE status = 'pending' AND partition_key IS NOT NULL"
                " AND queue = 'tenants' AND priority = 0"
                " ORDER BY queue, priority DESC, partition_key, run_at, id LIMIT 1")
            head = await conn.fetchval(BLOCKS) - before
        first, _ = await claim(conn, 10)
        second, read = await claim(conn, 10)
        ids = await db.fetch("SELECT id FROM aioqueue.jobs WHERE status = 'running' ORDER BY id")
    finally:
        await conn.close()
    assert drained >= 20 and head >= 15, (drained, head)
    assert first == second == ["f"] * 10
    assert [r["id"] for r in ids] == list(range(ids[0]["id"], ids[0]["id"] + 20))  # the oldest, in order
    assert read < head + 10, (read, head, drained)


async def test_a_job_added_past_the_cursor_is_claimed_by_the_next_claim(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """The session noted no key past the cursor, with a bound of an hour: a job added since (the
    job ids' sequence moved) has its key's turn in the next claim all the same."""
    await flood_alone(q, db)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET aioqueue.fair_tail_bound = '1h'")
        assert (await claim(conn, 10))[0] == ["f"] * 10
        await db.execute(
            "INSERT INTO aioqueue.jobs (queue, task, args, partition_key)"
            " SELECT 'tenants', task, '{}', 'z' FROM aioqueue.jobs LIMIT 1")
        assert sorted((await claim(conn, 10))[0]) == ["f"] * 9 + ["z"]
    finally:
        await conn.close()


async def test_a_job_whose_adding_transaction_commits_after_the_pass_is_claimed_by_the_next_claim(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """A job past the cursor whose id was taken before the pass noted no key there (the sequence
    does not move again) and whose transaction commits after the pass: the next claim finds it,
    the bound an hour (until 0047, the session's claims passed it over for the bound: 100 ms
    by default, in the per-key benchmark one batch of the small keys' in three or four)."""
    await flood_alone(q, db)
    conn = await asyncpg.connect(dsn)
    adding = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET aioqueue.fair_tail_bound = '1h'")
        async with adding.transaction():
            await adding.execute(
                "INSERT INTO aioqueue.jobs (queue, task, args, partition_key)"
                " SELECT 'tenants', task, '{}', 'z' FROM aioqueue.jobs LIMIT 1")
            assert (await claim(conn, 10))[0] == ["f"] * 10
        assert sorted((await claim(conn, 10))[0]) == ["f"] * 9 + ["z"]
    finally:
        await adding.close()
        await conn.close()


async def test_a_job_another_claim_held_locked_during_the_pass_is_claimed_by_the_next_claim(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """A job past the cursor that another transaction held locked while the pass ran (a walk
    locks a job added after its own transaction began, not due for it, and leaves it pending):
    once it is free, the next claim finds it, the bound an hour (until 0047, passed over)."""
    await flood_alone(q, db)
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, partition_key)"
        " SELECT 'tenants', task, '{}', 'z' FROM aioqueue.jobs LIMIT 1")
    conn = await asyncpg.connect(dsn)
    holding = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET aioqueue.fair_tail_bound = '1h'")
        async with holding.transaction():
            await holding.execute("SELECT FROM aioqueue.jobs WHERE partition_key = 'z' FOR UPDATE")
            assert (await claim(conn, 10))[0] == ["f"] * 10
        assert sorted((await claim(conn, 10))[0]) == ["f"] * 9 + ["z"]
    finally:
        await holding.close()
        await conn.close()


async def running_past_the_cursor(db: asyncpg.Connection) -> None:
    """A job of key 'z' (past the cursor) running, its lease expired; then 64 ids given out
    (jobs added and gone): its id is not among the newest a claim checks before it skips."""
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, partition_key, status, attempts, locked_at, locked_by,"
        " lease_expires_at) SELECT 'tenants', task, '{}', 'z', 'running', 1, now(), 'w', now() - interval '1 s'"
        " FROM aioqueue.jobs LIMIT 1")
    await db.execute("SELECT nextval('aioqueue.jobs_id_seq') FROM generate_series(1, 64)")


async def back_to_pending(db: asyncpg.Connection) -> None:
    """What reap_expired does to that job: pending again, its id the same (the sequence stays)."""
    await db.execute(
        "UPDATE aioqueue.jobs SET status = 'pending', run_at = now(), lease_expires_at = NULL,"
        " locked_at = NULL, locked_by = NULL WHERE partition_key = 'z'")


async def test_a_job_back_to_pending_past_the_cursor_may_wait_for_the_bound(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """The trade 0045 makes: a job of a key past the cursor that goes back to pending without a
    new id, after the session noted no key there, is passed over by the session's claims until
    the note's bound runs out (an hour here; 100 ms by default), unless its id is among the 64
    newest the sequence gave before the note."""
    await flood_alone(q, db)
    await running_past_the_cursor(db)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET aioqueue.fair_tail_bound = '1h'")
        assert (await claim(conn, 10))[0] == ["f"] * 10
        await back_to_pending(db)
        assert (await claim(conn, 10))[0] == ["f"] * 10
    finally:
        await conn.close()


async def test_a_job_back_to_pending_past_the_cursor_is_claimed_once_the_bound_ran_out(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """The same with the default bound (100 ms): the key past the cursor has its turn while the
    flood's jobs are still pending, a claim of one job at a time."""
    await flood_alone(q, db)
    await running_past_the_cursor(db)
    conn = await asyncpg.connect(dsn)
    try:
        assert (await claim(conn, 1))[0] == ["f"]
        await back_to_pending(db)
        taken: list[str] = []
        with anyio.fail_after(20):
            while "z" not in taken:
                taken += (await claim(conn, 1))[0]
                await anyio.sleep(0.005)  # the bound is time: nothing to wait for but a clock
    finally:
        await conn.close()
    assert taken[-1] == "z" and len(taken) < 300  # the flood had 300 pending


async def test_a_bound_of_zero_set_at_connect_turns_the_skip_off(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """`aioqueue.fair_tail_bound` set to `0` among a connection's server settings (what a queue's
    `connect_kwargs={"server_settings": {...}}` gives every connection it opens, as the per-key
    page says): no pass is skipped, and a job back to pending past the cursor has its turn in
    the next claim."""
    await flood_alone(q, db)
    await running_past_the_cursor(db)
    conn = await asyncpg.connect(dsn, server_settings={"aioqueue.fair_tail_bound": "0"})
    try:
        assert (await claim(conn, 10))[0] == ["f"] * 10
        await back_to_pending(db)
        assert "z" in (await claim(conn, 10))[0]
    finally:
        await conn.close()
