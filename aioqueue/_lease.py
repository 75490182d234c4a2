"""Keep the leases of a worker's jobs alive while the worker lives.

Every ``interval`` the heartbeat extends, in one statement, the lease of every claim the worker
holds (running, or finished with its outcome not yet written). The renewal is fenced by the
claim: a row is touched only while it is still running under the same attempt. A lease that has
expired in database time but was not reaped yet is renewed too: nobody else holds the job, the
attempt is still ours, and renewing it spares a needless repeat. A claim whose row no longer
matches (reaped, re-claimed, or finished elsewhere) is lost: its handler is interrupted, so one
job never runs twice at once in this worker. The heartbeat never touches claims it does not hold,
and never waits for a row lock: a row another transaction holds (the completer writing its
outcome, most often) is skipped and renewed at the next beat if still held.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

import anyio

from ._claims import ClaimKey, Claims

if TYPE_CHECKING:
    from ._database import Database

logger = logging.getLogger("aioqueue.lease")


@dataclasses.dataclass(eq=False)
class Heartbeat:
    """Extends the leases of the claims in ``claims``."""

    db: Database
    claims: Claims
    _: dataclasses.KW_ONLY
    lease: float
    interval: float
    on_lost: Callable[[ClaimKey], object]
    writing: Collection[ClaimKey] = frozenset()
    """Claims whose outcome the completer is writing now: gone, not lost, if their rows are."""
    beats: int = dataclasses.field(default=0, init=False)
    """Beats so far."""

    async def beat(self) -> list[ClaimKey]:
        """Extend every held lease now; return the claims whose lease was lost."""
        held = self.claims.held()
        if not held:
            return []
        async with self.db.connection() as conn:
            b = self.db.statements.extend_leases(
                ids=[i for i, _ in held], attempts=[a for _, a in held], lease=self.lease
            )
            rows = await conn.fetch(b.sql, *b.args)
        self.beats += 1
        kept = {(r["id"], r["attempts"]) for r in rows}
        # A claim whose outcome was written meanwhile (or is being written) is gone, not lost.
        lost = [c for c in held if c not in kept and self.claims.holds(c) and c not in self.writing]
        self.claims.release(lost)
        for claim in lost:
            self.on_lost(claim)
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
                logger.warning("lost the lease of %d job(s): %s", len(lost), [job_id for job_id, _ in lost])
