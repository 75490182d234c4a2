"""The hand-over of claimed jobs to runners: a claim reaches every idle runner, runners idle
again after one burst take the next, and an idle slot never starts a runner of its own."""

from __future__ import annotations

import asyncio
import gc

import anyio

import aioqueue
from tests.support.helpers import eventually, holding_task, running


async def test_a_claim_reaches_every_idle_runner(q: aioqueue.Queue) -> None:
    # Each job waits until all of its burst run at once: that happens only if the hand-over
    # wakes every idle runner, not one runner per claim.
    n = 200
    started = {1: 0, 2: 0}
    together = {1: anyio.Event(), 2: anyio.Event()}

    @q.task
    async def gather(burst: int) -> None:
        started[burst] += 1
        if started[burst] == n:
            together[burst].set()
        with anyio.fail_after(20):
            await together[burst].wait()

    worker = q.worker(concurrency=n, prefetch=0)
    async with running(worker):
        await gather.enqueue_many([{"burst": 1}] * n)
        with anyio.fail_after(20):
            await together[1].wait()
        await eventually(lambda: worker.stats.succeeded == n, what="the first burst to finish")
        # Every runner now waits for work: the second burst must reach all of them again.
        await gather.enqueue_many([{"burst": 2}] * n)
        with anyio.fail_after(20):
            await together[2].wait()
        await eventually(lambda: worker.stats.succeeded == 2 * n, what="the second burst to finish")


async def test_runners_start_only_for_slots_in_use(q: aioqueue.Queue) -> None:
    started = 0
    all_in, release = anyio.Event(), anyio.Event()

    @q.task
    async def hold() -> None:
        nonlocal started
        started += 1
        if started == 3:
            all_in.set()
        with anyio.fail_after(20):
            await release.wait()

    await hold.enqueue_many([{}] * 3)
    worker = q.worker(concurrency=10_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run_until_empty)
        with anyio.fail_after(20):
            await all_in.wait()
        # A runner a job in use and the worker's few services: not a task per slot of 10,000.
        assert len(asyncio.all_tasks()) < 50
        release.set()
    assert worker.stats.succeeded == 3


async def test_no_op_jobs_at_a_thousand_slots_start_few_runners(q: aioqueue.Queue) -> None:
    # Jobs that finish without an await are run by the runners already awake: a claim of a
    # thousand of them must not start a runner per slot, work per slot that no-op jobs would
    # pay per job.
    tasks: list[int] = []

    @q.task
    async def quick(i: int) -> None:
        if i % 100 == 0:
            tasks.append(len(asyncio.all_tasks()))

    n = 3000
    await quick.enqueue_many([{"i": i} for i in range(n)])
    worker = q.worker(concurrency=1000)
    stats = await worker.run_until_empty()
    assert stats.succeeded == n
    # The runners and the worker's few services, not a thousand runners.
    assert max(tasks) < 200, f"{max(tasks)} tasks while {n} no-op jobs ran at concurrency 1000"


async def test_a_busy_slot_holds_few_objects_for_the_collector(q: aioqueue.Queue) -> None:
    # Every object a busy slot holds is walked by the collections that run while it waits, so
    # what a slot holds is work that grows with the slots. A busy slot holds its runner task,
    # the handler's coroutine and what it awaits, the job and its attempt; not also a task
    # group's handle, cancel scope and event per runner (twice as many objects in all).
    slots = 500
    holding = holding_task(q, slots, timeout=None)  # released in the finally below
    await holding.task.enqueue_many([{"i": i} for i in range(slots)])
    worker = q.worker(concurrency=slots)
    gc.collect()
    before = len(gc.get_objects())
    try:
        async with running(worker):
            with anyio.fail_after(30):
                await holding.all_in.wait()
            gc.collect()
            per_slot = (len(gc.get_objects()) - before) / slots
            holding.release.set()
            await eventually(lambda: worker.stats.succeeded == slots, what="every slot to finish")
    finally:
        holding.release.set()
    assert per_slot < 25, f"{per_slot:.1f} objects tracked by the collector a busy slot"
