"""The enqueue call: an :class:`Enqueuer` holds a task, the options of its next call (checked
once, the one definition of valid enqueue options) and the caller's connection, if any; it
checks and encodes the call's arguments and hands the job, or a bulk call's batch, to
:mod:`aioqueue._enqueue` to write. Every way in (a task, a task by name, the periodic
scheduler) enqueues through it or its helpers.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypedDict, TypeVar, Unpack, cast

from . import _enqueue as enqueue
from . import _payload as payload
from ._checks import (
    INT32_MAX,
    check_int,
    check_key,
    check_keys,
    check_name,
    check_partition_key,
    check_run_at,
    check_seconds,
    item_of,
)
from ._connections import Writer, writer_for
from ._enqueue import Batch, EnqueueOptions
from ._errors import ConfigurationError, JobArgumentsError
from ._job import JobRef
from .hooks import entered

if TYPE_CHECKING:
    from ._task import NamedTask, Task

P = ParamSpec("P")
R = TypeVar("R")


def encode_call(
    task: Task[Any, Any] | NamedTask,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> str:
    """Check and serialise one call's arguments to ``task`` (and the hooks' headers, if any) to
    the JSON text stored in the job."""
    return payload.encode_args(task.name, task.named_args(args, kwargs, headers), task.app.max_payload_bytes)


class OptionChanges(TypedDict, total=False):
    """Enqueue options given for one call (None: keep the default); see :meth:`Task.options`."""

    delay: float | None
    run_at: datetime.datetime | None
    priority: int | None
    key: str | None
    queue: str | None
    max_attempts: int | None
    partition_key: str | None


#: How each option is checked: the one definition of valid enqueue options.
_CHECKS: dict[str, Callable[[Any], Any]] = {
    "delay": lambda v: check_seconds("delay", v),
    "run_at": check_run_at,
    "priority": lambda v: check_int("priority", v, -INT32_MAX, INT32_MAX),
    "key": check_key,
    "queue": lambda v: check_name("queue name", v),
    "max_attempts": lambda v: check_int("max_attempts", v, 1, 10_000),
    "partition_key": check_partition_key,
}


def checked_options(defaults: EnqueueOptions, **given: Unpack[OptionChanges]) -> EnqueueOptions:
    """Return ``defaults`` with the given options checked and set, shared by every way in."""
    changes = {name: _CHECKS[name](value) for name, value in given.items() if value is not None}
    return dataclasses.replace(defaults, **changes) if changes else defaults


def writer(task: str, conn: object) -> Writer | None:
    if conn is None:
        return None
    try:
        return writer_for(conn)
    except ConfigurationError as exc:
        raise type(exc)(f"task {task!r}: {exc}") from None


class Enqueuer(Generic[P, R]):
    """A task with options set for the next enqueue call (see :meth:`Task.options`)."""

    def __init__(self, task: Task[P, R] | NamedTask, opts: EnqueueOptions, conn: Writer | None):
        self.task = task
        self.opts = opts
        self.conn = conn

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> JobRef:
        """Store one job; return its id (the live job's id when its dedup key is taken)."""
        app = self.task.app
        with entered(app.enqueue_hooks, self.task, 1) as headers:
            text = encode_call(self.task, args, kwargs, headers)
            ref = JobRef(await enqueue.insert_one(app.database, self.task, self.opts, text, self.conn), app)
        if app._after_enqueue is not None and self.conn is None:
            await app._after_enqueue()
        return ref

    async def enqueue_many(
        self, items: Iterable[Mapping[str, Any]], *, keys: Iterable[str | None] | None = None
    ) -> list[JobRef]:
        """Store one job per mapping of keyword arguments, all or none, with one NOTIFY (one
        statement per ``enqueue.CHUNK`` jobs); return their ids, in the order given.

        Every job gets these options; one dedup key cannot name many jobs, so ``key`` is
        refused here. ``keys`` gives one key (or None) per item instead: an item whose key
        names a live job, or an earlier item of the batch, gets that job's id, and is not
        written.
        """
        calls = list(items)
        app = self.task.app
        with entered(app.enqueue_hooks, self.task, len(calls)) as headers:
            batch = self._batch(calls, keys, headers)
            if batch is None:
                return []
            ids = await enqueue.insert_many(app.database, self.task, self.opts, batch, self.conn)
        if app._after_enqueue is not None and self.conn is None:
            await app._after_enqueue()
        return JobRef.many(ids, app)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Store one job through the sync connection given as ``conn`` (psycopg or Django), in
        its transaction; return its id. Starts no event loop."""
        text = encode_call(self.task, args, kwargs)
        return enqueue.insert_one_sync(self.task.app.database, self.task, self.opts, text, self.conn)

    def enqueue_many_sync(
        self, items: Iterable[Mapping[str, Any]], *, keys: Iterable[str | None] | None = None
    ) -> list[int]:
        """Store one job per mapping of keyword arguments through the sync connection given as
        ``conn``, in its transaction; return their ids (``keys`` as in :meth:`enqueue_many`).
        Starts no event loop."""
        batch = self._batch(list(items), keys)
        if batch is None:
            return []
        return enqueue.insert_many_sync(self.task.app.database, self.task, self.opts, batch, self.conn)

    def _batch(
        self,
        calls: list[Mapping[str, Any]],
        keys: Iterable[str | None] | None,
        headers: Mapping[str, str] | None = None,
    ) -> Batch | None:
        """Check a bulk call (the options, every item's arguments and key) and encode what it
        writes; None for no items. Refuses the batch naming the first bad item."""
        if self.opts.key is not None:
            raise ConfigurationError(
                f"task {self.task.name!r}: enqueue_many cannot give one dedup key to many jobs; "
                "give one per item with keys="
            )
        try:
            per_item = None if keys is None else check_keys(keys, len(calls), "enqueue_many")
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {self.task.name!r}: {exc}") from None
        if per_item is not None and self.opts.links is not None:  # a taken key would link a job already there
            raise ConfigurationError(f"task {self.task.name!r}: dedup keys cannot be given with after= or group=")
        if not calls:
            return None
        named = self._named(calls, headers)
        return Batch.of(self.task.name, named, per_item, self.task.app.max_payload_bytes)

    def _named(self, calls: list[Mapping[str, Any]], headers: Mapping[str, str] | None) -> list[dict[str, Any]]:
        """Every item's arguments by name, checked against the signature (the items themselves
        when they already are); refuses the batch naming the first bad item."""
        plain = cast(list[dict[str, Any]], calls)
        if not headers and set(map(type, calls)) == {dict} and self.task.all_fit_as_is(plain):
            return plain  # plain dicts that already fit: encoded before this call returns, so not copied
        named = []
        for i, item in enumerate(calls):
            if not isinstance(item, Mapping):
                raise JobArgumentsError(
                    f"task {self.task.name!r}: {item_of('enqueue_many', i, len(calls))} is a "
                    f"{type(item).__name__}, not a mapping of keyword arguments"
                )
            try:
                named.append(self.task.named_args((), item, headers))
            except JobArgumentsError as exc:
                raise type(exc)(f"{item_of('enqueue_many', i, len(calls))}: {exc}") from None
        return named
