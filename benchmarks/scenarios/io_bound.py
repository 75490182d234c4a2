"""The I/O-bound scenario: what one worker process does with many handlers at once.

Three lanes, each a drain of preloaded jobs by one in-process worker at the defaults but for
``concurrency``: no-op handlers at each of ``Sizes.io_noop_concurrencies`` (the worker's own cost
per job, which must not grow with its slots); handlers that ``await asyncio.sleep(0.01)`` at
each of ``Sizes.io_sleep_concurrencies``, with the bare-loop lane beside each (the same handler
over the same count of argument dicts from an in-memory list, by as many coroutines as the
concurrency: what the event loop alone can do); with the process's CPU time per job of each
aioqueue lane; and the resident memory of a worker process
with ``Sizes.io_busy_slots`` handlers running at once, all of them awaiting, and the time one
heartbeat then takes to renew all their leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing.connection
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from common import (
    Measurement,
    Run,
    analyze,
    child_process,
    make_queue,
    noop,
    preload,
    preloaded,
    progress,
    recv,
    run_loop,
    worker_for,
)

SYSTEM = "aioqueue (defaults)"
BARE = "bare asyncio loop"
SLEEP = 0.01


async def sleepy(i: int = 0) -> None:
    """The I/O-bound handler: 10 ms of waiting, as on a webhook or an HTTP call."""
    await asyncio.sleep(SLEEP)


def noop_metric(concurrency: int) -> str:
    return f"no-op, concurrency {concurrency}"


def sleep_metric(concurrency: int) -> str:
    return f"sleep 10 ms, concurrency {concurrency}"


def sleep_jobs(run: Run, concurrency: int) -> int:
    """Jobs of a sleep lane: a hundred rounds of the slots, at most ``io_jobs`` (a lane at
    concurrency 100 would otherwise take five seconds a run for no more information)."""
    return min(run.sizes.io_jobs, concurrency * 100)


def plan(run: Run) -> None:
    """Line up the no-op drains, the sleep drains each with its bare-loop lane, and the memory."""
    sizes = run.sizes
    for concurrency in sizes.io_noop_concurrencies:
        run.step(f"io-bound: aioqueue no-op, concurrency {concurrency}",
                 _drain(run, noop_metric(concurrency), sizes.io_jobs, concurrency, noop))
    for concurrency in sizes.io_sleep_concurrencies:
        n = sleep_jobs(run, concurrency)
        run.step(f"io-bound: aioqueue sleep 10 ms, concurrency {concurrency}",
                 _drain(run, sleep_metric(concurrency), n, concurrency, sleepy))
        run.step(f"io-bound: bare loop sleep 10 ms, concurrency {concurrency}", _bare(run, n, concurrency))
    run.step(f"io-bound: memory, {sizes.io_busy_slots:,} busy slots", _memory(run, sizes.io_busy_slots))


def _drain(run: Run, metric: str, n: int, concurrency: int, handler: Callable[..., Awaitable[None]]) -> Measurement:
    async def measure(dsn: str) -> None:
        await preloaded(dsn, 0)
        queue, task = make_queue(dsn, handler=handler)
        async with queue:
            await preload(task, n)
            await analyze(queue)
            worker = worker_for(queue, concurrency, {})
            # Every lane starts with the collector's debt paid: else the full collection that
            # the lanes before it ran up (tens of ms over this process's whole heap) falls in
            # whichever lane comes next, the same one every run, and is billed to its jobs.
            gc.collect()
            start, cpu = time.perf_counter(), time.process_time()
            stats = await worker.run_until_empty()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if stats.succeeded != n:
            raise RuntimeError(f"the drain ran {stats.succeeded} jobs of {n}")
        run.results.add_rate("io-bound", SYSTEM, metric, n, elapsed)
        # The process's CPU time: the worker's own cost, which other load on the machine moves
        # much less than the rate.
        run.results.add("io-bound", SYSTEM, f"{metric}: CPU per job", cpu / n * 1e6, "us", higher_is_better=False)

    return measure


def _bare(run: Run, n: int, concurrency: int) -> Measurement:
    async def measure(dsn: str) -> None:
        run.results.add_rate("io-bound", BARE, sleep_metric(concurrency), n, await bare_loop(n, concurrency, sleepy))

    return measure


async def bare_loop(n: int, concurrency: int, handler: Callable[..., Awaitable[None]]) -> float:
    """Seconds for ``concurrency`` coroutines to call ``handler`` with each of ``n`` argument
    dicts from a list, and nothing else."""
    jobs = iter([{"i": i} for i in range(n)])

    async def runner() -> None:
        for args in jobs:
            await handler(**args)

    gc.collect()  # as the aioqueue lanes do
    start = time.perf_counter()
    # Plain asyncio tasks: the least a loop needs to start them (a task group's start_soon
    # costs more per task than a 10 ms handler's whole share of the loop at this concurrency).
    await asyncio.gather(*(asyncio.create_task(runner()) for _ in range(concurrency)))
    return time.perf_counter() - start


def _memory(run: Run, slots: int) -> Measurement:
    async def measure(dsn: str) -> None:
        await preloaded(dsn, slots)
        with child_process(_busy_process, dsn, slots) as pipe:
            before, busy, beat = await recv(pipe, 300.0, "the busy worker")
        run.results.add("io-bound", SYSTEM, f"RSS, {slots:,} slots busy", busy / 2**20, "MB",
                        higher_is_better=False)
        per_slot = (busy - before) / slots / 1024
        run.results.add("io-bound", SYSTEM, "RSS per busy slot", per_slot, "KB", higher_is_better=False)
        run.results.add("io-bound", SYSTEM, f"one heartbeat renewing {slots:,} leases", beat * 1e3, "ms",
                        higher_is_better=False)
        progress(f"    {busy / 2**20:.1f} MB with {slots:,} busy slots ({per_slot:.1f} KB a slot)")

    return measure


def _busy_process(dsn: str, slots: int, pipe: multiprocessing.connection.Connection) -> None:
    """Worker process: RSS with the queue open, then with ``slots`` handlers all running; and
    how long one heartbeat (one statement renewing every lease) takes then."""

    async def main() -> None:
        started = 0
        all_in = asyncio.Event()
        release = asyncio.Event()

        async def waiting(i: int = 0) -> None:
            nonlocal started
            started += 1
            if started == slots:
                all_in.set()
            await release.wait()

        queue, _ = make_queue(dsn, handler=waiting)
        async with queue:
            async with queue.connection() as conn:
                await conn.fetchval("SELECT 1")
            before = rss()
            worker = worker_for(queue, slots, {})
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run_until_empty)
                with anyio.fail_after(240):
                    await all_in.wait()
                busy = rss()
                assert worker.heartbeat is not None
                start = time.perf_counter()
                await worker.heartbeat.beat()
                beat = time.perf_counter() - start
                release.set()
        pipe.send((before, busy, beat))

    run_loop(main)


def rss() -> int:
    """This process's resident set size now, in bytes (VmRSS)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
