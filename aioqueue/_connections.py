"""The callers' connections a job can be written on, each inside the caller's own transaction.

``writer_for`` recognises what a caller passes as ``conn=`` (asyncpg, SQLAlchemy async on the
asyncpg driver, psycopg 3 async or sync, Django on PostgreSQL with psycopg 3) when the
enqueuer is made, and refuses anything else naming what is supported. Each writer sends one
named statement with ``$n`` parameters, as given: psycopg through its raw cursors, which bind
``$n`` server-side, so no statement is ever rewritten. Before writing, each checks that the
job will commit with the caller's work, never on its own; ``driver_connection`` names the
driver's connection under the caller's object, which outlives a pool's proxy or a session, for
what is learned about it once (see :mod:`aioqueue._database_identity`). SQLAlchemy, psycopg and Django are
imported only when the caller's object comes from them: none is required by the core.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ._errors import ConfigurationError, NotInTransactionError

if TYPE_CHECKING:
    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.utils.connection import ConnectionProxy
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

CallerConnection: TypeAlias = (
    "asyncpg.Connection[Any] | PoolConnectionProxy[Any] | AsyncSession | AsyncConnection"
    " | psycopg.AsyncConnection[Any] | psycopg.Connection[Any]"
    " | BaseDatabaseWrapper | ConnectionProxy[BaseDatabaseWrapper]"
)
"""What ``conn=`` accepts: a connection whose open transaction the job joins."""

Row: TypeAlias = tuple[Any, ...]

SUPPORTED = (
    "an asyncpg.Connection (or one acquired from an asyncpg pool), a SQLAlchemy AsyncSession or "
    "AsyncConnection on the asyncpg driver, a psycopg 3 AsyncConnection or Connection, or a Django "
    "database connection (django.db.connection) on PostgreSQL with psycopg 3"
)

# SQLSTATEs that mean the aioqueue schema is missing or older than the code.
SCHEMA_SQLSTATES = frozenset({"42P01", "3F000", "42703", "42883"})


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error from any supported driver (wrapped or not), or None."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str):
            return state
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return None


class AsyncpgWriter:
    """An asyncpg connection (plain or pooled); it must be inside a transaction."""

    def __init__(self, conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any]) -> None:
        self.conn = conn

    def check(self) -> asyncpg.Connection[Any] | PoolConnectionProxy[Any]:
        """Return the connection, or refuse it if no transaction is open on it."""
        if not self.conn.is_in_transaction():
            raise NotInTransactionError(
                "conn is an asyncpg connection with no transaction open, so the job would commit on its "
                "own and outlive a rollback of your work: enqueue inside `async with conn.transaction():`, "
                "or omit conn to enqueue in a transaction of the job's own"
            )
        return self.conn

    async def driver_connection(self) -> object:
        """The asyncpg connection itself: the same under every proxy a pool hands out for it."""
        conn = self.check()
        if isinstance(conn, PoolConnectionProxy):
            return getattr(conn, "_con", None) or conn  # asyncpg keeps it there, unnamed in its API
        return conn

    async def rows(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return [tuple(row) for row in await self.check().fetch(sql, *params)]


class SQLAlchemyWriter:
    """A SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` on the asyncpg driver, in a transaction.

    The statement goes through ``exec_driver_sql`` (the asyncpg dialect takes ``$n`` as is), so
    SQLAlchemy sends its deferred BEGIN first: the bare driver connection would still be outside
    any transaction before the session's first statement.
    """

    def __init__(self, conn: AsyncSession | AsyncConnection) -> None:
        self.conn = conn

    async def _checked(self) -> tuple[AsyncConnection, Any]:
        """The connection in the caller's transaction, and its pooled raw connection; refused
        when no transaction is begun (the session's is, at its first statement) or it commits
        every statement."""
        from sqlalchemy.ext.asyncio import AsyncSession

        kind = type(self.conn).__name__
        if not self.conn.in_transaction():
            raise NotInTransactionError(
                f"conn is a SQLAlchemy {kind} with no transaction begun, so the job would not be tied to "
                f"your work: enqueue inside `async with {'session' if kind == 'AsyncSession' else 'conn'}"
                ".begin():` (or after a statement of it), then commit"
            )
        conn = await self.conn.connection() if isinstance(self.conn, AsyncSession) else self.conn
        _check_sqlalchemy_driver(conn.dialect.driver)
        raw = await conn.get_raw_connection()
        if getattr(raw.dbapi_connection, "autocommit", False):
            raise NotInTransactionError(
                f"conn is a SQLAlchemy {kind} in AUTOCOMMIT mode, so the job would commit on its own: "
                "use a connection with a real transaction"
            )
        return conn, raw

    async def driver_connection(self) -> object:
        """The asyncpg connection under the session's current connection."""
        _conn, raw = await self._checked()
        return raw.driver_connection

    async def rows(self, sql: str, params: Sequence[Any]) -> list[Row]:
        conn, _raw = await self._checked()
        result = await conn.exec_driver_sql(sql, tuple(params))
        return [tuple(row) for row in result.all()]


def _check_sqlalchemy_driver(driver: str) -> None:
    if driver != "asyncpg":
        raise ConfigurationError(
            f"conn is a SQLAlchemy connection on the {driver!r} driver; aioqueue writes through SQLAlchemy "
            f"only on the asyncpg driver (postgresql+asyncpg://...). Supported: {SUPPORTED}"
        )


def _check_psycopg_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    import psycopg

    # Without autocommit, psycopg begins a transaction at the first statement, which commits
    # with the caller's commit(); in autocommit mode only `with conn.transaction()` opens one.
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise NotInTransactionError(
            "conn is a psycopg connection in autocommit mode with no transaction open, so the job would "
            "commit on its own: enqueue inside `with conn.transaction():` (async: `async with`)"
        )


class PsycopgAsyncWriter:
    """A psycopg 3 ``AsyncConnection``: one statement through a raw (``$n``) cursor."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def driver_connection(self) -> object:
        return self.conn

    async def rows(self, sql: str, params: Sequence[Any]) -> list[Row]:
        import psycopg

        _check_psycopg_transaction(self.conn)
        async with psycopg.AsyncRawCursor(self.conn) as cur:
            await cur.execute(sql, params)
            return list(await cur.fetchall())


class PsycopgWriter:
    """A psycopg 3 ``Connection`` (sync): one statement through a raw (``$n``) cursor."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def driver_connection(self) -> object:
        return self.conn

    def rows(self, sql: str, params: Sequence[Any]) -> list[Row]:
        _check_psycopg_transaction(self.conn)
        return _psycopg_rows(self.conn, sql, params)


def _psycopg_rows(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[Row]:
    import psycopg

    with psycopg.RawCursor(conn) as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


class DjangoWriter:
    """Django's connection on PostgreSQL with psycopg 3, inside ``transaction.atomic()``.

    The statement runs on the psycopg connection under Django's, so it joins the transaction
    Django opened.
    """

    def __init__(self, conn: BaseDatabaseWrapper | ConnectionProxy[BaseDatabaseWrapper]) -> None:
        self.conn = conn

    def _checked(self) -> psycopg.Connection[Any]:
        """The psycopg connection under Django's, in ``transaction.atomic()``; else refused."""
        import psycopg

        wrapper: Any = self.conn
        if wrapper.get_autocommit():
            raise NotInTransactionError(
                "conn is a Django connection in autocommit mode, so the job would commit on its own: "
                "enqueue inside `with transaction.atomic():`"
            )
        wrapper.validate_no_broken_transaction()
        wrapper.ensure_connection()
        raw = wrapper.connection
        if not isinstance(raw, psycopg.Connection):
            raise ConfigurationError(
                f"conn is a Django connection on {type(raw).__module__}.{type(raw).__name__}; aioqueue writes "
                f"through Django only with the psycopg 3 driver (pip install 'psycopg[binary]'). Supported: {SUPPORTED}"
            )
        return raw

    def driver_connection(self) -> object:
        """The psycopg connection Django holds now (a new one after Django reconnects)."""
        return self._checked()

    def rows(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return _psycopg_rows(self._checked(), sql, params)


AsyncWriter: TypeAlias = AsyncpgWriter | SQLAlchemyWriter | PsycopgAsyncWriter
SyncWriter: TypeAlias = PsycopgWriter | DjangoWriter
Writer: TypeAlias = AsyncWriter | SyncWriter
SYNC_WRITERS = (PsycopgWriter, DjangoWriter)


def writer_for(conn: object) -> Writer:
    """Return the writer for a caller's connection, or raise naming the supported kinds."""
    if isinstance(conn, asyncpg.Connection | PoolConnectionProxy):
        return AsyncpgWriter(conn)
    sa = sys.modules.get("sqlalchemy.ext.asyncio")
    if sa is not None and isinstance(conn, sa.AsyncSession | sa.AsyncConnection):
        bind = conn.bind if isinstance(conn, sa.AsyncSession) else conn
        if bind is not None:
            _check_sqlalchemy_driver(bind.dialect.driver)
        return SQLAlchemyWriter(conn)
    pg = sys.modules.get("psycopg")
    if pg is not None and isinstance(conn, pg.AsyncConnection):
        return PsycopgAsyncWriter(conn)
    if pg is not None and isinstance(conn, pg.Connection):
        return PsycopgWriter(conn)
    dj = sys.modules.get("django.db")
    if dj is not None:
        from django.db.backends.base.base import BaseDatabaseWrapper
        from django.utils.connection import ConnectionProxy

        if isinstance(conn, BaseDatabaseWrapper | ConnectionProxy):
            vendor = conn.vendor
            if vendor != "postgresql":
                raise ConfigurationError(
                    f"conn is a Django connection to {vendor!r}; aioqueue's jobs live in PostgreSQL. "
                    f"Supported: {SUPPORTED}"
                )
            return DjangoWriter(conn)
    raise ConfigurationError(f"conn must be {SUPPORTED}; got {type(conn).__name__} {conn!r}")
