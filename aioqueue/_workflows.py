"""Workflows as a :class:`~aioqueue.Queue` offers them: groups with callbacks (open, close,
count), the results a job reads from the jobs it waited for, the graph around a job, and the
Celery-like builders ``chain``, ``group`` and ``chord`` that enqueue many linked jobs in one
transaction. The links themselves are written by the enqueue (:mod:`aioqueue._links`) and
followed by the statements that finish jobs (migration 0014)."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from ._checks import check_int, check_job_id
from ._connections import writer_for
from ._enqueuer import encode_call
from ._errors import ConfigurationError, DependencyError, ResultUnavailable
from ._job import Connection, JobRef, current_job
from ._links import Call, Dependency
from ._payload import UndecodableValue, decode_shown

if TYPE_CHECKING:
    from ._app import Queue
    from ._database import Database

CALLBACK_KINDS = ("on_success", "on_failure", "on_complete")


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """A group of jobs with callbacks (see :meth:`Queue.open_group`). Jobs join it with
    ``task.options(group=g)``; :meth:`close` says no more will, after which its callbacks are
    enqueued once every member finished."""

    id: int
    queue: Queue

    async def close(self, *, conn: object = None) -> None:
        """Take no more members (see :meth:`Queue.close_group`)."""
        await self.queue.close_group(self.id, conn=conn)

    async def counts(self) -> GroupCounts:
        """The group's counts now (see :meth:`Queue.group_counts`)."""
        counts = await self.queue.group_counts(self.id)
        if counts is None:  # pragma: no cover - a group row is never deleted by aioqueue
            raise LookupError(f"group {self.id} is gone")
        return counts


@dataclasses.dataclass(frozen=True, slots=True)
class GroupCounts:
    """A group's members by state, and its callbacks."""

    id: int
    name: str | None
    total: int
    pending: int
    """Members not started yet (ready, waiting or retrying)."""
    running: int
    succeeded: int
    failed: int
    """Members that went dead."""
    cancelled: int
    closed: bool
    results: bool
    """Members are archived with their results."""
    done: bool
    """Closed, every member finished, and the callbacks enqueued (false again once a retry of
    a dead member reopened the group, until its members finished again)."""
    created_at: datetime.datetime
    done_at: datetime.datetime | None
    callbacks: dict[str, int]
    """The callbacks enqueued so far: kind (``on_success``, ...) to job id."""
    callback_tasks: dict[str, str]
    """The callbacks the group has: kind to task name."""


@dataclasses.dataclass(frozen=True, slots=True)
class Upstream:
    """The results of the jobs a job waited for, by position (from 0) or by name: a dependency's
    stored result, or, for a group's callback, each member's in id order. Reading one that did
    not succeed raises :class:`~aioqueue.ResultUnavailable`."""

    ids: tuple[int, ...]
    names: tuple[str | None, ...]
    statuses: tuple[str, ...]
    _results: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self.ids)))

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            if key not in self.names:
                raise KeyError(f"no dependency named {key!r} (names: {[n for n in self.names if n]})")
            key = self.names.index(key)
        status, result = self.statuses[key], self._results[key]
        if status != "succeeded":
            raise ResultUnavailable(f"upstream job {self.ids[key]} is {status}: it has no result")
        if isinstance(result, UndecodableValue):
            raise ResultUnavailable(f"upstream job {self.ids[key]}'s result cannot be read back: {result.error}")
        return result

    def by_name(self) -> dict[str, Any]:
        """The named dependencies' results (those that succeeded)."""
        return {n: self[i] for i, n in enumerate(self.names) if n is not None and self.statuses[i] == "succeeded"}


def _callback_spec(call: Call) -> str:
    """A callback as the group row keeps it (see job_groups in migration 0014)."""
    if not isinstance(call, Call):
        raise ConfigurationError(f"a group callback is a task call, task.s(...), got {call!r}")
    task = call.task
    args = encode_call(task, call.args, call.kwargs)
    opts = task.defaults
    return (
        f'{{"task": {json.dumps(task.name)}, "args": {args}, "queue": {json.dumps(opts.queue)}, '
        f'"priority": {opts.priority}, "max_attempts": {opts.max_attempts}, "archive": {json.dumps(task.archive)}}}'
    )


@asynccontextmanager
async def _transaction(db: Database, conn: object) -> AsyncIterator[Any]:
    """A writer in one transaction: the caller's (any supported driver), or a pooled one's."""
    if conn is not None:
        yield writer_for(conn)
        return
    async with db.connection() as c, c.transaction():
        yield writer_for(c)


class GroupOptions(TypedDict, total=False):
    """What a group is opened with (see :meth:`Queue.open_group`)."""

    on_success: Call | None
    on_failure: Call | None
    on_complete: Call | None
    name: str | None
    results: bool


class Workflows:
    """The workflow calls of :class:`~aioqueue.Queue`."""

    database: Database

    async def open_group(
        self,
        *,
        on_success: Call | None = None,
        on_failure: Call | None = None,
        on_complete: Call | None = None,
        name: str | None = None,
        results: bool = False,
        conn: object = None,
    ) -> Group:
        """Open a group of jobs; jobs join it with ``task.options(group=g)``. Once it is closed
        (:meth:`close_group`) and every member finished, ``on_success`` is enqueued if every
        member succeeded, ``on_failure`` if any went dead or was cancelled, ``on_complete``
        either way: each exactly once. ``results``: archive every member with its result, for
        the callbacks' :meth:`upstream` (otherwise only members of archiving tasks are kept).
        ``conn``: open it in the caller's transaction."""
        specs = {k: _callback_spec(c) for k, c in zip(CALLBACK_KINDS, (on_success, on_failure, on_complete),
                                                      strict=True) if c is not None}
        if name is not None and not isinstance(name, str):
            raise ConfigurationError(f"a group name is a str, got {name!r}")
        callbacks = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in specs.items()) + "}"
        q = self.database.queries
        async with _transaction(self.database, conn) as w:
            rows = await w.rows(q.open_group, (name, callbacks, bool(results)))
        return Group(int(rows[0][0]), self._queue)

    async def close_group(self, group: int | Group, *, conn: object = None) -> None:
        """Close a group: it takes no more members; its callbacks go once every member finished
        (at once, if they all did). Closing it again does nothing."""
        gid = check_job_id(getattr(group, "id", group))
        q = self.database.queries
        async with _transaction(self.database, conn) as w:
            if not await w.rows(q.close_group, (gid,)):
                raise ConfigurationError(f"group {gid} does not exist")
            await w.rows(q.settle_group, (gid,))

    async def group_counts(self, group: int | Group) -> GroupCounts | None:
        """A group's counts in one query; None when there is no such group."""
        gid = check_job_id(getattr(group, "id", group))
        async with self.database.connection() as c:
            row = await c.fetchrow(self.database.queries.group_counts, gid)
        if row is None:
            return None
        finished = row["succeeded"] + row["failed"] + row["cancelled"]
        specs = json.loads(row["callback_specs"])
        return GroupCounts(
            id=row["id"], name=row["name"], total=row["total"],
            pending=max(0, row["total"] - finished - row["running"]), running=row["running"],
            succeeded=row["succeeded"], failed=row["failed"], cancelled=row["cancelled"], closed=row["closed"],
            results=row["results"],
            done=row["done_at"] is not None, created_at=row["created_at"], done_at=row["done_at"],
            callbacks=json.loads(row["callbacks"] or "{}"),
            callback_tasks={kind: spec["task"] for kind, spec in specs.items()},
        )

    async def list_groups(self, *, before: int | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Groups, newest first (ids below ``before``), at most ``limit``."""
        limit = check_int("limit", limit, 1, 10_000)
        async with self.database.connection() as c:
            rows = await c.fetch(self.database.queries.list_groups, before, limit)
        return [dict(r) for r in rows]

    async def upstream(self, job_id: int | None = None) -> Upstream:
        """The results of the jobs that job ``job_id`` waited for (default: the running
        handler's own job), by position or name; for a group's callback, the members'."""
        job_id = check_job_id(current_job().id if job_id is None else job_id)
        async with self.database.connection() as c:
            rows = await c.fetch(self.database.queries.upstream_results, job_id)
        return Upstream(
            tuple(r["id"] for r in rows), tuple(r["name"] for r in rows), tuple(r["status"] for r in rows),
            tuple(decode_shown(r["result"], "result") if r["result"] is not None else None for r in rows),
        )

    async def workflow(self, job_id: int, *, limit: int = 10_000) -> list[dict[str, Any]]:
        """The workflow of job ``job_id``: every job linked to it by dependencies, either way and
        transitively (the other branches of a diamond too), at most ``limit``, in id order, with
        status, group, the reason of a cancellation and the ids each depends on."""
        job_id = check_job_id(job_id)
        limit = check_int("limit", limit, 1, 1_000_000)
        async with self.database.connection() as c:
            rows = await c.fetch(self.database.queries.workflow_of, job_id, limit)
        return [{**dict(r), "depends_on": list(r["depends_on"] or [])} for r in rows if r["status"] != "gone"
                or r["id"] == job_id]

    async def cancel_workflow(self, job_id: int) -> dict[int, str]:
        """Cancel every job of ``job_id``'s workflow (:meth:`workflow`) that has not finished (see
        :meth:`Queue.cancel`): waiting and pending ones at once, running ones on request."""
        nodes = await self.workflow(job_id)
        live = [n["id"] for n in nodes if n["status"] in ("pending", "waiting", "running")]
        return await self._queue.admin.cancel_jobs(live) if live else {}

    @property
    def _queue(self) -> Queue:
        return self  # type: ignore[return-value]  # mixed into Queue only


def _app_of(calls: Sequence[Call]) -> Queue:
    if not calls:
        raise ConfigurationError("a chain or group needs at least one task call")
    for call in calls:
        if not isinstance(call, Call):
            raise ConfigurationError(f"a chain or group takes task calls, task.s(...), got {call!r}")
    return calls[0].task.app


@asynccontextmanager
async def _one_transaction(app: Queue, conn: Connection | None) -> AsyncIterator[Any]:
    if conn is not None:
        yield conn
        return
    async with app.connection() as c, c.transaction():
        yield c


@dataclasses.dataclass(frozen=True, slots=True)
class chain:  # lower case: named as Celery's, which users know
    """Steps that run one after the other: each waits for the one before (and reads its result
    as ``(await queue.upstream())[0]``). ``await chain(a.s(...), b.s(...)).enqueue()`` writes
    them all in one transaction and returns their ids."""

    calls: tuple[Call, ...]

    def __init__(self, *calls: Call) -> None:
        object.__setattr__(self, "calls", calls)

    async def enqueue(self, *, conn: Connection | None = None) -> list[JobRef]:
        """Write the steps in one transaction (the caller's with ``conn``); return their
        :class:`~aioqueue.JobRef` objects in order."""
        app = _app_of(self.calls)
        refs: list[JobRef] = []
        async with _one_transaction(app, conn) as c:
            for call in self.calls:
                refs.append(await call.enqueue(conn=c, after=refs[-1:] or None))
        return refs


@dataclasses.dataclass(frozen=True, slots=True)
class group:  # lower case: named as Celery's, which users know
    """Jobs that run side by side as one :class:`Group`, with callbacks. ``await group(a.s(1),
    a.s(2)).enqueue(on_success=done.s())`` writes the members and the closed group in one
    transaction."""

    calls: tuple[Call, ...]

    def __init__(self, *calls: Call) -> None:
        object.__setattr__(self, "calls", calls)

    async def enqueue(self, *, conn: Connection | None = None, **options: Unpack[GroupOptions]) -> Group:
        """Open the group, enqueue its members and close it, in one transaction (the caller's
        with ``conn``); ``options`` as :meth:`Queue.open_group` takes them (the callbacks,
        ``name``, ``results``)."""
        app = _app_of(self.calls)
        async with _one_transaction(app, conn) as c:
            g = await app.open_group(conn=c, **options)
            at = 0
            while at < len(self.calls):  # runs of keyword-only calls of one task go as one bulk enqueue
                task, end = self.calls[at].task, at + 1
                while end < len(self.calls) and self.calls[end].task is task and not self.calls[end].args:
                    end += 1
                if end - at > 1 and not self.calls[at].args:
                    await task.options(conn=c, group=g.id).enqueue_many([x.kwargs for x in self.calls[at:end]])
                else:
                    await self.calls[at].enqueue(conn=c, group=g.id)
                    end = at + 1
                at = end
            await g.close(conn=c)
        return g


def chord(header: group | Sequence[Call], body: Call) -> _Chord:
    """A group whose callback ``body`` runs once every member succeeded, reading their results
    in order with ``await queue.upstream()``: ``await chord([a.s(1), a.s(2)], total.s()).enqueue()``
    (``enqueue(*, name=None, conn=None)``: one transaction, the caller's with ``conn``; returns the :class:`Group`)."""
    return _Chord(header if isinstance(header, group) else group(*header), body)


@dataclasses.dataclass(frozen=True, slots=True)
class _Chord:
    header: group
    body: Call

    async def enqueue(self, *, name: str | None = None, conn: Connection | None = None) -> Group:
        return await self.header.enqueue(on_success=self.body, name=name, results=True, conn=conn)


class Workflow:
    """A graph of task calls with named steps, enqueued in one transaction: each step waits for
    the steps it names in ``after`` (and reads their results by those names). A cycle or a name
    no step has is refused by :meth:`enqueue`, naming it, before anything is written."""

    def __init__(self) -> None:
        self.steps: dict[str, tuple[Call, tuple[str, ...], frozenset[str]]] = {}

    def add(self, name: str, call: Call, *, after: Sequence[str] = (), may_fail: Sequence[str] = ()) -> Workflow:
        """Add step ``name`` running ``call`` once the steps ``after`` succeeded and those in
        ``may_fail`` finished, whatever their outcome. Returns the workflow, to chain calls."""
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a workflow step's name is a non-empty str, got {name!r}")
        if name in self.steps:
            raise ConfigurationError(f"workflow step {name!r} is added twice")
        if not isinstance(call, Call):
            raise ConfigurationError(f"workflow step {name!r}: give a task call, task.s(...), got {call!r}")
        for what, names in (("after", after), ("may_fail", may_fail)):
            if isinstance(names, str | bytes):
                raise ConfigurationError(f"workflow step {name!r}: {what}= takes a list of step names, got {names!r}")
        waits = tuple(dict.fromkeys((*after, *may_fail)))  # a step that may fail is still waited for
        self.steps[name] = (call, waits, frozenset(may_fail))
        return self

    def order(self) -> list[str]:
        """The steps in an order where each comes after those it waits for; refuses a cycle or an
        unknown step, naming it."""
        for name, (_, after, may_fail) in self.steps.items():
            for dep in (*after, *may_fail):
                if dep not in self.steps:
                    raise DependencyError(f"workflow step {name!r} waits for {dep!r}, which is no step")
        done: list[str] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = [*path[path.index(name):], name]
                raise DependencyError(f"workflow has a cycle: {' -> '.join(cycle)}; nothing was written")
            state[name] = 1
            for dep in self.steps[name][1]:
                visit(dep, [*path, name])
            state[name] = 2
            done.append(name)

        for name in self.steps:
            visit(name, [])
        return done

    async def enqueue(self, *, conn: Connection | None = None) -> dict[str, JobRef]:
        """Write every step in one transaction (the caller's with ``conn``); return their ids by name."""
        order = self.order()
        if not order:
            raise ConfigurationError("a workflow needs at least one step")
        app = _app_of([self.steps[n][0] for n in order])
        refs: dict[str, JobRef] = {}
        async with _one_transaction(app, conn) as c:
            for name in order:
                call, after, may_fail = self.steps[name]
                deps = {d: Dependency(refs[d], may_fail=d in may_fail) for d in after}
                refs[name] = await call.enqueue(conn=c, after=deps or None)
        return refs
