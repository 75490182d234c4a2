"""Periodic jobs: tasks enqueued on a cron schedule or a fixed interval, with no leader.

Every worker runs a ``Scheduler``. At each slot boundary it reads the database's clock, works out
each periodic task's newest slot, and, in one short transaction per task, locks the task's row in
``periodic`` and enqueues the slot only if no worker has recorded it yet. However many workers
run, each slot is enqueued once. The scheduler never runs a handler; the job goes through the
queue like any other.

Slots missed while no worker ran are handled by ``missed``: ``"once"`` (the default) enqueues
one job for the newest missed slot when a worker comes back; ``"skip"`` enqueues nothing unless
the newest slot is at most ``misfire_grace`` seconds old. A periodic task seen for the first time
starts with its next slot.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio
from croniter import croniter

from . import _enqueue as enqueue
from ._checks import check_seconds
from ._enqueuer import encode_call
from ._errors import ConfigurationError
from ._job import Connection
from ._task import Task

if TYPE_CHECKING:
    from ._database import Database

logger = logging.getLogger("aioqueue.periodic")

Missed = Literal["once", "skip"]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


@dataclasses.dataclass(frozen=True, slots=True)
class Periodic:
    """A schedule for one task: a cron expression (UTC) or an interval in seconds."""

    name: str
    task: Task[Any, Any]
    cron: str | None
    every: float | None
    missed: Missed
    misfire_grace: float
    kwargs: dict[str, Any]

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"periodic {self.name!r}: give a cron expression or every=, not both")
        if self.cron is not None and not (isinstance(self.cron, str) and croniter.is_valid(self.cron)):
            raise ConfigurationError(f"periodic {self.name!r}: {self.cron!r} is not a valid cron expression")
        if self.every is not None and not (
            isinstance(self.every, int | float) and not isinstance(self.every, bool) and 1 <= self.every <= 366 * 86400
        ):
            raise ConfigurationError(f"periodic {self.name!r}: every= must be 1 second to a year, got {self.every!r}")
        if self.missed not in ("once", "skip"):
            raise ConfigurationError(f"periodic {self.name!r}: missed must be 'once' or 'skip'")
        check_seconds(f"periodic {self.name!r}: misfire_grace", self.misfire_grace)
        if not isinstance(self.kwargs, dict):
            raise ConfigurationError(f"periodic {self.name!r}: kwargs must be a dict, got {self.kwargs!r}")
        # Encode now what every slot will enqueue: arguments that do not fit the signature or
        # cannot be stored fail at registration, not at every scheduling tick.
        encode_call(self.task, (), self.kwargs)

    def slot(self, now: datetime.datetime) -> datetime.datetime:
        """The newest slot at or before ``now`` (an aware datetime)."""
        if self.every is not None:
            # Whole microseconds, so every worker computes the very same slot for a period.
            micros = (now - _EPOCH) // _MICROSECOND
            period = round(self.every * 1_000_000)
            return _EPOCH + (micros - micros % period) * _MICROSECOND
        assert self.cron is not None
        # croniter's get_prev is strictly before its start: start just after `now`.
        start = now.astimezone(datetime.UTC) + datetime.timedelta(microseconds=1)
        prev: datetime.datetime = croniter(self.cron, start).get_prev(datetime.datetime)
        return prev

    def next_slot(self, now: datetime.datetime) -> datetime.datetime:
        """The first slot after ``now``."""
        if self.every is not None:
            return self.slot(now) + datetime.timedelta(seconds=self.every)
        assert self.cron is not None
        nxt: datetime.datetime = croniter(self.cron, now.astimezone(datetime.UTC)).get_next(datetime.datetime)
        return nxt


class Scheduler:
    """Enqueues each periodic task's slots, once each across every worker."""

    def __init__(self, db: Database, periodics: Sequence[Periodic]) -> None:
        self.db = db
        self.periodics = list(periodics)
        self.enqueued = 0

    async def tick(self) -> datetime.datetime:
        """Enqueue every slot that is due and not yet enqueued; return the next slot time."""
        q = self.db.queries
        next_due: datetime.datetime | None = None
        async with self.db.connection() as conn:
            for p in self.periodics:
                async with conn.transaction():
                    now: datetime.datetime = await conn.fetchval(q.database_now)
                    slot = p.slot(now)
                    last = await conn.fetchval(q.periodic_last_slot, p.name)
                    if last is not None and last < slot:
                        fresh = (now - slot).total_seconds() <= p.misfire_grace
                        if p.missed == "once" or fresh:
                            await self._enqueue(conn, p, slot)
                        else:
                            logger.info("periodic %s: skipped missed slot %s", p.name, slot.isoformat())
                    await conn.execute(q.periodic_record_slot, p.name, slot)
                following = p.next_slot(now)
                next_due = following if next_due is None else min(next_due, following)
        assert next_due is not None
        return next_due

    async def _enqueue(self, conn: Connection, p: Periodic, slot: datetime.datetime) -> None:
        task = p.task
        text = encode_call(task, (), p.kwargs)
        opts = dataclasses.replace(task.defaults, key=f"periodic:{p.name}:{slot.isoformat()}")
        job_id = await enqueue.insert_one(self.db, task, opts, text, conn)
        self.enqueued += 1
        logger.info("periodic %s: enqueued slot %s as job %d", p.name, slot.isoformat(), job_id)

    async def run(self) -> None:
        """Tick at every slot boundary until cancelled; errors are logged and retried."""
        while True:
            try:
                next_due = await self.tick()
                async with self.db.connection() as conn:
                    now: datetime.datetime = await conn.fetchval(self.db.queries.database_now)
                # Sleep until the next slot by the database's clock, checking at least every minute.
                delay = min(60.0, max(0.01, (next_due - now).total_seconds() + 0.005))
            except Exception as exc:
                logger.warning("periodic scheduling failed (%s: %s)", type(exc).__name__, exc)
                delay = 1.0
            await anyio.sleep(delay)
