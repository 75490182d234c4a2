"""Run a worker in the background of an application, between its startup and shutdown hooks.

``start()`` opens the queue's pool (or attaches the application's), optionally migrates, checks
the schema, starts the worker and returns once it claims jobs. ``stop()`` stops claiming, lets
in-flight jobs finish within the worker's grace period (then interrupts them, back to pending),
writes every outcome and closes the pool it opened. The worker runs in one asyncio task that
this object owns and always joins: a framework may call its startup and shutdown hooks from
different tasks, which a task group (bound to the task that entered it) cannot span. It never
installs signal handlers by default: the web server owns the process's signals.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Unpack

import anyio
import asyncpg

from .._app import Queue
from .._config import WorkerOptions
from .._worker import Worker, WorkerStats

logger = logging.getLogger("aioqueue.integrations")


class BackgroundWorker:
    """A :class:`~aioqueue.Worker` for ``queue`` that runs from :meth:`start` to :meth:`stop`.

    ``worker_options`` go to ``queue.worker(...)`` (concurrency, queues, grace_period, ...; see
    :class:`~aioqueue.WorkerConfig`); signal handlers are off unless asked for.
    ``pool``: an asyncpg pool of the application's for the queue to borrow instead of opening
    its own. ``migrate``: create or upgrade the schema at start. Also an async context manager.
    """

    def __init__(
        self,
        queue: Queue,
        *,
        migrate: bool = False,
        pool: asyncpg.Pool | None = None,
        start_timeout: float = 30.0,
        **worker_options: Unpack[WorkerOptions],
    ) -> None:
        worker_options.setdefault("install_signal_handlers", False)
        self.queue = queue
        self.migrate = migrate
        self.pool = pool
        self.start_timeout = start_timeout
        self.worker: Worker = queue.worker(**worker_options)
        self.stats: WorkerStats | None = None
        self._task: asyncio.Task[WorkerStats] | None = None
        self._close_queue = False
        self._stopping = False

    @property
    def running(self) -> bool:
        """Whether the worker task is alive."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Open the queue, start the worker, and return once it is claiming jobs."""
        if self._task is not None:
            raise RuntimeError("this background worker was already started")
        if self.pool is not None:
            self.queue.attach_pool(self.pool)
        self._close_queue = not self.queue.database.is_open  # close only what this call opens
        await self.queue.open()
        try:
            if self.migrate:
                await self.queue.migrate()
            await self.queue.check_schema()  # fail the app's startup, not a background task
            self._task = asyncio.create_task(self.worker.run(), name=f"aioqueue worker {self.worker.name}")
            self._task.add_done_callback(self._exited)
            await self._until_ready(self._task)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._halt()
            raise

    async def _until_ready(self, task: asyncio.Task[WorkerStats]) -> None:
        ready = asyncio.ensure_future(self.worker.ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, task}, timeout=self.start_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if task in done:
            task.result()  # raises the worker's error, if it failed
            raise RuntimeError("the worker stopped before it began claiming jobs")
        if not done:
            raise TimeoutError(f"the worker did not start claiming within {self.start_timeout}s")

    def _exited(self, task: asyncio.Task[WorkerStats]) -> None:
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            logger.error("the background worker %s crashed", self.worker.name, exc_info=task.exception())

    async def stop(self) -> WorkerStats | None:
        """Stop claiming, drain in-flight jobs within the grace period, close what start opened.

        Returns the worker's counts. If this call is cancelled, the worker is cancelled too
        (running jobs go back to pending) and its outcomes are still written.
        """
        self._stopping = True
        self.worker.stop()
        try:
            if self._task is not None:
                self.stats = await self._task
        finally:
            with anyio.CancelScope(shield=True):
                await self._halt()
        return self.stats

    async def _halt(self) -> None:
        """Cancel the worker if it still runs, wait for it, close the pool start opened."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            self.worker.abort()
            task.cancel()
            await asyncio.wait({task})
        if self._close_queue:
            self._close_queue = False
            await self.queue.close()

    async def __aenter__(self) -> BackgroundWorker:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
