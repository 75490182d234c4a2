"""Stop the handlers of jobs that an operator asked to cancel while they run on this worker.

A cancel request reaches a worker two ways: a NOTIFY naming the job, which the notifier hands to
:meth:`CancelWatch.notified`, and the watch's own poll, every ``interval``, of the requests
standing against the claims the worker holds: the backstop for a notification lost while the
listener was away. Either way the handler is interrupted, never the row written: the executor
turns the interrupt into the job's outcome, and the completer writes it. The watch only reads.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ._claims import ClaimKey, Claims
from ._outcome import Interrupt

if TYPE_CHECKING:
    from ._database import Database

logger = logging.getLogger("aioqueue.worker")


@dataclasses.dataclass(eq=False)
class CancelWatch:
    """Interrupts, through ``interrupt`` (a claim) and ``interrupt_job`` (every attempt of a
    job running here), the handlers of held claims whose jobs are asked to cancel."""

    db: Database
    claims: Claims
    _: dataclasses.KW_ONLY
    interval: float
    interrupt: Callable[[ClaimKey, Interrupt], object]
    interrupt_job: Callable[[int, Interrupt], object]

    def notified(self, payload: str) -> None:
        """A cancel request arrived by NOTIFY: interrupt the job if it runs here."""
        if payload.isdigit():
            self.interrupt_job(int(payload), Interrupt.CANCELLED)

    async def run(self) -> None:
        """Poll for cancel requests of held jobs every ``interval``, until cancelled."""
        failing = False
        while True:
            await anyio.sleep(self.interval)
            held = self.claims.held()
            if not held:
                continue
            try:
                async with self.db.connection() as conn:
                    b = self.db.statements.cancel_requests(ids=[i for i, _ in held], attempts=[a for _, a in held])
                    rows = await conn.fetch(b.sql, *b.args)
            except Exception as exc:
                if not failing:  # once per outage, not once a tick
                    logger.warning("checking for cancel requests failed (%s: %s)", type(exc).__name__, exc)
                failing = True
                continue
            failing = False
            for row in rows:
                self.interrupt((row["id"], row["attempts"]), Interrupt.CANCELLED)
