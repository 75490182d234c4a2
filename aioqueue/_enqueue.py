"""Write validated jobs: one row per call, or many in one statement, each call with one NOTIFY.

The callers (``Enqueuer``, the by-name calls, the periodic scheduler) have already checked the
arguments; this module encodes a bulk call into its batch (chunks, dedup keys) and sends the
named ``enqueue`` statements, on the caller's connection when given (so the job joins the
caller's transaction) or on a pooled one. Every path, async or sync, whatever the driver, sends
the same statement with the same parameters, bound once (:mod:`aioqueue._statements`). It
returns job ids, never a half-written batch.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import _database_identity as database_identity
from . import _payload as payload
from ._connections import SCHEMA_SQLSTATES, SYNC_WRITERS, AsyncpgWriter, Writer, sqlstate_of
from ._errors import ConfigurationError, NotRegisteredError, SchemaNotReadyError
from ._job import Connection
from ._links import Links, refused
from ._statements import Bound, NewJobs

if TYPE_CHECKING:
    from ._database import Database


class JobSource(Protocol):
    """What a job row takes from its task: its name and whether it is archived when done."""

    @property
    def name(self) -> str: ...

    @property
    def archive(self) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """What one enqueue call writes besides the arguments."""

    queue: str | None
    """None: the queue the task's workers recorded (a job enqueued by name, given no queue)."""
    priority: int
    max_attempts: int
    delay: float = 0.0
    run_at: datetime.datetime | None = None
    key: str | None = None
    links: Links | None = None
    """The jobs it waits for and the group it joins (workflows), or None."""
    partition_key: str | None = None


def new_jobs(task: JobSource, opts: EnqueueOptions) -> NewJobs:
    """What every job of a call of ``task`` with ``opts`` shares, as the statements take it."""
    return NewJobs(
        queue=opts.queue, task=task.name, priority=opts.priority, run_at=opts.run_at, delay=opts.delay,
        max_attempts=opts.max_attempts, archive=task.archive, partition_key=opts.partition_key,
    )


def one_job(db: Database, task: JobSource, opts: EnqueueOptions, args: str) -> Bound:
    """The ``enqueue`` statement for one job with the JSON arguments ``args``."""
    group = None if opts.links is None else opts.links.group
    return db.statements.enqueue_one(jobs=new_jobs(task, opts), args=args, key=opts.key, group=group)


#: Jobs per statement in a bulk call. A batch goes as statements of at most this many jobs,
#: pipelined in one implicit transaction on asyncpg (one after the other, in the caller's
#: transaction, on the other drivers): the server then parses and holds one part of a large
#: argument array at a time, and starts inserting while the rest is still on its way, which
#: measured faster than one statement for the whole batch.
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

    @classmethod
    def of(cls, task: str, named: list[dict[str, Any]], keys: list[str | None] | None, limit: int) -> Batch:
        """The batch of a bulk call of ``task`` whose items' arguments are ``named`` (checked),
        with one dedup key (or None) per item: only the first item of a key is written, the
        others get its job's id. Refuses the batch naming the first item that does not encode
        (or exceeds ``limit`` bytes), by its place in the whole call."""
        arrays = _encode(task, named, limit)
        if keys is None:
            return cls(arrays, len(named))
        seen: set[str] = set()
        written = []
        for i, key in enumerate(keys):
            if key is None or key not in seen:
                written.append(i)
                if key is not None:
                    seen.add(key)
        if len(written) < len(named):  # the whole call was encoded first, so errors name its items
            arrays = _encode(task, [named[i] for i in written], limit)
        sent = [keys[i] for i in written]
        return cls(arrays, len(named), keys, [sent[at : at + CHUNK] for at in range(0, len(sent), CHUNK)])

    def statements(self, db: Database, task: JobSource, opts: EnqueueOptions) -> list[Bound]:
        """One statement per array, keyed or not. Every statement sends the same NOTIFY, which
        PostgreSQL delivers once per transaction."""
        sent: list[list[str | None]] | list[None] = self.sent if self.sent is not None else [None] * len(self.arrays)
        jobs = new_jobs(task, opts)
        group = None if opts.links is None else opts.links.group
        return [
            db.statements.enqueue_batch(jobs=jobs, args=array, keys=keys, group=group)
            for array, keys in zip(self.arrays, sent, strict=True)
        ]

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


def _encode(task: str, named: list[dict[str, Any]], limit: int) -> list[str]:
    """The jobs' arguments as JSON arrays of at most ``CHUNK`` jobs each (see
    ``payload.encode_args_array``): one per statement."""
    return [
        payload.encode_args_array(task, named[at : at + CHUNK], limit, "enqueue_many", first=at, total=len(named))
        for at in range(0, len(named), CHUNK)
    ]


def _schema_error(db: Database, exc: Exception) -> SchemaNotReadyError | None:
    if sqlstate_of(exc) in SCHEMA_SQLSTATES:
        return SchemaNotReadyError(
            f"the aioqueue schema {db.schema!r} is missing or out of date ({exc}): "
            "run `aioqueue migrate` (or `await queue.migrate()`)"
        )
    return None


#: The statement that links the jobs an enqueue wrote into a workflow, from the enqueue's rows
#: (None: no links).
Then = Callable[[list[Any]], Bound] | None


async def rows_of(
    db: Database, task: JobSource, writer: Writer | Connection | None, statements: list[Bound], then: Then = None
) -> list[Any]:
    """Run an enqueue statement once per parameter tuple, on the caller's connection or a pooled
    one, all or none; return the rows of all. On asyncpg the runs are pipelined (one implicit
    transaction when no transaction is open); elsewhere they follow one another in the caller's
    transaction. A caller's connection to another database than the Queue's is refused first.
    ``then``: the workflow statement to run next from the rows, in the same transaction."""
    try:
        return await _linked_rows_of(db, task, writer, statements, then)
    except Exception as exc:
        error = refused(task.name, exc)
        if error is None:
            raise
        raise error from None


async def _run_linked(conn: Connection, statements: list[Bound], then: Then) -> list[Any]:
    if then is None:
        return await _fetch_all(conn, statements)
    async with conn.transaction():
        rows = await _fetch_all(conn, statements)
        link = then(rows)
        await conn.fetch(link.sql, *link.args)
        return rows


async def _linked_rows_of(
    db: Database, task: JobSource, writer: Writer | Connection | None, statements: list[Bound], then: Then
) -> list[Any]:
    if writer is None or not isinstance(writer, Writer):
        async with db.connection(writer) as c:
            return await _run_linked(c, statements, then)
    if isinstance(writer, SYNC_WRITERS):
        raise ConfigurationError(
            f"conn is a sync connection ({type(writer.conn).__name__}): use enqueue_sync()/enqueue_many_sync()"
        )
    await database_identity.check(db, writer, task.name)
    if isinstance(writer, AsyncpgWriter):
        async with db.connection(writer.check()) as c:
            return await _run_linked(c, statements, then)
    try:
        rows = [row for b in statements for row in await writer.rows(b.sql, b.args)]
        if then is not None:
            link = then(rows)
            await writer.rows(link.sql, link.args)
        return rows
    except Exception as exc:
        missing = _schema_error(db, exc)
        if missing is None:
            raise
        raise missing from exc


async def _fetch_all(conn: Connection, statements: list[Bound]) -> list[Any]:
    if len(statements) == 1:
        return await conn.fetch(statements[0].sql, *statements[0].args)
    # A bulk call's statements share one SQL text (keyed or not, the whole call alike).
    return await conn.fetchmany(statements[0].sql, [b.args for b in statements])


def rows_of_sync(
    db: Database, task: JobSource, writer: Writer | None, statements: list[Bound], then: Then = None
) -> list[Any]:
    """:func:`rows_of` on a sync connection."""
    if not isinstance(writer, SYNC_WRITERS):
        what = "no conn" if writer is None else f"the async connection {type(writer.conn).__name__}"
        raise ConfigurationError(
            f"enqueue_sync()/enqueue_many_sync() write on a sync connection (psycopg.Connection or Django's "
            f"connection), given with options(conn=...); got {what}: use `await enqueue()` instead"
        )
    database_identity.check_sync(db, writer, task.name)
    try:
        rows = [row for b in statements for row in writer.rows(b.sql, b.args)]
        if then is not None:
            link = then(rows)
            writer.rows(link.sql, link.args)
        return rows
    except Exception as exc:
        error = refused(task.name, exc) or _schema_error(db, exc)
        if error is None:
            raise
        raise error from exc


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
    rows = await rows_of(db, task, conn, [one_job(db, task, opts, args)], _then_one(db, task, opts))
    return int(_written(db, task, opts, rows)[0][0])


def _then_one(db: Database, task: JobSource, opts: EnqueueOptions) -> Then:
    links = opts.links
    if links is None:
        return None
    return lambda rows: links.bound(db, [int(_written(db, task, opts, rows)[0][0])])


def _then_many(db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch) -> Then:
    links = opts.links
    if links is None:
        return None
    return lambda rows: links.bound(db, batch.ids(_written(db, task, opts, rows)))


async def insert_many(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | Connection | None
) -> list[int]:
    """Write a bulk call's jobs of one task, all or none, with one NOTIFY (see :data:`CHUNK`);
    return their ids in the order of the call's items."""
    rows = await rows_of(db, task, conn, batch.statements(db, task, opts), _then_many(db, task, opts, batch))
    return batch.ids(_written(db, task, opts, rows))


def insert_one_sync(db: Database, task: JobSource, opts: EnqueueOptions, args: str, conn: Writer | None) -> int:
    """:func:`insert_one` on a sync connection (psycopg or Django), with no event loop."""
    rows = rows_of_sync(db, task, conn, [one_job(db, task, opts, args)], _then_one(db, task, opts))
    return int(_written(db, task, opts, rows)[0][0])


def insert_many_sync(
    db: Database, task: JobSource, opts: EnqueueOptions, batch: Batch, conn: Writer | None
) -> list[int]:
    """:func:`insert_many` on a sync connection (psycopg or Django), with no event loop."""
    rows = rows_of_sync(db, task, conn, batch.statements(db, task, opts), _then_many(db, task, opts, batch))
    return batch.ids(_written(db, task, opts, rows))
