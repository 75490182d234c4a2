"""Durable steps, sleeps and event waits inside a handler: each is stored in ``job_steps`` when
it completes, and a later run of the same job (a retry, a reaped or interrupted attempt, the
wake-up after a sleep) returns what was stored instead of doing it again.

A run of a handler loads every stored step of its job with one query, at its first step (none
at the job's first attempt, which cannot have any). A step
is found again by its name and occurrence (the n-th call of that name in the run), so a handler
must reach its steps in the same order each time it runs. A sleep or a wait that is not over
ends the run with :class:`Suspended`, which the executor hands to the completer: the job goes
back to pending, due when it wakes, without spending an attempt.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import _payload as payload
from ._errors import AioqueueError, ConfigurationError, Snooze
from ._job import Connection, Job, current_job

if TYPE_CHECKING:
    import asyncpg

    from ._database import Database

T = TypeVar("T")

_TEN_YEARS = 10 * 365 * 86400


class EventTimeout(AioqueueError, TimeoutError):
    """The event :func:`wait_for_event` waited for did not come before its timeout. Raised in
    the handler, which chooses what that means (catch it, or let the job fail)."""

    def __init__(self, event: str, key: str | None, timeout_at: datetime.datetime | None) -> None:
        self.event, self.key, self.timeout_at = event, key, timeout_at
        whose = f"event {event!r}" + (f" with key {key!r}" if key is not None else "")
        super().__init__(f"{whose} did not come before {timeout_at:%Y-%m-%d %H:%M:%S%z}" if timeout_at else whose)


class StepNotRecorded(AioqueueError):
    """A step could not be stored because this attempt no longer holds its job (its lease
    expired and it was reaped, or it was cancelled): the step's transaction, if it was given a
    connection, is rolled back, and the attempt should stop."""


class Suspended(Snooze):
    """Ends a handler's run at a sleep or an event wait that is not over (middleware see it as
    ``snoozed``). Let it propagate: the job resumes when it wakes."""

    def __init__(self) -> None:
        super().__init__(0.0)


_database: contextvars.ContextVar[Database] = contextvars.ContextVar("aioqueue_steps_database")


def bind(db: Database) -> None:
    """Make ``db`` the database the steps of handlers run in this context are stored in (a
    worker's runner calls it once)."""
    _database.set(db)


@dataclasses.dataclass(slots=True)
class _Stored:
    state: str
    result: str | None
    wake_at: datetime.datetime | None
    now: datetime.datetime
    kind: str = "step"


@dataclasses.dataclass(slots=True)
class _Run:
    """One run of a job's handler: its stored steps and how many times each name was reached."""

    job: Job
    db: Database
    stored: dict[tuple[str, int], _Stored]
    reached: Counter[str] = dataclasses.field(default_factory=Counter)
    written: Counter[str] = dataclasses.field(default_factory=Counter)
    """What this run stored, by kind (step, sleep, event): what the worker and metrics count."""

    def next(self, name: str, kind: str) -> tuple[int, _Stored | None]:
        self.reached[name] += 1
        occurrence = self.reached[name]
        found = self.stored.get((name, occurrence))
        if found is not None and found.kind != kind:
            raise AioqueueError(
                f"job {self.job.id}: {kind} {name!r} (occurrence {occurrence}) was stored as a {found.kind} "
                "by an earlier run: a handler must reach its steps in the same order every run"
            )
        return occurrence, found

    async def write(self, conn: Connection, sql: str, *args: Any) -> _Stored:
        row = await conn.fetchrow(sql, self.job.id, self.job.attempt, *args)
        if row is None:
            raise StepNotRecorded(
                f"job {self.job.id} attempt {self.job.attempt} no longer holds its job: "
                f"step {args[0]!r} was not stored"
            )
        return _Stored(row["state"], row["result"], row["wake_at"], row["now"])

    async def record(self, name: str, occurrence: int, kind: str, state: str, *args: Any,
                     conn: Connection | None = None) -> _Stored:
        sql = self.db.queries.record_step
        if conn is not None:
            stored = await self.write(conn, sql, name, occurrence, kind, state, *args)
        else:
            async with self.db.connection() as pooled:
                stored = await self.write(pooled, sql, name, occurrence, kind, state, *args)
        self.written[kind] += 1
        return stored

    async def settle(self, name: str, occurrence: int) -> _Stored:
        async with self.db.connection() as conn:
            return await self.write(conn, self.db.queries.settle_step, name, occurrence)


_run: contextvars.ContextVar[_Run] = contextvars.ContextVar("aioqueue_steps_run")


async def _current_run(call: str) -> _Run:
    try:
        job = current_job()
    except LookupError:
        raise AioqueueError(f"aioqueue.{call}() is called from inside a running handler only") from None
    run = _run.get(None)
    if run is not None and run.job is job:
        return run
    try:
        db = _database.get()
    except LookupError:
        raise AioqueueError(f"aioqueue.{call}(): this job was not started by an aioqueue worker") from None
    if job.attempt == 1:
        # The job's first run ever (attempts never go down; every later run, a retry, a resumed
        # sleep, a reaped or interrupted attempt, claims a higher one): nothing is stored yet.
        rows = []
    else:
        async with db.connection() as conn:
            rows = await conn.fetch(db.queries.load_steps, job.id)
    run = _Run(job, db, {(r["name"], r["occurrence"]): _from_row(r) for r in rows})
    _run.set(run)
    return run


def stored_by(job: Job) -> Counter[str] | None:
    """The steps, sleeps and event waits (``step``, ``sleep``, ``event``) that the run of
    ``job``'s handler which just ended in this context stored, by kind; None when it reached
    none. The executor and the metrics middleware read it when the run ends."""
    run = _run.get(None)
    return run.written if run is not None and run.job is job else None


def _from_row(row: asyncpg.Record) -> _Stored:
    return _Stored(row["state"], row["result"], row["wake_at"], row["now"], row["kind"])


def _check_name(call: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"aioqueue.{call}(): the name must be a non-empty string, got {name!r}")
    return name


def _check_seconds(call: str, what: str, seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds <= _TEN_YEARS \
            or math.isnan(seconds):
        raise ConfigurationError(f"aioqueue.{call}(): {what} must be 0..10 years in seconds, got {seconds!r}")
    return float(seconds)


async def step(
    name: str, fn: Callable[..., Awaitable[T]], /, *args: Any, connection: Connection | None = None
) -> Any:
    """Run ``await fn(*args)`` once for this job, store its result, and return it (as JSON
    gives it back: a tuple comes back a list). A later run of the job that reaches this step
    returns the stored result without calling ``fn``.

    With ``connection``, ``fn``'s own writes on that connection and the step's result commit in
    one transaction (opened here; a savepoint if one is open, which then commits with it). The
    result must be JSON (refused with :class:`~aioqueue.ConfigurationError`, nothing stored).
    Raises :class:`StepNotRecorded` if this attempt no longer holds its job.
    """
    _check_name("step", name)
    run = await _current_run("step")
    occurrence, found = run.next(name, "step")
    if found is not None:
        return None if found.result is None else payload.decode(found.result, "result")
    if connection is None:
        value = await fn(*args)
        text = _encoded(name, value)
        await run.record(name, occurrence, "step", "done", text, None, None, None, None)
    else:
        async with connection.transaction():
            value = await fn(*args)
            text = _encoded(name, value)
            await run.record(name, occurrence, "step", "done", text, None, None, None, None, conn=connection)
    return payload.decode(text, "result")


def _encoded(name: str, value: Any) -> str:
    payload.check_json(value, f"the result of step {name!r}")
    return payload.dumps(value)


async def sleep(seconds: float, *, name: str = "sleep") -> None:
    """Sleep ``seconds`` (up to 10 years) on the queue's clock, durably: the run ends here and
    the job resumes, on any worker, when the time has come; its worker slot is free meanwhile.
    Resumed, the handler runs again from the start: steps before the sleep return their stored
    results, and the sleep itself returns at once."""
    await _sleep("sleep", name, None, _check_seconds("sleep", "seconds", seconds))


async def sleep_until(when: datetime.datetime, *, name: str = "sleep") -> None:
    """:func:`sleep` until ``when`` (an aware datetime; at once if it has passed)."""
    if not isinstance(when, datetime.datetime) or when.utcoffset() is None:
        raise ConfigurationError(f"aioqueue.sleep_until(): when must be an aware datetime, got {when!r}")
    await _sleep("sleep_until", name, when, None)


async def _sleep(call: str, name: str, when: datetime.datetime | None, seconds: float | None) -> None:
    _check_name(call, name)
    run = await _current_run(call)
    occurrence, found = run.next(name, "sleep")
    if found is None:
        found = await run.record(name, occurrence, "sleep", "waiting", None, when, seconds, None, None)
    if found.state == "waiting":
        if found.wake_at is not None and found.wake_at > found.now:
            raise Suspended
        found = await run.settle(name, occurrence)
        if found.state == "waiting":
            raise Suspended


async def wait_for_event(event: str, *, key: str | None = None, timeout: float, name: str | None = None) -> Any:
    """Wait for ``event`` (with ``key``, if given) sent by :meth:`Queue.send_event` or the SQL
    function ``send_event`` after this wait began, for at most ``timeout`` seconds (up to 10
    years); return its payload. The run ends here and the job resumes when the event comes or
    the timeout passes; its worker slot is free meanwhile. Raises :class:`EventTimeout` when the
    timeout passed first (then, at every later run too). ``name`` is the step's name (default:
    the event's)."""
    _check_name("wait_for_event", event)
    if key is not None and not isinstance(key, str):
        raise ConfigurationError(f"aioqueue.wait_for_event(): key must be a string or None, got {key!r}")
    seconds = _check_seconds("wait_for_event", "timeout", timeout)
    step_name = _check_name("wait_for_event", event if name is None else name)
    run = await _current_run("wait_for_event")
    occurrence, found = run.next(step_name, "event")
    if found is None:
        found = await run.record(step_name, occurrence, "event", "waiting", None, None, seconds, event, key)
    if found.state == "waiting" and found.wake_at is not None and found.wake_at > found.now:
        raise Suspended
    if found.state in ("waiting", "received"):
        found = await run.settle(step_name, occurrence)
    if found.state == "waiting":
        raise Suspended
    if found.state == "timed_out":
        raise EventTimeout(event, key, found.wake_at)
    return None if found.result is None else payload.decode(found.result, "result")
