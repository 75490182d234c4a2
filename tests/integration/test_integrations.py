"""The web integrations end to end: the example apps through their real ASGI / aiohttp stacks,
lifespan on, against PostgreSQL; and the background worker's startup and shutdown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

import aioqueue
from aioqueue.integrations import BackgroundWorker
from aioqueue.integrations import aiohttp as aioqueue_aiohttp
from aioqueue.integrations.fastapi import lifespan
from tests.support.examples import asgi_lifespan, assert_one_job_ever, load_example, order_then_refusal, served
from tests.support.helpers import eventually


def _waited_for_a_cpu() -> float:
    """Seconds this thread has spent ready to run but waiting for a CPU (Linux schedstat)."""
    with open("/proc/thread-self/schedstat") as stat:
        return int(stat.read().split()[1]) / 1e9


async def max_loop_lag(until: anyio.Event, tick: float = 0.005) -> float:
    """Measure the longest the event loop was late for a ``tick`` sleep until ``until`` is set,
    less the time the machine's other processes kept it from a CPU: what this process's own
    code (a long step, a blocking call) held the loop for, on a busy machine as on an idle one."""
    worst = 0.0
    while not until.is_set():
        started, waited = time.perf_counter(), _waited_for_a_cpu()
        await anyio.sleep(tick)
        worst = max(worst, time.perf_counter() - started - tick - (_waited_for_a_cpu() - waited))
    return worst


@pytest.mark.parametrize(
    ("name", "confirmed", "orders", "available"),
    [
        ("fastapi_app", lambda order: order["confirmed_at"] is not None,
         "SELECT count(*) FROM orders", "SELECT available FROM stock WHERE item = 'widget'"),
        ("fastapi_sqlalchemy", lambda order: bool(order["confirmed"]),
         "SELECT count(*) FROM sa_orders", "SELECT available FROM sa_stock"),
    ],
)
async def test_fastapi_order_and_job_commit_together(
    dsn: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch,
    name: str, confirmed: Callable[[dict[str, Any]], bool], orders: str, available: str,
) -> None:
    """Both FastAPI examples (plain asyncpg, and SQLAlchemy sessions) commit an order and its
    job together, or neither."""
    example = load_example(name, dsn, monkeypatch)
    async with served(example.app) as http:
        await order_then_refusal(
            http, db, confirmed=confirmed, orders=orders, available=available,
            what="the background worker to confirm the order",
        )
    # Shutdown closed the pool the lifespan opened.
    with pytest.raises(aioqueue.AioqueueError):
        _ = example.queue.pool


async def test_fastapi_enqueue_is_one_statement_in_the_request_transaction(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_example("fastapi_app", dsn, monkeypatch)
    async with asgi_lifespan(example.app):
        statements: list[str] = []
        async with example.queue.pool.acquire() as conn:

            def log(record: asyncpg.connection.LoggedQuery) -> None:
                statements.append(record.query)

            conn.add_query_logger(log)
            for _ in range(2):
                async with conn.transaction():
                    await example.send_order_confirmation.options(conn=conn).enqueue(order_id=1)
                    await conn.execute("SELECT pg_sleep(0)")  # the caller's own work
            # Query loggers run as callbacks soon after each query: wait for the last one.
            await eventually(lambda: statements.count("COMMIT;") == 2, what="the query log")
            conn.remove_query_logger(log)
        kinds = ["enqueue" if "INSERT INTO aioqueue.jobs" in s else s for s in statements]
        assert kinds == ["BEGIN;", "enqueue", "SELECT pg_sleep(0)", "COMMIT;"] * 2, statements


async def test_background_worker_keeps_the_event_loop_responsive(q: aioqueue.Queue) -> None:
    done = 0

    @q.task
    async def tiny(n: int) -> None:
        nonlocal done
        done += 1

    count = 2000
    await tiny.enqueue_many([{"n": i} for i in range(count)])
    finished = anyio.Event()
    async with BackgroundWorker(q, concurrency=50, poll_interval=0.05), anyio.create_task_group() as tg:

        async def drained() -> None:
            await eventually(lambda: done == count, timeout=30, what="the backlog to drain")
            finished.set()

        tg.start_soon(drained)
        lag = await max_loop_lag(finished)
    # Claims, completions and heartbeats are awaited I/O: no step holds the loop for long.
    assert lag < 0.25, f"the event loop was blocked for {lag:.3f}s while the worker drained"


async def test_lifespan_drains_an_in_flight_job_on_shutdown(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    started, release = anyio.Event(), anyio.Event()
    finished: list[int] = []

    @q.task
    async def slow(n: int) -> None:
        started.set()
        await release.wait()
        finished.append(n)

    app_lifespan = lifespan(q, concurrency=2, grace_period=10.0, poll_interval=0.05)
    async with anyio.create_task_group() as tg:
        async with app_lifespan(object()):
            await slow.enqueue(n=7)
            with anyio.fail_after(10):
                await started.wait()
            # Shutdown begins while the job runs: the exit below asks the worker to stop before
            # it first waits, and only then does this task run and let the job finish.
            tg.start_soon(_release, release)
        assert finished == [7]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def _release(event: anyio.Event) -> None:
    event.set()


async def test_shutdown_interrupts_a_job_past_the_grace_period(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    started = anyio.Event()

    @q.task
    async def stuck() -> None:
        started.set()
        await anyio.sleep_forever()

    background = BackgroundWorker(q, grace_period=0.2, poll_interval=0.05)
    await background.start()
    job_id = await stuck.enqueue()
    with anyio.fail_after(10):
        await started.wait()
        stats = await background.stop()
    assert stats is not None and stats.interrupted == 1
    row = await db.fetchrow("SELECT status, last_error FROM aioqueue.jobs WHERE id = $1", job_id)
    assert row is not None and row["status"] == "pending"
    assert "shut down" in row["last_error"]
    assert not background.running


async def test_background_worker_fails_startup_on_a_missing_schema(empty_dsn: str) -> None:
    queue = aioqueue.Queue(empty_dsn)

    @queue.task
    async def noop() -> None:
        pass

    with pytest.raises(aioqueue.SchemaNotReadyError, match="aioqueue migrate"):
        await BackgroundWorker(queue).start()
    with pytest.raises(aioqueue.AioqueueError):
        _ = queue.pool  # the pool start() opened is closed again


async def test_background_worker_borrows_the_apps_pool(dsn: str) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        queue = aioqueue.Queue(dsn)
        ran = anyio.Event()

        @queue.task
        async def ping() -> None:
            ran.set()

        async with BackgroundWorker(queue, pool=pool, poll_interval=0.05):
            assert queue.pool is pool
            await ping.enqueue()
            with anyio.fail_after(10):
                await ran.wait()
        assert await pool.fetchval("SELECT 1") == 1  # still open: it is the app's


async def test_aiohttp_order_and_job_commit_together(
    dsn: str, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_example("aiohttp_app", dsn, monkeypatch)
    app = example.create_app()
    async with TestClient(TestServer(app)) as client:
        background = app[aioqueue_aiohttp.WORKER_KEY]
        assert background.running
        created = await client.post("/orders", json={"item": "widget", "quantity": 2})
        assert created.status == 201, await created.text()
        order_id = (await created.json())["order_id"]

        async def confirmed() -> bool:
            response = await client.get(f"/orders/{order_id}")
            return (await response.json())["confirmed_at"] is not None

        await eventually(confirmed, what="the background worker to confirm the order")

        refused = await client.post("/orders", json={"item": "widget", "quantity": 1000})
        assert refused.status == 409, await refused.text()
        assert await db.fetchval("SELECT count(*) FROM orders") == 1
        await assert_one_job_ever(db)
    assert not background.running
    assert background.stats is not None and background.stats.succeeded == 1
