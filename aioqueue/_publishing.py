"""The outbox calls of a :class:`~aioqueue.Queue`: write events in the caller's transaction
(``publish``, ``publish_many`` and their sync twins), read the outbox's state, and make the
relay that publishes it to a stream.

An event is written by the schema's ``publish_events()`` function, which every way in calls
(asyncpg, SQLAlchemy, psycopg, Django, plain SQL): it locks the event's key until the caller's
transaction ends, so one key's events take their ids in commit order (migration 0013). This
module checks and encodes the events first, and sends nothing for a call it refuses. It never
publishes: the relay (:mod:`aioqueue._relay`) does, once the transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from . import _enqueue as enqueue
from . import _payload as payload
from ._connections import CallerConnection, writer_for
from ._errors import ConfigurationError
from ._relay import Relay, RelayOptions

if TYPE_CHECKING:
    from ._database import Database
    from ._statements import Bound
    from .streams import Stream

#: The longest stream name (a Redis key, a Kafka topic name is at most 249 characters).
MAX_STREAM = 200


class _Outbox:
    """What the enqueue layer's identity check and errors name: the outbox stream written."""

    archive = False

    def __init__(self, stream: str) -> None:
        self.name = f"(outbox stream {stream!r})"


def check_stream(stream: object) -> str:
    """Return ``stream`` if it is a usable outbox stream name, else raise naming it."""
    if not isinstance(stream, str) or not stream or len(stream) > MAX_STREAM or "\x00" in stream:
        raise ConfigurationError(
            f"an outbox stream name must be a non-empty str of at most {MAX_STREAM} characters, got {stream!r}"
        )
    return stream


def _statement(db: Database, stream: object, events: Iterable[tuple[str, Any]], max_bytes: int) -> Bound:
    name = check_stream(stream)
    keys: list[str] = []
    texts: list[str] = []
    items = list(events)
    for i, item in enumerate(items):
        where = f"event {i + 1} of {len(items)} of stream {name!r}"
        if not isinstance(item, tuple) or len(item) != 2:
            raise ConfigurationError(f"{where}: give each event as a (key, payload) tuple, got {item!r}")
        key, value = item
        if not isinstance(key, str) or not key or "\x00" in key:
            raise ConfigurationError(f"{where}: its key must be a non-empty str, got {key!r}")
        keys.append(key)
        texts.append(payload.encode_value(f"{where}: the payload", value, max_bytes))
    return db.statements.publish_events(stream=name, keys=keys, payloads=texts)


class Publishing:
    """The outbox calls :class:`~aioqueue.Queue` offers."""

    database: Database
    max_payload_bytes: int

    async def publish(self, stream: str, key: str, payload: Any, *, conn: CallerConnection | None = None) -> int:
        """Write one event to the outbox ``stream`` with ordering ``key`` and a JSON ``payload``;
        return its id. With ``conn`` (asyncpg, SQLAlchemy async, psycopg async), the event joins
        that connection's open transaction: published once it commits, never if it rolls back.
        Without, it commits on its own."""
        return (await self.publish_many(stream, [(key, payload)], conn=conn))[0]

    async def publish_many(
        self, stream: str, events: Iterable[tuple[str, Any]], *, conn: CallerConnection | None = None
    ) -> list[int]:
        """Write ``(key, payload)`` events to the outbox ``stream`` in one statement, all or none;
        return their ids in order. ``conn`` as :meth:`publish`."""
        bound = _statement(self.database, stream, events, self.max_payload_bytes)
        if not bound.args[1]:
            return []
        writer = writer_for(conn) if conn is not None else None
        rows = await enqueue.rows_of(self.database, _Outbox(stream), writer, [bound])
        return [int(row[0]) for row in rows]

    def publish_sync(self, stream: str, key: str, payload: Any, *, conn: CallerConnection) -> int:
        """:meth:`publish` on a sync connection (psycopg ``Connection``, Django's connection),
        in its transaction, with no event loop."""
        return self.publish_many_sync(stream, [(key, payload)], conn=conn)[0]

    def publish_many_sync(self, stream: str, events: Iterable[tuple[str, Any]], *, conn: CallerConnection) -> list[int]:
        """:meth:`publish_many` on a sync connection, in its transaction."""
        bound = _statement(self.database, stream, events, self.max_payload_bytes)
        if not bound.args[1]:
            return []
        rows = enqueue.rows_of_sync(self.database, _Outbox(stream), writer_for(conn), [bound])
        return [int(row[0]) for row in rows]

    async def outbox_status(self) -> list[dict[str, Any]]:
        """Per outbox stream: ``waiting`` events, ``lag`` (seconds the oldest waiting event has
        waited; 0 when none waits), ``published`` (events relayed so far), and ``relay`` (the
        name of the relay holding the stream's lease, or None)."""
        async with self.database.connection() as conn:
            rows = await conn.fetch(self.database.queries.outbox_status)
        return [dict(row) for row in rows]

    def relay(self, stream: Stream, streams: Sequence[str], **options: Unpack[RelayOptions]) -> Relay:
        """Make a relay that publishes the outbox ``streams`` to ``stream`` (a
        :class:`~aioqueue.streams.Stream`, such as ``RedisStream``); run it with ``run()``.
        ``streams`` is a list of names: a bare string is refused, not read as its letters."""
        if isinstance(streams, str | bytes) or not isinstance(streams, Iterable):
            raise ConfigurationError(
                f"a relay takes a list of outbox stream names, got {streams!r}: write [{streams!r}]"
            )
        return Relay(self.database, stream, [check_stream(s) for s in streams], **options)
