"""aiohttp integration: run an aioqueue worker pool in the application's own process, through
``app.cleanup_ctx``, from startup to cleanup.

``aioqueue.integrations.aiohttp.setup(app, queue, concurrency=8)`` stores the queue under
``QUEUE_KEY`` (``request.app[QUEUE_KEY]``), and on startup opens the queue's pool and starts the
worker; on cleanup it stops claiming, drains in-flight jobs within the grace period and closes
the pool. Request handlers enqueue inside their own transaction, as with any asyncpg code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Unpack

import asyncpg
from aiohttp import web

from .._app import Queue
from .._config import WorkerOptions
from .background import BackgroundWorker

QUEUE_KEY = web.AppKey("aioqueue_queue", Queue)
"""Where :func:`setup` stores the queue: ``request.app[QUEUE_KEY]``."""

WORKER_KEY = web.AppKey("aioqueue_worker", BackgroundWorker)
"""Where :func:`setup` stores the :class:`BackgroundWorker` (its ``worker`` has the stats)."""


def setup(
    app: web.Application,
    queue: Queue,
    *,
    migrate: bool = False,
    pool: asyncpg.Pool | None = None,
    **worker_options: Unpack[WorkerOptions],
) -> BackgroundWorker:
    """Run a worker for ``queue`` while ``app`` runs; return it (not started yet).

    ``migrate`` and ``pool`` are :class:`BackgroundWorker`'s; ``worker_options`` are the
    worker's own (``concurrency``, ``queues``, ``grace_period``, ...; see ``WorkerConfig``).
    """
    background = BackgroundWorker(queue, migrate=migrate, pool=pool, **worker_options)
    app[QUEUE_KEY] = queue
    app[WORKER_KEY] = background
    app.cleanup_ctx.append(worker_context(background))
    return background


def worker_context(background: BackgroundWorker) -> Callable[[web.Application], AsyncIterator[None]]:
    """Return a ``cleanup_ctx`` entry that starts ``background`` and stops it at cleanup."""

    async def run_worker(app: web.Application) -> AsyncIterator[None]:
        await background.start()
        try:
            yield
        finally:
            await background.stop()

    return run_worker
