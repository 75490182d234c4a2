"""Publish outbox events to Redis Streams, each committed event once.

One Lua script per batch appends the events to the stream (``XADD``, the entry fields ``id``,
``key``, ``payload``, ``created_at``) and records, in a hash beside it, the last event id
appended per key; an event whose id is not above its key's recorded one is already there and is
skipped. Redis runs a script whole or not at all, so the entry and its recorded id are written
together: a relay that dies after Redis took a batch, before its own delete, sends it again
and nothing is appended twice. That holds across a Redis restart only for what Redis kept: run
it with ``appendonly yes`` and ``appendfsync always`` (or replicas and ``WAIT``), else a crash
loses the last second of entries after the outbox deleted them.

The hash is ``<stream key>:positions``, one field per key ever published. On a Redis Cluster
both keys must share a slot: name the stream with a hash tag, such as ``{orders}``.
Needs ``redis`` (``pip install "aioqueue[redis]"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    import redis.asyncio as aioredis
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('aioqueue.streams.redis needs redis: pip install "aioqueue[redis]"') from exc

from . import Event, check_batch

__all__ = ["RedisStream"]

# KEYS: the stream, its positions hash. ARGV: maxlen (0: none), then four per event: id, key,
# payload, created_at. Ids compare as Lua numbers (doubles): exact below 2^53, which a bigint
# identity takes centuries to reach.
_APPEND = """
local maxlen = tonumber(ARGV[1])
local appended = 0
for i = 2, #ARGV, 4 do
    local last = redis.call('HGET', KEYS[2], ARGV[i + 1])
    if last == false or tonumber(ARGV[i]) > tonumber(last) then
        if maxlen > 0 then
            redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'id', ARGV[i], 'key', ARGV[i + 1],
                       'payload', ARGV[i + 2], 'created_at', ARGV[i + 3])
        else
            redis.call('XADD', KEYS[1], '*', 'id', ARGV[i], 'key', ARGV[i + 1],
                       'payload', ARGV[i + 2], 'created_at', ARGV[i + 3])
        end
        redis.call('HSET', KEYS[2], ARGV[i + 1], ARGV[i])
        appended = appended + 1
    end
end
return appended
"""


class RedisStream:
    """Redis Streams: the outbox stream ``NAME`` goes to the Redis stream ``prefix + NAME``.

    ``url``: as ``redis.asyncio.from_url`` takes it (``redis://HOST:6379/0``), or pass a
    ``client`` of yours (``close()`` then leaves it open). ``maxlen``: trim each stream to about
    this many entries (0: never trim; consumers' groups then trim).
    """

    exactly_once = True

    def __init__(
        self,
        url: str | None = None,
        *,
        client: aioredis.Redis | None = None,
        prefix: str = "",
        maxlen: int = 0,
        socket_timeout: float = 10.0,
    ) -> None:
        if (url is None) == (client is None):
            raise ValueError("RedisStream needs a url or a client (one of them)")
        if not isinstance(maxlen, int) or maxlen < 0:
            raise ValueError(f"maxlen must be an int >= 0, got {maxlen!r}")
        self._own = client is None
        if client is None:
            assert url is not None
            client = aioredis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
        self.client: aioredis.Redis = client
        self.prefix = prefix
        self.maxlen = maxlen
        self._append = self.client.register_script(_APPEND)

    def key_of(self, stream: str) -> str:
        """The Redis key of the outbox stream ``stream``."""
        return self.prefix + stream

    async def publish(self, events: Sequence[Event]) -> int:
        """Append the events not yet in the stream, in order, in one script call."""
        key = self.key_of(check_batch(events))
        args: list[Any] = [self.maxlen]
        for e in events:
            args += [e.id, e.key, e.payload, e.created_at.isoformat()]
        return int(await self._append(keys=[key, key + ":positions"], args=args))

    async def aclose(self) -> None:
        """Close the client this stream made."""
        if self._own:
            await self.client.aclose()
