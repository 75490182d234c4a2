"""Graceful shutdown: stop claiming, let running jobs finish within the grace period, then
interrupt the rest and put them back without spending an attempt."""

from __future__ import annotations

import anyio
import asyncpg

import aioqueue
from aioqueue.worker_group import run_workers
from tests.support.helpers import eventually


async def test_stop_lets_running_jobs_finish(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    inside = anyio.Event()
    release = anyio.Event()

    @q.task
    async def work(n: int) -> None:
        inside.set()
        with anyio.fail_after(10):
            await release.wait()

    await work.enqueue(n=1)
    worker = q.worker(concurrency=1, grace_period=10)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await inside.wait()
        await work.enqueue(n=2)  # must not be claimed after stop
        worker.stop()
        release.set()
    assert worker.stats.succeeded == 1
    assert worker.stats.claimed == 1
    rows = await db.fetch("SELECT status, args FROM aioqueue.jobs")
    assert [(r["status"], r["args"]) for r in rows] == [("pending", '{"n": 2}')]


async def test_grace_period_over_interrupts_and_requeues_without_spending_attempt(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    inside = anyio.Event()

    @q.task(max_attempts=3)
    async def stuck() -> None:
        inside.set()
        await anyio.sleep_forever()

    job_id = await stuck.enqueue()
    worker = q.worker(grace_period=0.2)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await inside.wait()
            worker.stop()
    assert worker.stats.interrupted == 1
    row = await db.fetchrow("SELECT * FROM aioqueue.jobs WHERE id = $1", job_id)
    assert row is not None
    assert row["status"] == "pending"
    assert row["attempts"] == 1
    assert row["max_attempts"] == 4  # the interrupted attempt is given back
    assert row["last_error"].startswith("Interrupted: the worker shut down")
    assert row["lease_expires_at"] is None


async def test_cancelling_the_worker_records_running_jobs(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    inside = anyio.Event()

    @q.task
    async def stuck() -> None:
        inside.set()
        await anyio.sleep_forever()

    job_id = await stuck.enqueue()
    worker = q.worker()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await inside.wait()
            tg.cancel_scope.cancel()  # e.g. the web app's lifespan task was cancelled
    row = await db.fetchrow("SELECT status, last_error FROM aioqueue.jobs WHERE id = $1", job_id)
    assert row is not None
    assert row["status"] == "pending"
    assert row["last_error"].startswith("Interrupted")


async def test_abort_interrupts_at_once(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def stuck(n: int) -> None:
        await anyio.sleep_forever()

    await stuck.enqueue_many([{"n": i} for i in range(5)])
    worker = q.worker(concurrency=5, grace_period=3600)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await eventually(lambda: worker.executor is not None and len(worker.executor.running) == 5,
                             what="five running handlers")
            worker.abort()
    assert worker.stats.interrupted == 5
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 5


async def test_a_stop_before_the_run_holds_for_it_and_only_for_it(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A group of workers is told to stop before each starts (a signal that came while the
    process was starting): the run that follows claims nothing and returns; the next runs."""
    ran: list[int] = []

    @q.task
    async def work(n: int) -> None:
        ran.append(n)

    await work.enqueue(n=1)
    workers = [q.worker(install_signal_handlers=False, poll_interval=0.05) for _ in range(2)]
    for worker in workers:
        worker.stop()
    with anyio.fail_after(10):
        stats = await run_workers(workers, handle_signals=False)
    assert [s.claimed for s in stats] == [0, 0] and ran == []
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 1

    with anyio.fail_after(10):
        assert (await workers[0].run_until_empty()).succeeded == 1  # the stop held for one run only
    assert ran == [1]
