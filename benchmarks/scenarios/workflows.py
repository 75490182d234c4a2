"""The workflows scenario: what a graph costs over the same jobs without one, as ratios of runs
lined up in pairs in one process and one run.

- fan-out/fan-in: enqueue N jobs and run them all, plain, or as one group whose callback runs
  after every member, written by ``aioqueue.group(...).enqueue(on_success=...)`` in one
  transaction as the plain jobs are (the whole run, enqueue to callback, is timed);
- group drain: a preloaded group of M members drained, against M plain jobs;
- plain beside: plain jobs drained by one worker while another drains a group of as many
  members, against the same while the other drains as many plain jobs.
"""

from __future__ import annotations

import time

import anyio
from common import Measurement, Run, analyze, make_queue, migrated, preload, timed_until_empty, worker_for

import aioqueue

SCENARIO = "workflows"


def plan(run: Run) -> None:
    """Line up the pairs, graph and plain alternating."""
    quick = run.sizes.drain_jobs < 20_000
    fan = 1_000 if quick else 10_000
    members = 10_000 if quick else 100_000
    beside = 2_000 if quick else 20_000
    for graph in (False, True):
        kind = "group" if graph else "plain"
        run.step(f"workflows: fan-out/fan-in {fan} {kind}", _fan(run, fan, graph))
    for graph in (False, True):
        kind = "group" if graph else "plain"
        run.step(f"workflows: drain {members} {kind}", _drain(run, members, graph))
    for graph in (False, True):
        kind = "beside a group" if graph else "beside plain jobs"
        run.step(f"workflows: plain {beside} {kind}", _beside(run, beside, graph))


def _system(graph: bool) -> str:
    return "aioqueue (workflow)" if graph else "aioqueue (plain)"


def _fan(run: Run, n: int, graph: bool) -> Measurement:
    async def measure(dsn: str) -> None:
        await migrated(dsn)
        queue, task = make_queue(dsn)
        called: list[int] = []

        @queue.task(name="bench_callback")
        async def callback() -> None:
            called.append(1)

        async with queue:
            start = time.perf_counter()
            if graph:
                # As a user writes a fan-out and its fan-in: the builder, one transaction.
                await aioqueue.group(*[task.s(i=i) for i in range(n)]).enqueue(on_success=callback.s())
            else:
                await preload(task, n)
            await worker_for(queue, 10, {}).run_until_empty()
            elapsed = time.perf_counter() - start
        if graph and called != [1]:
            raise RuntimeError(f"the callback ran {len(called)} times")
        run.results.add_rate(SCENARIO, _system(graph), f"fan-out/fan-in of {n}, enqueue to last job", n, elapsed)

    return measure


def _drain(run: Run, n: int, graph: bool) -> Measurement:
    async def measure(dsn: str) -> None:
        await migrated(dsn)
        queue, task = make_queue(dsn)
        async with queue:
            g = await queue.open_group() if graph else None
            await preload(task, n, g)
            if g is not None:
                await g.close()
            await analyze(queue)
            elapsed = await timed_until_empty(worker_for(queue, 10, {}), n, "drain")
        run.results.add_rate(SCENARIO, _system(graph), f"drain of {n} preloaded jobs", n, elapsed)

    return measure


def _beside(run: Run, n: int, graph: bool) -> Measurement:
    async def measure(dsn: str) -> None:
        await migrated(dsn)
        queue, task = make_queue(dsn, pool_size=20)
        async with queue:
            await task.options(queue="plain").enqueue_many([{"i": i} for i in range(n)])
            g = await queue.open_group() if graph else None
            await task.options(queue="other", group=g).enqueue_many([{"i": i} for i in range(n)])
            if g is not None:
                await g.close()
            plain = queue.worker(concurrency=10, queues=["plain"], install_signal_handlers=False)
            other = queue.worker(concurrency=10, queues=["other"], install_signal_handlers=False)
            elapsed = 0.0

            async def timed() -> None:
                nonlocal elapsed
                start = time.perf_counter()
                await plain.run_until_empty()
                elapsed = time.perf_counter() - start

            async with anyio.create_task_group() as tg:
                tg.start_soon(other.run_until_empty)
                tg.start_soon(timed)
        run.results.add_rate(SCENARIO, _system(graph), f"plain jobs drained beside {n} others", n, elapsed)

    return measure
