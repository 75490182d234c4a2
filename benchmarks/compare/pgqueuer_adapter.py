"""Competitor adapter for PgQueuer (``pip install "pgqueuer[asyncpg]==1.6.0"``).

How it drives the library (public API only, asyncpg driver throughout):

* schema: ``Queries(AsyncpgDriver(conn)).install()`` when ``schema_is_installed()`` is
  false, then ``optimize_autovacuum()`` (the ``pgq install`` + ``pgq autovac`` steps of
  PgQueuer's performance checklist). Tables stay logged (durability ``durable``).
* bulk enqueue: one ``Queries.enqueue(list[str], list[bytes | None], list[int])`` call,
  which PgQueuer turns into a single multi-row INSERT.
* single enqueue: ``Queries.enqueue(entrypoint, None)`` over an ``AsyncpgPoolDriver``
  whose pool has one connection per caller.
* drain pre-load: the same bulk call, then ``ANALYZE`` (see ``analyze``).
* worker: a ``QueueManager`` over an ``AsyncpgPoolDriver`` (pool of
  ``2 * concurrency`` connections, the docs' starting point), run with
  ``max_concurrent_tasks=concurrency`` and ``batch_size=concurrency // 2`` (PgQueuer
  requires ``max_concurrent_tasks >= 2 * batch_size``). It is stopped by setting
  ``QueueManager.shutdown``, which lets in-flight jobs finish and flushes the buffered
  status log before ``run()`` returns. The scheduler half of ``PgQueuer`` is not run.
* latency: an idle ``QueueManager`` with default ``run()`` settings; jobs come from a
  separate producer connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import asyncpg
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from .base import AdapterBase, CompetitorError, concurrent_callers, idle_wakeups, stop_task

__all__ = ["PgQueuerAdapter"]

WorkerDriver = Literal["pool", "connection"]


class PgQueuerAdapter(AdapterBase):
    """Drives PgQueuer 1.6 through ``Queries`` (producer) and ``QueueManager`` (worker)."""

    name = "pgqueuer"

    #: Entrypoint (job type) used for every benchmark job.
    entrypoint = "aioqueue_bench_noop"

    def __init__(self, *, worker_driver: WorkerDriver = "pool", **settings: Any) -> None:
        """
        Args:
            worker_driver: ``"pool"`` (``AsyncpgPoolDriver``, recommended in the docs
                for high throughput) or ``"connection"`` (``AsyncpgDriver`` over one
                dedicated connection).
            settings: as :class:`AdapterBase`. ``sample_timeout`` stays above PgQueuer's
                30 s ``dequeue_timeout`` poll.
        """
        super().__init__(**settings)
        self.worker_driver: WorkerDriver = worker_driver
        self._qm: QueueManager | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def _install(self) -> None:
        async with self._connection() as conn:
            queries = Queries(AsyncpgDriver(conn))
            if not await queries.schema_is_installed():
                await queries.install()
            await queries.optimize_autovacuum()

    # -- benchmarks --------------------------------------------------------------

    async def enqueue_bulk(self, n: int) -> float:
        entrypoints, payloads, priorities = self._batch(n)
        async with self._connection() as conn:
            queries = Queries(AsyncpgDriver(conn))
            start = time.perf_counter()
            ids = await queries.enqueue(entrypoints, payloads, priorities)
            elapsed = time.perf_counter() - start
            await self._purge(queries, expected=n, got=len(ids))
        return elapsed

    async def enqueue_one_by_one(self, n: int, callers: int) -> float:
        async with self._pool(callers) as pool:
            queries = Queries(AsyncpgPoolDriver(pool))

            async def caller(count: int) -> int:
                done = 0
                for _ in range(count):
                    done += len(await queries.enqueue(self.entrypoint, None))
                return done

            elapsed, done = await concurrent_callers(n, callers, caller)
            await self._purge(queries, expected=n, got=done)
        return elapsed

    async def drain(self, n: int, concurrency: int) -> float:
        if concurrency < 2:
            raise ValueError("PgQueuer needs concurrency >= 2 (max_concurrent_tasks >= 2)")
        async with self._connection() as conn:
            entrypoints, payloads, priorities = self._batch(n)
            await Queries(AsyncpgDriver(conn)).enqueue(entrypoints, payloads, priorities)
            if self.analyze:
                await conn.execute("ANALYZE")

        async with self._worker_driver(2 * concurrency) as driver:
            qm = self._make_queue_manager(driver)
            return await self._timed_drain(
                n, lambda: self._start_worker(qm, batch_size=concurrency // 2, max_concurrent_tasks=concurrency)
            )

    async def wakeup_latency(self, samples: int) -> list[float]:
        async with self._worker_driver(4) as driver, self._connection() as conn:
            producer = Queries(AsyncpgDriver(conn))
            worker = self._start_worker(self._make_queue_manager(driver))
            try:
                return await idle_wakeups(
                    self._tracker, worker, lambda: producer.enqueue(self.entrypoint, None), samples,
                    self.sample_timeout, "pgqueuer",
                )
            finally:
                await self._stop_worker()

    # -- helpers -----------------------------------------------------------------

    def _batch(self, n: int) -> tuple[list[str], list[bytes | None], list[int]]:
        return [self.entrypoint] * n, [None] * n, [0] * n

    async def _purge(self, queries: Queries, *, expected: int, got: int) -> None:
        if got != expected:
            raise CompetitorError(f"pgqueuer returned {got} job ids for {expected} enqueues")
        await queries.clear_queue(self.entrypoint)

    def _make_queue_manager(self, driver: AsyncpgDriver | AsyncpgPoolDriver) -> QueueManager:
        qm = QueueManager(Queries(driver))
        tracker = self._tracker

        async def noop(job: Job) -> None:
            tracker.hit()

        # Called rather than used as a decorator, so that type-checking still passes
        # (with pgqueuer seen as Any) where the optional ``compare`` extra is missing.
        qm.entrypoint(self.entrypoint, accepts_context=False)(noop)
        return qm

    def _start_worker(
        self,
        qm: QueueManager,
        *,
        batch_size: int = 10,
        max_concurrent_tasks: int | None = None,
    ) -> asyncio.Task[None]:
        if self._worker is not None:
            raise CompetitorError("a pgqueuer worker is already running")
        self._qm = qm
        self._worker = asyncio.create_task(
            qm.run(batch_size=batch_size, max_concurrent_tasks=max_concurrent_tasks),
            name="pgqueuer-worker",
        )
        return self._worker

    async def _stop_worker(self) -> None:
        worker, qm = self._worker, self._qm
        self._worker = self._qm = None
        if worker is None or qm is None:
            return
        qm.shutdown.set()
        await stop_task(worker, self.stop_timeout, "the pgqueuer QueueManager")

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await asyncpg.connect(self._require_dsn())
        try:
            yield conn
        finally:
            await conn.close()

    @asynccontextmanager
    async def _pool(self, size: int) -> AsyncIterator[asyncpg.Pool]:
        # min_size == max_size: every connection is open before the clock starts.
        pool = await asyncpg.create_pool(self._require_dsn(), min_size=size, max_size=size)
        try:
            yield pool
        finally:
            await pool.close()

    @asynccontextmanager
    async def _worker_driver(self, pool_size: int) -> AsyncIterator[AsyncpgDriver | AsyncpgPoolDriver]:
        if self.worker_driver == "connection":
            async with self._connection() as conn:
                yield AsyncpgDriver(conn)
        else:
            async with self._pool(max(pool_size, 4)) as pool:
                yield AsyncpgPoolDriver(pool)
