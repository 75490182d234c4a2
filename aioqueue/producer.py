"""Claim ready jobs for one worker: as many as it has free slots, in one statement.

The producer waits for free capacity and for a reason to look (a notification, the end of a
claim that filled every slot, or the poll tick), then claims with ``FOR UPDATE SKIP LOCKED`` in
a single short statement and hands the jobs to the worker. It never runs a handler and never
holds a transaction open beyond the claim.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .job import Connection, Job, Undecodable, decode_claimed
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
        # Queues with a global concurrency or rate limit: claims on them lock their settings
        # row first. Re-read at most every `limits_refresh` seconds.
        self.limited: list[str] = []
        self.limits_refresh = max(poll_interval, 1.0)
        self._limits_read_at = -math.inf

    def wake(self, queue: str | None = None) -> None:
        """Look for jobs now (``queue``: the queue a notification named, if any)."""
        if queue is None or queue in self.queues:
            self.wakeup.set()

    async def claim(self, limit: int, per_queue: Sequence[int] | None = None) -> list[Job]:
        """Claim up to ``limit`` ready jobs (and up to ``per_queue[i]`` of ``queues[i]``) in one
        statement; they are running under our lease.

        Claims on queues with a global limit run in a short transaction that first locks those
        queues' settings rows, so concurrent workers take turns and the limit holds.
        """
        self.claims += 1
        q = self.app.queries
        wants = list(per_queue) if per_queue is not None else [limit] * len(self.queues)
        args = (self.queues, wants, self.worker_id, self.lease, limit)
        async with self.app.connection() as conn:
            now = time.monotonic()
            if now - self._limits_read_at >= self.limits_refresh:
                self.limited = [r["name"] for r in await conn.fetch(q.limited_queues, self.queues)]
                self._limits_read_at = now
            while True:
                if self.limited:
                    async with conn.transaction():
                        await conn.execute(q.lock_queues, self.limited)
                        rows = await conn.fetch(q.claim, *args)
                else:
                    rows = await conn.fetch(q.claim_unlimited, *args)
                jobs, bad = decode_claimed(rows)
                if not bad:
                    return jobs
                await self._bury(conn, bad)
                # An empty claim tells the worker nothing is ready: claim again rather than
                # return one that is empty only because every row in it was buried.
                if jobs:
                    return jobs

    async def _bury(self, conn: Connection, bad: list[Undecodable]) -> None:
        """Make dead at once the claimed jobs no handler could be called for: no attempt could
        decode them, and leaving them running would hold them until their lease expires."""
        n = len(bad)
        await conn.execute(
            self.app.queries.fail, [b.id for b in bad], [b.attempt for b in bad], [b.error for b in bad],
            [None] * n, [True] * n, [0.0] * n, [1.0] * n, [0.0] * n, [0.0] * n,
        )
        for b in bad:
            logger.error("job %d: marked dead: %s", b.id, b.error)

    async def wait(self) -> None:
        """Wait for a notification or the poll tick, whichever comes first."""
        await self.wakeup.wait(self.poll_interval)

    async def claim_with_retry(
        self, limit: int, stopping: Callable[[], bool], per_queue: Sequence[int] | None = None
    ) -> list[Job]:
        """Claim, and on a database error log it and back off rather than fail the worker;
        return nothing once ``stopping()`` is true."""
        failures = 0
        while not stopping():
            try:
                self.wakeup.clear()
                return await self.claim(limit, per_queue)
            except Exception as exc:
                failures += 1
                delay = min(max(self.poll_interval, 0.1) * 5, 0.05 * 2**failures)
                logger.warning("claiming jobs failed (%s: %s); retrying in %.2fs",
                               type(exc).__name__, exc, delay)
                await self.wakeup.wait(delay)
        return []
