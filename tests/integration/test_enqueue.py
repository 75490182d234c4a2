"""Enqueueing: transactional, bulk in one round trip, and refusing bad input before writing."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import aioqueue
from tests.support.helpers import eventually, noop_task


def _register(q: aioqueue.Queue) -> aioqueue.Task[..., None]:
    @q.task(queue="email")
    async def send_email(order_id: int) -> None:
        pass

    return send_email


async def _listen(dsn: str, channel: str) -> tuple[asyncpg.Connection, list[str], anyio.Event]:
    conn = await asyncpg.connect(dsn)
    received: list[str] = []
    marker = anyio.Event()

    def on(_c: object, _pid: int, _ch: str, payload: object) -> None:
        assert isinstance(payload, str)
        received.append(payload)
        if payload == "marker":
            marker.set()

    await conn.add_listener(channel, on)
    return conn, received, marker


@pytest.mark.parametrize("bulk", [False, True], ids=["one", "bulk"])
async def test_rolled_back_enqueue_leaves_no_job_and_no_notification(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, bulk: bool
) -> None:
    send_email = _register(q)
    listener, received, marker = await _listen(dsn, q.channel)
    try:
        async def order_then_fail() -> None:
            async with db.transaction():
                await db.execute("CREATE TABLE orders (id int)")
                if bulk:
                    await send_email.enqueue_many([{"order_id": i} for i in range(100)], conn=db)
                else:
                    await send_email.options(conn=db).enqueue(order_id=1)
                raise RuntimeError("declined")

        with pytest.raises(RuntimeError, match="declined"):
            await order_then_fail()
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
        assert await db.fetchval("SELECT to_regclass('orders')") is None
        # A marker sent after the rollback arrives; nothing arrived before it.
        await db.execute("SELECT pg_notify($1, 'marker')", q.channel)
        with anyio.fail_after(5):
            await marker.wait()
        assert received == ["marker"]
    finally:
        await listener.close()


@pytest.mark.parametrize("bulk", [False, True], ids=["one", "bulk"])
async def test_committed_enqueue_notifies_once_and_runs(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, bulk: bool
) -> None:
    ran = anyio.Event()

    @q.task(queue="email")
    async def send_email(order_id: int) -> None:
        assert order_id == 7
        ran.set()

    listener, received, marker = await _listen(dsn, q.channel)
    try:
        async with db.transaction():
            await db.execute("CREATE TABLE orders (id int)")
            await db.execute("INSERT INTO orders VALUES (7)")
            if bulk:
                [job_id] = await send_email.enqueue_many([{"order_id": 7}], conn=db)
            else:
                job_id = await send_email.options(conn=db).enqueue(order_id=7)
        await db.execute("SELECT pg_notify($1, 'marker')", q.channel)
        with anyio.fail_after(5):
            await marker.wait()
        assert received == ["email", "marker"]
        stats = await q.worker().run_until_empty()
        assert ran.is_set()
        assert stats.succeeded == 1
        assert await q.get_job(job_id) is None  # finished jobs are deleted
    finally:
        await listener.close()


async def test_bulk_enqueue_of_10000_takes_the_round_trips_of_10(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    statements: list[str] = []
    db.add_query_logger(lambda record: statements.append(record.query))

    async def logged(n: int) -> list[aioqueue.JobRef]:
        statements.clear()
        async with db.transaction():
            ids = await send_email.enqueue_many([{"order_id": i} for i in range(n)], conn=db)
        await anyio.lowlevel.checkpoint()  # asyncpg calls query loggers on the next loop tick
        return ids

    await logged(1)  # asyncpg looks up the types of a connection's first statements once
    await logged(10)
    for_ten = list(statements)
    ids = await logged(10_000)
    # BEGIN, one statement for every job (and the NOTIFY), COMMIT.
    assert statements == for_ten and len(statements) == 3, statements
    assert statements[0] == "BEGIN;" and statements[2] == "COMMIT;"
    assert len(ids) == len(set(ids)) == 10_000
    rows = await db.fetch("SELECT id, args FROM aioqueue.jobs ORDER BY id")
    by_id = {r["id"]: json.loads(r["args"])["order_id"] for r in rows}
    assert [by_id[i] for i in ids] == list(range(10_000))  # ids come back in input order
    # Each id is an int that follows its job on this queue.
    assert all(isinstance(i, aioqueue.JobRef) and i.queue is q for i in ids)
    assert (await ids[7].info()).args == {"order_id": 7}  # type: ignore[union-attr]


async def test_single_enqueue_is_one_statement(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    async with db.transaction():  # a connection's first job asks once which database it reaches
        await send_email.options(conn=db).enqueue(order_id=0)
    statements: list[str] = []
    db.add_query_logger(lambda record: statements.append(record.query))
    async with db.transaction():
        await send_email.options(conn=db).enqueue(order_id=1)
    await anyio.lowlevel.checkpoint()
    assert statements[0] == "BEGIN;" and statements[2] == "COMMIT;" and len(statements) == 3


async def test_enqueue_options_are_stored(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    job_id = await send_email.options(delay=60, priority=5, max_attempts=9, queue="other").enqueue(order_id=3)
    row = await db.fetchrow(
        "SELECT *, extract(epoch FROM run_at - created_at) AS wait FROM aioqueue.jobs WHERE id = $1", job_id
    )
    assert row is not None
    assert (row["queue"], row["task"], row["priority"], row["max_attempts"]) == ("other", "send_email", 5, 9)
    assert json.loads(row["args"]) == {"order_id": 3}
    assert 59.0 <= row["wait"] <= 61.0  # database time: now() at insert plus the delay
    when = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    later = await send_email.options(run_at=when).enqueue(order_id=4)
    assert await db.fetchval("SELECT run_at FROM aioqueue.jobs WHERE id = $1", later) == when


async def test_dedup_key_returns_the_live_job(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    first = await send_email.options(key="order-1").enqueue(order_id=1)
    again = await send_email.options(key="order-1").enqueue(order_id=1)
    other = await send_email.options(key="order-2").enqueue(order_id=2)
    assert first == again != other
    with pytest.raises(aioqueue.ConfigurationError, match="enqueue_many cannot give one dedup key to many jobs"):
        await send_email.options(key="order-3").enqueue_many([{"order_id": 3}, {"order_id": 4}])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 2


async def test_enqueue_many_takes_a_dedup_key_per_item(q: aioqueue.Queue, dsn: str, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    live = await send_email.options(key="k-live").enqueue(order_id=0)
    gone = await send_email.options(key="k-dead").enqueue(order_id=0)
    await db.execute("UPDATE aioqueue.jobs SET status = 'dead' WHERE id = $1", gone)  # a dead job's key is free
    listener, received, marker = await _listen(dsn, q.channel)
    try:
        ids = await send_email.enqueue_many(
            [{"order_id": n} for n in range(1, 8)],
            keys=[None, "k-live", "k-new", "k-new", None, "k-dead", "k-new"],
        )
        await db.execute("SELECT pg_notify($1, 'marker')", q.channel)
        with anyio.fail_after(10):
            await marker.wait()
    finally:
        await listener.close()
    assert received == ["email", "marker"]  # one NOTIFY for the batch
    assert ids[1] == live  # the live job's id, and that job is untouched
    assert ids[2] == ids[3] == ids[6]  # the batch's first item of a key is written, the others get its id
    assert len({ids[0], ids[2], ids[4], ids[5], live, gone}) == 6
    assert ids[0] < ids[4]  # new jobs without a key come in the order given
    rows = await db.fetch("SELECT id, args->>'order_id' AS n, dedup_key FROM aioqueue.jobs ORDER BY id")
    assert {(r["id"], r["n"], r["dedup_key"]) for r in rows} == {
        (live, "0", "k-live"),
        (gone, "0", "k-dead"),
        (ids[0], "1", None),
        (ids[2], "3", "k-new"),
        (ids[4], "5", None),
        (ids[5], "6", "k-dead"),
    }
    assert all(isinstance(i, aioqueue.JobRef) for i in ids)
    # A key is a key across concurrent batches too: the second waits for the first to commit.
    other = await asyncpg.connect(dsn)
    second: list[int] = []

    async def enqueue_second() -> None:
        async with other.transaction():
            second.extend(await send_email.enqueue_many([{"order_id": 10}] * 2, keys=["b", "c"], conn=other))

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg, db.transaction():
                first = await send_email.enqueue_many([{"order_id": 8}, {"order_id": 9}], keys=["a", "b"], conn=db)
                tg.start_soon(enqueue_second)

                async def second_waits() -> bool:
                    sql = "SELECT $2 = ANY(pg_blocking_pids($1))"
                    return bool(await db.fetchval(sql, other.get_server_pid(), db.get_server_pid()))

                await eventually(second_waits, what="the second batch to wait on the first's key")
                # Asked while the first is open: once it commits, the second may finish at once.
                assert not second
    finally:
        await other.close()
    assert second[0] == first[1] and second[1] not in first
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE dedup_key IN ('a', 'b', 'c')") == 3


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["a"], "task 'send_email': enqueue_many: 1 keys for 2 items; give one key"),
        ("ab", "keys must be a list of one dedup key"),
        (["a", ""], "enqueue_many: item 2 of 2: dedup key must be a non-empty str"),
        ([7, "a"], "enqueue_many: item 1 of 2: dedup key must be a non-empty str, got 7"),
        (["a", "€" * 700], "enqueue_many: item 2 of 2: dedup key is 2100 bytes in UTF-8; the limit is 2000"),
        (["a", "x" * 1001], "enqueue_many: item 2 of 2: dedup key is 1001 characters long"),
    ],
)
async def test_bad_keys_in_bulk_are_refused_naming_the_item(
    q: aioqueue.Queue, db: asyncpg.Connection, keys: Any, message: str
) -> None:
    send_email = _register(q)
    with pytest.raises(aioqueue.ConfigurationError) as info:
        await send_email.enqueue_many([{"order_id": 1}, {"order_id": 2}], keys=keys)
    assert message in str(info.value)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_a_batch_over_one_statement_is_written_all_or_nothing_in_order_with_one_notify(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    from aioqueue._enqueue import CHUNK

    send_email = _register(q)
    n = 2 * CHUNK + 7  # three statements
    listener, received, marker = await _listen(dsn, q.channel)
    try:
        ids = await send_email.enqueue_many([{"order_id": i} for i in range(n)])
        await db.execute("SELECT pg_notify($1, 'marker')", q.channel)
        with anyio.fail_after(10):
            await marker.wait()
    finally:
        await listener.close()
    assert received == ["email", "marker"]
    assert len(ids) == n and ids == sorted(ids)
    rows = await db.fetch("SELECT id, (args->>'order_id')::int AS n FROM aioqueue.jobs ORDER BY id")
    assert [(r["id"], r["n"]) for r in rows] == list(zip(ids, range(n), strict=True))
    # A refused item in a later statement's share is named by its place in the whole call.
    bad: list[dict[str, Any]] = [{"order_id": i} for i in range(n)]
    bad[2 * CHUNK + 3] = {"order_id": math.inf}
    with pytest.raises(aioqueue.JobArgumentsError, match=rf"enqueue_many: item {2 * CHUNK + 4} of {n}: "):
        await send_email.enqueue_many(bad)
    # The server refusing the last statement takes back the ones before it, pooled or in a
    # caller's transaction, with or without keys.
    await db.execute("DELETE FROM aioqueue.jobs")
    await db.execute(
        """CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN IF NEW.args->>'order_id' = '-1' THEN RAISE EXCEPTION 'refused row'; END IF; RETURN NEW; END $$;
           CREATE TRIGGER refuse BEFORE INSERT ON aioqueue.jobs FOR EACH ROW EXECUTE FUNCTION refuse();"""
    )
    last_refused = [{"order_id": i} for i in range(n - 1)] + [{"order_id": -1}]
    keys: list[str | None] = [f"k{i}" for i in range(n)]
    with pytest.raises(asyncpg.RaiseError, match="refused row"):
        await send_email.enqueue_many(last_refused)
    with pytest.raises(asyncpg.RaiseError, match="refused row"):
        await send_email.enqueue_many(last_refused, keys=keys)
    other = await asyncpg.connect(dsn)
    try:
        with pytest.raises(asyncpg.RaiseError, match="refused row"):
            async with other.transaction():
                await send_email.enqueue_many(last_refused, conn=other)
    finally:
        await other.close()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    # With keys over several statements: ids in order, repeats and live keys resolved across them.
    await db.execute("DROP TRIGGER refuse ON aioqueue.jobs")
    live = await send_email.options(key="k1").enqueue(order_id=-2)
    keys[CHUNK + 10] = "k3"  # repeats a key of the first statement's share
    keys[2 * CHUNK + 1] = None
    ids = await send_email.enqueue_many([{"order_id": i} for i in range(n)], keys=keys)
    assert ids[1] == live and ids[CHUNK + 10] == ids[3] and len(set(ids)) == n - 1
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == n - 1


class _NotJson:
    pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "missing a required argument: 'order_id'"),
        ({"order_id": 1, "extra": 2}, "unexpected keyword argument 'extra'"),
        ({"order_id": _NotJson()}, "argument 'order_id' is of type _NotJson"),
        ({"order_id": math.nan}, "argument 'order_id' is nan"),
        ({"order_id": "a\x00b"}, "argument 'order_id' contains a NUL character"),
        ({"order_id": "\ud800"}, "argument 'order_id' contains an unpaired surrogate"),
        ({"order_id": {(1, 2): "x"}}, "has a key (1, 2) of type tuple"),
    ],
)
async def test_bad_arguments_fail_at_enqueue_naming_task_and_argument(
    q: aioqueue.Queue, db: asyncpg.Connection, kwargs: dict[str, Any], message: str
) -> None:
    send_email = _register(q)
    with pytest.raises(aioqueue.JobArgumentsError) as info:
        await send_email.enqueue(**kwargs)
    assert "task 'send_email'" in str(info.value)
    assert message in str(info.value)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_bad_item_in_bulk_writes_nothing(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    send_email = _register(q)
    with pytest.raises(aioqueue.JobArgumentsError, match=r"enqueue_many: item 3 of 3: .*'order_id'"):
        await send_email.enqueue_many([{"order_id": 1}, {"order_id": 2}, {"order_id": object()}])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_oversized_payload_is_refused(dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(dsn, max_payload_bytes=1000) as q:
        big = noop_task(q, "big")
        await big.enqueue(blob="x" * 900)
        with pytest.raises(aioqueue.PayloadTooLargeError, match="over the limit of 1000"):
            await big.enqueue(blob="x" * 1001)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delay": -1}, "delay must be"),
        ({"delay": math.inf}, "delay must be"),
        ({"priority": 2**40}, "priority must be"),
        ({"priority": "high"}, "priority must be"),
        ({"max_attempts": 0}, "max_attempts must be"),
        ({"queue": ""}, "queue name must be"),
        ({"queue": "x" * 300}, "queue name is 300 characters"),
        ({"key": "a\x00"}, "dedup key"),
        ({"run_at": datetime.datetime(2030, 1, 1)}, "timezone-aware"),
    ],
)
def test_bad_options_are_refused(q: aioqueue.Queue, options: dict[str, Any], message: str) -> None:
    send_email = _register(q)
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        send_email.options(**options)


def test_task_definitions_are_checked(q: aioqueue.Queue) -> None:
    def sync(x: int) -> None:
        pass

    with pytest.raises(aioqueue.ConfigurationError, match="not an async function"):
        q.task(sync)  # type: ignore[arg-type]

    async def positional(x: int, /) -> None:
        pass

    with pytest.raises(aioqueue.ConfigurationError, match="positional-only"):
        q.task(positional)

    async def dup() -> None:
        pass

    q.task(dup)
    with pytest.raises(aioqueue.ConfigurationError, match="already registered"):
        q.task(dup)
