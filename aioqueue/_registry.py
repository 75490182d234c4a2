"""The registry of live workers: each worker's row in ``workers``, kept fresh while it runs
with what it did so far (its counts), and the queue of each task it serves, in ``tasks``.

A ``WorkerRegistry`` runs in every worker's service task group. It writes one statement per
interval (insert the row, or refresh ``last_seen``, and delete the rows of workers silent for
longer than ``expiry``), and deletes its own row, shielded, when the worker stops cleanly. A
crashed worker's row is ignored by readers once older than ``expiry`` and deleted by the next
worker that refreshes. Its first write also records the queue of each task the worker serves,
where jobs enqueued by name without a queue go. It never touches jobs: a job's ``locked_by`` is
the worker's name.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from ._version import __version__

if TYPE_CHECKING:
    from ._database import Database
    from ._job import Connection

logger = logging.getLogger("aioqueue.registry")

#: Seconds between two refreshes of a worker's row.
DEFAULT_INTERVAL = 10.0
#: A row not refreshed for this many intervals belongs to a worker that is gone.
EXPIRY_INTERVALS = 3


class WorkerRegistry:
    """Keeps one worker's row in the ``workers`` table while :meth:`run` runs."""

    def __init__(
        self,
        db: Database,
        name: str,
        *,
        queues: Sequence[str],
        concurrency: int,
        tasks: Mapping[str, str] | None = None,
        host: str | None = None,
        pid: int | None = None,
        version: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        counts: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.db = db
        self.name = name
        self.queues = list(queues)
        self.concurrency = concurrency
        self.tasks = dict(tasks or {})
        """The queue of each task the worker serves, by name: recorded by the first write."""
        self._unrecorded = sorted(self.tasks)
        self.host = socket.gethostname() if host is None else host
        self.pid = os.getpid() if pid is None else pid
        self.version = __version__ if version is None else version
        self.interval = interval
        self.counts = counts
        """What the worker did so far (claimed, succeeded, ..., steps stored), read at each refresh."""
        self.refreshes = 0
        """Statements written to refresh the row so far (one per interval)."""
        self.registered = anyio.Event()
        """Set once the row has been written."""
        self.tried = anyio.Event()
        """Set once the first write was attempted, whether or not it succeeded."""

    @property
    def expiry(self) -> float:
        """Seconds after which a row that was not refreshed counts as a crashed worker's."""
        return self.interval * EXPIRY_INTERVALS

    async def refresh(self, conn: Connection | None = None) -> None:
        """Write the row (or refresh ``last_seen``) and delete expired rows, and until that has
        succeeded once, record the tasks' queues: one statement (on ``conn`` if given)."""
        names = self._unrecorded
        counts = json.dumps(dict(self.counts()) if self.counts is not None else {})
        async with self.db.connection(conn) as c:
            await c.execute(
                self.db.queries.register_worker, self.name, self.host, self.pid, self.queues,
                self.concurrency, self.version, self.expiry, names, [self.tasks[n] for n in names], counts,
            )
        self._unrecorded = []
        self.refreshes += 1
        self.registered.set()

    async def unregister(self) -> None:
        """Delete the row."""
        async with self.db.connection() as conn:
            await conn.execute(self.db.queries.unregister_worker, self.name, "off")

    async def run(self, first: Connection | None = None) -> None:
        """Refresh every ``interval`` until cancelled, the first time on ``first`` if given (a
        connection the caller holds, and uses again once :attr:`tried` is set); then delete the
        row (shielded)."""
        failing = False
        try:
            while True:
                try:
                    await self.refresh(first)
                    failing = False
                except Exception as exc:
                    if not failing:  # once per outage, not once a tick
                        logger.warning("worker registry refresh failed (%s: %s)", type(exc).__name__, exc)
                    failing = True
                first = None
                self.tried.set()
                await anyio.sleep(self.interval)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                try:
                    await self.unregister()
                except Exception as exc:
                    logger.warning("could not remove worker %s from the registry (%s: %s); it expires in %.0fs",
                                   self.name, type(exc).__name__, exc, self.expiry)
