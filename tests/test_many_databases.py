"""Beyond one database: Queues in two databases of the local server, served by one process
(``run_workers``, or ``aioqueue worker A:qa B:qb``); each task enqueues into its own Queue's
database, and a job in another database cannot join the caller's transaction."""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue.worker_group import run_workers

from .cli_tools import cli_env
from .conftest import TEMPLATE, fresh_database
from .helpers import eventually


@pytest.fixture
async def other_dsn() -> AsyncIterator[str]:
    """A second migrated database: the one the heavy queue is routed to."""
    async with fresh_database("o", TEMPLATE) as url:
        yield url


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def test_one_process_serves_queues_of_two_databases(dsn: str, other_dsn: str) -> None:
    app, heavy = aioqueue.Queue(dsn), aioqueue.Queue(other_dsn)
    ran: list[str] = []

    @app.task(queue="mail")
    async def send_mail(n: int) -> None:
        ran.append(f"mail {n}")

    @heavy.task(queue="thumbnails")
    async def thumbnail(n: int) -> None:
        ran.append(f"thumb {n}")

    async with app, heavy:
        await send_mail.enqueue_many([{"n": n} for n in range(20)])
        await thumbnail.enqueue_many([{"n": n} for n in range(30)])
        # Each task's jobs are in its own Queue's database.
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'mail'") == 20
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'thumbnails'") == 0
        assert await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'thumbnails'") == 30

        workers = [q.worker(install_signal_handlers=False, poll_interval=0.05) for q in (app, heavy)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_workers, workers)
            await eventually(lambda: len(ran) == 50, timeout=20, what="both databases' jobs to run")
            for w in workers:
                w.stop()
        # What is lost: a job in the other database cannot join the caller's transaction.
        # Rolled back, the app database's job is gone; the other database's was committed alone.
        async def failing_request() -> None:
            async with app.pool.acquire() as conn, conn.transaction():
                await send_mail.options(conn=conn).enqueue(99)
                await thumbnail.enqueue(99)
                raise RuntimeError("the request fails")

        with pytest.raises(RuntimeError):
            await failing_request()
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs") == 0
        assert await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs") == 1
    assert sorted(ran) == sorted([f"mail {n}" for n in range(20)] + [f"thumb {n}" for n in range(30)])


async def test_run_workers_refuses_workers_that_watch_signals(q: aioqueue.Queue) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="install_signal_handlers=False"):
        await run_workers([q.worker()])


TWO_QUEUES = '''
import os
import aioqueue

app = aioqueue.Queue(os.environ["AIOQUEUE_DSN"])
heavy = aioqueue.Queue(os.environ["HEAVY_DSN"])


@app.task(queue="mail")
async def send_mail(n: int) -> None:
    pass


@heavy.task(queue="thumbnails")
async def thumbnail(n: int) -> None:
    pass
'''


async def test_the_worker_command_serves_several_targets(dsn: str, other_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "two_queues.py").write_text(TWO_QUEUES)
    async with aioqueue.Queue(dsn) as app, aioqueue.Queue(other_dsn) as heavy:
        await app.task(queue="mail", name="send_mail")(_job).enqueue_many([{"n": n} for n in range(20)])
        await heavy.task(queue="thumbnails", name="thumbnail")(_job).enqueue_many([{"n": n} for n in range(20)])
    command = [sys.executable, "-m", "aioqueue", "worker", "two_queues:app", "two_queues:heavy",
               "--poll-interval", "0.1"]
    env = {**cli_env(dsn), "HEAVY_DSN": other_dsn}
    async with await anyio.open_process(command, env=env, cwd=tmp_path, stdout=None, stderr=None) as process:
        async def drained() -> bool:
            return (await _count(dsn, "SELECT count(*) FROM aioqueue.jobs")
                    + await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs")) == 0

        await eventually(drained, timeout=30, what="both databases to drain")
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


async def _job(n: int) -> None:
    pass
