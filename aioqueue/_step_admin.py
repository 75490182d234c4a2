"""Operator calls on durable steps, sleeps and event waits (``job_steps``): a job's steps, the
open waits, and sending an event. The Queue, the command line and the dashboard use them."""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._job import Connection
from ._payload import check_json, decode_shown, dumps

if TYPE_CHECKING:
    from ._database import Database


@dataclasses.dataclass(frozen=True, slots=True)
class StepInfo:
    """One stored step of a job: a step (``kind`` 'step'), a sleep or an event wait."""

    name: str
    occurrence: int
    kind: str
    """'step', 'sleep' or 'event'."""
    state: str
    """'done', 'waiting', 'received' (an event came, the handler has not taken it yet) or 'timed_out'."""
    result: Any
    """A step's result, or the payload of the event a wait received."""
    wake_at: datetime.datetime | None
    """When a sleep ends or an event wait times out."""
    event: str | None
    event_key: str | None
    created_at: datetime.datetime
    updated_at: datetime.datetime

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps as ISO 8601)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return value if value is None or isinstance(value, str | int | float | bool | list | dict) else str(value)


def check_event(event: object, key: object) -> None:
    """Refuse an event name that is not a non-empty string, or a key that is not a string."""
    if not isinstance(event, str) or not event:
        raise ConfigurationError(f"the event name must be a non-empty string, got {event!r}")
    if key is not None and not isinstance(key, str):
        raise ConfigurationError(f"an event key must be a string or None, got {key!r}")


class StepAdmin:
    """Reads and sends on the ``job_steps`` of one :class:`~aioqueue._database.Database`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def job_steps(self, job_id: int) -> list[StepInfo]:
        """Every stored step of job ``job_id``, in the order they were first reached."""
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise ConfigurationError(f"a job id is a positive integer, got {job_id!r}")
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.load_steps, job_id)
        return [
            StepInfo(
                name=r["name"], occurrence=r["occurrence"], kind=r["kind"], state=r["state"],
                result=decode_shown(r["result"], "result"), wake_at=r["wake_at"], event=r["event"],
                event_key=r["event_key"], created_at=r["created_at"], updated_at=r["updated_at"],
            )
            for r in rows
        ]

    async def list_waits(self, *, event: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Open sleeps and event waits, soonest to wake first: job_id, queue, task, name,
        occurrence, kind, state, event, event_key, wake_at, created_at."""
        if event is not None:
            check_event(event, None)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise ConfigurationError(f"limit must be an integer from 1 to 10,000, got {limit!r}")
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.list_waits, limit, event)
        return [dict(r) for r in rows]

    async def send_event(
        self, event: str, payload: Any = None, *, key: str | None = None, conn: Connection | None = None
    ) -> int:
        """Deliver ``event`` to the jobs waiting for it; return how many waits it reached."""
        check_event(event, key)
        text = dumps(check_json(payload, "the event's payload"))
        async with self.db.connection(conn) as c:
            reached: int = await c.fetchval(self.db.queries.send_event, event, key, text)
        return reached
