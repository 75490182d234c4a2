"""Periodic jobs: each slot enqueued once across workers, missed slots by policy."""

from __future__ import annotations

import datetime

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._periodic import Periodic, Scheduler
from tests.support.helpers import eventually, running

UTC = datetime.UTC


def test_slots() -> None:
    q = aioqueue.Queue("postgresql://localhost/x")

    @q.periodic("*/5 * * * *")
    async def every_five() -> None:
        pass

    p = q.periodics["every_five"]
    at = datetime.datetime(2026, 12, 2, 12, 7, 30, tzinfo=UTC)
    assert p.slot(at) == datetime.datetime(2026, 12, 2, 12, 5, tzinfo=UTC)
    assert p.slot(datetime.datetime(2026, 12, 2, 12, 10, tzinfo=UTC)).minute == 10  # on the slot itself
    assert p.next_slot(at) == datetime.datetime(2026, 12, 2, 12, 10, tzinfo=UTC)

    @q.periodic(every=30)
    async def half_minute() -> None:
        pass

    h = q.periodics["half_minute"]
    assert h.slot(at) == datetime.datetime(2026, 12, 2, 12, 7, 30, tzinfo=UTC)
    assert h.next_slot(at) == datetime.datetime(2026, 12, 2, 12, 8, tzinfo=UTC)


def test_bad_schedules_are_refused() -> None:
    q = aioqueue.Queue("postgresql://localhost/x")

    async def f(x: int) -> None:
        pass

    with pytest.raises(aioqueue.ConfigurationError, match="not a valid cron"):
        q.periodic("every tuesday")(f)
    with pytest.raises(aioqueue.ConfigurationError, match="not both"):
        q.periodic("* * * * *", every=5, name="g")(f)
    with pytest.raises(aioqueue.JobArgumentsError, match="missing a required argument"):
        q.periodic(every=5, name="h")(f)  # no kwargs for its required argument


async def test_each_slot_enqueued_once_across_workers(dsn: str, db: asyncpg.Connection) -> None:
    queues = [aioqueue.Queue(dsn) for _ in range(3)]
    for queue in queues:

        @queue.periodic(every=1, name="tick", archive=True)
        async def tick() -> None:
            pass

    async with anyio.create_task_group() as tg:
        workers = []
        for queue in queues:
            await queue.open()
            worker = queue.worker(poll_interval=0.05)
            workers.append(worker)
            tg.start_soon(worker.run)

        async def enough() -> bool:
            return bool(await db.fetchval("SELECT count(*) >= 3 FROM aioqueue.jobs_done WHERE task = 'tick'"))

        await eventually(enough, timeout=20, what="three periodic slots to run")
        for worker in workers:
            worker.stop()
    for queue in queues:
        await queue.close()
    keys = [r["dedup_key"] for r in await db.fetch("SELECT dedup_key FROM aioqueue.jobs_done WHERE task = 'tick'")]
    pending = await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE task = 'tick'")
    assert len(keys) == len(set(keys))  # no slot ran twice
    assert all(k.startswith("periodic:tick:") for k in keys)
    assert pending <= 1


async def _scheduler(q: aioqueue.Queue, missed: str, grace: float = 60.0) -> Scheduler:
    @q.task(name=f"yearly_{missed}")
    async def yearly() -> None:
        pass

    p = Periodic(
        name=yearly.name, task=yearly, cron="0 0 1 1 *", every=None, missed=missed,  # type: ignore[arg-type]
        misfire_grace=grace, kwargs={},
    )
    return Scheduler(q.database, [p])


@pytest.mark.parametrize(("missed", "expected"), [("once", 1), ("skip", 0)])
async def test_missed_slot_policy(q: aioqueue.Queue, db: asyncpg.Connection, missed: str, expected: int) -> None:
    scheduler = await _scheduler(q, missed)
    await scheduler.tick()  # first sight: records the current slot, enqueues nothing
    assert scheduler.enqueued == 0
    # Every worker was down for over a year: the slot of this January was missed.
    await db.execute("UPDATE aioqueue.periodic SET last_slot = last_slot - interval '1 year'")
    await scheduler.tick()
    await scheduler.tick()
    assert scheduler.enqueued == expected
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == expected


async def test_concurrent_ticks_enqueue_a_slot_once(dsn: str, q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    first = await _scheduler(q, "once")
    await first.tick()
    await db.execute("UPDATE aioqueue.periodic SET last_slot = last_slot - interval '1 year'")
    queues = [aioqueue.Queue(dsn) for _ in range(5)]
    schedulers = [await _scheduler(queue, "once") for queue in queues]
    async with anyio.create_task_group() as tg:
        for queue, scheduler in zip(queues, schedulers, strict=True):
            await queue.open()
            tg.start_soon(scheduler.tick)
    for queue in queues:
        await queue.close()
    assert sum(s.enqueued for s in schedulers) == 1
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1


async def test_periodic_job_runs_in_a_worker(q: aioqueue.Queue) -> None:
    ran = anyio.Event()

    @q.periodic(every=1, kwargs={"greeting": "hi"})
    async def hello(greeting: str) -> None:
        assert greeting == "hi"
        ran.set()

    async with running(q.worker(poll_interval=0.05)):
        with anyio.fail_after(10):
            await ran.wait()


def test_periodic_arguments_and_grace_are_checked_at_registration() -> None:
    q = aioqueue.Queue("postgresql://localhost/x")

    async def f(x: object = None) -> None:
        pass

    with pytest.raises(aioqueue.JobArgumentsError, match="argument 'x' is of type object, which is not JSON"):
        q.periodic(every=5, name="a", kwargs={"x": object()})(f)
    with pytest.raises(aioqueue.JobArgumentsError, match="unexpected keyword argument 'y'"):
        q.periodic(every=5, name="b", kwargs={"y": 1})(f)
    # app.py registers the task before the schedule is checked: each attempt needs its own name.
    for i, grace in enumerate((-1, float("nan"), "5", 10**400)):
        with pytest.raises(aioqueue.ConfigurationError, match="misfire_grace must be 0 to ten years in seconds"):
            q.periodic(every=5, name=f"c{i}", misfire_grace=grace)(f)  # type: ignore[arg-type]
    with pytest.raises(aioqueue.ConfigurationError, match="every= must be 1 second to a year, got True"):
        q.periodic(every=True, name="d")(f)
    assert q.periodics == {}
    q.periodic(every=5, name="e", kwargs={"x": [1, "two"]}, misfire_grace=0)(f)
    assert list(q.periodics) == ["e"]
