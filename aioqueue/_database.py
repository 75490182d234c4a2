"""The data-access object every part of aioqueue is handed: the pool, the named queries of one
schema, and the notification channels.

``Database`` opens and owns a pool (or borrows the application's), hands out connections that
translate a missing schema into :class:`~aioqueue.SchemaNotReadyError`, opens the dedicated
connections a listener needs, and runs migrations. It knows nothing of tasks or workers; the
services (producer, completer, heartbeat, maintenance, operator calls) receive it instead of the
``Queue``.

An asyncpg pool works only on the event loop it was made on, and scripts, sync applications
and test suites run one loop after another (``asyncio.run`` twice): a pool opened here belongs
to the loop that opened it, each loop gets its own, and each closes when its loop ends. A
borrowed pool of another loop is refused, saying what to do.

Behind a transaction-pooling proxy (PgBouncer ``pool_mode = transaction``, the poolers of hosted
PostgreSQL) a session is not one server connection: named prepared statements vanish between
transactions and notifications never arrive. With ``pooler`` set (or detected: the proxy hands
out a backend pid that is not the server's) the pool uses unnamed statements only, and LISTEN
goes to ``listen_dsn`` (straight to the server) or nowhere: the workers then poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import anyio
import asyncpg
from asyncpg.pool import PoolConnectionProxy

from . import _array_types as array_types
from . import _migrate as migrations
from ._database_identity import DatabaseIdentity
from ._dsn import describe_dsn
from ._errors import AioqueueError, ConfigurationError, ConnectError, SchemaNotReadyError
from ._job import Connection
from ._loop_pools import LoopPool, dispose, gone, home_loop, running_loop
from ._queries import Queries, validate_schema
from ._statements import Channels, Statements

_SCHEMA_ERRORS = (
    asyncpg.UndefinedTableError,
    asyncpg.InvalidSchemaNameError,
    asyncpg.UndefinedColumnError,
    asyncpg.UndefinedFunctionError,
)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: aioqueue leaves no session state behind, so skip the reset round trip."""


class Database:
    """The pool, queries and channels of one aioqueue schema."""

    # Only Queue makes one, passing every setting: the defaults are Queue's, stated there once.
    def __init__(
        self,
        dsn: str | None,
        *,
        pool: asyncpg.Pool | None,
        schema: str,
        pool_min_size: int,
        pool_max_size: int,
        connect_timeout: float,
        connect_kwargs: dict[str, Any] | None,
        pooler: bool | None,
        listen_dsn: str | None,
    ) -> None:
        if dsn is None and pool is None:
            raise ConfigurationError("Queue needs a dsn or a pool")
        if dsn is not None and not isinstance(dsn, str):
            raise ConfigurationError(f"dsn must be a str such as 'postgresql://user@host/db', got {dsn!r}")
        if pool is not None and not isinstance(pool, asyncpg.Pool):
            raise ConfigurationError(f"pool must be an asyncpg.Pool (from asyncpg.create_pool), got {pool!r}")
        for name, size in (("pool_min_size", pool_min_size), ("pool_max_size", pool_max_size)):
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 10_000:
                raise ConfigurationError(f"{name} must be an int from 0 to 10000, got {size!r}")
        if pool_max_size < max(1, pool_min_size):
            raise ConfigurationError(
                f"pool_max_size ({pool_max_size}) must be at least 1 and at least pool_min_size ({pool_min_size})"
            )
        if not isinstance(connect_timeout, int | float) or isinstance(connect_timeout, bool) or not (
            0 < connect_timeout <= 3600
        ):
            raise ConfigurationError(f"connect_timeout must be seconds in (0, 3600], got {connect_timeout!r}")
        if connect_kwargs is not None and not isinstance(connect_kwargs, dict):
            raise ConfigurationError(f"connect_kwargs must be a dict, got {connect_kwargs!r}")
        if pooler is not None and not isinstance(pooler, bool):
            raise ConfigurationError(f"pooler must be True, False or None (detect), got {pooler!r}")
        if listen_dsn is not None and not isinstance(listen_dsn, str):
            raise ConfigurationError(f"listen_dsn must be a str such as 'postgresql://host/db', got {listen_dsn!r}")
        self.dsn = dsn
        self.listen_dsn = listen_dsn
        self.pooler = pooler
        """Whether a transaction-pooling proxy stands between us and the server (None: not yet
        known; :meth:`open` detects it for a pool it opens)."""
        self.schema = validate_schema(schema)
        self.statements = Statements.for_schema(self.schema)
        """The hot-path statements, bound by keyword (see :mod:`aioqueue._statements`)."""
        self.queries: Queries = self.statements.queries
        self.channels: Channels = self.statements.channels
        self._borrowed = pool
        """The application's pool, when the queue borrows one; else None."""
        self._pools: dict[asyncio.AbstractEventLoop, LoopPool] = {}
        """The pools opened here, by the loop each belongs to."""
        self._pool_sizes = (pool_min_size, pool_max_size)
        self._connect_timeout = float(connect_timeout)
        self._connect_kwargs = dict(connect_kwargs or {})
        self.identity: DatabaseIdentity | None = None
        """Which database the queue's connections reach, as the server said when first asked
        (see :mod:`aioqueue._database_identity`); None until then."""

    @property
    def connect_timeout(self) -> float:
        """Seconds a new connection may take."""
        return self._connect_timeout

    # -- the pool ----------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether a pool is there for the running event loop (opened here or borrowed); outside
        a loop, whether any is open."""
        return self._borrowed is not None or self._own_pool() is not None

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool (of the running event loop); raises if it is not open."""
        if self._borrowed is not None:
            return self._checked(self._borrowed)
        pool = self._own_pool()
        if pool is None:
            raise AioqueueError("the queue is not open: use `async with queue:` or `await queue.open()`")
        return pool

    def _own_pool(self) -> asyncpg.Pool | None:
        """The pool opened here for the running loop; outside a loop, the one still open."""
        loop = running_loop()
        if loop is not None:
            state = self._pools.get(loop)
            return None if state is None else state.pool
        live = [state.pool for home, state in self._pools.items() if state.pool is not None and not home.is_closed()]
        return live[0] if len(live) == 1 else None

    def _checked(self, pool: asyncpg.Pool) -> asyncpg.Pool:
        """``pool`` (borrowed), refused if it belongs to another loop than the running one."""
        home, loop = home_loop(pool), running_loop()
        if home is not None and loop is not None and home is not loop:
            raise ConfigurationError(
                f"the asyncpg pool this queue borrows belongs to another event loop"
                f"{' (closed now)' if home.is_closed() else ''}, and a pool works only on the loop that "
                "made it: create a pool in this loop and hand it over with queue.attach_pool(pool), or "
                "give the Queue a dsn instead, and it opens a pool for each loop itself"
            )
        return pool

    async def _usable_pool(self) -> asyncpg.Pool:
        """The pool for the running loop, opened first if need be."""
        if self._borrowed is not None:
            return self._checked(self._borrowed)
        pool = self._own_pool()
        if pool is None:
            await self.open()
            pool = self.pool
        return pool

    async def open(self) -> None:
        """Open a pool for the running event loop if this object owns its pools; idempotent."""
        if self._borrowed is not None:
            self._checked(self._borrowed)
            return
        loop = asyncio.get_running_loop()
        state = self._pools.get(loop)
        if state is None:
            self._forget_closed_loops()
            state = self._pools[loop] = LoopPool()
        async with state.lock:
            if state.pool is not None:
                return
            min_size, max_size = self._pool_sizes
            try:
                if self.pooler is None:
                    self.pooler = await self._behind_pooler()
                state.pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=min_size,
                    max_size=max_size,
                    reset=_keep_session,
                    init=array_types.declare_on_connect,
                    timeout=self._connect_timeout,
                    **self._pool_kwargs(),
                )
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise ConnectError(
                    f"cannot connect to PostgreSQL at {describe_dsn(self.dsn)}: {type(exc).__name__}: {exc}"
                ) from exc
            state.keeper = self._close_with_loop(loop, state)
            await state.keeper.asend(None)

    async def _close_with_loop(self, loop: asyncio.AbstractEventLoop, state: LoopPool) -> AsyncGenerator[None, None]:
        """Wait for the end of ``loop`` (or :meth:`close`), then close its pool, so that no
        connection outlives the loop and no later loop meets a pool it cannot use."""
        try:
            yield
        finally:
            if self._pools.get(loop) is state:
                del self._pools[loop]
            pool, state.pool = state.pool, None
            if pool is not None and not loop.is_closed():
                with anyio.CancelScope(shield=True), anyio.move_on_after(10) as waited:
                    await pool.close()  # waits for the connections in use to come back
                if waited.cancelled_caught:
                    pool.terminate()

    def _forget_closed_loops(self) -> None:
        for loop in [loop for loop in self._pools if loop.is_closed()]:
            keeper = self._pools.pop(loop).keeper
            if keeper is not None:
                dispose(keeper)

    def cap_pool(self, max_size: int) -> None:
        """Hold at most ``max_size`` pooled connections (say, from ``aioqueue worker
        --pool-max-size``); only before the pool opens."""
        if not isinstance(max_size, int) or isinstance(max_size, bool) or not 1 <= max_size <= 10_000:
            raise ConfigurationError(f"pool_max_size must be an int from 1 to 10000, got {max_size!r}")
        if self._borrowed is not None or any(state.pool is not None for state in self._pools.values()):
            raise AioqueueError("the pool is already open: cap it before it opens")
        self._pool_sizes = (min(self._pool_sizes[0], max_size), max_size)

    def _pool_kwargs(self) -> dict[str, Any]:
        kwargs = dict(self._connect_kwargs)
        if self.pooler:
            # Unnamed statements live until the next Parse on the same server connection, and
            # asyncpg sends Parse, Bind and Execute before one Sync: a pooler cannot split them.
            kwargs.setdefault("statement_cache_size", 0)
        return kwargs

    async def _behind_pooler(self) -> bool:
        """Whether ``dsn`` leads to a pooling proxy: PgBouncer and its kind answer the startup
        with a cancel key of their own, so the pid the client saw is not the backend's."""
        kwargs = {**self._connect_kwargs, "statement_cache_size": 0}
        conn = await asyncpg.connect(self.dsn, timeout=self._connect_timeout, **kwargs)
        try:
            backend_pid = await conn.fetchval("SELECT pg_backend_pid()")
            return bool(backend_pid != conn.get_server_pid())
        finally:
            await conn.close()

    async def can_listen(self) -> bool:
        """Whether LISTEN can work here: not through a pooler, unless ``listen_dsn`` bypasses it."""
        if self.listen_dsn is not None:
            return True
        await self._usable_pool()  # opening it tells whether a pooler is in the way
        return not self.pooler

    async def close(self) -> None:
        """Close the pool this object opened for the running event loop; a borrowed pool stays
        open. (The pool of a loop that ends closes with it.)"""
        state = self._pools.get(asyncio.get_running_loop())
        if state is None:
            return
        async with state.lock:
            keeper, state.keeper = state.keeper, None
        if keeper is not None:
            await keeper.aclose()  # closes the pool

    def attach_pool(self, pool: asyncpg.Pool) -> None:
        """Borrow ``pool`` instead of opening one; ``close()`` will leave it open. A pool
        borrowed before that belongs to a loop now closed may be replaced."""
        if not isinstance(pool, asyncpg.Pool):
            raise ConfigurationError(f"pool must be an asyncpg.Pool, got {pool!r}")
        current = self._borrowed
        if current is None:
            current = self._own_pool()
        if current is not None and current is not pool and not gone(current):
            raise AioqueueError("the queue is already open with another pool")
        self._borrowed = pool

    @contextlib.asynccontextmanager
    async def connection(self, conn: Connection | None = None) -> AsyncIterator[Connection]:
        """Yield ``conn`` if given, else a pooled connection; translate schema errors."""
        try:
            if conn is not None:
                yield conn
            else:
                async with (await self._usable_pool()).acquire() as pooled:
                    yield pooled
        except _SCHEMA_ERRORS as exc:
            raise SchemaNotReadyError(
                f"the aioqueue schema {self.schema!r} is missing or out of date ({exc}): "
                "run `aioqueue migrate` (or `await queue.migrate()`)"
            ) from exc

    def lent(self, conn: object) -> bool:
        """Whether ``conn`` was handed out by this queue's pool for the running loop (and so
        reaches its database)."""
        if not isinstance(conn, PoolConnectionProxy):
            return False
        pool = getattr(getattr(conn, "_holder", None), "_pool", None)  # asyncpg's, unnamed in its API
        return pool is not None and (pool is self._borrowed or pool is self._own_pool())

    async def ask_identity(self) -> DatabaseIdentity:
        """Ask the server which database this queue's connections reach, and keep the answer in
        :attr:`identity`. With a DSN it asks on a connection of its own, never the pool's: the
        caller may hold the last free one (its unnamed statement passes any pooler)."""
        dsn = self.dsn or self.listen_dsn
        try:
            if dsn is None:
                async with self.connection() as pooled:
                    row = await pooled.fetchrow(self.queries.database_identity)
            else:
                kwargs = {**self._connect_kwargs, "statement_cache_size": 0}
                conn = await asyncpg.connect(dsn, timeout=self._connect_timeout, **kwargs)
                try:
                    row = await conn.fetchrow(self.queries.database_identity)
                finally:
                    await conn.close()
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ConnectError(
                f"cannot connect to PostgreSQL at {describe_dsn(dsn)}: {type(exc).__name__}: {exc}"
            ) from exc
        self.identity = DatabaseIdentity.from_row(row)
        return self.identity

    # -- dedicated connections (listeners) -----------------------------------------------------

    async def connect(self) -> Connection:
        """A connection outside the pool's rotation, for LISTEN: dedicated when there is a DSN,
        else borrowed from the pool for good (give it back with :meth:`disconnect`). With a
        ``listen_dsn`` it connects there (past the pooler, to the server itself)."""
        if self.listen_dsn is not None or self.dsn is not None:
            kwargs = self._connect_kwargs if self.listen_dsn is not None else self._pool_kwargs()
            conn: Connection = await asyncpg.connect(
                self.listen_dsn or self.dsn, timeout=self._connect_timeout, **kwargs
            )
            return conn
        return await (await self._usable_pool()).acquire()

    async def disconnect(self, conn: Connection) -> None:
        """Close a connection from :meth:`connect` (or return it to the pool); never raises."""
        try:
            with anyio.fail_after(2):
                if isinstance(conn, PoolConnectionProxy):
                    await self.pool.release(conn)
                elif not conn.is_closed():
                    await conn.close()
        except Exception:
            conn.terminate()

    # -- schema ------------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Create or upgrade the schema; return the versions applied. Safe to run concurrently."""
        async with self.connection() as conn:
            return await migrations.migrate(conn, self.schema)

    async def check_schema(self, limits_of: Sequence[str] | None = None) -> list[asyncpg.Record]:
        """Raise :class:`SchemaNotReadyError` unless the schema is at this code's version. With
        ``limits_of`` (a worker's queues), read in the same statement which of them have limits,
        and return those rows of ``limited_queues`` (else none)."""
        rows: list[asyncpg.Record] = []
        async with self.connection() as conn:
            if limits_of is None:
                version = await migrations.applied_version(conn, self.schema)
            else:
                try:
                    rows = await conn.fetch(self.queries.limited_queues_at_version, list(limits_of))
                    version = rows[0]["version"]
                except _SCHEMA_ERRORS:  # no schema, or one too old for the read: the version tells
                    version = await migrations.applied_version(conn, self.schema)
                    if version == migrations.latest_version():
                        raise
        latest = migrations.latest_version()
        if version < latest:
            state = "does not exist" if version == 0 else f"is at version {version}"
            raise SchemaNotReadyError(
                f"the aioqueue schema {self.schema!r} {state}; this code needs version {latest}: "
                "run `aioqueue migrate` (or `await queue.migrate()`)"
            )
        if version > latest:
            raise SchemaNotReadyError(
                f"the aioqueue schema {self.schema!r} is at version {version}, newer than this "
                f"code's {latest}: upgrade aioqueue"
            )
        return [row for row in rows if row["name"] is not None]
