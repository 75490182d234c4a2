"""The outbox scenario: events per second the relay publishes from the outbox to Redis Streams
(each event once, through the script that drops what the stream already holds), with the
default batch and a larger one, and events per second written by ``publish_many``. Redis is
``AIOQUEUE_BENCH_REDIS``, else 127.0.0.1:6379; the streams go under a prefix of the run's own
and are deleted after."""

from __future__ import annotations

import os
import time
import uuid

import redis.asyncio as aioredis
from common import Measurement, Run, migrated, progress

import aioqueue
from aioqueue.streams.redis import RedisStream

REDIS = os.environ.get("AIOQUEUE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
#: Keys the events are spread over (a key's events keep their order; keys are independent).
KEYS = 100


def plan(run: Run) -> None:
    """Line up the publish measurement and one relay measurement per batch size."""
    for batch in (500, 2000):
        run.step(f"outbox: relay to Redis, batch {batch}", _relay(run, batch))


def _relay(run: Run, batch: int) -> Measurement:
    events = run.sizes.outbox_events

    async def measure(dsn: str) -> None:
        await migrated(dsn)
        async with aioqueue.Queue(dsn) as queue:
            started = time.perf_counter()
            for start in range(0, events, 5000):
                await queue.publish_many(
                    "bench", [(f"k{i % KEYS}", {"i": i}) for i in range(start, min(events, start + 5000))]
                )
            written = time.perf_counter() - started
            async with queue.connection() as conn:
                await conn.execute("ANALYZE aioqueue.outbox")
            prefix = f"aioqueue-bench-{uuid.uuid4().hex[:8]}:"
            stream = RedisStream(REDIS, prefix=prefix)
            try:
                started = time.perf_counter()
                stats = await queue.relay(stream, ["bench"], batch_size=batch).run_until_empty()
                relayed = time.perf_counter() - started
            finally:
                client: aioredis.Redis = stream.client
                await client.delete(prefix + "bench", prefix + "bench:positions")
                await stream.aclose()
        assert stats.published == events, stats
        if batch == 500:
            _rate(run, f"publish_many, 5000 per call, {KEYS} keys", events / written)
        _rate(run, f"relayed to Redis, batch {batch}", events / relayed)

    return measure


def _rate(run: Run, metric: str, per_second: float) -> None:
    run.results.add("outbox", "aioqueue", metric, per_second, "events/s", higher_is_better=True)
    progress(f"    {per_second:12,.0f} events/s")
