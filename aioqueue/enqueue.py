"""Write validated jobs: one row per call, or many in one statement, each call with one NOTIFY.

The callers (``Task.enqueue``, ``Task.enqueue_many``, the periodic scheduler) have already checked
and serialised the arguments; this module only sends the named ``enqueue`` statements, on the
caller's connection when given (so the job joins the caller's transaction) or on a pooled one.
It returns job ids, never a half-written batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .job import Connection

if TYPE_CHECKING:
    from .database import Database
    from .task import EnqueueOptions, Task


def _fields(task: Task[Any, Any], opts: EnqueueOptions) -> tuple[Any, ...]:
    """The leading parameters both enqueue statements take, in their shared order."""
    return (opts.queue, task.name, opts.priority, opts.run_at, opts.delay, opts.max_attempts, task.archive)


def _channels(db: Database) -> tuple[str, str]:
    """Where a job ready now wakes workers, and where a later one says when it is due."""
    return db.channels.jobs, db.channels.due


async def insert_one(
    db: Database, task: Task[Any, Any], opts: EnqueueOptions, args: str, conn: Connection | None
) -> int:
    """Write one job and its NOTIFY; return its id (the live job's, when its dedup key is taken)."""
    async with db.connection(conn) as c:
        row = await c.fetchrow(db.queries.enqueue, *_fields(task, opts), args, opts.key, *_channels(db))
    assert row is not None
    return int(row["id"])


async def insert_many(
    db: Database,
    task: Task[Any, Any],
    opts: EnqueueOptions,
    args: Sequence[str],
    keys: Sequence[str | None] | None,
    conn: Connection | None,
) -> list[int]:
    """Write many jobs of one task in one statement and one NOTIFY; return their ids in the
    order given."""
    key_list: list[str | None] = list(keys) if keys is not None else [None] * len(args)
    async with db.connection(conn) as c:
        rows = await c.fetch(db.queries.enqueue_many, *_fields(task, opts), list(args), key_list, *_channels(db))
    by_key = {r["dedup_key"]: int(r["id"]) for r in rows if r["dedup_key"] is not None}
    # Identity values follow the insert order, which follows the input order.
    unkeyed = iter(sorted(int(r["id"]) for r in rows if r["dedup_key"] is None))
    return [by_key[k] if k is not None else next(unkeyed) for k in key_list]
