"""Keep the leases of a worker's jobs alive while the worker lives.

Every ``interval`` the heartbeat extends, in one statement, the lease of every job the worker
holds (running, or finished with its outcome not yet written). A job whose lease could not be
extended was reaped and may be running elsewhere: its handler is interrupted, so it does not run
twice at once. The heartbeat never touches jobs it does not hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from .app import Queue

logger = logging.getLogger("aioqueue.lease")


class Heartbeat:
    """Extends the leases of the jobs in ``holdings`` (job id -> attempt)."""

    def __init__(
        self,
        app: Queue,
        holdings: dict[int, int],
        *,
        lease: float,
        interval: float,
        on_lost: Callable[[int], object],
        writing: set[int] | None = None,
    ) -> None:
        self.app = app
        self.holdings = holdings
        self.lease = lease
        self.interval = interval
        self.on_lost = on_lost
        self.writing = writing if writing is not None else set()
        self.beats = 0

    async def beat(self) -> list[int]:
        """Extend every held lease now; return the ids whose lease was lost."""
        held = dict(self.holdings)
        if not held:
            return []
        async with self.app.connection() as conn:
            rows = await conn.fetch(
                self.app.queries.extend_leases, list(held), list(held.values()), self.lease
            )
        self.beats += 1
        kept = {r["id"] for r in rows}
        # A job whose outcome was written meanwhile (or is being written) is gone, not lost.
        lost = [
            i for i, a in held.items() if i not in kept and self.holdings.get(i) == a and i not in self.writing
        ]
        for job_id in lost:
            self.holdings.pop(job_id, None)
            self.on_lost(job_id)
        return lost

    async def run(self) -> None:
        """Beat every ``interval`` until cancelled; a failed beat is logged and retried."""
        while True:
            await anyio.sleep(self.interval)
            try:
                lost = await self.beat()
            except Exception as exc:
                logger.warning("extending leases failed (%s: %s)", type(exc).__name__, exc)
                continue
            if lost:
                logger.warning("lost the lease of %d job(s): %s", len(lost), lost)
