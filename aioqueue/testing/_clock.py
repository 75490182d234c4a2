"""The queue's clock in a test: move the time a schema's statements read, in the database.

Every time aioqueue acts on is read from the schema's function ``now()`` (migration 0012):
when a job is due, when a lease ends, a retry's backoff, a periodic slot, a rate window,
retention. In production that function is the transaction's ``now()``. :class:`Clock` redefines
it in the test's schema as the wall clock moved by an offset, or as one instant standing still,
so that a job delayed by a day runs in the test without waiting, against the real database.
After each move it tells the workers of every queue with pending jobs to look again.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable

from aioqueue import AioqueueError, ConfigurationError, Queue

from . import _isolated

_MICROSECOND = datetime.timedelta(microseconds=1)


class Clock:
    """Where the queue's time stands, for one queue's schema, and the calls that move it.

    The clock runs with the wall clock, moved by what :meth:`advance` and :meth:`travel_to`
    added, until :meth:`freeze` stops it at one instant (then :meth:`advance` and
    :meth:`travel_to` move that instant); :meth:`reset` gives back the wall clock. The time is
    the database's for every session at once, workers in other processes included.

    It moves only a schema made by :func:`~aioqueue.testing.isolated` (moving a real queue's
    clock makes its delayed jobs due at once); ``any_schema=True`` lifts that guard, for a test
    database of your own.
    """

    def __init__(self, queue: Queue, *, any_schema: bool = False) -> None:
        if not isinstance(queue, Queue):
            raise ConfigurationError(f"Clock needs an aioqueue.Queue, got {queue!r}")
        self.queue = queue
        self.any_schema = bool(any_schema)

    async def now(self) -> datetime.datetime:
        """The queue's time now."""
        async with self.queue.connection() as conn:
            now: datetime.datetime = await conn.fetchval(self.queue.queries.database_now)
        return now

    async def advance(
        self,
        delta: float | datetime.timedelta = 0.0,
        /,
        *,
        days: float = 0.0,
        hours: float = 0.0,
        minutes: float = 0.0,
        seconds: float = 0.0,
    ) -> datetime.datetime:
        """Move the queue's time forward by ``delta`` (seconds, or a ``timedelta``) plus the
        units given by name; return the new time. ``advance(days=1)``, ``advance(90)``."""
        step = _duration("delta", delta, 1.0)
        for name, value, unit in (("days", days, 86400.0), ("hours", hours, 3600.0), ("minutes", minutes, 60.0),
                                  ("seconds", seconds, 1.0)):
            step += _duration(name, value, unit)
        return await self._move(lambda now: now + step)

    async def travel_to(self, when: datetime.datetime) -> datetime.datetime:
        """Set the queue's time to ``when`` (an aware datetime, earlier or later); it runs on from
        there, or stays there if the clock is frozen. Return it."""
        target = _instant("when", when)
        return await self._move(lambda now: target)

    async def freeze(self, at: datetime.datetime | None = None) -> datetime.datetime:
        """Stop the queue's time at ``at`` (default: where it stands now); return it. Every
        statement then sees that instant until the clock moves again: a retry's backoff or a
        rate window never runs out by itself."""
        target = None if at is None else _instant("at", at)
        return await self._move(lambda now: now if target is None else target, frozen=True)

    async def reset(self) -> datetime.datetime:
        """Give the queue back the wall clock, as migrated; return the time."""
        return await self._move(None)

    async def _move(
        self, target: Callable[[datetime.datetime], datetime.datetime] | None, *, frozen: bool | None = None
    ) -> datetime.datetime:
        """Redefine the clock so that it reads ``target(now)`` (None: the wall clock), frozen or
        running (None: as it is), and wake the workers; all in one transaction."""
        queue = self.queue
        if not self.any_schema and queue.schema not in _isolated.made:
            raise AioqueueError(
                f"Clock moves only a schema made by aioqueue.testing.isolated(), not {queue.schema!r}: moving a "
                "real queue's clock makes its delayed jobs due at once (pass any_schema=True for a test "
                "database of your own)"
            )
        q = queue.queries
        async with queue.connection() as conn, conn.transaction():
            state = await conn.fetchrow(q.clock_state)
            assert state is not None  # one row: the function migration 0012 made
            stands_still = state["frozen"] if frozen is None else frozen
            offset, frozen_at = 0, None
            if target is not None:
                try:
                    to = target(state["now"])
                except OverflowError:
                    raise ConfigurationError("the clock cannot move past the years 1 to 9999") from None
                if stands_still:
                    frozen_at = to
                else:
                    offset = (to - state["wall"]) // _MICROSECOND
            await conn.fetch(q.set_clock, offset, frozen_at)
            await conn.execute(q.redefine_clock)
            await conn.fetchval(q.wake_due, queue.database.channels.due)
            now: datetime.datetime = await conn.fetchval(q.database_now)
        return now


def _duration(name: str, value: object, unit: float) -> datetime.timedelta:
    """``value`` (a number of ``unit`` seconds, or a timedelta) as a timedelta, refused unless it
    is finite and not negative: the clock goes back only by :meth:`Clock.travel_to`."""
    if isinstance(value, datetime.timedelta):
        step = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        try:
            step = datetime.timedelta(seconds=value * unit)
        except OverflowError:
            raise ConfigurationError(f"advance: {name}={value!r} is past the years 1 to 9999") from None
    else:
        what = "seconds" if name == "delta" else name
        raise ConfigurationError(f"advance: {name} must be a number of {what} or a timedelta, got {value!r}")
    if step < datetime.timedelta(0):
        raise ConfigurationError(f"advance: {name} must not be negative, got {value!r} (use travel_to to go back)")
    return step


def _instant(name: str, value: object) -> datetime.datetime:
    if not isinstance(value, datetime.datetime) or value.utcoffset() is None:
        raise ConfigurationError(f"{name} must be an aware datetime (with a tzinfo), got {value!r}")
    return value
