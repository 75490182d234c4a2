"""Which database a connection reaches, as the server says, and the check that a caller's
connection (``conn=``) reaches the database of the Queue whose job it is to carry.

A job written on a connection to another database than its Queue's would wait there forever:
no worker of that Queue looks in it. So before the first job a connection carries, it and the
Queue are each asked one read-only statement (``database_identity``): the database's name and
the start of the server process, which every role may ask and a pooler such as PgBouncer
answers as the server behind it. The Queue asks on a connection of its own (see
:meth:`Database.ask_identity`), never its pool's, which the caller may have exhausted. Answers
are kept, the connection's for as long as the driver's connection object lives and the Queue's
in its ``Database``: the same connection enqueuing again pays nothing, and a connection the
Queue's own pool handed out is not asked at all. A restart changes the start time, so answers
that differ are asked again on both sides before the call is refused.

On the sync paths (``enqueue_sync`` on psycopg or Django) no event loop runs: the Queue's
answer is the one it already has, else it is asked through one short psycopg connection to its
DSN. A Queue that only borrows a pool and has not been asked yet is not checked there.
"""

from __future__ import annotations

import dataclasses
import datetime
import weakref
from typing import TYPE_CHECKING, Any

from ._connections import AsyncpgWriter
from ._dsn import describe_dsn
from ._errors import ConnectError, WrongDatabaseError

if TYPE_CHECKING:
    from ._connections import AsyncWriter, Row, SyncWriter
    from ._database import Database


@dataclasses.dataclass(frozen=True, slots=True)
class DatabaseIdentity:
    """A database as its server names it: ``name`` and ``started`` tell it apart; ``host`` and
    ``port`` (None over a Unix socket) say where, for people."""

    name: str
    started: datetime.datetime
    host: str | None = None
    port: int | None = None

    @classmethod
    def from_row(cls, row: Row | Any) -> DatabaseIdentity:
        return cls(name=row[0], started=row[1], host=row[2], port=row[3])

    def same(self, other: DatabaseIdentity) -> bool:
        """Whether both are the same database of the same server."""
        return self.name == other.name and self.started == other.started

    def __str__(self) -> str:
        where = "over a local socket" if self.host is None else f"at {self.host}:{self.port}"
        return f"database {self.name!r} {where}"


#: What each driver connection answered, for as long as the connection object lives.
_answers: weakref.WeakKeyDictionary[Any, DatabaseIdentity] = weakref.WeakKeyDictionary()


def _refusal(task: str, ours: DatabaseIdentity, theirs: DatabaseIdentity) -> WrongDatabaseError:
    servers = " (another server)" if ours.name == theirs.name else ""
    return WrongDatabaseError(
        f"task {task!r} belongs to a Queue on {ours}, but conn reaches {theirs}{servers}: the job "
        "would wait there forever, since no worker of that Queue looks in that database. Enqueue "
        "without conn= (the job then commits on its own, not with your transaction), or on a "
        "connection to the Queue's database"
    )


async def _ask(writer: AsyncWriter, key: object, sql: str) -> DatabaseIdentity:
    answer = _answers[key] = DatabaseIdentity.from_row((await writer.rows(sql, ()))[0])
    return answer


async def check(db: Database, writer: AsyncWriter, task: str) -> None:
    """Refuse ``writer``'s connection (async) unless it reaches ``db``'s database."""
    if isinstance(writer, AsyncpgWriter) and db.lent(writer.conn):
        return  # from the Queue's own pool
    key = await writer.driver_connection()
    sql = db.queries.database_identity
    theirs = _answers.get(key) or await _ask(writer, key, sql)
    ours = db.identity or await db.ask_identity()
    if ours.same(theirs):
        return
    theirs, ours = await _ask(writer, key, sql), await db.ask_identity()  # either may be stale
    if not ours.same(theirs):
        raise _refusal(task, ours, theirs)


def _ask_queue_sync(db: Database) -> DatabaseIdentity | None:
    """The Queue's answer through one short psycopg connection to its DSN (None: no DSN)."""
    if db.dsn is None:
        return None
    import psycopg

    try:
        with psycopg.connect(db.dsn, autocommit=True, connect_timeout=max(1, round(db.connect_timeout))) as conn:
            row = conn.execute(db.queries.database_identity, prepare=False).fetchone()
    except psycopg.OperationalError as exc:
        raise ConnectError(
            f"cannot ask which database the Queue's DSN names, to check conn against it (once): "
            f"cannot connect to PostgreSQL at {describe_dsn(db.dsn)}: {exc}"
        ) from exc
    db.identity = DatabaseIdentity.from_row(row)
    return db.identity


def _ask_sync(writer: SyncWriter, key: object, sql: str) -> DatabaseIdentity:
    answer = _answers[key] = DatabaseIdentity.from_row(writer.rows(sql, ())[0])
    return answer


def check_sync(db: Database, writer: SyncWriter, task: str) -> None:
    """Refuse ``writer``'s connection (sync) unless it reaches ``db``'s database."""
    ours = db.identity or _ask_queue_sync(db)
    if ours is None:
        return  # a borrowed pool, never asked: nothing to compare with without an event loop
    key = writer.driver_connection()
    sql = db.queries.database_identity
    theirs = _answers.get(key) or _ask_sync(writer, key, sql)
    if ours.same(theirs):
        return
    theirs = _ask_sync(writer, key, sql)  # either may be stale
    ours = _ask_queue_sync(db) or ours
    if not ours.same(theirs):
        raise _refusal(task, ours, theirs)
