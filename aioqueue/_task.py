"""Tasks: registered async functions, and the enqueue calls that turn a call into a job row.

A ``Task`` carries its defaults (queue, priority, attempts, timeout, retry policy); ``options``
returns an ``Enqueuer`` with some of them overridden for one call, and optionally bound to the
caller's connection so the job commits or rolls back with the caller's transaction. Arguments
are checked against the function's signature and serialised here, so bad input fails at the
call that caused it and nothing is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import itertools
import operator
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

from ._checks import (
    INT32_MAX,
    MAX_DELAY_SECONDS,
    MAX_KEY_BYTES,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    check_int,
    check_name,
    check_run_at,
    check_seconds,
)
from ._connections import CallerConnection
from ._enqueue import EnqueueOptions
from ._enqueuer import Enqueuer, checked_options, writer
from ._errors import ConfigurationError, JobArgumentsError
from ._job import HEADERS_KEY, JobRef
from ._links import Call, Dependency, links_of
from ._retry import Backoff

if TYPE_CHECKING:
    from ._app import Queue
    from ._workflows import Group

# The validators live in checks.py; other modules import them from here too.
__all__ = [
    "MAX_DELAY_SECONDS", "MAX_KEY_BYTES", "MAX_KEY_LENGTH", "MAX_NAME_LENGTH", "EnqueueOptions", "Enqueuer",
    "NamedTask", "Task", "check_int", "check_name", "check_run_at", "check_seconds", "checked_options",
]

P = ParamSpec("P")
R = TypeVar("R")

_INT32 = INT32_MAX


class _Enqueues(Generic[P, R]):
    """What :class:`Task` and :class:`NamedTask` share: a name, enqueue defaults, and
    ``options`` for one call."""

    name: str
    defaults: EnqueueOptions
    app: Queue

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Call:
        """A call of this task to enqueue later, as a workflow's step or a group's callback
        (``chain``, ``group``, ``chord``, :meth:`~aioqueue.Queue.open_group`)."""
        return Call(cast("Task[Any, Any] | NamedTask", self), args, kwargs)

    def options(
        self,
        *,
        conn: CallerConnection | None = None,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        key: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        after: Iterable[int | Dependency] | Mapping[str, int | Dependency] | None = None,
        group: int | Group | None = None,
        partition_key: str | None = None,
    ) -> Enqueuer[P, R]:
        """Return an enqueuer with these options for the next ``enqueue``/``enqueue_many`` (or
        ``enqueue_sync``/``enqueue_many_sync`` on a sync connection).

        ``conn``: a connection inside the caller's transaction, which the job joins: asyncpg,
        SQLAlchemy ``AsyncSession``/``AsyncConnection`` (asyncpg driver), psycopg 3 (async or
        sync) or Django's. ``delay``/``run_at``: when the job becomes ready, in database time;
        both may be given (the job runs ``delay`` seconds after ``run_at``). ``key``: a dedup
        key; while a job with this key is pending or running, enqueueing again returns that
        job's id. ``after``: the jobs this one waits for (ids, :class:`~aioqueue.Dependency`
        objects, or a mapping of names to either); it becomes ready when all of them succeeded.
        ``group``: the open :class:`~aioqueue.Group` it joins. See :doc:`/howto/workflows`.
        ``partition_key``: the key (a tenant, a user, an account) that per-key limits and fair
        claims go by (see :meth:`Queue.set_key_limits`); every job of the call gets it.
        """
        opts = checked_options(
            self.defaults, delay=delay, run_at=run_at, priority=priority, key=key, queue=queue,
            max_attempts=max_attempts, partition_key=partition_key,
        )
        links = links_of(self.name, after, group, self.app.database)
        if links is not None:
            if opts.key is not None:
                raise ConfigurationError(f"task {self.name!r}: a dedup key cannot be given with after= or group=")
            opts = dataclasses.replace(opts, links=links)
        # Only Task and NamedTask derive from this class.
        source = cast("Task[P, R] | NamedTask", self)
        return Enqueuer(source, opts, writer(self.name, conn))


class Task(_Enqueues[P, R]):
    """An async function registered on a :class:`~aioqueue.Queue`, runnable as a job.

    Calling the task runs the function directly; ``enqueue`` stores a job for a worker.
    """

    def __init__(
        self,
        app: Queue,
        fn: Callable[P, Awaitable[R]],
        *,
        name: str,
        queue: str,
        priority: int,
        max_attempts: int,
        timeout: float | None,
        retry: Backoff,
        archive: bool,
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(f"task {name!r}: {fn!r} is not an async function")
        signature = inspect.signature(fn)
        for param in signature.parameters.values():
            if param.kind in (param.POSITIONAL_ONLY, param.VAR_POSITIONAL):
                raise ConfigurationError(
                    f"task {name!r}: parameter {param.name!r} is positional-only or *args; job "
                    "arguments are stored by name, so every parameter must accept a keyword"
                )
        if not isinstance(retry, Backoff):
            raise ConfigurationError(f"task {name!r}: retry must be an aioqueue.Backoff")
        self.app = app
        self.fn = fn
        self.name = check_name("task name", name)
        self._queue = check_name("queue name", queue)
        self.defaults = EnqueueOptions(
            queue=self._queue,
            priority=check_int("priority", priority, -_INT32, _INT32),
            max_attempts=check_int("max_attempts", max_attempts, 1, 10_000),
        )
        self.timeout = None if timeout is None else check_seconds("timeout", timeout, allow_zero=False)
        self.retry = retry
        self.archive = bool(archive)
        self.signature = signature
        # For the fast path of keyword-only calls (bulk enqueue): which names are accepted
        # (None: any, the function takes **kwargs) and which must be given.
        params = signature.parameters.values()
        self._names: frozenset[str] | None = (
            None if any(p.kind is p.VAR_KEYWORD for p in params) else frozenset(signature.parameters)
        )
        self._required = frozenset(p.name for p in params if p.default is p.empty)
        self._all_required = self._names is not None and self._required == self._names
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    @property
    def queue(self) -> str:
        """The queue this task's jobs go to unless an enqueue says otherwise."""
        return self._queue

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this process, without a job."""
        return await self.fn(*args, **kwargs)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobRef:
        """Store a job that calls this task with these arguments; return its id.

        The job is written in a short transaction of its own and wakes the queue's workers.
        """
        return await Enqueuer(self, self.defaults, None).enqueue(*args, **kwargs)

    async def enqueue_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        keys: Iterable[str | None] | None = None,
        conn: CallerConnection | None = None,
    ) -> list[JobRef]:
        """Store one job per mapping of keyword arguments, all or none, with one NOTIFY; return
        their ids. ``keys``: one dedup key (or None) per item (see :meth:`Enqueuer.enqueue_many`)."""
        return await Enqueuer(self, self.defaults, writer(self.name, conn)).enqueue_many(items, keys=keys)

    def fits(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether a keyword-only call with these arguments binds to the signature as they are:
        the checks bind() makes for one, without its cost (False when the function takes
        ``**kwargs``: then bind() decides). A worker asks it of every job it runs: with no
        required argument, or none but required ones, it makes one object (an iterator) rather
        than three (a keys view and two iterators)."""
        names = self._names
        if names is None or not names.issuperset(kwargs):
            return False
        required = self._required
        if self._all_required:  # every name it takes is required, and it got only those
            return len(kwargs) == len(required)
        return not required or required <= kwargs.keys()

    def bind_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Check a call against the signature and return its arguments by name."""
        if not args and self.fits(kwargs):
            return dict(kwargs)
        check_argument_names(self.name, kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise JobArgumentsError(f"task {self.name!r}: {exc}") from None
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            else:
                named[name] = value
        return named

    def all_fit_as_is(self, calls: list[dict[str, Any]]) -> bool:
        """Are these keyword arguments, every call's, already what :meth:`named_args` would
        return (the fast check of a bulk enqueue; False means: ask named_args job by job)?"""
        names = self._names
        seen = set().union(*calls)
        if names is None or not names.issuperset(seen):
            return False
        required = self._required
        if not required:
            return True
        if not required <= seen:
            return False
        # Each call holds only names seen; one as long as the names seen holds them all (the
        # usual batch: every call names the same arguments). Else ask name by name. Both in C.
        return min(map(len, calls)) == len(seen) or all(
            all(map(operator.contains, calls, itertools.repeat(name))) for name in required
        )

    def named_args(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """One call's arguments by name, checked against the signature, with the hooks' headers
        if any: the object stored as the job's arguments."""
        named = self.bind_arguments(args, kwargs)
        if headers:
            named[HEADERS_KEY] = dict(headers)
        return named

    def arguments_problem(self, args: Mapping[str, Any]) -> str | None:
        """Why a stored job's arguments do not fit this task's signature (naming the task and the
        argument), or None when they do. For jobs enqueued by name, checked where the handler is."""
        if self.fits(args):
            return None  # every job a worker runs asks this: the common answer first
        if self._names is not None:
            unexpected = sorted(set(args) - self._names)
            if unexpected:  # a misspelt name also makes a required one missing: name the cause
                return f"task {self.name!r}: got an unexpected keyword argument {unexpected[0]!r}"
        try:
            self.bind_arguments((), args)
        except JobArgumentsError as exc:
            return str(exc)
        return None


_STR_ONLY = frozenset({str})


def check_argument_names(task: str, kwargs: Mapping[Any, Any]) -> None:
    """Refuse arguments by name whose names are not all str, naming the task and the name (a
    mapping of arguments given as data can hold any key; Python's ``**`` would refuse it with no
    name at all)."""
    for name in kwargs:
        if not isinstance(name, str):
            raise JobArgumentsError(
                f"task {task!r}: argument names must be str, got {name!r}; the arguments are a JSON object"
            )


class NamedTask(_Enqueues[..., Any]):
    """A task known only by name, as a producer without the handler's code sees it.

    Its arguments are any JSON object of keyword arguments (checked against the signature by
    the worker that runs it). Its defaults are the registered task's when this process has it;
    else those of ``Queue.task()``, except the queue: given none, a job goes to the queue the
    workers that serve the task recorded, looked up where it is written, and is refused
    (:class:`~aioqueue.NotRegisteredError`, nothing written) while no such worker has started.
    """

    def __init__(self, app: Queue, name: str) -> None:
        self.app = app
        self.name = check_name("task name", name)
        local = app.tasks.get(name)
        self.archive = local.archive if local is not None else False
        self.defaults = local.defaults if local is not None else EnqueueOptions(
            queue=None, priority=0, max_attempts=5
        )
        self._local = local

    @property
    def queue(self) -> str | None:
        """The queue this task's jobs go to unless an enqueue says otherwise: the registered
        task's, or None (the queue its workers recorded, looked up at each enqueue)."""
        return self.defaults.queue

    def __repr__(self) -> str:
        return f"<NamedTask {self.name!r}>"

    def all_fit_as_is(self, calls: list[dict[str, Any]]) -> bool:
        """See :meth:`Task.all_fit_as_is`: JSON objects whose names are all str."""
        if self._local is not None:
            return self._local.all_fit_as_is(calls)
        return _STR_ONLY.issuperset(map(type, set().union(*calls)))

    def named_args(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """A JSON object of keyword arguments, checked (against the signature too, when the task
        is registered in this process), with the hooks' headers if any."""
        if self._local is not None:
            return self._local.named_args(args, kwargs, headers)
        if args:
            raise JobArgumentsError(f"task {self.name!r}: arguments by name are keyword arguments only")
        check_argument_names(self.name, kwargs)
        named = dict(kwargs)
        if headers:
            named[HEADERS_KEY] = dict(headers)
        return named
