"""Competitor adapter for Procrastinate (``pip install procrastinate==3.10.0``).

How it drives the library (public API only, psycopg 3 driver):

* schema: ``App.schema_manager.apply_schema_async()`` unless the ``procrastinate_jobs``
  table already exists (applying the schema twice fails, so the check makes
  ``setup`` idempotent).
* bulk enqueue: ``Task.batch_defer_async(*[{}] * n)``, one call for all jobs.
* single enqueue: ``Task.defer_async()`` from concurrent coroutines sharing one
  ``App`` whose ``PsycopgConnector`` pool has one connection per caller.
* drain pre-load: ``batch_defer_async`` again, then ``ANALYZE`` (see ``analyze``).
* worker: ``App.run_worker_async(concurrency=..., queues=[...],
  install_signal_handlers=False)`` in a task, with all other worker options at their
  defaults (LISTEN/NOTIFY on, 5 s fallback polling, finished jobs kept:
  ``delete_jobs="never"``). The connector pool gets ``2 * concurrency`` connections so
  the worker never waits for one. It is stopped the documented way, by cancelling that
  task; the worker then finishes its running jobs, unregisters itself and the task
  ends cancelled.

Every ``App`` is created, opened and closed inside the method that needs it; the pool's
connections are all opened (``min_size == max_size``) before any clock starts.

Known effect on the latency figures: the worker clears its "new job" flag after every
fetch, so a NOTIFY that arrives while a fetch which did not see the new job is in
flight is lost, and that job waits for the 5 s fallback poll. With one job enqueued as
soon as the previous one starts, this hit about 1 sample in 100-300 in our runs, which
shows up as a ~5 s p99/max.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import procrastinate
from procrastinate.tasks import Task

from .base import AdapterBase, CompetitorError, concurrent_callers, idle_wakeups, stop_task

__all__ = ["ProcrastinateAdapter"]

NoopTask: TypeAlias = Task[[], Coroutine[Any, Any, None], []]


class ProcrastinateAdapter(AdapterBase):
    """Drives Procrastinate 3.10 through ``App``, ``PsycopgConnector`` and its worker.

    Settings as :class:`AdapterBase`. ``sample_timeout`` stays well above the worker's 5 s
    fallback polling interval. Without ``analyze``, the planner picks a plan for
    ``procrastinate_fetch_job_v2`` on the freshly loaded table that scans and sorts every
    queued job on each fetch (about 25 ms per fetch with 30,000 queued jobs, against 0.07 ms
    once analyzed).
    """

    name = "procrastinate"

    #: Queue and task name used for every benchmark job.
    queue = "aioqueue_bench"
    task_name = "aioqueue_bench_noop"

    # -- lifecycle ---------------------------------------------------------------

    async def _install(self) -> None:
        async with self._app(pool_size=1) as (app, _):
            row = await app.connector.execute_query_one_async(
                "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS installed"
            )
            if not row["installed"]:
                await app.schema_manager.apply_schema_async()

    # -- benchmarks --------------------------------------------------------------

    async def enqueue_bulk(self, n: int) -> float:
        kwargs: list[dict[str, Any]] = [{} for _ in range(n)]
        async with self._app(pool_size=1) as (app, noop):
            start = time.perf_counter()
            ids = await noop.batch_defer_async(*kwargs)
            elapsed = time.perf_counter() - start
            await self._purge(app, expected=n, got=len(ids))
        return elapsed

    async def enqueue_one_by_one(self, n: int, callers: int) -> float:
        async with self._app(pool_size=callers) as (app, noop):

            async def caller(count: int) -> int:
                for _ in range(count):
                    await noop.defer_async()
                return count

            elapsed, done = await concurrent_callers(n, callers, caller)
            await self._purge(app, expected=n, got=done)
        return elapsed

    async def drain(self, n: int, concurrency: int) -> float:
        async with self._app(pool_size=max(2 * concurrency, 4)) as (app, noop):
            await noop.batch_defer_async(*[{} for _ in range(n)])
            if self.analyze:
                await app.connector.execute_query_async("ANALYZE")
            return await self._timed_drain(n, lambda: self._start_worker(app, concurrency))

    async def wakeup_latency(self, samples: int) -> list[float]:
        async with self._app(pool_size=4) as (app, noop):
            worker = self._start_worker(app, concurrency=1)
            try:
                return await idle_wakeups(
                    self._tracker, worker, noop.defer_async, samples, self.sample_timeout, "procrastinate"
                )
            finally:
                await self._stop_worker()

    # -- helpers -----------------------------------------------------------------

    async def _purge(self, app: procrastinate.App, *, expected: int, got: int) -> None:
        """Delete the still-queued benchmark jobs (Procrastinate has no bulk-delete API)."""
        if got != expected:
            raise CompetitorError(f"procrastinate deferred {got} jobs for {expected} enqueues")
        await app.connector.execute_query_async(
            "DELETE FROM procrastinate_jobs WHERE queue_name = %(queue)s AND status = 'todo'",
            queue=self.queue,
        )

    def _start_worker(self, app: procrastinate.App, concurrency: int) -> asyncio.Task[None]:
        if self._worker is not None:
            raise CompetitorError("a procrastinate worker is already running")
        self._worker = asyncio.create_task(
            app.run_worker_async(
                queues=[self.queue],
                concurrency=concurrency,
                install_signal_handlers=False,
            ),
            name="procrastinate-worker",
        )
        return self._worker

    async def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        worker.cancel()  # the documented way to stop a worker running as a task
        await stop_task(worker, self.stop_timeout, "the procrastinate worker")

    @asynccontextmanager
    async def _app(self, pool_size: int) -> AsyncIterator[tuple[procrastinate.App, NoopTask]]:
        connector = procrastinate.PsycopgConnector(conninfo=self._require_dsn(), min_size=pool_size, max_size=pool_size)
        app = procrastinate.App(connector=connector)
        tracker = self._tracker

        async def noop() -> None:
            tracker.hit()

        # Called rather than used as a decorator, so that type-checking still passes
        # (with procrastinate seen as Any) where the optional ``compare`` extra is missing.
        task: NoopTask = app.task(name=self.task_name, queue=self.queue)(noop)
        async with app.open_async():
            yield app, task
