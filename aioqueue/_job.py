"""What a job is, as a worker holds it and as an operator sees it.

``Job`` is a claimed job inside a worker; ``current_job()`` gives the running handler its own.
``JobInfo`` is the read-only view returned by the admin calls (``Queue.get_job`` and friends).
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import itertools
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ._payload import UndecodableValue, decode, decode_shown

if TYPE_CHECKING:
    from ._app import Queue

Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
"""A connection aioqueue can write on: a plain asyncpg connection or one from a pool."""


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """A job a worker has claimed: its identity, its arguments and its claim.

    ``(id, attempt)`` identifies the claim: every write that finishes the job is fenced by it.
    """

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime.datetime
    created_at: datetime.datetime
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    """What the enqueuer's hooks attached (a trace context, say); never passed to the handler."""

    @classmethod
    def from_records(cls, rows: Sequence[asyncpg.Record]) -> tuple[list[Job], list[Undecodable]]:
        """Build the jobs of one claim and set apart the rows that cannot be decoded (see
        :func:`decode_claimed`)."""
        return decode_claimed(rows)


_MIN = datetime.datetime.min.replace(tzinfo=datetime.UTC)
_MAX = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def from_epoch(seconds: float) -> datetime.datetime:
    """The UTC datetime ``seconds`` after the epoch, as a claim sends timestamps (exact to the
    microsecond); an infinite one as asyncpg gives it, the least or the greatest datetime."""
    try:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return _MAX if seconds > 0 else _MIN


class _FromEpoch:
    """``Job.run_at`` and ``Job.created_at`` read through their own slots: a claim fills the
    slot with epoch seconds (a float; most handlers never read them), and the first read turns
    them into the datetime, kept in the slot. Every read goes through here (equality, repr,
    copies, pickles), so a claimed job is a plain ``Job``."""

    __slots__ = ("slot",)

    def __init__(self, slot: Any) -> None:
        self.slot = slot

    def __get__(self, job: Job | None, owner: type | None = None) -> Any:
        if job is None:
            return self.slot  # the class's attribute as the dataclass made it
        value = self.slot.__get__(job)
        if type(value) is float:
            value = from_epoch(value)
            self.slot.__set__(job, value)
        return value

    def __set__(self, job: Job, value: datetime.datetime) -> None:
        self.slot.__set__(job, value)


for _field in ("run_at", "created_at"):
    setattr(Job, _field, _FromEpoch(vars(Job)[_field]))


class _OwnDict:
    """``Job.headers`` read through its own slot: a claim leaves the slot None for a job without
    headers (most have none), and the first read puts a dict of the job's own there, as ``Job()``
    would have made. A dict a job made with the claim's other thousand-odd objects at once would
    count towards the collector's next young collection: a claim's objects, alive until their
    handlers end, are what sets off most of them at many slots. Every read goes through here, so
    a claimed job is a plain ``Job``."""

    __slots__ = ("slot",)

    def __init__(self, slot: Any) -> None:
        self.slot = slot

    def __get__(self, job: Job | None, owner: type | None = None) -> Any:
        if job is None:
            return self.slot  # the class's attribute as the dataclass made it
        value = self.slot.__get__(job)
        if value is None:
            value = {}
            self.slot.__set__(job, value)
        return value

    def __set__(self, job: Job, value: dict[str, str]) -> None:
        self.slot.__set__(job, value)


Job.headers = _OwnDict(vars(Job)["headers"])  # type: ignore[assignment,misc]


class _Unfrozen:
    """A ``Job``'s slots without its freezing: a claimed job is built as one, its fields set by
    plain attribute stores, then made a ``Job`` by assigning its class (the same slots, so the
    same layout: Python allows it). A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and the slots' own setters cost as much (a call through a wrapper
    each, about a microsecond for the ten): a visible share of a worker's own CPU per short job."""

    __slots__ = Job.__slots__


def _claimed_job(
    id: int, queue: str, task: str, args: dict[str, Any], priority: int, attempt: int, max_attempts: int,
    run_at: float, created_at: float, headers: dict[str, str] | None,
) -> Job:
    """``Job(...)`` for a claimed row, built more cheaply (see :class:`_Unfrozen`): the same
    immutable object, its timestamps (epoch seconds) left to be built when read (see
    :class:`_FromEpoch`)."""
    job: Any = _Unfrozen()  # its slots are Job's: set by name, as Job() would
    job.id = id
    job.queue = queue
    job.task = task
    job.args = args
    job.priority = priority
    job.attempt = attempt
    job.max_attempts = max_attempts
    job.run_at = run_at
    job.created_at = created_at
    job.headers = headers or None  # none stored: a dict of its own when first read (see _OwnDict)
    job.__class__ = Job
    made: Job = job
    return made


# A field added to Job (and not here), or a layout Python no longer lets a class be swapped
# for, fails here, at import, rather than in a worker's first claim.
_probe = _claimed_job(0, "", "", {}, 0, 0, 0, 0.0, 0.0, None)
if type(_probe) is not Job or not all(hasattr(_probe, name) for name in Job.__slots__) or _probe.headers != {}:
    raise RuntimeError("aioqueue._job: _claimed_job no longer builds a Job")


@dataclasses.dataclass(frozen=True, slots=True)
class Undecodable:
    """A claimed row whose arguments Python cannot decode: ``(id, attempt)`` fences the write
    that makes it dead; ``error`` says why."""

    id: int
    attempt: int
    error: str


def decode_claimed(rows: Sequence[asyncpg.Record]) -> tuple[list[Job], list[Undecodable]]:
    """Build the jobs of rows with the claim's columns (``claimed_columns`` of queries.sql, read
    by name), as :func:`decode_claim` does."""
    return decode_claim([[row[name] for row in rows] for name in _CLAIM_COLUMNS])


def decode_claim(columns: Sequence[Any]) -> tuple[list[Job], list[Undecodable]]:
    """Build the jobs of one claim from its columns (the first nine of ``claimed_arrays`` of
    queries.sql, a worker's claim as one row: each column an array over the jobs, NULL if
    none), in claim order, and set apart those whose arguments cannot be decoded.

    Claim order is priority, then run_at, then id (the arrays come in no particular order).
    The arguments (jsonb as text, so valid JSON) are parsed as one JSON array: cheaper per job
    than a json.loads each. If that fails (nesting past Python's recursion limit, an int over
    its digit limit), each job's are decoded on its own, so one bad job never takes its
    batch-mates with it.
    """
    ids, queues, tasks, texts, priorities, attempts, most, run_ats, created_ats = map(columns.__getitem__, range(9))
    if not ids:
        return [], []
    in_order: Iterable[Iterable[Any]]
    order: Sequence[int]
    if priorities.count(priorities[0]) == len(ids) and run_ats == sorted(run_ats) and ids == sorted(ids):
        # Most often the rows come in claim order already (one priority, the order the claim
        # locked them in): seen in C without a call a job, and taken as they are.
        order = range(len(ids))
        in_order = (ids, queues, tasks, priorities, attempts, most, run_ats, created_ats)
        joined = ",".join(texts)
    else:
        # Positions in claim order, in C, by stable sorts on one column each: a key of two
        # columns would be a tuple a job, thousands at once that the collector counts.
        order = sorted(range(len(ids)), key=ids.__getitem__)
        order.sort(key=run_ats.__getitem__)
        order.sort(key=priorities.__getitem__, reverse=True)
        in_order = (map(c.__getitem__, order) for c in (ids, queues, tasks, priorities, attempts, most, run_ats,
                                                         created_ats))
        joined = ",".join(map(texts.__getitem__, order))
    try:
        args = json.loads("[" + joined + "]")
    except (ValueError, RecursionError):
        args = None
    if args is not None and {*map(type, args)} <= {dict}:
        # Column by column, each job built by one call: no bytecodes of ours a job but its own.
        o_ids, o_queues, o_tasks, o_priorities, o_attempts, o_most, o_run_ats, o_created_ats = in_order
        headers = map(dict.pop, args, itertools.repeat(HEADERS_KEY), itertools.repeat(None))
        return list(map(
            _claimed_job, o_ids, o_queues, o_tasks, args, o_priorities, o_attempts, o_most, o_run_ats, o_created_ats,
            headers,
        )), []
    jobs: list[Job] = []
    bad: list[Undecodable] = []
    for i in order:
        job_args = decode(texts[i])
        if isinstance(job_args, UndecodableValue):
            bad.append(Undecodable(ids[i], attempts[i], job_args.error))
        elif type(job_args) is not dict:
            kind = type(job_args).__name__
            error = f"TypeError: the stored arguments are a JSON {kind}, not an object of keyword arguments"
            bad.append(Undecodable(ids[i], attempts[i], error))
        else:
            jobs.append(_claimed_job(
                ids[i], queues[i], tasks[i], job_args, priorities[i], attempts[i], most[i], run_ats[i],
                created_ats[i], job_args.pop(HEADERS_KEY, None),
            ))
    return jobs, bad


HEADERS_KEY = "__aioqueue_headers__"
"""Where a job's headers ride in its stored arguments (no column of their own: no migration)."""


def shown_args(text: str) -> Any:
    """A job's stored arguments as an operator sees them (see :func:`~aioqueue._payload.decode_shown`):
    as its handler gets them, the enqueue hooks' headers left out."""
    args = decode_shown(text, "arguments")
    if type(args) is dict:
        args.pop(HEADERS_KEY, None)
    return args


_CLAIM_COLUMNS = ("id", "queue", "task", "args", "priority", "attempts", "max_attempts", "run_at", "created_at")

_current: contextvars.ContextVar[Job] = contextvars.ContextVar("aioqueue_current_job")


def current_job() -> Job:
    """Return the job whose handler is running in this context.

    Raises ``LookupError`` outside a handler.
    """
    return _current.get()


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """What a job's handler reported last with :func:`aioqueue.set_progress`, as stored."""

    fraction: float | None
    """How far the job is, 0.0 to 1.0 (None: not given)."""
    message: str | None
    """A short message (None: not given)."""
    data: Any
    """A small JSON document (None: not given)."""
    attempt: int
    """The attempt that reported it."""
    keep: bool
    """Whether later attempts show it (until they report their own)."""
    updated_at: datetime.datetime | None
    """When a worker wrote it (the queue's clock): up to about half a second after the call."""

    @classmethod
    def shown(cls, text: str | None, attempts: int) -> Progress | None:
        """The progress stored as ``text`` as readers show it for a job at attempt ``attempts``:
        None when there is none, or when an earlier attempt reported it without ``keep``."""
        if text is None:
            return None
        try:
            doc = json.loads(text)
            attempt, keep = int(doc["attempt"]), bool(doc.get("keep", False))
        except (ValueError, TypeError, KeyError, RecursionError):  # not a value aioqueue wrote
            return None
        if attempt != attempts and not keep:
            return None
        at = doc.get("at")
        fraction = doc.get("fraction")
        return cls(
            fraction=None if fraction is None else float(fraction),
            message=doc.get("message"),
            data=doc.get("data"),
            attempt=attempt,
            keep=keep,
            updated_at=datetime.datetime.fromisoformat(at) if isinstance(at, str) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (``updated_at`` as ISO 8601)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.updated_at is not None:
            out["updated_at"] = self.updated_at.isoformat()
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as stored: live (pending, running, dead) or archived (succeeded, cancelled)."""

    id: int
    queue: str
    task: str
    args: dict[str, Any] | UndecodableValue
    """The job's keyword arguments, or what stands for arguments aioqueue cannot read back."""
    status: str
    priority: int
    attempts: int
    max_attempts: int
    run_at: datetime.datetime
    created_at: datetime.datetime
    last_error: str | None
    dedup_key: str | None
    result: Any
    """An archived success's result (an :class:`UndecodableValue` if aioqueue cannot read it back)."""
    finished_at: datetime.datetime | None
    progress: Progress | None = None
    """What its handler reported last (:func:`aioqueue.set_progress`), while it runs and after;
    None when it reported nothing, or when an earlier attempt did, without ``keep``."""

    @classmethod
    def from_record(cls, row: asyncpg.Record) -> JobInfo:
        """Build from a row of ``get_job`` or ``list_dead``."""
        return cls(
            id=row["id"],
            queue=row["queue"],
            task=row["task"],
            args=shown_args(row["args"]),
            status=row["status"],
            priority=row["priority"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            run_at=row["run_at"],
            created_at=row["created_at"],
            last_error=row["last_error"],
            dedup_key=row["dedup_key"],
            result=decode_shown(row["result"], "result"),
            finished_at=row["finished_at"],
            progress=Progress.shown(row["progress"], row["attempts"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (timestamps as ISO 8601). Arguments or a result that cannot be
        read back are None there, and ``undecodable`` maps their field to the reason."""
        out: dict[str, Any] = {}
        undecodable: dict[str, str] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, datetime.datetime):
                value = value.isoformat()
            elif isinstance(value, Progress):
                value = value.to_dict()
            elif isinstance(value, UndecodableValue):
                undecodable[field.name] = value.error
                value = None
            out[field.name] = value
        if undecodable:
            out["undecodable"] = undecodable
        return out


class JobRef(int):
    """The id of an enqueued job. It is an ``int``; it can also follow its job.

    Each queue has its own subclass holding the queue, so a reference is a bare int with no
    per-object dict: a bulk enqueue makes thousands at the cost of ints.
    """

    __slots__ = ()
    queue: Queue

    def __new__(cls, job_id: int, queue: Queue) -> JobRef:
        return int.__new__(queue.job_ref_type, job_id)

    @classmethod
    def bound_to(cls, queue: Queue) -> type[JobRef]:
        """The subclass whose references follow jobs of ``queue``."""
        return type("JobRef", (cls,), {"__slots__": (), "queue": queue, "__module__": cls.__module__})

    @staticmethod
    def many(ids: Iterable[int], queue: Queue) -> list[JobRef]:
        """One reference per id (a bulk enqueue's ids)."""
        return list(map(int.__new__, itertools.repeat(queue.job_ref_type), ids))

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the job's result (see :meth:`Queue.wait_result`)."""
        return await self.queue.wait_result(self, timeout=timeout)

    async def cancel(self) -> str:
        """Cancel the job (see :meth:`Queue.cancel`)."""
        return await self.queue.cancel(self)

    async def info(self) -> JobInfo | None:
        """The job as stored now, or None when it is gone."""
        return await self.queue.get_job(self)

    async def progress(self) -> Progress | None:
        """What the job's handler reported last (see :attr:`JobInfo.progress`); None when it
        reported nothing, or the job is gone."""
        info = await self.queue.get_job(self)
        return None if info is None else info.progress
