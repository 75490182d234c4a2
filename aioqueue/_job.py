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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ._payload import UndecodableValue, decode_shown

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


HEADERS_KEY = "__aioqueue_headers__"
"""Where a job's headers ride in its stored arguments (no column of their own: no migration)."""


def shown_args(text: str) -> Any:
    """A job's stored arguments as an operator sees them (see :func:`~aioqueue._payload.decode_shown`):
    as its handler gets them, the enqueue hooks' headers left out."""
    args = decode_shown(text, "arguments")
    if type(args) is dict:
        args.pop(HEADERS_KEY, None)
    return args


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
