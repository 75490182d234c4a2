"""Claim ready jobs for one worker: as many as it has free slots, in one statement.

The producer waits for free capacity and for a reason to look (a notification, the end of a
claim that filled every slot, or the poll tick), then claims with ``FOR UPDATE SKIP LOCKED`` in
a single short statement and hands the jobs to the worker. It never runs a handler and never
holds a transaction open beyond the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .job import Job
from .signal import Flag

if TYPE_CHECKING:
    from .app import Queue

logger = logging.getLogger("aioqueue.producer")


class Producer:
    """Claims jobs of the given queues for one worker."""

    def __init__(
        self,
        app: Queue,
        *,
        worker_id: str,
        queues: Sequence[str],
        lease: float,
        poll_interval: float,
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.queues = list(queues)
        self.lease = lease
        self.poll_interval = poll_interval
        self.wakeup = Flag()
        self.claims = 0

    def wake(self, queue: str | None = None) -> None:
        """Look for jobs now (``queue``: the queue a notification named, if any)."""
        if queue is None or queue in self.queues:
            self.wakeup.set()

    async def claim(self, limit: int) -> list[Job]:
        """Claim up to ``limit`` ready jobs in one statement; they are running under our lease."""
        self.claims += 1
        async with self.app.connection() as conn:
            rows = await conn.fetch(
                self.app.queries.claim,
                self.queues,
                [limit] * len(self.queues),
                self.worker_id,
                self.lease,
                limit,
            )
        return [Job.from_record(row) for row in rows]

    async def wait(self) -> None:
        """Wait for a notification or the poll tick, whichever comes first."""
        await self.wakeup.wait(self.poll_interval)

    async def claim_with_retry(self, limit: int, stopping: Callable[[], bool]) -> list[Job]:
        """Claim, and on a database error log it and back off rather than fail the worker;
        return nothing once ``stopping()`` is true."""
        failures = 0
        while not stopping():
            try:
                self.wakeup.clear()
                return await self.claim(limit)
            except Exception as exc:
                failures += 1
                delay = min(max(self.poll_interval, 0.1) * 5, 0.05 * 2**failures)
                logger.warning("claiming jobs failed (%s: %s); retrying in %.2fs",
                               type(exc).__name__, exc, delay)
                await self.wakeup.wait(delay)
        return []
