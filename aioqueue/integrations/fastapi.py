"""FastAPI (and Starlette) integration: a lifespan that runs an aioqueue worker pool in the
application's own process, from startup to shutdown.

``FastAPI(lifespan=aioqueue.integrations.fastapi.lifespan(queue, concurrency=8))`` opens the
queue's pool, starts the worker and, on shutdown, stops claiming, drains in-flight jobs within
the grace period and closes the pool. Request handlers enqueue on a connection of their own
transaction (``task.options(conn=conn).enqueue(...)``): one INSERT, no extra round trip.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Unpack

import asyncpg

from .._app import Queue
from .._config import WorkerOptions
from .background import BackgroundWorker


def lifespan(
    queue: Queue,
    *,
    migrate: bool = False,
    pool: asyncpg.Pool | None = None,
    **worker_options: Unpack[WorkerOptions],
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """Return a lifespan function that runs a worker for ``queue`` while the app serves.

    ``worker_options`` go to ``queue.worker(...)``: ``concurrency``, ``queues``,
    ``grace_period``, ``poll_interval``, ``lease`` and the rest. ``migrate=True`` creates or
    upgrades the schema at startup. ``pool`` lends the queue an asyncpg pool the app already
    has. To compose with a lifespan of your own, enter it inside yours:
    ``async with aioqueue_lifespan(app): ...``, or use :class:`BackgroundWorker` directly.
    """

    @contextlib.asynccontextmanager
    async def run_worker(app: Any) -> AsyncIterator[None]:
        async with BackgroundWorker(queue, migrate=migrate, pool=pool, **worker_options):
            yield

    return run_worker
