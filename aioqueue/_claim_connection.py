"""The connection a worker's producer claims on: held while its claims follow each other, given
back to the pool when they pause, and the claim sent ahead on it in a burst.

A claim's rows come back as one row of arrays that the worker then decodes into jobs and hands
to its runners; meanwhile the claim connection, and the server behind it, would have nothing to
do. So when a claim got all it asked for and there is room for more once its jobs count, the
producer sends the next claim at once (see ``Producer._send_ahead``) and decodes while the
server works. This module keeps that statement in flight (:class:`AheadClaim`) and the rule
that goes with it: the connection is never given back while a claim is in flight on it, and a
claim sent is never cancelled, since it may have committed: its jobs are then the worker's to
run or give back. It never decides how many jobs to claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

    from ._database import Database
    from ._job import Connection

logger = logging.getLogger("aioqueue.producer")


class AheadClaim:
    """A claim statement in flight on the claim connection, sent before the last claim's jobs
    were handed over."""

    __slots__ = ("limit", "marks", "sent", "task")

    def __init__(
        self, conn: Connection, sql: str, args: tuple[Any, ...], limit: int, marks: tuple[int, int, int]
    ) -> None:
        self.limit = limit
        """The most jobs it claims."""
        self.marks = marks
        """The producer's marks when it was sent: what its answer can have seen (``Producer._marks``)."""
        self.sent = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(_fetch(conn, sql, args))

    async def row(self) -> tuple[asyncpg.Record, float]:
        """The claim's row and when (``time.monotonic``) it came; raises what the statement
        raised. Cancelling the caller does not cancel the statement."""
        return await asyncio.shield(self.task)


async def _fetch(conn: Connection, sql: str, args: tuple[Any, ...]) -> tuple[asyncpg.Record, float]:
    row = await conn.fetchrow(sql, *args)
    assert row is not None  # an aggregate: one row, claimed or not
    return row, time.monotonic()


class ClaimConnection:
    """The producer's claim connection, held or not, and the claim in flight on it, if any."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._held: tuple[Connection, contextlib.AsyncExitStack] | None = None
        self.ahead: AheadClaim | None = None
        """The claim sent ahead, until the producer takes its answer (:meth:`take_ahead`)."""

    @property
    def held(self) -> Connection | None:
        """The connection, while held."""
        return None if self._held is None else self._held[0]

    async def hold(self) -> Connection:
        """The connection to claim on, kept while claims follow each other (see performance.md)."""
        if self._held is None:
            stack = contextlib.AsyncExitStack()
            self._held = (await stack.enter_async_context(self.db.connection()), stack)
        return self._held[0]

    async def let_go(self) -> bool:
        """Give the connection back to the pool if held and no claim is in flight on it (return
        whether it was given back; a failure is the pool's to mend)."""
        if self._held is None or self.ahead is not None:
            return False
        stack, self._held = self._held[1], None
        try:
            await stack.aclose()
        except Exception as exc:
            logger.warning("returning a connection to the pool after a claim failed (%s: %s)",
                           type(exc).__name__, exc)
        return True

    def pool_has_room(self) -> bool:
        """Whether the pool can lend another connection without waiting (so no one waits)."""
        return (pool := self.db.pool).get_idle_size() > 0 or pool.get_size() < pool.get_max_size()

    def send_ahead(self, sql: str, args: tuple[Any, ...], limit: int, marks: tuple[int, int, int]) -> None:
        """Send the claim ``sql`` (of ``limit`` jobs at most) on the held connection."""
        assert self._held is not None
        assert self.ahead is None
        self.ahead = AheadClaim(self._held[0], sql, args, limit, marks)

    async def settled(self) -> None:
        """Wait until no claim is in flight on the connection, whatever its end (the answer
        stays for :meth:`take_ahead`)."""
        if self.ahead is not None:
            await asyncio.wait({self.ahead.task})

    async def take_ahead(self) -> tuple[asyncpg.Record, float, AheadClaim] | None:
        """The row of the claim sent ahead once it is back, the seconds it took, and the claim;
        None if it failed (logged, and the connection given back)."""
        ahead = self.ahead
        assert ahead is not None
        try:
            row, back = await ahead.row()
        except Exception as exc:
            self.ahead = None
            logger.warning("claiming jobs failed (%s: %s)", type(exc).__name__, exc)
            await self.let_go()
            return None
        self.ahead = None
        return row, back - ahead.sent, ahead
