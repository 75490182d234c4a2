"""Assertions on the jobs a test enqueued: read from the queue's table, matched by task, queue,
arguments, priority and dedup key, and reported with the jobs that are there when none match."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aioqueue import ConfigurationError, JobInfo, NamedTask, Queue, Task

TaskLike = Task[Any, Any] | NamedTask | str
"""A task as the assertions take it: the registered task, a task by name, or its name."""

_SHOWN = 20
"""How many pending jobs a failed assertion lists."""


async def assert_enqueued(
    app: Queue,
    /,
    task: TaskLike | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    key: str | None = None,
    count: int | None = None,
) -> list[JobInfo]:
    """Assert that ``app`` holds pending jobs (waiting, due now or later) that match every
    filter given, and return them, oldest first; with ``count``, exactly that many.

    ``task``: a task, a task by name, or a name. ``args``: the arguments the job must have; a
    job may have others too, and a dict matches a dict holding at least its keys (so
    ``args={"order": {"id": 7}}`` matches ``order={"id": 7, "total": 5}``); other values must be
    equal, compared as JSON stores them (a tuple matches a list). ``queue``, ``priority``,
    ``key`` (the dedup key): equal. Raises ``AssertionError`` listing the pending jobs there are.
    """
    found, pending = await _matching(app, task, args, queue, priority, key)
    if found if count is None else len(found) == count:
        return found
    wanted = "a pending job" if count is None else f"{count} pending job(s)"
    raise AssertionError(
        f"expected {wanted} {_describe(task, args, queue, priority, key)}; found {len(found)}. "
        + _listing(pending)
    )


async def refute_enqueued(
    app: Queue,
    /,
    task: TaskLike | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    key: str | None = None,
) -> None:
    """Assert that ``app`` holds no pending job that matches every filter given (as in
    :func:`assert_enqueued`); raises ``AssertionError`` listing those that do."""
    found, _ = await _matching(app, task, args, queue, priority, key)
    if found:
        raise AssertionError(
            f"expected no pending job {_describe(task, args, queue, priority, key)}; found {len(found)}. "
            + _listing(found)
        )


async def _matching(
    app: Queue,
    task: TaskLike | None,
    args: Mapping[str, Any] | None,
    queue: str | None,
    priority: int | None,
    key: str | None,
) -> tuple[list[JobInfo], list[JobInfo]]:
    """The pending jobs that match, and all those of the task and queue asked for."""
    if not isinstance(app, Queue):
        raise ConfigurationError(f"the first argument must be the aioqueue.Queue to look in, got {app!r}")
    name = _task_name(task)
    wanted = _as_stored(args)
    async with app.connection() as conn:
        rows = await conn.fetch(app.queries.find_jobs, "pending", name, queue)
    pending = [JobInfo.from_record(row) for row in rows]
    found = [
        job for job in pending
        if (wanted is None or (isinstance(job.args, dict) and _contains(job.args, wanted)))
        and (priority is None or job.priority == priority)
        and (key is None or job.dedup_key == key)
    ]
    return found, pending


def _task_name(task: TaskLike | None) -> str | None:
    if task is None or isinstance(task, str):
        return task
    if isinstance(task, Task | NamedTask):
        return task.name
    raise ConfigurationError(f"task must be a task, a task by name or a task's name, got {task!r}")


def _as_stored(args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``args`` as a job's arguments come back from the table: through JSON."""
    if args is None:
        return None
    if not isinstance(args, Mapping):
        raise ConfigurationError(f"args must be a mapping of argument names to values, got {args!r}")
    try:
        stored: dict[str, Any] = json.loads(json.dumps(dict(args)))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"args must be values JSON can hold, as a job's arguments are: {exc}") from None
    return stored


def _contains(have: Any, want: Any) -> bool:
    """Whether ``have`` holds ``want``: every key of a dict (recursively), any other value equal."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _contains(have[k], v) for k, v in want.items())
    return bool(have == want)


def _describe(
    task: TaskLike | None, args: Mapping[str, Any] | None, queue: str | None, priority: int | None, key: str | None
) -> str:
    parts = [f"{label} {value!r}" for label, value in (
        ("of task", _task_name(task)), ("with args containing", None if args is None else dict(args)),
        ("in queue", queue), ("with priority", priority), ("with key", key),
    ) if value is not None]
    return " ".join(parts) if parts else "of any kind"


def _listing(jobs: list[JobInfo]) -> str:
    if not jobs:
        return "There are no pending jobs of that task and queue."
    lines = [
        f"  job {job.id}: task {job.task!r} queue {job.queue!r} args {job.args!r} priority {job.priority} "
        f"key {job.dedup_key!r} run_at {job.run_at.isoformat()}"
        for job in jobs[:_SHOWN]
    ]
    more = f"\n  ... and {len(jobs) - _SHOWN} more" if len(jobs) > _SHOWN else ""
    return "Pending jobs of that task and queue:\n" + "\n".join(lines) + more
