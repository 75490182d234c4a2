"""The outbox: events written in the caller's transaction from every way in, published by the
relay to a real Redis in commit order per key, once each; a rolled-back transaction publishes
nothing; a relay that dies after Redis took a batch sends nothing twice; two relays never
reorder a key; the lag as a metric and a dashboard figure; the commands."""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import httpx
import prometheus_client
import psycopg
import pytest
import redis.asyncio as aioredis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import aioqueue
from aioqueue.dashboard import create_app
from aioqueue.metrics import PrometheusMetrics
from aioqueue.streams import Event, Stream, open_stream
from aioqueue.streams.redis import RedisStream
from tests.support import dashboard_tools, redis_tools
from tests.support.cli_tools import aioqueue_cli, cli_process, free_port
from tests.support.dashboard_tools import SERVED
from tests.support.django_db import django_connection
from tests.support.helpers import eventually
from tests.support.redis_tools import REDIS_URL, check_arrivals, entries

# The shared fixtures these tests use.
redis_client, prefix, redis_stream = redis_tools.redis_client, redis_tools.prefix, redis_tools.redis_stream


class Declined(Exception):
    """What a caller's code raises inside its transaction: the transaction rolls back."""


async def _rolled_back(body: Callable[[], Awaitable[object]]) -> None:
    with pytest.raises(Declined):
        await body()


def _rolled_back_sync(body: Callable[[], object]) -> None:
    with pytest.raises(Declined):
        body()


async def _outbox(db: asyncpg.Connection) -> list[tuple[int, str, str, Any]]:
    rows = await db.fetch("SELECT id, stream, key, payload::text FROM aioqueue.outbox ORDER BY id")
    return [(r["id"], r["stream"], r["key"], json.loads(r["payload"])) for r in rows]


# -- writing: every way in, in the caller's transaction ---------------------------------------


async def test_async_ways_in_commit_with_the_caller_and_roll_back_with_it(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    committed: list[int] = []
    async with q.pool.acquire() as conn:
        async with conn.transaction():
            committed.append(await q.publish("orders", "o1", {"step": "asyncpg"}, conn=conn))

        async def asyncpg_then_fail() -> None:
            async with conn.transaction():
                await q.publish_many("orders", [("o1", "lost"), ("o2", "lost")], conn=conn)
                raise Declined

        await _rolled_back(asyncpg_then_fail)
        with pytest.raises(aioqueue.NotInTransactionError):
            await q.publish("orders", "o1", "no transaction", conn=conn)
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        async with AsyncSession(engine) as session, session.begin():
            committed += await q.publish_many("orders", [("o1", {"step": "sqlalchemy"}), ("o2", [1, 2])],
                                              conn=session)

        async def session_then_fail() -> None:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text("SELECT 1"))
                await q.publish("orders", "o2", "lost", conn=session)
                raise Declined

        await _rolled_back(session_then_fail)
    finally:
        await engine.dispose()
    async with await psycopg.AsyncConnection.connect(dsn) as pconn:
        async with pconn.transaction():
            committed.append(await q.publish("orders", "o2", {"step": "psycopg"}, conn=pconn))

        async def psycopg_then_fail() -> None:
            async with pconn.transaction():
                await q.publish("orders", "o1", "lost", conn=pconn)
                raise Declined

        await _rolled_back(psycopg_then_fail)
    # SQL and triggers: the function every way in calls.
    committed.append(await db.fetchval("SELECT aioqueue.publish('orders', 'o3', '{\"step\": \"sql\"}')"))
    async with db.transaction():
        sql_ids = await db.fetch("SELECT aioqueue.publish_events('audit', ARRAY['a', 'b'], ARRAY['1', '2']::jsonb[])")
    committed += [r[0] for r in sql_ids]
    committed.append(await q.publish("orders", "o3", None))  # no conn: its own transaction
    rows = await _outbox(db)
    assert [r[0] for r in rows] == committed
    assert "lost" not in [r[3] for r in rows]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("orders", "o1", {"step": "asyncpg"}), ("orders", "o1", {"step": "sqlalchemy"}), ("orders", "o2", [1, 2]),
        ("orders", "o2", {"step": "psycopg"}), ("orders", "o3", {"step": "sql"}), ("audit", "a", 1),
        ("audit", "b", 2), ("orders", "o3", None),
    ]


def test_sync_ways_in_commit_with_the_caller_and_roll_back_with_it(q: aioqueue.Queue, django_db: str) -> None:
    with psycopg.connect(django_db) as conn:
        with conn.transaction():
            first = q.publish_sync("orders", "o1", {"via": "psycopg"}, conn=conn)

        def psycopg_then_fail() -> None:
            with conn.transaction():
                q.publish_many_sync("orders", [("o1", "lost")], conn=conn)
                raise Declined

        _rolled_back_sync(psycopg_then_fail)
    from django.db import transaction

    connection = django_connection(django_db)
    with transaction.atomic():
        second = q.publish_many_sync("orders", [("o1", {"via": "django"}), ("o2", 2)], conn=connection)

    def django_then_fail() -> None:
        with transaction.atomic():
            q.publish_sync("orders", "o1", "lost", conn=connection)
            raise Declined

    _rolled_back_sync(django_then_fail)
    with pytest.raises(aioqueue.NotInTransactionError):
        q.publish_sync("orders", "o1", "autocommit", conn=connection)
    with connection.cursor() as cur:
        cur.execute("SELECT id, key, payload::text FROM aioqueue.outbox ORDER BY id")
        rows = [(i, k, json.loads(p)) for i, k, p in cur.fetchall()]
    assert rows == [(first, "o1", {"via": "psycopg"}), (second[0], "o1", {"via": "django"}), (second[1], "o2", 2)]


async def test_bad_events_are_refused_naming_them_and_nothing_is_written(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="outbox stream name"):
        await q.publish("", "k", 1)
    with pytest.raises(aioqueue.ConfigurationError, match=r"event 2 of 2 of stream 'orders': its key"):
        await q.publish_many("orders", [("k", 1), (None, 2)])  # type: ignore[list-item]
    with pytest.raises(aioqueue.ConfigurationError, match=r"event 1 of 1 .*\(key, payload\) tuple"):
        await q.publish_many("orders", ["k"])  # type: ignore[list-item]
    with pytest.raises(aioqueue.JobArgumentsError, match=r"event 2 of 3 of stream 'orders': the payload\['when'\]"):
        await q.publish_many("orders", [("k", 1), ("k", {"when": object()}), ("k", 3)])
    with pytest.raises(aioqueue.PayloadTooLargeError, match="event 1 of 1"):
        await q.publish("orders", "k", "x" * (q.max_payload_bytes + 1))
    with pytest.raises(asyncpg.InvalidParameterValueError, match="event 2 of 2 has no key"):
        await db.execute("SELECT aioqueue.publish_events('orders', ARRAY['a', NULL], ARRAY['1', '2']::jsonb[])")
    assert await q.publish_many("orders", []) == []
    assert await _outbox(db) == []


# -- ordering: per key, id order is commit order ----------------------------------------------


async def test_a_second_writer_of_a_key_takes_its_id_after_the_first_commits(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    first, second, other = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        tx = first.transaction()
        await tx.start()
        await q.publish("orders", "k", "first", conn=first)
        # Another key does not wait.
        async with other.transaction():
            await q.publish("orders", "other", "free", conn=other)
        result: list[int] = []

        async def second_writer() -> None:
            async with second.transaction():
                result.append(await q.publish("orders", "k", "second", conn=second))

        async with anyio.create_task_group() as tg:
            tg.start_soon(second_writer)
            pid = second.get_server_pid()
            await eventually(lambda: _waits_for_lock(db, pid), what="the second writer waiting for the key")
            # The first takes another id now, and commits: the waiting writer's id is bigger.
            late = await q.publish("orders", "k", "first again", conn=first)
            await tx.commit()
        assert result and result[0] > late
    finally:
        for conn in (first, second, other):
            await conn.close()


async def _waits_for_lock(db: asyncpg.Connection, pid: int) -> bool:
    kind = await db.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid)
    return bool(kind == "Lock")


async def test_concurrent_writers_reach_redis_in_commit_order_per_key(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, redis_stream: RedisStream,
    redis_client: aioredis.Redis,
) -> None:
    """Each transaction publishes, dawdles, then counts its key in a ledger row: the row's lock
    orders the counts by commit, so in the stream each key's counts must read 1, 2, 3, ... Were
    ids taken in another order than commits, a later-committed count would come first."""
    keys = [f"k{i}" for i in range(4)]
    await db.execute("CREATE TABLE ledger (key text PRIMARY KEY, n int NOT NULL)")
    await db.executemany("INSERT INTO ledger VALUES ($1, 0)", [(k,) for k in keys])
    rng = random.Random(7)
    relay = q.relay(redis_stream, ["orders"], poll_interval=0.2, lease=5.0)

    async def writer(n: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for _ in range(n):
                key = rng.choice(keys)
                async with conn.transaction():
                    await conn.execute("SELECT pg_sleep($1)", rng.random() * 0.004)
                    event_id = await q.publish("orders", key, None, conn=conn)
                    await conn.execute("SELECT pg_sleep($1)", rng.random() * 0.004)
                    count = await conn.fetchval("UPDATE ledger SET n = n + 1 WHERE key = $1 RETURNING n", key)
                    await conn.execute("UPDATE aioqueue.outbox SET payload = to_jsonb($1::int) WHERE id = $2",
                                       count, event_id)
        finally:
            await conn.close()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            async with anyio.create_task_group() as writers:
                for _ in range(8):
                    writers.start_soon(writer, 40)
            await eventually(lambda: relay.stats.published == 320, timeout=30, what="every event published")
            relay.stop()
    got = await entries(redis_client, redis_stream.key_of("orders"))
    counts: dict[str, list[int]] = {}
    for _, key, payload in got:
        counts.setdefault(key, []).append(int(payload))
    assert {k: v == list(range(1, len(v) + 1)) for k, v in counts.items()} == dict.fromkeys(counts, True)
    assert sum(len(v) for v in counts.values()) == 320
    assert await _outbox(db) == []


# -- relaying to Redis ------------------------------------------------------------------------


async def test_the_relay_publishes_each_event_once_and_deletes_it(
    q: aioqueue.Queue, db: asyncpg.Connection, redis_stream: RedisStream, redis_client: aioredis.Redis
) -> None:
    assert isinstance(redis_stream, Stream) and redis_stream.exactly_once
    ids = await q.publish_many("orders", [(f"k{i % 3}", {"n": i}) for i in range(25)])
    audit = await q.publish("audit", "a", "x")
    status = {r["stream"]: r for r in await q.outbox_status()}
    assert status["orders"]["waiting"] == 25 and status["orders"]["lag"] > 0 and status["orders"]["relay"] is None
    relay = q.relay(redis_stream, ["orders"], batch_size=10)
    stats = await relay.run_until_empty()
    assert (stats.published, stats.duplicates, stats.batches) == (25, 0, 3)
    got = await entries(redis_client, redis_stream.key_of("orders"))
    assert [e[0] for e in got] == ids and json.loads(got[4][2]) == {"n": 4} and got[4][1] == "k1"
    assert [r[0] for r in await _outbox(db)] == [audit]  # only the streams it relays
    status = {r["stream"]: r for r in await q.outbox_status()}
    assert (status["orders"]["waiting"], status["orders"]["lag"], status["orders"]["published"]) == (0, 0.0, 25)
    assert status["orders"]["relay"] is None  # a clean stop ends the lease at once
    assert relay.lag == {"orders": 0.0}


async def test_a_relay_that_dies_after_redis_took_a_batch_sends_nothing_twice(
    q: aioqueue.Queue, redis_stream: RedisStream, redis_client: aioredis.Redis
) -> None:
    ids = await q.publish_many("orders", [(f"k{i % 4}", i) for i in range(20)])
    async with q.pool.acquire() as conn:
        rows = await conn.fetch("SELECT id, key, payload::text, created_at FROM aioqueue.outbox ORDER BY id LIMIT 12")
    # What a relay killed between Redis's answer and its delete had done: published, not deleted.
    taken = [Event(id=r[0], stream="orders", key=r[1], payload=r[2], created_at=r[3]) for r in rows]
    assert await redis_stream.publish(taken) == 12
    stats = await q.relay(redis_stream, ["orders"]).run_until_empty()
    assert (stats.published, stats.duplicates) == (8, 12)
    check_arrivals(await entries(redis_client, redis_stream.key_of("orders")),
                   {f"k{k}": ids[k::4] for k in range(4)})


async def test_a_batch_redis_refuses_stays_in_the_outbox(
    q: aioqueue.Queue, db: asyncpg.Connection, prefix: str, redis_client: aioredis.Redis
) -> None:
    await q.publish_many("orders", [("k", i) for i in range(5)])
    dead = RedisStream(f"redis://127.0.0.1:{free_port()}/0", prefix=prefix, socket_timeout=1.0)
    relay = q.relay(dead, ["orders"], poll_interval=0.05, lease=1.0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(relay.run)
            await eventually(lambda: "orders" in relay.leading, what="the relay leading")
            relay.stop()
    finally:
        await dead.aclose()
    assert relay.stats.published == 0 and len(await _outbox(db)) == 5
    live = RedisStream(REDIS_URL, prefix=prefix)
    try:
        assert (await q.relay(live, ["orders"]).run_until_empty()).published == 5
    finally:
        await live.aclose()
    assert len(await entries(redis_client, prefix + "orders")) == 5


async def test_two_relays_on_one_outbox_never_reorder_a_key(
    q: aioqueue.Queue, redis_stream: RedisStream, redis_client: aioredis.Redis
) -> None:
    """Both run while events are written: one leads, the other stands by. The leader stops
    without a clean end (its lease lapses), and the standby takes over from where it was."""
    first = q.relay(redis_stream, ["orders"], poll_interval=0.05, lease=0.5, name="first")
    second = q.relay(redis_stream, ["orders"], poll_interval=0.05, lease=0.5, name="second")
    committed: dict[str, list[int]] = {}

    async def write(n: int) -> None:
        for i in range(n):
            key = f"k{i % 5}"
            committed.setdefault(key, []).append(await q.publish("orders", key, i))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            first_scope = anyio.CancelScope()

            async def run_first() -> None:
                with first_scope:
                    await first.run()

            tg.start_soon(run_first)
            await eventually(lambda: "orders" in first.leading, what="the first relay leading")
            tg.start_soon(second.run)
            await write(200)
            await eventually(lambda: first.stats.published == 200, what="the leader publishing")
            assert second.stats.published == 0 and "orders" not in second.leading
            first.leading.clear()  # as if it died: no clean end of its lease
            first_scope.cancel()
            await write(200)
            await eventually(lambda: second.stats.published == 200, what="the standby taking over")
            second.stop()
    check_arrivals(await entries(redis_client, redis_stream.key_of("orders")), committed)


def test_relay_options_are_checked(q: aioqueue.Queue) -> None:
    stream = open_stream("redis://127.0.0.1:6379/0")
    with pytest.raises(aioqueue.ConfigurationError, match="at least one outbox stream"):
        q.relay(stream, [])
    with pytest.raises(aioqueue.ConfigurationError, match="batch_size must be a positive int"):
        q.relay(stream, ["s"], batch_size=0)
    with pytest.raises(aioqueue.ConfigurationError, match=r"lease .* longer than poll_interval"):
        q.relay(stream, ["s"], lease=1.0, poll_interval=2.0)
    with pytest.raises(aioqueue.ConfigurationError, match="outbox stream name"):
        q.relay(stream, [""])
    with pytest.raises(aioqueue.ConfigurationError, match=r"a list of outbox stream names, got 'orders'"):
        q.relay(stream, "orders")  # not read as the streams o, r, d, e, s
    with pytest.raises(aioqueue.ConfigurationError, match="names no stream"):
        open_stream("amqp://x")


# -- operating: lag metric, dashboard figure, commands -----------------------------------------


async def test_lag_is_a_metric_and_a_dashboard_figure(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    await q.publish_many("orders", [("k", 1), ("k", 2)])
    await db.execute("UPDATE aioqueue.outbox SET created_at = created_at - interval '90 seconds'")
    metrics = PrometheusMetrics(prometheus_client.CollectorRegistry())
    await metrics.refresh(q)
    lag = metrics.registry.get_sample_value("aioqueue_outbox_lag_seconds", {"stream": "orders"})
    assert lag is not None and 90 <= lag < 120
    assert metrics.registry.get_sample_value("aioqueue_outbox_waiting", {"stream": "orders"}) == 2
    async with dashboard_tools.client_for(create_app(q), SERVED, origin=SERVED) as client:
        page = (await client.get("/")).text
    assert 'data-stream="orders"' in page and "1m3" in page.split('data-stream="orders"')[1].split("</tr>")[0]


async def test_relay_command_serves_probes_registers_and_stops_on_sigterm(
    dsn: str, q: aioqueue.Queue, db: asyncpg.Connection, prefix: str, redis_client: aioredis.Redis, tmp_path: Any
) -> None:
    health = free_port()
    args = ["relay", "--to", REDIS_URL, "--prefix", prefix, "-s", "orders,audit", "--name", "relay-a",
            "--health-port", str(health), "--poll-interval", "0.2"]
    async with cli_process(args, dsn, tmp_path) as (process, output):
        await output.wait_for("relay relay-a started")
        async with httpx.AsyncClient() as http:
            await eventually(lambda: _ready(http, health), what="the relay ready")
        row = await db.fetchrow("SELECT queues, concurrency FROM aioqueue.workers WHERE name = 'relay-a'")
        assert row is not None and sorted(row["queues"]) == ["outbox:audit", "outbox:orders"]
        ids = await q.publish_many("orders", [("k", i) for i in range(10)])
        await eventually(lambda: _count(redis_client, prefix + "orders", 10), what="events in Redis")
        code, out, _ = await aioqueue_cli("outbox", "status", "--json", dsn=dsn)
        assert code == 0 and [r | {"lag": 0} for r in json.loads(out)] == [
            {"stream": "audit", "waiting": 0, "lag": 0, "published": 0, "relay": "relay-a"},
            {"stream": "orders", "waiting": 0, "lag": 0, "published": 10, "relay": "relay-a"},
        ]
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await process.wait() == 0
    assert [e[0] for e in await entries(redis_client, prefix + "orders")] == ids
    assert await db.fetchval("SELECT count(*) FROM aioqueue.workers") == 0
    code, out, _ = await aioqueue_cli("outbox", "status", dsn=dsn)
    assert code == 0 and out.split("\n")[2].split() == ["orders", "0", "0.0s", "10", "-"]
    code, _, err = await aioqueue_cli("relay", "--to", "nats://x", "-s", "orders", dsn=dsn)
    assert code == 2 and "names no stream" in err


async def _ready(http: httpx.AsyncClient, port: int) -> bool:
    try:
        return (await http.get(f"http://127.0.0.1:{port}/ready")).status_code == 200
    except httpx.HTTPError:
        return False


async def _count(client: aioredis.Redis, key: str, n: int) -> bool:
    return bool(await client.xlen(key) >= n)
