"""Write validated jobs: one row per call, or many in one statement, each call with one NOTIFY.

The callers (``Enqueuer``, the by-name calls, the periodic scheduler) have already checked and
serialised the arguments; this module only sends the named ``enqueue`` statements, on the
caller's connection when given (so the job joins the caller's transaction) or on a pooled one.
Every path, async or sync, whatever the driver, sends the same statement with the same
parameters, built here once. It returns job ids, never a half-written batch.
"""

from __future__ import annotations

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


def many_params(db: Database, task: JobSource, opts: EnqueueOptions, array: str) -> tuple[Any, ...]:
    """The ``enqueue_many`` statement's parameters for many jobs of one task, whose arguments
    come as one JSON array (see ``payload.encode_args_array``)."""
    return (*_fields(task, opts), array, db.channels.jobs, db.channels.due)


def _all(rows: list[Any], expected: int) -> list[int]:
    """``enqueue_many``'s ids (its one row holds them as one array), in the order of the input."""
    ids: list[int] = rows[0] or []
    if len(ids) != expected:  # pragma: no cover - one row per array element, by construction
        raise RuntimeError(f"enqueue_many wrote {len(ids)} jobs for {expected} items")
    return ids


def _schema_error(db: Database, exc: Exception) -> SchemaNotReadyError | None:
    if sqlstate_of(exc) in SCHEMA_SQLSTATES:
        return SchemaNotReadyError(
            f"the aioqueue schema {db.schema!r} is missing or out of date ({exc}): "
            "run `aioqueue migrate` (or `await queue.migrate()`)"
        )
    return None


async def _ids_of(db: Database, writer: Writer | Connection | None, sql: str, params: tuple[Any, ...]) -> list[int]:
    """Run an enqueue statement; return the first column of its rows (the job ids)."""
    if writer is None or not isinstance(writer, Writer):
        async with db.connection(writer) as c:
            return [r[0] for r in await c.fetch(sql, *params)]
    if isinstance(writer, AsyncpgWriter):
        async with db.connection(writer.check()) as c:
            return [r[0] for r in await c.fetch(sql, *params)]
    if isinstance(writer, SYNC_WRITERS):
        raise ConfigurationError(
            f"conn is a sync connection ({type(writer.conn).__name__}): use enqueue_sync()/enqueue_many_sync()"
        )
    try:
        return [r[0] for r in await writer.rows(sql, params)]
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


def _ids_of_sync(db: Database, writer: Writer | None, sql: str, params: tuple[Any, ...]) -> list[int]:
    """:func:`_ids_of` on a sync connection."""
    if not isinstance(writer, SYNC_WRITERS):
        what = "no conn" if writer is None else f"the async connection {type(writer.conn).__name__}"
        raise ConfigurationError(
            f"enqueue_sync()/enqueue_many_sync() write on a sync connection (psycopg.Connection or Django's "
            f"connection), given with options(conn=...); got {what}: use `await enqueue()` instead"
        )
    try:
        return [r[0] for r in writer.rows(sql, params)]
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


async def insert_one(
    db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | Connection | None
) -> int:
    """Write one job and its NOTIFY; return its id (the live job's, when its dedup key is taken)."""
    ids = await _ids_of(db, conn, db.queries.enqueue, one_params(db, task, opts, args))
    return int(ids[0])


async def insert_many(
    db: Database, task: JobSource, opts: EnqueueOptions, array: str, count: int, conn: Writer | Connection | None
) -> list[int]:
    """Write ``count`` jobs of one task, their arguments the JSON array ``array``, in one
    statement and one NOTIFY; return their ids in the order given."""
    return _all(await _ids_of(db, conn, db.queries.enqueue_many, many_params(db, task, opts, array)), count)


def insert_one_sync(db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | None) -> int:
    """:func:`insert_one` on a sync connection (psycopg or Django), with no event loop."""
    ids = _ids_of_sync(db, conn, db.queries.enqueue, one_params(db, task, opts, args))
    return int(ids[0])


def insert_many_sync(
    db: Database, task: JobSource, opts: EnqueueOptions, array: str, count: int, conn: Writer | None
) -> list[int]:
    """:func:`insert_many` on a sync connection (psycopg or Django), with no event loop."""
    return _all(_ids_of_sync(db, conn, db.queries.enqueue_many, many_params(db, task, opts, array)), count)
