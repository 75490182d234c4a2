"""A queue's per-key settings: whether its claims take partition keys in turn, how many jobs of
one key may run at once and how many may start per interval, across every worker (migrations
0018, 0020, 0022, 0024, 0025 and 0026, ``claim_keyed``); and the operator's view of its keys: the
busiest ones, with their running and pending jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._checks import check_int, check_limit, check_name, check_rate
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._database import Database

MAX_KEY_CONCURRENCY = 1_000_000
#: How many of the newest jobs :func:`busiest_keys` reads for the keys arriving now.
RECENT_JOBS = 5000
#: How many candidate keys :func:`busiest_keys` counts per key it returns.
CANDIDATES_PER_KEY = 4


async def set_key_limits(
    db: Database, queue: str, *, concurrency: int | None, rate: tuple[int, float] | None, fair: bool
) -> None:
    """Set ``queue``'s per-key settings (see :meth:`aioqueue.Queue.set_key_limits`)."""
    check_name("queue name", queue)
    if concurrency is not None:
        check_int("per-key concurrency", concurrency, 0, MAX_KEY_CONCURRENCY)
    rate_limit, rate_period = (None, None) if rate is None else check_rate(rate, "per-key rate")
    if not isinstance(fair, bool):
        raise ConfigurationError(f"fair must be True or False, got {fair!r}")
    async with db.connection() as conn:
        await conn.execute(
            db.queries.set_key_limits, queue, fair, concurrency, db.channels.jobs, rate_limit, rate_period
        )


async def busiest_keys(db: Database, queue: str, *, limit: int = 10, bound: int = 1000) -> list[dict[str, Any]]:
    """The busiest partition keys of ``queue`` (see :meth:`aioqueue.Queue.busiest_keys`)."""
    check_name("queue name", queue)
    check_limit("limit", limit, 1, 100)
    check_limit("bound", bound, 1, 100_000)
    async with db.connection() as conn, conn.transaction():
        await conn.execute(db.queries.index_reads_only)
        rows = await conn.fetch(
            db.queries.busiest_keys, queue, limit, bound, RECENT_JOBS, CANDIDATES_PER_KEY * limit
        )
    return [dict(r) for r in rows]
