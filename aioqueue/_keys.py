"""A queue's per-key settings: whether its claims take partition keys in turn, and how many jobs
of one key may run at once, across every worker (migration 0018 and ``claim_keyed``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._checks import check_int, check_name
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._database import Database

MAX_KEY_CONCURRENCY = 1_000_000


async def set_key_limits(db: Database, queue: str, *, concurrency: int | None, fair: bool) -> None:
    """Set ``queue``'s per-key settings (see :meth:`aioqueue.Queue.set_key_limits`)."""
    check_name("queue name", queue)
    if concurrency is not None:
        check_int("per-key concurrency", concurrency, 0, MAX_KEY_CONCURRENCY)
    if not isinstance(fair, bool):
        raise ConfigurationError(f"fair must be True or False, got {fair!r}")
    async with db.connection() as conn:
        await conn.execute(db.queries.set_key_limits, queue, fair, concurrency, db.channels.jobs)
