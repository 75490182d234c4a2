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

from . import _database_identity as database_identity
from ._connections import SCHEMA_SQLSTATES, SYNC_WRITERS, AsyncpgWriter, Writer, sqlstate_of
from ._errors import ConfigurationError, NotRegisteredError, SchemaNotReadyError
from ._job import Connection

if TYPE_CHECKING:
    from ._database import Database
    from ._task import EnqueueOptions


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


#: Jobs per statement in a bulk call. A batch goes as statements of at most this many jobs,
#: pipelined in one implicit transaction on asyncpg (one after the other, in the caller's
#: transaction, on the other drivers): the server parses and holds a quarter of a 20,000-job
#: argument array at a time (a new backend touches that much less fresh memory), and starts
#: inserting while the rest is still on its way. 20,000 jobs in fresh databases: 81.7 ms against
#: 88.8 ms as one statement (median of 9).
CHUNK = 5000


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """A bulk call's jobs, checked and encoded: ``arrays`` hold the arguments of the jobs to
    write, one JSON array per statement; with dedup keys, ``keys`` has one per item of the call
    (or None) and ``sent`` one list per statement, a key per element of its array (each key
    once: its first item)."""

    arrays: list[str]
    count: int
    keys: list[str | None] | None = None
    sent: list[list[str | None]] | None = None

    def statement(self, db: Database) -> str:
        return db.queries.enqueue_many if self.sent is None else db.queries.enqueue_many_keyed

    def params(self, db: Database, task: JobSource, opts: EnqueueOptions) -> list[tuple[Any, ...]]:
        """Each statement's parameters: the task's fields, its array, the channels, its keys.
        Every statement sends the same NOTIFY, which PostgreSQL delivers once per transaction."""
        head, channels = _fields(task, opts), (db.channels.jobs, db.channels.due)
        if self.sent is None:
            return [(*head, array, *channels) for array in self.arrays]
        return [(*head, array, *channels, keys) for array, keys in zip(self.arrays, self.sent, strict=True)]

    def ids(self, rows: list[Any]) -> list[int]:
        """The job ids in the order of the call's items, from the statements' rows (one each):
        the ids of the new jobs in order, then (with keys) the keys written and their jobs' ids."""
        ids: list[int] = [job_id for row in rows for job_id in row[0] or ()]
        if self.keys is not None:
            by_key = {key: job_id for row in rows for key, job_id in zip(row[1] or (), row[2] or (), strict=True)}
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


async def _rows_of(
    db: Database, task: JobSource, writer: Writer | Connection | None, sql: str, statements: list[tuple[Any, ...]]
) -> list[Any]:
    """Run an enqueue statement once per parameter tuple, on the caller's connection or a pooled
    one, all or none; return the rows of all. On asyncpg the runs are pipelined (one implicit
    transaction when no transaction is open); elsewhere they follow one another in the caller's
    transaction. A caller's connection to another database than the Queue's is refused first."""
    if writer is None or not isinstance(writer, Writer):
        async with db.connection(writer) as c:
            return await _fetch_all(c, sql, statements)
    if isinstance(writer, SYNC_WRITERS):
        raise ConfigurationError(
            f"conn is a sync connection ({type(writer.conn).__name__}): use enqueue_sync()/enqueue_many_sync()"
        )
    await database_identity.check(db, writer, task.name)
    if isinstance(writer, AsyncpgWriter):
        async with db.connection(writer.check()) as c:
            return await _fetch_all(c, sql, statements)
    try:
        return [row for params in statements for row in await writer.rows(sql, params)]
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


async def _fetch_all(conn: Connection, sql: str, statements: list[tuple[Any, ...]]) -> list[Any]:
    if len(statements) == 1:
        return await conn.fetch(sql, *statements[0])
    return await conn.fetchmany(sql, statements)


def _rows_of_sync(
    db: Database, task: JobSource, writer: Writer | None, sql: str, statements: list[tuple[Any, ...]]
) -> list[Any]:
    """:func:`_rows_of` on a sync connection."""
    if not isinstance(writer, SYNC_WRITERS):
        what = "no conn" if writer is None else f"the async connection {type(writer.conn).__name__}"
        raise ConfigurationError(
            f"enqueue_sync()/enqueue_many_sync() write on a sync connection (psycopg.Connection or Django's "
            f"connection), given with options(conn=...); got {what}: use `await enqueue()` instead"
        )
    database_identity.check_sync(db, writer, task.name)
    try:
        return [row for params in statements for row in writer.rows(sql, params)]
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


def _written(db: Database, task: JobSource, opts: EnqueueOptions, rows: list[Any]) -> list[Any]:
    """``rows``, unless the statements wrote nothing because the job has no queue (none given,
    none recorded by a worker of its task): then refuse the call, naming the task."""
    if opts.queue is None and not any(row[0] is not None or (len(row) > 1 and row[1]) for row in rows):
        raise NotRegisteredError(
            f"task {task.name!r} has no known queue: this Queue does not register it, and no worker that "
            f"serves it has recorded one (table {db.schema}.tasks); pass queue=..., or start a worker that serves it"
        )
    return rows


async def insert_one(
    db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | Connection | None
) -> int:
    """Write one job and its NOTIFY; return its id (the live job's, when its dedup key is taken)."""
    rows = await _rows_of(db, task, conn, db.queries.enqueue, [one_params(db, task, opts, args)])
    return int(_written(db, task, opts, rows)[0][0])


async def insert_many(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | Connection | None
) -> list[int]:
    """Write a bulk call's jobs of one task, all or none, with one NOTIFY (see :data:`CHUNK`);
    return their ids in the order of the call's items."""
    rows = await _rows_of(db, task, conn, batch.statement(db), batch.params(db, task, opts))
    return batch.ids(_written(db, task, opts, rows))


def insert_one_sync(db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | None) -> int:
    """:func:`insert_one` on a sync connection (psycopg or Django), with no event loop."""
    rows = _rows_of_sync(db, task, conn, db.queries.enqueue, [one_params(db, task, opts, args)])
    return int(_written(db, task, opts, rows)[0][0])


def insert_many_sync(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | None
) -> list[int]:
    """:func:`insert_many` on a sync connection (psycopg or Django), with no event loop."""
    rows = _rows_of_sync(db, task, conn, batch.statement(db), batch.params(db, task, opts))
    return batch.ids(_written(db, task, opts, rows))
