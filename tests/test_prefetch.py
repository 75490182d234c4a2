"""Adaptive prefetch, the default: short jobs are claimed in large batches, long jobs are never
hoarded, a worker never holds more than its cap, and a stopping worker gives back at once what
it holds unstarted."""

from __future__ import annotations

import sys

import anyio
import asyncpg

import aioqueue
from aioqueue._producer import Prefetch

from .helpers import eventually


def test_buffer_follows_rate_times_round_trip_within_the_cap() -> None:
    pace = Prefetch(cap=1000)
    assert pace.target() == 0  # nothing finished yet: claim only for free slots
    pace.claimed(0.001)
    # 1-s jobs on 10 slots: 10 jobs/s x 1 ms is far below one job: buffer nothing.
    for second in range(1, 30):
        pace.finished(10 * second, pace._at + 1.0)
    assert 9 < pace.rate < 11
    assert pace.target() == 0
    # No-op jobs at 50,000/s: 50 jobs per 1-ms round trip, times the margin.
    fast = Prefetch(cap=1000)
    fast.claimed(0.001)
    for step in range(1, 50):  # samples of 20 ms (above SAMPLE even after float rounding)
        fast.finished(1000 * step, fast._at + 0.02)
    assert 50 * Prefetch.MARGIN * 0.9 <= fast.target() <= 50 * Prefetch.MARGIN
    fast.claimed(0.5)  # a slow round trip: the buffer would be 50,000, but the cap holds
    assert fast.target() == 1000
    assert Prefetch(cap=0).target() == 0


async def test_two_worker_processes_share_one_second_jobs(dsn: str, db: asyncpg.Connection) -> None:
    from .prefetch_worker import NAPS_TABLE

    await db.execute(NAPS_TABLE)
    q = aioqueue.Queue(dsn)

    @q.task(name="nap", queue="naps")
    async def nap() -> None: ...

    async with q:
        processes = [
            await anyio.open_process([sys.executable, "-m", "tests.prefetch_worker", dsn, "1.0"]) for _ in range(2)
        ]
        try:
            await eventually(lambda: db.fetchval(
                "SELECT count(*) = 2 FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            ), timeout=20, what="two listening workers")
            await nap.enqueue_many([{}] * 10)
            await eventually(lambda: db.fetchval("SELECT count(*) = 10 FROM naps"), timeout=30,
                             what="10 one-second jobs across two processes")
        finally:
            for p in processes:
                p.terminate()
            for p in processes:
                await p.wait()
    per_process = [r["n"] for r in await db.fetch("SELECT count(*) AS n FROM naps GROUP BY pid")]
    took = await db.fetchval("SELECT extract(epoch FROM max(ended) - min(started))::float8 FROM naps")
    assert sorted(per_process) == [5, 5]  # neither worker hoarded the other's share
    assert took < 1.8, took  # about 1 s: all ten ran at once (2 s if one worker held six or more)


async def test_buffer_never_exceeds_the_cap(q: aioqueue.Queue) -> None:
    held: list[int] = []
    worker = q.worker(concurrency=2, prefetch=50)

    @q.task
    async def quick(n: int) -> None:
        held.append(worker.active)

    await quick.enqueue_many([{"n": i} for i in range(3000)])
    with anyio.fail_after(60):
        assert (await worker.run_until_empty()).succeeded == 3000
    assert max(held) <= 2 + 50
    assert max(held) > 2 + 10  # short jobs: it did claim ahead, in batches

    held.clear()
    off = q.worker(concurrency=2, prefetch=0)

    @q.task
    async def quick_off(n: int) -> None:
        held.append(off.active)

    await quick_off.enqueue_many([{"n": i} for i in range(500)])
    with anyio.fail_after(60):
        await off.run_until_empty()
    assert max(held) <= 2


async def test_stopping_worker_hands_back_unstarted_jobs_at_once(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    release = anyio.Event()
    blocked = anyio.Event()

    @q.task
    async def step(n: int) -> None:
        if n == 400:
            blocked.set()
            with anyio.fail_after(30):
                await release.wait()

    await step.enqueue_many([{"n": i} for i in range(2000)])
    worker = q.worker(concurrency=1, prefetch=100, grace_period=3600, poll_interval=5.0)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await blocked.wait()
            await eventually(lambda: worker.active > 1, what="jobs buffered behind the blocked one")
            worker.stop()
            # The blocked handler still runs; every buffered job is pending again already.
            await eventually(lambda: db.fetchval(
                "SELECT count(*) = 1 FROM aioqueue.jobs WHERE status = 'running'"), timeout=5,
                what="the unstarted jobs to go back")
            assert await db.fetchval("SELECT args->>'n' FROM aioqueue.jobs WHERE status = 'running'") == "400"
            release.set()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending' AND attempts = 0") > 0
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status <> 'pending'") == 0
