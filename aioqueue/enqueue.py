"""Write validated jobs: one row per call, or many in one statement, each call with one NOTIFY.

The callers (``Enqueuer``, the by-name calls, the periodic scheduler) have already checked and
serialised the arguments; this module only sends the named ``enqueue`` statements, on the
caller's connection when given (so the job joins the caller's transaction) or on a pooled one.
Every path, async or sync, whatever the driver, sends the same statement with the same
parameters, built here once. It returns job ids, never a half-written batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from .connections import SCHEMA_SQLSTATES, SYNC_WRITERS, AsyncpgWriter, Writer, sqlstate_of
from .errors import ConfigurationError, SchemaNotReadyError
from .job import Connection

if TYPE_CHECKING:
    from .database import Database
    from .task import EnqueueOptions


class JobSource(Protocol):
    """What a job row takes from its task: its name and whether it is archived when done."""

    @property
    def name(self) -> str: ...

    @property
    def archive(self) -> bool: ...


def _fields(task: JobSource, opts: EnqueueOptions) -> tuple[Any, ...]:
    """The leading parameters both enqueue statements take, in their shared order."""
    return (opts.queue, task.name, opts.priority, opts.run_at, opts.delay, opts.max_attempts, task.archive)


def one_params(db: Database, task: JobSource, opts: EnqueueOptions, args: str) -> tuple[Any, ...]:
    """The ``enqueue`` statement's parameters for one job."""
    return (*_fields(task, opts), args, opts.key, db.channels.jobs, db.channels.due)


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """A bulk call's jobs, checked and encoded: ``array`` holds the arguments of the jobs to
    write as one JSON array; with dedup keys, ``keys`` has one per item of the call (or None)
    and ``sent`` one per element of ``array`` (each key once: its first item)."""

    array: str
    count: int
    keys: list[str | None] | None = None
    sent: list[str | None] | None = None

    def statement(self, db: Database) -> str:
        return db.queries.enqueue_many if self.sent is None else db.queries.enqueue_many_keyed

    def params(self, db: Database, task: JobSource, opts: EnqueueOptions) -> tuple[Any, ...]:
        """The statement's parameters: the task's fields, the array, the channels, the keys."""
        params = (*_fields(task, opts), self.array, db.channels.jobs, db.channels.due)
        return params if self.sent is None else (*params, self.sent)

    def ids(self, rows: list[Any]) -> list[int]:
        """The job ids in the order of the call's items, from the statement's one row: the ids
        of the new jobs in order, then (with keys) the keys written and their jobs' ids."""
        ids: list[int] = rows[0][0] or []
        if self.keys is not None:
            by_key = dict(zip(rows[0][1] or [], rows[0][2] or [], strict=True))
            fresh = iter(ids)
            ids = [next(fresh) if key is None else by_key[key] for key in self.keys]
        if len(ids) != self.count:  # pragma: no cover - one row per array element, by construction
            raise RuntimeError(f"enqueue_many wrote {len(ids)} jobs for {self.count} items")
        return ids


def _schema_error(db: Database, exc: Exception) -> SchemaNotReadyError | None:
    if sqlstate_of(exc) in SCHEMA_SQLSTATES:
        return SchemaNotReadyError(
            f"the aioqueue schema {db.schema!r} is missing or out of date ({exc}): "
            "run `aioqueue migrate` (or `await queue.migrate()`)"
        )
    return None


async def _rows_of(db: Database, writer: Writer | Connection | None, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """Run an enqueue statement on the caller's connection or a pooled one; return its rows."""
    if writer is None or not isinstance(writer, Writer):
        async with db.connection(writer) as c:
            return await c.fetch(sql, *params)
    if isinstance(writer, AsyncpgWriter):
        async with db.connection(writer.check()) as c:
            return await c.fetch(sql, *params)
    if isinstance(writer, SYNC_WRITERS):
        raise ConfigurationError(
            f"conn is a sync connection ({type(writer.conn).__name__}): use enqueue_sync()/enqueue_many_sync()"
        )
    try:
        return await writer.rows(sql, params)
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


def _rows_of_sync(db: Database, writer: Writer | None, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """:func:`_rows_of` on a sync connection."""
    if not isinstance(writer, SYNC_WRITERS):
        what = "no conn" if writer is None else f"the async connection {type(writer.conn).__name__}"
        raise ConfigurationError(
            f"enqueue_sync()/enqueue_many_sync() write on a sync connection (psycopg.Connection or Django's "
            f"connection), given with options(conn=...); got {what}: use `await enqueue()` instead"
        )
    try:
        return writer.rows(sql, params)
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


async def insert_one(
    db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | Connection | None
) -> int:
    """Write one job and its NOTIFY; return its id (the live job's, when its dedup key is taken)."""
    rows = await _rows_of(db, conn, db.queries.enqueue, one_params(db, task, opts, args))
    return int(rows[0][0])


async def insert_many(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | Connection | None
) -> list[int]:
    """Write a bulk call's jobs of one task in one statement and one NOTIFY; return their ids
    in the order of the call's items."""
    return batch.ids(await _rows_of(db, conn, batch.statement(db), batch.params(db, task, opts)))


def insert_one_sync(db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | None) -> int:
    """:func:`insert_one` on a sync connection (psycopg or Django), with no event loop."""
    rows = _rows_of_sync(db, conn, db.queries.enqueue, one_params(db, task, opts, args))
    return int(rows[0][0])


def insert_many_sync(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | None
) -> list[int]:
    """:func:`insert_many` on a sync connection (psycopg or Django), with no event loop."""
    return batch.ids(_rows_of_sync(db, conn, batch.statement(db), batch.params(db, task, opts)))
