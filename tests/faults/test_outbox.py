"""The outbox under real faults: the relay (``aioqueue relay``) is killed with SIGKILL and Redis
(a private, durable ``redis-server``) is killed and restarted while events are written and
relayed. Every committed event arrives, once, each key's in commit order. The Kafka path runs the
same where a broker is given (``AIOQUEUE_TEST_KAFKA``: bootstrap servers)."""

from __future__ import annotations

import datetime
import os
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis
from anyio.abc import Process
from redis.exceptions import AuthenticationError

import aioqueue
from aioqueue.streams import Event
from aioqueue.streams.redis import RedisStream
from tests.support.cli_tools import cli_env, free_port
from tests.support.helpers import eventually
from tests.support.redis_tools import OwnRedis, check_arrivals, entries, own_redis


class RelayProcess:
    """``aioqueue relay`` in a child process that a test kills and starts again."""

    def __init__(self, dsn: str, to: str, cwd: Path) -> None:
        self.args = [sys.executable, "-m", "aioqueue", "relay", "--to", to, "-s", "orders", "--lease", "1",
                     "--poll-interval", "0.1", "--batch-size", "500", "--log-level", "WARNING"]
        self.env, self.cwd = cli_env(dsn), cwd
        self.process: Process | None = None
        self.kills = 0

    async def start(self) -> None:
        self.process = await anyio.open_process(self.args, env=self.env, cwd=self.cwd, stdout=None, stderr=None)

    async def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        with anyio.fail_after(10):
            await self.process.wait()
        self.kills += 1

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            await self.kill()
            self.kills -= 1  # the end of the test, not a fault


async def write_events(dsn: str, total: int, writers: int, committed: dict[str, list[int]]) -> None:
    """``total`` events in batches from ``writers`` connections at once, keys among 50; each
    committed id recorded under its key (ids of one key only grow: commit order)."""
    per = total // writers

    async def writer(seed: int) -> None:
        rng = random.Random(seed)
        async with aioqueue.Queue(dsn, pool_max_size=1) as queue:
            left = per
            while left:
                n = min(left, rng.randint(1, 200))
                keys = [f"k{rng.randrange(50)}" for _ in range(n)]
                ids = await queue.publish_many("orders", [(k, {"seed": seed}) for k in keys])
                for key, event_id in zip(keys, ids, strict=True):
                    committed.setdefault(key, []).append(event_id)
                left -= n

    async with anyio.create_task_group() as tg:
        for seed in range(writers):
            tg.start_soon(writer, seed)


async def run_with_faults(
    dsn: str, tmp_path: Path, total: int, faults: list[str], timeout: float,
) -> None:
    """Write ``total`` events while the relay publishes them to a private Redis; at each tenth
    of the events in Redis, the next fault: ``relay`` (SIGKILL it, start another), ``redis``
    (SIGKILL Redis, start it again on its files), ``both``."""
    committed: dict[str, list[int]] = {}
    async with own_redis(tmp_path, free_port()) as server:
        client = aioredis.from_url(server.url)
        relay = RelayProcess(dsn, server.url, tmp_path)
        try:
            with anyio.fail_after(timeout):
                await relay.start()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write_events, dsn, total, 4, committed)
                    for step, fault in enumerate(faults, start=1):
                        await eventually(_has(client, total * step // (len(faults) + 1)), timeout=timeout,
                                         interval=0.02, what=f"{step}/{len(faults) + 1} of the events in Redis")
                        if fault in ("relay", "both"):
                            await relay.kill()
                        if fault in ("redis", "both"):
                            await server.kill()
                            await server.start()
                        if fault in ("relay", "both"):
                            await relay.start()
                await eventually(_has(client, total), timeout=timeout, interval=0.05, what="every event in Redis")
                conn = await asyncpg.connect(dsn)
                try:
                    await eventually(_empty(conn), what="the outbox emptied")
                finally:
                    await conn.close()
            got = await entries(client, "orders")
        finally:
            await relay.stop()
            await client.aclose()
    assert sum(map(len, committed.values())) == total
    check_arrivals(got, committed)
    assert relay.kills == sum(f in ("relay", "both") for f in faults)


def _has(client: aioredis.Redis, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            return bool(await client.xlen("orders") >= n)
        except Exception:
            return False  # Redis is restarting

    return check


def _empty(conn: asyncpg.Connection) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return not await conn.fetchval("SELECT EXISTS (SELECT FROM aioqueue.outbox)")

    return check


async def test_killed_relay_and_redis_lose_nothing_and_repeat_nothing(dsn: str, tmp_path: Path) -> None:
    await run_with_faults(dsn, tmp_path, 4000, ["relay", "redis", "both"], timeout=90)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_hundred_thousand_events_through_killed_relays_and_redis(dsn: str, tmp_path: Path) -> None:
    await run_with_faults(
        dsn, tmp_path, 100_000, ["relay", "redis", "relay", "both", "relay", "redis", "both", "relay", "redis"],
        timeout=600,
    )


async def test_own_redis_takes_no_other_server_on_its_port_for_its_own(tmp_path: Path) -> None:
    """Another test's server has the port (it took it while this one was down): start() fails
    saying so, where it used to go on against that server and its stream."""
    port = free_port()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "mine").mkdir()
    async with own_redis(tmp_path / "theirs", port):
        mine = OwnRedis(tmp_path / "mine", port)
        try:
            with pytest.raises(AssertionError, match=f"redis-server on port {port} exited"):
                await mine.start()
        finally:
            if mine.process is not None and mine.process.returncode is None:
                await mine.kill()


async def test_a_relay_without_its_password_writes_nothing_to_own_redis(tmp_path: Path) -> None:
    """A relay of another test that reaches this test's port (its own server gone, the port taken
    by this one) is refused: it adds nothing to this test's stream."""
    async with own_redis(tmp_path, free_port()) as server:
        stranger = RedisStream(f"redis://127.0.0.1:{server.port}/0")
        event = Event(id=1, stream="orders", key="k", payload="{}", created_at=datetime.datetime.now(datetime.UTC))
        try:
            with pytest.raises(AuthenticationError):
                await stranger.publish([event])
        finally:
            await stranger.aclose()
        client = aioredis.from_url(server.url)
        try:
            assert await client.exists("orders", "orders:positions") == 0
        finally:
            await client.aclose()


# -- Kafka, where a broker is given -----------------------------------------------------------

KAFKA = os.environ.get("AIOQUEUE_TEST_KAFKA")


@pytest.fixture
def kafka_topic() -> str:
    if not KAFKA:
        pytest.skip("no Kafka broker: set AIOQUEUE_TEST_KAFKA=HOST:PORT (docs/howto/outbox.md says how to start one)")
    return f"aioqueue-test-{random.randrange(1 << 30):x}"


@pytest.mark.kafka
@pytest.mark.timeout(900)
async def test_kafka_gets_every_event_in_order_per_key_through_killed_relays(
    dsn: str, tmp_path: Path, kafka_topic: str
) -> None:
    """At least once: every committed event arrives, each key's first arrivals in commit order;
    a repeat carries the id of an event already seen (the relay died after Kafka took it)."""
    from aiokafka import AIOKafkaConsumer

    from aioqueue.streams.kafka import EVENT_ID_HEADER

    assert KAFKA is not None
    total = int(os.environ.get("AIOQUEUE_TEST_KAFKA_EVENTS", "100000"))
    committed: dict[str, list[int]] = {}
    relay = RelayProcess(dsn, f"kafka://{KAFKA}", tmp_path)
    relay.args += ["--prefix", kafka_topic + "-"]
    consumer = AIOKafkaConsumer(f"{kafka_topic}-orders", bootstrap_servers=KAFKA, auto_offset_reset="earliest")
    seen: dict[str, list[int]] = {}
    arrived = 0
    try:
        with anyio.fail_after(600):
            await relay.start()
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_events, dsn, total, 4, committed)
                for _ in range(3):
                    await anyio.sleep(2.0)  # no progress to wait on without reading the topic here
                    await relay.kill()
                    await relay.start()
            await consumer.start()
            while arrived < total:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    for record in records:
                        event_id = int(dict(record.headers)[EVENT_ID_HEADER])
                        key = record.key.decode()
                        last = seen.get(key, [0])[-1]
                        if event_id > last:  # the consumer's rule: drop what is not above its key's last
                            seen.setdefault(key, []).append(event_id)
                            arrived += 1
                        else:
                            assert event_id in seen[key], "a repeat must be an event seen before"
    finally:
        await consumer.stop()
        await relay.stop()
    assert {k: sorted(v) for k, v in committed.items()} == seen
