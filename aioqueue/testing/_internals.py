"""Every use the test kit makes of aioqueue's private parts, in one place: pointing a queue's
database object at another schema, and ticking the periodic scheduler once."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from aioqueue import Queue
from aioqueue._periodic import Scheduler

if TYPE_CHECKING:
    from aioqueue._queries import Queries
    from aioqueue._statements import Channels, Statements

Target: TypeAlias = "tuple[str, Statements, Queries, Channels]"


def retarget(queue: Queue, schema: str) -> Target:
    """Point ``queue``'s database object at ``schema`` (its statements and notification
    channels); return what it held before, for :func:`restore`. The pool is untouched: its
    connections reach the same database whatever the schema."""
    db = queue.database
    before = (db.schema, db.statements, db.queries, db.channels)
    # A Queue made for the name renders the statements and channels, and validates the name.
    other = Queue("postgresql://", schema=schema).database
    db.schema, db.statements, db.queries, db.channels = other.schema, other.statements, other.queries, other.channels
    return before


def restore(queue: Queue, before: Target) -> None:
    """Undo :func:`retarget`."""
    db = queue.database
    db.schema, db.statements, db.queries, db.channels = before


async def tick_periodic(queue: Queue, queues: set[str] | None = None) -> int:
    """Enqueue every periodic slot of ``queue`` (of its tasks in ``queues``, when given) that the
    queue's clock has reached, as a worker's scheduler does at each slot; return how many. A
    schedule seen for the first time starts at its next slot, and enqueues nothing now."""
    periodics = [p for p in queue.periodics.values() if queues is None or p.task.queue in queues]
    if not periodics:
        return 0
    scheduler = Scheduler(queue.database, periodics)
    await scheduler.tick()
    return scheduler.enqueued
