"""The connection budget, counted in pg_stat_activity under load: a worker holds at most its
pool plus one LISTEN connection; a ``-p N`` supervisor N times that (the supervisor itself
none); a BackgroundWorker borrowing the application's pool adds only its listener."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import asyncpg

import aioqueue
from aioqueue.integrations.background import BackgroundWorker
from tests.support.cli_tools import app_task, cli_process
from tests.support.helpers import eventually

T = TypeVar("T")


async def _peak_connections(dsn: str, db: asyncpg.Connection, body: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """Run ``body`` while sampling, on a connection of its own, the backends connected to
    ``dsn``'s database (neither ``db`` nor the sampler counted); return the most seen at once,
    and what ``body`` returned."""
    peak = 0
    # Client backends only: an autovacuum worker (on by default, as on the embedded server) or a
    # parallel query's worker also shows the database's name, and is no connection of anyone's.
    query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
             " AND backend_type = 'client backend' AND pid <> ALL($1::int[])")
    sampler = await asyncpg.connect(dsn)
    mine = [sampler.get_server_pid(), db.get_server_pid()]

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, int(await sampler.fetchval(query, mine)))
            await anyio.sleep(0.005)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            result = await body()
            tg.cancel_scope.cancel()
    finally:
        await sampler.close()
    return peak, result


async def test_a_worker_holds_its_pool_and_one_listener(dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(dsn, pool_max_size=3) as q:

        @q.task
        async def uses_the_pool(n: int) -> None:
            async with q.pool.acquire() as conn:
                await conn.execute("SELECT pg_sleep(0.002)")

        await uses_the_pool.enqueue_many([{"n": n} for n in range(500)])
        worker = q.worker(concurrency=30, poll_interval=0.05)

        async def drain() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=30,
                                 what="the jobs to run")
                worker.stop()

        peak, _ = await _peak_connections(dsn, db, drain)
    assert 2 <= peak <= 3 + 1, peak


async def test_a_background_worker_on_the_apps_pool_adds_only_a_listener(dsn: str, db: asyncpg.Connection) -> None:
    app_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        q = aioqueue.Queue(dsn)

        @q.task
        async def work(n: int) -> None:
            async with app_pool.acquire() as conn:
                await conn.execute("SELECT 1")

        await q.open()
        await work.enqueue_many([{"n": n} for n in range(300)])
        await q.close()

        async def serve() -> None:
            async with BackgroundWorker(q, pool=app_pool, concurrency=20, poll_interval=0.05):
                await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=30,
                                 what="the jobs to run")

        peak, _ = await _peak_connections(dsn, db, serve)
    finally:
        await app_pool.close()
    assert 2 <= peak <= 4 + 1, peak


async def test_a_supervisor_of_n_holds_n_pools_and_n_listeners(
    dsn: str, db: asyncpg.Connection, app_dir: Path
) -> None:
    async with aioqueue.Queue(dsn) as q:
        await app_task(q, "record", "cli").enqueue_many([{"n": n} for n in range(400)])

    async def supervise() -> None:
        args = ["worker", "cli_app:queue", "-p", "2", "--pool-max-size", "2", "-c", "20", "--poll-interval", "0.05"]
        async with cli_process(args, dsn, app_dir) as (process, output):
            await output.wait_for("worker process 1 started")
            await eventually(lambda: db.fetchval("SELECT count(*) = 400 FROM seen"), timeout=60,
                             what="the jobs to run")
            process.terminate()
            with anyio.fail_after(30):
                assert await process.wait() == 0

    peak, _ = await _peak_connections(dsn, db, supervise)
    assert 2 <= peak <= 2 * (2 + 1), peak


async def test_a_burst_drains_on_two_connections(dsn: str) -> None:
    # One for the claims, one for the outcomes (the outcome write's plan goes first on it, then
    # the registry row and the reaper take turns with the writes); upkeep and vacuum checks
    # wait until the burst is over or has lasted their interval, so none opens a third beside
    # a short burst.
    async with aioqueue.Queue(dsn) as q:

        @q.task
        async def noop(n: int) -> None:
            pass

        await noop.enqueue_many([{"n": n} for n in range(2000)])
        assert q.pool.get_size() == 1  # what enqueueing left open
        stats = await q.worker(reap_interval=60).run_until_empty()
        assert stats.succeeded == 2000
        assert q.pool.get_size() == 2
