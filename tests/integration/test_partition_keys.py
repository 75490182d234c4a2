"""Partition keys against the real server: the key a job gets at enqueue, per-key concurrency
limits that hold across workers and let other keys through, freed-slot wake-ups per key, keys
claimed in turn (fairness) with priorities first, and bad keys and limits refused at the call."""

from __future__ import annotations

import collections
import contextlib
import math
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.helpers import eventually, running


async def _keys(db: asyncpg.Connection) -> list[str | None]:
    return [r["partition_key"] for r in await db.fetch("SELECT partition_key FROM aioqueue.jobs ORDER BY id")]


async def test_the_key_is_stored_from_each_python_call(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task(name="bill")
    async def bill(n: int) -> None:
        pass

    await bill.options(partition_key="acme").enqueue(n=1)
    await bill.options(partition_key="globex").enqueue_many([{"n": 2}, {"n": 3}])
    await q.enqueue_by_name("bill", {"n": 4}, partition_key="initech")
    await q.enqueue_many_by_name("bill", [{"n": 5}], partition_key="umbrella", keys=["d5"])
    await bill.enqueue(n=6)
    async with db.transaction():
        await bill.options(conn=db, partition_key="hooli").enqueue(n=7)
    assert await _keys(db) == ["acme", "globex", "globex", "initech", "umbrella", None, "hooli"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "partition key must be a non-empty str"),
        ("x" * 256, "partition key is 256 characters long; the limit is 255"),
        ("é" * 255, None),  # 510 bytes: allowed
        ("\U0001f600" * 251, "partition key is 1004 bytes in UTF-8; the limit is 1000"),
        ("a\x00b", "contains a NUL character"),
        (5, "partition key must be a non-empty str"),
        (b"acme", "partition key must be a non-empty str"),
    ],
)
async def test_bad_keys_are_refused_at_the_call_and_nothing_is_written(
    q: aioqueue.Queue, db: asyncpg.Connection, bad: Any, message: str | None
) -> None:
    @q.task(name="bill")
    async def bill() -> None:
        pass

    if message is None:  # the control: an allowed key goes through
        await bill.options(partition_key=bad).enqueue()
        assert await _keys(db) == [bad]
        return
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        bill.options(partition_key=bad)
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.enqueue_by_name("bill", {}, partition_key=bad)
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.enqueue_many_by_name("bill", [{}], partition_key=bad)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": -1}, "per-key concurrency must be"),
        ({"concurrency": math.nan}, "per-key concurrency must be"),
        ({"concurrency": 1.5}, "per-key concurrency must be"),
        ({"concurrency": True}, "per-key concurrency must be"),
        ({"concurrency": 10**7}, "per-key concurrency must be"),
        ({"fair": "yes"}, "fair must be True or False"),
        ({"fair": None}, "fair must be True or False"),
    ],
)
async def test_bad_key_limits_are_refused_and_nothing_is_written(
    q: aioqueue.Queue, db: asyncpg.Connection, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.set_key_limits("mail", **options)
    with pytest.raises(aioqueue.ConfigurationError, match="queue name"):
        await q.set_key_limits("", concurrency=1)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.queues") == 0
    await q.set_key_limits("mail", concurrency=2)  # the control
    assert [(s["fair"], s["key_concurrency_limit"]) for s in await q.queue_settings()] == [(False, 2)]


class Exclusive:
    """Counts the jobs of each key running at once, as the handlers see them."""

    def __init__(self) -> None:
        self.now: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.done = 0

    @contextlib.contextmanager
    def holding(self, key: str) -> Any:
        self.now[key] += 1
        self.peak[key] = max(self.peak[key], self.now[key])
        try:
            yield
        finally:
            self.now[key] -= 1
            self.done += 1


async def test_per_key_concurrency_holds_across_workers_and_queues_instances(dsn: str) -> None:
    seen = Exclusive()
    queues = [aioqueue.Queue(dsn) for _ in range(3)]
    for queue in queues:

        @queue.task(name="sync", queue="tenants")
        async def sync(key: str) -> None:
            with seen.holding(key):
                await anyio.sleep(0.1)  # long enough for a second job of the key to start

    await queues[0].set_key_limits("tenants", concurrency=2)
    keys = [f"tenant-{i}" for i in range(8)]
    async with contextlib.AsyncExitStack() as stack:
        for queue in queues:
            await stack.enter_async_context(queue)
        task = queues[0].tasks["sync"]
        for key in keys:
            await task.options(partition_key=key).enqueue_many([{"key": key}] * 10)
        for queue in queues:
            await stack.enter_async_context(running(queue.worker(concurrency=8, poll_interval=0.05)))
        await eventually(lambda: seen.done == 80, timeout=60, what="every job")
    assert max(seen.peak.values()) == 2  # reached, never passed
    assert set(seen.peak) == set(keys)


async def test_a_key_at_its_limit_holds_back_only_its_own_jobs(q: aioqueue.Queue) -> None:
    release = anyio.Event()
    ran: list[str] = []

    @q.task(queue="tenants")
    async def work(key: str) -> None:
        ran.append(key)
        if key == "busy":
            with anyio.fail_after(20):
                await release.wait()

    await q.set_key_limits("tenants", concurrency=1)
    await work.options(partition_key="busy").enqueue_many([{"key": "busy"}] * 3)
    await work.options(partition_key="calm").enqueue_many([{"key": "calm"}] * 5)
    worker = q.worker(concurrency=4, poll_interval=0.05)
    async with running(worker):
        await eventually(lambda: ran.count("calm") == 5, what="the other key's jobs")
        assert ran.count("busy") == 1  # its limit holds the other two back
        release.set()
        await eventually(lambda: worker.stats.succeeded == 8, what="all jobs")


async def test_a_freed_slot_of_a_key_wakes_workers_without_a_poll(dsn: str) -> None:
    """Two workers in two Queue instances, polling once a minute: the second job of a key at its
    limit starts as soon as the first ends, on whichever worker."""
    release = anyio.Event()
    started: list[int] = []
    async with aioqueue.Queue(dsn) as a, aioqueue.Queue(dsn) as b:
        for queue in (a, b):

            @queue.task(name="step", queue="tenants")
            async def step(n: int) -> None:
                started.append(n)
                if n == 1:
                    with anyio.fail_after(20):
                        await release.wait()

        await a.set_key_limits("tenants", concurrency=1)
        await a.tasks["step"].options(partition_key="acme").enqueue_many([{"n": 1}, {"n": 2}])
        async with running(a.worker(poll_interval=60)), running(b.worker(poll_interval=60)):
            await eventually(lambda: started == [1], what="the first job")
            await anyio.sleep(0.2)  # give a wrong second start the time to show
            assert started == [1]
            release.set()
            await eventually(lambda: started == [1, 2], timeout=10, what="the held-back job, well before a poll")


async def test_keys_take_turns_so_a_flood_does_not_delay_the_others(q: aioqueue.Queue) -> None:
    ran: list[str] = []

    @q.task(queue="tenants")
    async def work(key: str) -> None:
        ran.append(key)

    await q.set_key_limits("tenants", fair=True)
    await work.options(partition_key="flood").enqueue_many([{"key": "flood"}] * 200)
    for i in range(5):
        await work.options(partition_key=f"small-{i}").enqueue_many([{"key": f"small-{i}"}] * 2)
    await work.enqueue(key="none")  # no key: runs in the room the keys leave
    await q.worker(concurrency=1, prefetch=0).run_until_empty()
    assert len(ran) == 211
    # Round robin: every small key's first job within the first round of 6 keys, its second in
    # the second round; the flood gets one turn per round.
    assert set(ran[:6]) == {"flood", *(f"small-{i}" for i in range(5))}
    assert sorted(ran[6:12]) == sorted(ran[:6])
    assert ran[12:].count("flood") == len(ran[12:]) - 1
    # Without fairness the same jobs run first in, first out.
    await q.set_key_limits("tenants", fair=False)
    ran.clear()
    await work.options(partition_key="flood").enqueue_many([{"key": "flood"}] * 20)
    await work.options(partition_key="small-0").enqueue(key="small-0")
    await q.worker(concurrency=1, prefetch=0).run_until_empty()
    assert ran == ["flood"] * 20 + ["small-0"]


async def test_a_higher_priority_goes_first_across_keys_then_keys_take_turns(q: aioqueue.Queue) -> None:
    ran: list[tuple[str, int]] = []

    @q.task(queue="tenants")
    async def work(key: str, p: int) -> None:
        ran.append((key, p))

    await q.set_key_limits("tenants", fair=True)
    await work.options(partition_key="a").enqueue_many([{"key": "a", "p": 0}] * 3)
    await work.options(partition_key="b", priority=5).enqueue_many([{"key": "b", "p": 5}] * 2)
    await work.options(partition_key="c", priority=5).enqueue(key="c", p=5)
    await q.worker(concurrency=1, prefetch=0).run_until_empty()
    assert [p for _, p in ran] == [5, 5, 5, 0, 0, 0]
    assert [k for k, _ in ran[:3]].count("b") == 2
    assert ran[1][0] != ran[0][0]  # b and c take turns at priority 5


async def test_the_keyed_claim_is_one_round_whatever_the_batch(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A claim of many jobs from few keys goes round the keys again; the cursor carries the turn
    to the next claim, in any process."""
    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    for key in ("a", "b", "c"):
        await work.options(partition_key=key).enqueue_many([{}] * 4)
    async with db.transaction():
        rows = await db.fetch(
            "SELECT j.partition_key FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[5], 'w', 30, 5, NULL) AS c "
            "JOIN aioqueue.jobs AS j ON j.id = c.id ORDER BY c.id")
    assert collections.Counter(r["partition_key"] for r in rows) == {"a": 2, "b": 2, "c": 1}
    assert await db.fetchval("SELECT key_cursor FROM aioqueue.queues WHERE name = 'tenants'") == "b"
    async with db.transaction():
        rows = await db.fetch(
            "SELECT j.partition_key FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[1], 'w', 30, 1, NULL) AS c "
            "JOIN aioqueue.jobs AS j ON j.id = c.id")
    assert [r["partition_key"] for r in rows] == ["c"]


async def test_sql_functions_take_a_key_and_refuse_bad_ones(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    await db.execute("SELECT aioqueue.add_job('bill', '{}', 'mail', partition_key => 'acme')")
    await db.execute("""SELECT aioqueue.add_jobs('[{"task": "bill", "queue": "mail", "partition_key": "globex"},
                                               {"task": "bill", "queue": "mail"},
                                               {"task": "bill", "queue": "mail", "partition_key": "k",
                                                "dedup_key": "d"}]')""")
    assert await _keys(db) == ["acme", "globex", None, "k"]
    refused = [
        ("SELECT aioqueue.add_job('bill', '{}', 'mail', partition_key => '')", "must be a non-empty str"),
        ("SELECT aioqueue.add_job('bill', '{}', 'mail', partition_key => repeat('x', 256))",
         "partition key is 256 characters long; the limit is 255"),
        ("SELECT aioqueue.add_job('bill', '{}', 'mail', partition_key => repeat('\U0001f600', 251))",
         "partition key is 1004 bytes in UTF-8; the limit is 1000"),
        ("""SELECT aioqueue.add_jobs('[{"task": "bill", "queue": "mail"}, {"task": "bill", "queue": "mail",
                                     "partition_key": 5}]')""", "job 2 of 2: partition_key must be a string"),
        ("""SELECT aioqueue.add_jobs('[{"task": "bill", "queue": "mail", "partition_key": ""}]')""",
         "job 1 of 1: partition key must be a non-empty str"),
    ]
    for sql, message in refused:
        with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
            await db.execute(sql)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 4
