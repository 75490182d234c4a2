"""A fresh schema per test: the application's own Queue, pointed for one block at a schema of
its database that nothing else uses, migrated, and dropped with everything in it afterwards."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator

import anyio

from aioqueue import AioqueueError, Queue

from ._internals import restore, retarget, tick_periodic

PREFIX = "aioqueue_test_"
"""How the names of the schemas :func:`isolated` makes begin."""

made: set[str] = set()
"""The schemas :func:`isolated` made in this process and has not dropped yet: the only ones a
:class:`~aioqueue.testing.Clock` moves without being told to."""


@contextlib.asynccontextmanager
async def isolated(queue: Queue) -> AsyncIterator[Queue]:
    """Point ``queue``, and every task registered on it, at a fresh schema of its database for
    the block: migrated, its periodic schedules started at the queue's time, and dropped with
    everything in it when the block ends. Yields ``queue`` itself.

    The queue keeps its DSN or pool and its options; only the schema (a random name beginning
    with ``aioqueue_test_``, so that tests in parallel processes never meet) and with it the
    notification channels change. A queue that was not open is closed again after. Enter it
    before starting any worker of the queue, and stop them before the block ends.
    """
    if queue.schema.startswith(PREFIX):
        raise AioqueueError(f"the queue is already isolated in schema {queue.schema!r}")
    schema = PREFIX + secrets.token_hex(8)
    was_open = queue.database.is_open
    before = retarget(queue, schema)
    made.add(schema)
    try:
        await queue.migrate()
        await tick_periodic(queue)
        yield queue
    finally:
        with anyio.CancelScope(shield=True):
            try:
                with anyio.fail_after(30):
                    async with queue.connection() as conn:
                        await conn.execute(queue.queries.drop_schema)
            finally:
                made.discard(schema)
                restore(queue, before)
                if not was_open:
                    await queue.close()
