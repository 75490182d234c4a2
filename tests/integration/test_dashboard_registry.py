"""The worker registry: a worker's row while it runs, gone when it stops cleanly, expired when
it crashed; a job's ``locked_by`` leads to its worker; ``aioqueue status`` lists workers."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import anyio
import asyncpg

import aioqueue
from aioqueue._registry import WorkerRegistry
from tests.support.cli_tools import aioqueue_cli
from tests.support.helpers import eventually, running


async def test_a_running_worker_is_listed_with_its_jobs_and_gone_after_a_clean_stop(
    q: aioqueue.Queue, dsn: str
) -> None:
    started = anyio.Event()
    release = anyio.Event()

    @q.task(queue="reg")
    async def hold() -> None:
        started.set()
        await release.wait()

    job_id = await hold.enqueue()
    worker = q.worker(concurrency=3, name="w-one")
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        await eventually(lambda: _has_workers(q), what="the worker's row")
        [row] = await q.admin.list_workers()
        assert (row["name"], row["host"], row["queues"], row["concurrency"]) == (
            "w-one", socket.gethostname(), ["reg"], 3
        )
        assert row["version"] == aioqueue.__version__ and row["pid"] > 0
        assert row["running"] == 1
        detail = await q.admin.job_detail(job_id)
        assert detail is not None and detail["locked_by"] == "w-one"  # the job leads to its worker
        status, out, err = await aioqueue_cli("status", dsn=dsn)
        assert status == 0, err
        assert "WORKER" in out and "w-one" in out and "1/3" in out
        release.set()
    assert await q.admin.list_workers() == []
    async with q.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM aioqueue.workers") == 0


async def _has_workers(q: aioqueue.Queue) -> bool:
    return bool(await q.admin.list_workers())


async def test_a_crashed_workers_row_expires_and_is_deleted(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    # A worker that wrote its row and then died: nothing refreshes it and nothing deletes it.
    crashed = WorkerRegistry(q.database, "crashed", queues=["a"], concurrency=1, interval=0.2)
    await crashed.refresh()
    assert [w["name"] for w in await q.admin.list_workers(expiry=crashed.expiry)] == ["crashed"]
    await eventually(lambda: _none_listed(q, crashed.expiry), timeout=5, what="the crashed row to be ignored")
    async with _registered(q, "live", interval=0.2):
        names = await db.fetch("SELECT name FROM aioqueue.workers ORDER BY name")
        assert [r["name"] for r in names] == ["live"]  # the live registry deleted the expired row
    assert await db.fetchval("SELECT count(*) FROM aioqueue.workers") == 0  # shielded clean-up ran


@contextlib.asynccontextmanager
async def _registered(q: aioqueue.Queue, name: str, interval: float) -> AsyncIterator[WorkerRegistry]:
    """Run a registry for ``name`` in the background once its row is written; cancel it after
    the body (its clean-up is shielded, so the row goes)."""
    registry = WorkerRegistry(q.database, name, queues=["a"], concurrency=1, interval=interval)
    async with anyio.create_task_group() as tg:
        tg.start_soon(registry.run)
        with anyio.fail_after(5):
            await registry.registered.wait()
        yield registry
        tg.cancel_scope.cancel()


async def _none_listed(q: aioqueue.Queue, expiry: float) -> bool:
    return not await q.admin.list_workers(expiry=expiry)


async def test_the_registry_writes_one_statement_per_interval(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    async with _registered(q, "counted", interval=0.1) as registry:
        first = await db.fetchval("SELECT last_seen FROM aioqueue.workers WHERE name = 'counted'")
        start = anyio.current_time()
        await eventually(lambda: registry.refreshes >= 6, timeout=5, what="five more refreshes")
        elapsed = anyio.current_time() - start
        assert elapsed >= 0.4  # never faster than one statement per interval
        later = await db.fetchval("SELECT last_seen FROM aioqueue.workers WHERE name = 'counted'")
        assert later > first  # the same row, refreshed
    assert await db.fetchval("SELECT count(*) FROM aioqueue.workers") == 0
