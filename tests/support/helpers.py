"""Helpers for worker tests: run a worker in the background, wait for conditions, drive a
queue from a sync (hypothesis) test."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import asyncpg

import aioqueue

if TYPE_CHECKING:
    from aioqueue._producer import Producer

T = TypeVar("T")
H = TypeVar("H", bound="LoopHarness")


class LoopHarness:
    """For tests that cannot be async (hypothesis drives them): an event loop of the test's own,
    an open queue on the test's database, and a direct connection; :meth:`run` drives a
    coroutine on that loop, under a timeout."""

    def __init__(self, dsn: str, **queue_options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = aioqueue.Queue(dsn, **queue_options)
        self.run(self.queue.open())
        self.conn: asyncpg.Connection = self.run(asyncpg.connect(dsn))

    def run(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def close(self) -> None:
        self.run(self.conn.close())
        self.run(self.queue.close())
        self.loop.close()


def closed_after(harness: H) -> Iterator[H]:
    """Yield ``harness`` to a fixture's test, then close it."""
    try:
        yield harness
    finally:
        harness.close()


@contextlib.asynccontextmanager
async def running(worker: aioqueue.Worker, timeout: float = 30.0) -> AsyncIterator[aioqueue.Worker]:
    """Run ``worker`` in the background for the body; stop it (gracefully) afterwards."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(timeout):
            await worker.ready.wait()
        try:
            yield worker
        finally:
            worker.stop()


def recording_task(q: aioqueue.Queue, name: str, **options: Any) -> tuple[aioqueue.Task[..., None], list[Any]]:
    """Register a task called ``name`` (with the task ``options``) whose handler takes one
    argument, ``n``, and records it; return the task and the values recorded, in the order its
    jobs ran. A job whose arguments do not fit ``n`` fails as any handler's would."""
    runs: list[Any] = []

    @q.task(name=name, **options)
    async def record(n: Any) -> None:
        runs.append(n)

    return record, runs


def noop_task(q: aioqueue.Queue, name: str, **options: Any) -> aioqueue.Task[..., None]:
    """Register a task called ``name`` (with the task ``options``) that takes any keyword
    arguments and does nothing: for tests of where jobs go, how they are stored, listed or
    refused, not of what a handler does."""

    @q.task(name=name, **options)
    async def noop(**kwargs: Any) -> None:
        pass

    return noop


async def burst_of_noops(q: aioqueue.Queue, jobs: int, timeout: float = 60.0, **worker_options: Any) -> Producer:
    """Enqueue ``jobs`` no-op jobs and drain them in one burst (``run_until_empty``) of a worker
    with ``worker_options``, within ``timeout`` seconds; check that every one succeeded and
    return the worker's producer, whose counters the test reads."""
    await noop_task(q, "noop").enqueue_many([{}] * jobs)
    worker = q.worker(**worker_options)
    with anyio.fail_after(timeout):
        stats = await worker.run_until_empty()
    assert stats.succeeded == jobs
    assert worker.producer is not None
    return worker.producer


@dataclasses.dataclass
class Holding:
    """A task whose handlers each wait until ``release`` is set; ``all_in`` is set once
    ``slots`` of them have started."""

    task: aioqueue.Task[..., None]
    slots: int
    all_in: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    release: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    started: int = 0


def holding_task(q: aioqueue.Queue, slots: int, timeout: float | None = 180.0) -> Holding:
    """Register a task ``hold(i)`` whose handlers all start and then wait for the test's release
    (at most ``timeout`` seconds each; None: no limit of their own, for a test that counts what a
    waiting handler holds and releases them in a ``finally``): ``slots`` busy slots at once."""

    async def hold(i: int) -> None:
        holding.started += 1
        if holding.started == slots:
            holding.all_in.set()
        if timeout is None:
            await holding.release.wait()
            return
        with anyio.fail_after(timeout):
            await holding.release.wait()

    holding = Holding(q.task(name="hold")(hold), slots)
    return holding


async def hang_until_cancelled(cancelled: anyio.Event) -> None:
    """A handler's body that never ends by itself: sleep until cancelled, then set ``cancelled``
    (so a test can wait for the cancel to have reached the handler)."""
    try:
        await anyio.sleep_forever()
    finally:
        cancelled.set()


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it returns true; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(interval)


@contextlib.asynccontextmanager
async def terminated_after(process: anyio.abc.Process, timeout: float = 20.0) -> AsyncIterator[anyio.abc.Process]:
    """Yield ``process`` to the body; then terminate it if it still runs, and wait (at most
    ``timeout`` seconds) for it to exit."""
    async with process:
        try:
            yield process
        finally:
            if process.returncode is None:
                process.terminate()
                with anyio.fail_after(timeout):
                    await process.wait()


async def reclaimed(q: aioqueue.Queue, db: asyncpg.Connection) -> tuple[aioqueue.Job, aioqueue.Job]:
    """Claim the queue's one pending job as worker ``first``, let its lease run out, reap it and
    claim it again as ``second``: return the stale claim and the fresh one."""
    from aioqueue._config import WorkerConfig
    from aioqueue._producer import Producer

    first = Producer(q.database, WorkerConfig(name="first", lease=60), queues=["default"])
    second = Producer(q.database, WorkerConfig(name="second", lease=60), queues=["default"])
    [stale] = await first.claim(1)
    # The first worker stalls; its lease runs out and the reaper hands the job to the second.
    await db.execute("UPDATE aioqueue.jobs SET lease_expires_at = now() - interval '1 second'")
    assert await q.reap() == 1
    [fresh] = await second.claim(1)
    return stale, fresh


async def prune_archive(conn: Any, sql: str, retention: float, batch: int) -> tuple[int, int]:
    """Run retention's statement ``sql`` (a schema's ``prune_archive``) once: (partitions
    dropped, rows deleted)."""
    row = await conn.fetchrow(sql, retention, batch)
    assert row is not None
    return int(row["dropped"]), int(row["deleted"])


async def add_keyed_jobs(db: asyncpg.Connection, task: str, keys: range, per_key: int) -> None:
    """``per_key`` jobs of ``task`` in queue 'tenants' for each key ``'k' || n``, ``n`` in ``keys``,
    by one INSERT (as a SQL enqueue does): the first of every key, then the second, and so on."""
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, partition_key) SELECT 'tenants', $1, '{}', 'k' || k"
        " FROM generate_series(1, $2) AS j, generate_series($3::int, $4::int) AS k",
        task, per_key, keys.start, keys.stop - 1)
