"""Where an outbox relay publishes: the :class:`Stream` interface, the :class:`Event` it is
handed, and :func:`open_stream`, which makes one from a URL (``redis://``, ``kafka://``).

A stream is one small object: ``publish`` appends a batch of one outbox stream's events in the
order given, all of them or raises, and ``aclose`` lets go of its connections. The relay calls
``publish`` with each key's events in commit order and deletes them from the outbox only once it
returned, so a stream that raises loses nothing: the same events come again. ``exactly_once``
says what consumers see when the relay dies between the stream's answer and its own delete:
True where the stream drops what it already holds (:mod:`aioqueue.streams.redis`), False where
the event comes again with the same id (:mod:`aioqueue.streams.kafka`). Another stream is one
module with a class of these three members.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .._errors import ConfigurationError

__all__ = ["Event", "Stream", "open_stream"]


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One committed outbox event, as a stream publishes it."""

    id: int
    """Stable and unique: the same event always comes with the same id, and a key's ids grow in
    commit order, so a consumer may drop an event whose id is not above the last of its key."""
    stream: str
    """The outbox stream it was published to (the Redis stream key, the Kafka topic)."""
    key: str
    """Its ordering key: one key's events reach the stream in commit order."""
    payload: str
    """Its JSON payload, as text."""
    created_at: datetime.datetime
    """When its transaction wrote it (the server's clock)."""


@runtime_checkable
class Stream(Protocol):
    """What the relay publishes through."""

    @property
    def exactly_once(self) -> bool:
        """Whether the stream drops an event it already holds (by its id), so consumers see each
        committed event once; else they may see one again, with the same id."""
        ...

    async def publish(self, events: Sequence[Event]) -> int:
        """Append ``events`` (all of one outbox stream, in order); return how many were new (not
        already held). Raise if they may not all be held: the relay sends them again."""
        ...

    async def aclose(self) -> None:
        """Close the stream's connections."""
        ...


def open_stream(url: str, *, prefix: str = "") -> Stream:
    """A stream from a URL: ``redis://HOST:PORT/DB`` (or ``rediss://``) for Redis Streams,
    ``kafka://HOST:PORT[,HOST:PORT...]`` for Kafka; ``prefix`` goes before each outbox stream's
    name there. Each needs its client installed (``aioqueue[redis]``, ``aioqueue[kafka]``)."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        from .redis import RedisStream

        return RedisStream(url, prefix=prefix)
    if scheme == "kafka":
        from .kafka import KafkaStream

        return KafkaStream(url.partition("://")[2].strip("/"), prefix=prefix)
    raise ConfigurationError(
        f"stream URL {url!r} names no stream this relay knows: use redis://HOST:PORT/DB or kafka://HOST:PORT"
    )


def check_batch(events: Sequence[Event]) -> str:
    """The outbox stream of a batch (every event's), or raise: a batch is one stream's."""
    if not events:
        raise ValueError("publish() needs at least one event")
    names = {e.stream for e in events}
    if len(names) != 1:
        raise ValueError(f"a batch holds one stream's events, got {sorted(names)}")
    return events[0].stream
