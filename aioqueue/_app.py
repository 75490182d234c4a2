"""The ``Queue``: where a user's code meets aioqueue.

It holds the registry (tasks, periodic schedules, middleware) and hands out workers; the
database side (pool, named queries, channels, migrations) belongs to its ``database``, and the
operator calls (status, dead jobs, cancel, pause, limits, results) to its ``admin``. The methods
of the same names here are the public face of those two. It never runs a handler.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Unpack, overload

import asyncpg

from ._admin import Admin
from ._config import WorkerOptions
from ._connections import CallerConnection
from ._database import Database
from ._errors import ConfigurationError, JobArgumentsError, NotRegisteredError
from ._job import Connection, JobRef
from ._operating import Operations
from ._payload import DEFAULT_MAX_PAYLOAD_BYTES
from ._periodic import Missed, Periodic
from ._publishing import Publishing
from ._queries import Queries
from ._retry import Backoff
from ._task import NamedTask, Task, check_argument_names, check_name
from ._worker import Worker
from ._workflows import Workflows

if TYPE_CHECKING:
    from .hooks import EnqueueHook
    from .middleware import Middleware

P = ParamSpec("P")
R = TypeVar("R")


def _json_object(task: str, args: Mapping[str, Any] | None) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise JobArgumentsError(
            f"task {task!r}: arguments by name must be a JSON object (a mapping of keyword arguments), "
            f"got {type(args).__name__}"
        )
    check_argument_names(task, args)  # before they become **keywords, which names no key
    return dict(args)


class Queue(Operations, Publishing, Workflows):
    """A job queue in one PostgreSQL schema.

    Give it a DSN (it opens and owns a pool) or an asyncpg pool of yours. ``async with queue``
    opens it and closes what it owns; enqueue calls open it on first use. A pool it opens
    belongs to the event loop that opened it and closes when that loop ends: under another loop
    (``asyncio.run`` again) the queue opens another. A pool of yours serves only its own loop.

    Behind a transaction-pooling proxy such as PgBouncer, ``pooler=True`` (detected when left
    None) keeps named prepared statements away from it, and ``listen_dsn`` (a DSN straight to
    the server) carries LISTEN past it; without one, workers and ``result()`` poll.
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
        pooler: bool | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        if not isinstance(max_payload_bytes, int) or isinstance(max_payload_bytes, bool) or max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
        self.database = Database(
            dsn,
            pool=pool,
            schema=schema,
            pool_min_size=pool_min_size,
            pool_max_size=pool_max_size,
            connect_timeout=connect_timeout,
            connect_kwargs=connect_kwargs,
            pooler=pooler,
            listen_dsn=listen_dsn,
        )
        self.admin = Admin(self.database)
        self.max_payload_bytes = max_payload_bytes
        self.job_ref_type = JobRef.bound_to(self)
        """The class of the job ids this queue's enqueue calls return."""
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.periodics: dict[str, Periodic] = {}
        self.middleware: list[Middleware] = []
        self.enqueue_hooks: list[EnqueueHook] = []
        """Wrapped around every enqueue call; they may attach headers (see :mod:`aioqueue.hooks`)."""
        self._after_enqueue: Callable[[], Awaitable[None]] | None = None
        """Awaited by an enqueue call once its jobs are committed (not with ``conn=``): how
        :func:`aioqueue.testing.inline` runs them before the call returns. None in production."""

    # -- the database ------------------------------------------------------------------------

    @property
    def dsn(self) -> str | None:
        """The DSN the queue connects with (None: it only borrows a pool)."""
        return self.database.dsn

    @dsn.setter
    def dsn(self, value: str | None) -> None:
        self.database.dsn = value

    @property
    def schema(self) -> str:
        """The schema the queue's tables live in."""
        return self.database.schema

    @property
    def queries(self) -> Queries:
        """The named SQL statements, rendered for this schema."""
        return self.database.queries

    @property
    def channel(self) -> str:
        """The NOTIFY channel that wakes workers (payload: a queue name)."""
        return self.database.channels.jobs

    @property
    def pool(self) -> asyncpg.Pool:
        """The open pool; raises if the queue is not open."""
        return self.database.pool

    async def open(self) -> Queue:
        """Open a pool for the running event loop if this queue owns its pools; idempotent."""
        await self.database.open()
        return self

    async def close(self) -> None:
        """Close the pool this queue opened for the running event loop (one also closes when its
        loop ends); a pool of yours stays open."""
        await self.database.close()

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
        self.database.attach_pool(pool)

    @contextlib.asynccontextmanager
    async def connection(self, conn: Connection | None = None) -> AsyncIterator[Connection]:
        """Yield ``conn`` if given, else a pooled connection; a missing schema says to migrate."""
        async with self.database.connection(conn) as c:
            yield c

    async def migrate(self) -> list[int]:
        """Create or upgrade the schema; return the versions applied. Safe to run concurrently."""
        return await self.database.migrate()

    async def check_schema(self) -> None:
        """Raise :class:`SchemaNotReadyError` unless the schema is at this code's version."""
        await self.database.check_schema()

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

    def by_name(self, name: str) -> NamedTask:
        """Return the task called ``name`` as a producer without its code sees it: enqueue it
        with ``.options(...).enqueue(**args)`` (or ``enqueue_sync`` on a sync connection).
        Its arguments are checked against the handler's signature where the handler runs."""
        return NamedTask(self, name)

    async def enqueue_by_name(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        conn: CallerConnection | None = None,
        queue: str | None = None,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        key: str | None = None,
        max_attempts: int | None = None,
        partition_key: str | None = None,
    ) -> JobRef:
        """Store a job of the task called ``name`` with ``args`` (a JSON object of keyword
        arguments), without the handler's code; return its id. Options as :meth:`Task.options`.

        A worker that has the task runs it; if the arguments do not fit its signature, the job
        goes dead at once with a ``last_error`` naming the task and the argument.
        """
        enqueuer = self.by_name(name).options(
            conn=conn, queue=queue, delay=delay, run_at=run_at, priority=priority, key=key,
            max_attempts=max_attempts, partition_key=partition_key,
        )
        return await enqueuer.enqueue(**_json_object(name, args))

    async def enqueue_many_by_name(
        self,
        name: str,
        items: Iterable[Mapping[str, Any]],
        *,
        conn: CallerConnection | None = None,
        queue: str | None = None,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        keys: Iterable[str | None] | None = None,
        partition_key: str | None = None,
    ) -> list[JobRef]:
        """Store one job of the task called ``name`` per JSON object of arguments, all or none,
        with one NOTIFY; return their ids in order. ``keys``: one dedup key (or None) per item. See
        :meth:`enqueue_by_name`."""
        enqueuer = self.by_name(name).options(
            conn=conn, queue=queue, delay=delay, run_at=run_at, priority=priority, max_attempts=max_attempts,
            partition_key=partition_key,
        )
        return await enqueuer.enqueue_many(items, keys=keys)

    # -- workers -----------------------------------------------------------------------------

    def worker(self, **options: Unpack[WorkerOptions]) -> Worker:
        """Make a worker for this queue's tasks; ``options`` are :class:`~aioqueue.WorkerConfig`'s
        (``concurrency``, ``queues``, ``poll_interval``, ``lease``, ``grace_period``, ...).

        ``queues``: the queues to work (default: those of the registered tasks), or a mapping
        ``{queue: slots}`` that also caps how many of this worker's slots each queue may use.
        """
        return Worker(self, **options)

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
            try:
                # Checks the schedule and the kwargs against the signature now, not at a slot.
                schedule = Periodic(
                    name=registered.name,
                    task=registered,
                    cron=cron,
                    every=every,
                    missed=missed,
                    misfire_grace=misfire_grace,
                    kwargs=dict(kwargs or {}),
                )
            except BaseException:
                del self.tasks[registered.name]  # a refused schedule registers nothing
                raise
            self.periodics[registered.name] = schedule
            return registered

        return register
