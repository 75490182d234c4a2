"""The ``Queue``: where aioqueue meets the user's database.

It owns the connection pool (or borrows the user's), the schema name, and the registry of
tasks; it writes jobs (``insert_job``/``insert_jobs``) and answers the operator's calls (status,
dead jobs, retries). Workers are made from it with ``worker()``. It never runs a handler.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import anyio
import asyncpg

from . import migrate as migrations
from .errors import (
    AioqueueError,
    ConfigurationError,
    ConnectError,
    JobCancelled,
    JobFailed,
    NotRegisteredError,
    ResultUnavailable,
    SchemaNotReadyError,
)
from .job import Connection, JobInfo, JobRef
from .payload import DEFAULT_MAX_PAYLOAD_BYTES
from .periodic import Missed, Periodic
from .queries import Queries, for_schema, validate_schema
from .retry import Backoff
from .signal import Flag
from .task import EnqueueOptions, Task, check_int, check_name, check_seconds

if TYPE_CHECKING:
    from .middleware import Middleware
    from .worker import Worker

P = ParamSpec("P")
R = TypeVar("R")

_SCHEMA_ERRORS = (
    asyncpg.UndefinedTableError,
    asyncpg.InvalidSchemaNameError,
    asyncpg.UndefinedColumnError,
    asyncpg.UndefinedFunctionError,
)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset hook: aioqueue leaves no session state behind, so skip the reset round trip."""


def describe_dsn(dsn: str | None) -> str:
    """Return ``host:port/database`` of a DSN for error messages, without the password."""
    if not dsn:
        return "the server named by the PG* environment variables"
    try:
        parts = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(parts.query)
        host = parts.hostname or query.get("host", ["localhost"])[0]
        port = parts.port or query.get("port", [5432])[0]
        database = parts.path.lstrip("/") or "(default database)"
    except ValueError:
        return "the server of the given DSN"
    return f"{host}:{port}/{database}"


class Queue:
    """A job queue in one PostgreSQL schema.

    Give it a DSN (it opens and owns a pool) or an asyncpg pool of yours. ``async with queue``
    opens it and closes what it owns; enqueue calls open it on first use.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        schema: str = "aioqueue",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        connect_timeout: float = 10.0,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if dsn is None and pool is None:
            raise ConfigurationError("Queue needs a dsn or a pool")
        if not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
        self.dsn = dsn
        self.schema = validate_schema(schema)
        self.queries: Queries = for_schema(self.schema)
        self.channel = f"{self.schema}_jobs"
        self.cancel_channel = f"{self.schema}_cancel"
        self.done_channel = f"{self.schema}_done"
        self.max_payload_bytes = max_payload_bytes
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodics: dict[str, Periodic] = {}
        self.middleware: list[Middleware] = []
        self._pool = pool
        self._owns_pool = pool is None
        self._pool_sizes = (pool_min_size, pool_max_size)
        self._connect_timeout = connect_timeout
        self._connect_kwargs = dict(connect_kwargs or {})
        self._open_lock = anyio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> Queue:
        """Open the pool if this queue owns one; idempotent."""
        async with self._open_lock:
            if self._pool is None:
                min_size, max_size = self._pool_sizes
                try:
                    self._pool = await asyncpg.create_pool(
                        self.dsn,
                        min_size=min_size,
                        max_size=max_size,
                        reset=_keep_session,
                        timeout=self._connect_timeout,
                        **self._connect_kwargs,
                    )
                except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    raise ConnectError(
                        f"cannot connect to PostgreSQL at {describe_dsn(self.dsn)}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
        return self

    async def close(self) -> None:
        """Close the pool if this queue opened it."""
        async with self._open_lock:
            if self._owns_pool and self._pool is not None:
                pool, self._pool = self._pool, None
                await pool.close()

    async def __aenter__(self) -> Queue:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def attach_pool(self, pool: asyncpg.Pool) -> None:
        """Borrow ``pool`` (say, the web application's) instead of opening one of its own.

        Call it before the queue opens; ``close()`` leaves a borrowed pool open.
        """
        if self._pool is not None and self._pool is not pool:
            raise AioqueueError("the queue is already open with another pool")
        self._pool = pool
        self._owns_pool = False

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool; raises if the queue is not open."""
        if self._pool is None:
            raise AioqueueError("the queue is not open: use `async with queue:` or `await queue.open()`")
        return self._pool

    def connect_params(self) -> tuple[str | None, dict[str, Any]]:
        """The DSN and keyword arguments for a dedicated connection (the worker's listener)."""
        return self.dsn, {"timeout": self._connect_timeout, **self._connect_kwargs}

    @contextlib.asynccontextmanager
    async def connection(self, conn: Connection | None = None) -> AsyncIterator[Connection]:
        """Yield ``conn`` if given, else a pooled connection; translate schema errors."""
        try:
            if conn is not None:
                yield conn
            else:
                if self._pool is None:
                    await self.open()
                async with self.pool.acquire() as pooled:
                    yield pooled
        except _SCHEMA_ERRORS as exc:
            raise SchemaNotReadyError(
                f"the aioqueue schema {self.schema!r} is missing or out of date ({exc}): "
                "run `aioqueue migrate` (or `await queue.migrate()`)"
            ) from exc

    # -- schema ------------------------------------------------------------------------------

    async def migrate(self) -> list[int]:
        """Create or upgrade the schema; return the versions applied. Safe to run concurrently."""
        async with self.connection() as conn:
            return await migrations.migrate(conn, self.schema)

    async def check_schema(self) -> None:
        """Raise :class:`SchemaNotReadyError` unless the schema is at this code's version."""
        async with self.connection() as conn:
            version = await migrations.applied_version(conn, self.schema)
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

    # -- tasks -------------------------------------------------------------------------------

    def use(self, middleware: Middleware) -> Middleware:
        """Run ``middleware`` around every handler this queue's workers run; return it, so it
        can decorate. The first registered is the outermost (see :mod:`aioqueue.middleware`)."""
        self.middleware.append(middleware)
        return middleware

    @overload
    def task(self, fn: Callable[P, Awaitable[R]], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        retry: Backoff | None = None,
        archive: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], Task[P, R]]: ...

    def task(  # type: ignore[misc]
        self,
        fn: Callable[P, Awaitable[R]] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        retry: Backoff | None = None,
        archive: bool = False,
    ) -> Any:
        """Register an async function as a task: ``@queue.task`` or ``@queue.task(queue=...)``.

        ``name`` defaults to the function's name and must be unique on this queue: it is what
        the job row stores. ``timeout`` (seconds) cancels a handler that runs longer and counts
        as a failure. ``archive`` keeps finished jobs (and their results) in ``jobs_done``.
        """

        def register(f: Callable[P, Awaitable[R]]) -> Task[P, R]:
            task_name = name if name is not None else getattr(f, "__name__", None)
            check_name("task name", task_name)
            assert isinstance(task_name, str)
            if task_name in self.tasks:
                raise ConfigurationError(
                    f"a task named {task_name!r} is already registered ({self.tasks[task_name].fn!r}); "
                    "pass name=... to tell them apart"
                )
            registered = Task(
                self,
                f,
                name=task_name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                timeout=timeout,
                retry=retry if retry is not None else Backoff(),
                archive=archive,
            )
            self.tasks[task_name] = registered
            return registered

        if fn is not None:
            return register(fn)
        return register

    def get_task(self, name: str) -> Task[Any, Any]:
        """Return the registered task called ``name``."""
        try:
            return self.tasks[name]
        except KeyError:
            raise NotRegisteredError(f"no task named {name!r} is registered on this queue") from None

    # -- writing jobs ------------------------------------------------------------------------

    async def insert_job(
        self, task: Task[Any, Any], opts: EnqueueOptions, args: str, conn: Connection | None
    ) -> JobRef:
        """Write one job (already validated) and its NOTIFY; return its id."""
        async with self.connection(conn) as c:
            row = await c.fetchrow(
                self.queries.enqueue,
                opts.queue,
                task.name,
                args,
                opts.priority,
                opts.run_at,
                opts.delay,
                opts.max_attempts,
                opts.key,
                task.archive,
                self.channel,
            )
        assert row is not None
        return JobRef(row["id"], self)

    async def insert_jobs(
        self,
        task: Task[Any, Any],
        opts: EnqueueOptions,
        args: Sequence[str],
        keys: Sequence[str | None] | None,
        conn: Connection | None,
    ) -> list[JobRef]:
        """Write many jobs of one task (already validated) in one statement; return their ids
        in the order given."""
        key_list: list[str | None] = list(keys) if keys is not None else [None] * len(args)
        async with self.connection(conn) as c:
            rows = await c.fetch(
                self.queries.enqueue_many,
                opts.queue,
                task.name,
                opts.priority,
                opts.run_at,
                opts.delay,
                opts.max_attempts,
                task.archive,
                list(args),
                key_list,
                self.channel,
            )
        by_key = {r["dedup_key"]: int(r["id"]) for r in rows if r["dedup_key"] is not None}
        # Identity values follow the insert order, which follows the input order.
        unkeyed = iter(sorted(int(r["id"]) for r in rows if r["dedup_key"] is None))
        return [JobRef(by_key[k] if k is not None else next(unkeyed), self) for k in key_list]

    # -- operating ---------------------------------------------------------------------------

    def worker(
        self,
        *,
        concurrency: int = 10,
        queues: Sequence[str] | Mapping[str, int] | None = None,
        poll_interval: float = 1.0,
        lease: float = 300.0,
        grace_period: float = 30.0,
        **options: Any,
    ) -> Worker:
        """Make a worker for this queue's tasks (see :class:`~aioqueue.Worker`).

        ``queues``: the queues to work (default: those of the registered tasks), or a mapping
        ``{queue: slots}`` that also caps how many of this worker's slots each queue may use.
        """
        from .worker import Worker

        return Worker(
            self,
            concurrency=concurrency,
            queues=queues,
            poll_interval=poll_interval,
            lease=lease,
            grace_period=grace_period,
            **options,
        )

    async def get_job(self, job_id: int) -> JobInfo | None:
        """Return a job by id, live or archived; None when it is gone (or was never there)."""
        async with self.connection() as conn:
            row = await conn.fetchrow(self.queries.get_job, job_id)
        return None if row is None else JobInfo.from_record(row)

    async def list_dead(self, *, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """Return dead jobs, newest first."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.queries.list_dead, queue, limit)
        return [JobInfo.from_record(r) for r in rows]

    async def retry_dead(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Send dead jobs back to pending now; return their ids. Name ids, or pass ``all=True``
        (optionally with ``queue``)."""
        selected = self._select_dead(ids, queue, all)
        async with self.connection() as conn, conn.transaction():
            rows = await conn.fetch(self.queries.retry_dead, selected, queue)
            for queue_name in sorted({r["queue"] for r in rows}):
                await conn.execute("SELECT pg_notify($1, $2)", self.channel, queue_name)
        return sorted(int(r["id"]) for r in rows)

    async def purge_dead(
        self, ids: Sequence[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Delete dead jobs; return their ids. Name ids, or pass ``all=True``."""
        selected = self._select_dead(ids, queue, all)
        async with self.connection() as conn:
            rows = await conn.fetch(self.queries.purge_dead, selected, queue)
        return sorted(int(r["id"]) for r in rows)

    @staticmethod
    def _select_dead(ids: Sequence[int] | None, queue: str | None, all: bool) -> list[int] | None:
        if ids is not None and all:
            raise ConfigurationError("pass either ids or all=True, not both")
        if ids is None and not all and queue is None:
            raise ConfigurationError("name the dead jobs: ids, queue=..., or all=True")
        if queue is not None:
            check_name("queue name", queue)
        return None if ids is None else [int(i) for i in ids]

    # -- scheduling and flow control ------------------------------------------------------

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | None = None,
        name: str | None = None,
        missed: Missed = "once",
        misfire_grace: float = 60.0,
        kwargs: Mapping[str, Any] | None = None,
        **task_options: Any,
    ) -> Callable[[Callable[P, Awaitable[R]]], Task[P, R]]:
        """Register a task and enqueue it on a schedule: ``@queue.periodic("*/5 * * * *")``
        (cron, UTC) or ``@queue.periodic(every=30)`` (seconds, aligned to the Unix epoch).

        Each slot is enqueued once however many workers run (workers of a queue that knows the
        task schedule it). ``missed`` says what a worker coming back does with slots missed
        while none ran: ``"once"`` runs the newest once, ``"skip"`` skips it unless it is at
        most ``misfire_grace`` seconds old. ``kwargs`` are the job's arguments; other options
        go to :meth:`task`.
        """

        def register(fn: Callable[P, Awaitable[R]]) -> Task[P, R]:
            registered: Task[P, R] = self.task(name=name, **task_options)(fn)
            schedule = Periodic(
                name=registered.name,
                task=registered,
                cron=cron,
                every=every,
                missed=missed,
                misfire_grace=misfire_grace,
                kwargs=dict(kwargs or {}),
            )
            registered.bind_arguments((), schedule.kwargs)  # fail now, not at the first slot
            self.periodics[registered.name] = schedule
            return registered

        return register

    async def pause(self, queue: str) -> None:
        """Stop every worker from claiming jobs of ``queue`` (running jobs finish)."""
        async with self.connection() as conn:
            await conn.execute(self.queries.set_paused, check_name("queue name", queue), True, self.channel)

    async def resume(self, queue: str) -> None:
        """Let workers claim jobs of ``queue`` again, and wake them."""
        async with self.connection() as conn:
            await conn.execute(self.queries.set_paused, check_name("queue name", queue), False, self.channel)

    async def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
    ) -> None:
        """Limit ``queue`` across every worker: at most ``concurrency`` jobs running, and at
        most ``rate[0]`` jobs started per ``rate[1]`` seconds. None clears a limit. Workers
        pick up a change within a second or their poll interval."""
        check_name("queue name", queue)
        if concurrency is not None:
            check_int("concurrency", concurrency, 0, 1_000_000)
        rate_limit = rate_period = None
        if rate is not None:
            rate_limit = check_int("rate limit", rate[0], 0, 100_000)
            rate_period = check_seconds("rate period", rate[1], allow_zero=False)
        async with self.connection() as conn:
            await conn.execute(self.queries.set_limits, queue, concurrency, rate_limit, rate_period)

    async def queue_settings(self) -> list[dict[str, Any]]:
        """Every queue with settings: paused, concurrency_limit, rate_limit, rate_period."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.queries.queue_settings)
        return [dict(r) for r in rows]

    async def cancel(self, job_id: int) -> str:
        """Cancel a job. Return ``"cancelled"`` for a pending job (it will never run),
        ``"requested"`` for a running one (its handler is cancelled at its next await, through
        NOTIFY or within the worker's poll interval), ``"not_found"`` otherwise. Cancelled jobs
        are kept in the archive with status ``cancelled``."""
        async with self.connection() as conn:
            row = await conn.fetchrow(self.queries.cancel, job_id, self.cancel_channel)
        assert row is not None
        if row["cancelled"]:
            return "cancelled"
        return "requested" if row["requested"] else "not_found"

    async def wait_result(self, job_id: int, *, timeout: float | None = None, poll_interval: float = 1.0) -> Any:
        """Wait for a job of an archiving task to succeed and return its result.

        Raises :class:`JobFailed` if it died, :class:`JobCancelled` if it was cancelled,
        :class:`ResultUnavailable` if it is gone without an archived result, and
        ``TimeoutError`` after ``timeout`` seconds. Woken by NOTIFY; polls as a backstop.
        """
        with anyio.fail_after(timeout):
            wake = Flag()
            listener: asyncpg.Connection | None = None
            if self.dsn is not None:
                dsn, kwargs = self.connect_params()
                listener = await asyncpg.connect(dsn, **kwargs)
                await listener.add_listener(self.done_channel, lambda *_: wake.set())
            try:
                while True:
                    wake.clear()
                    info = await self.get_job(job_id)
                    if info is None:
                        raise ResultUnavailable(
                            f"job {job_id} is gone without a kept result: its task does not archive "
                            "(archive=True), it was pruned or purged, or it never existed"
                        )
                    if info.status == "succeeded":
                        return info.result
                    if info.status == "dead":
                        raise JobFailed(job_id, info.last_error)
                    if info.status == "cancelled":
                        raise JobCancelled(f"job {job_id} was cancelled")
                    await wake.wait(poll_interval)
            finally:
                if listener is not None:
                    with anyio.CancelScope(shield=True):
                        await listener.close()

    async def status(self) -> list[dict[str, Any]]:
        """Per queue: pending, ready, scheduled, running, dead, oldest ready age in seconds, and
        jobs that succeeded in the last minute (``completed_last_minute``)."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.queries.queue_status)
        return [dict(r) for r in rows]

    async def reap(self, limit: int = 1000) -> int:
        """Return jobs with expired leases to pending (or dead); return how many were reaped."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.queries.reap_expired, limit, self.channel)
        return len(rows)

