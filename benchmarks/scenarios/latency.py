"""The latency scenario: how soon an idle worker starts a job after it is enqueued, from just
before the enqueue call and from the moment the call returned (its commit seen by the
caller); and the first of those through the other queues asked for with ``--compare``."""

from __future__ import annotations

import time
from typing import Any

import anyio
from common import TASK, Measurement, Run, competitor_on, migrated
from compare.base import IDLE_GAP

import aioqueue

FROM_CALL = "enqueue call -> handler start"
FROM_COMMIT = "commit seen -> handler start"
LATENESS = "run_at -> handler start (jobs delayed 0.2 s)"
DELAY = 0.2


def plan(run: Run) -> None:
    """Line up aioqueue's wake-up measurement, then each other queue's."""
    samples = run.sizes.latency_samples

    def measure(system: str, options: dict[str, Any]) -> Measurement:
        async def go(dsn: str) -> None:
            from_call, from_commit = await aioqueue_latency(dsn, samples, options)
            run.results.add_latency("latency", system, FROM_CALL, from_call)
            run.results.add_latency("latency", system, FROM_COMMIT, from_commit)

        return go

    run.step("latency: aioqueue", measure("aioqueue", {}))
    # What skipping the WAL flush of the claim buys the wake-up.
    run.step("latency: aioqueue durable_claims", measure("aioqueue (durable_claims)", {"durable_claims": True}))

    async def lateness(dsn: str) -> None:
        run.results.add_latency("latency", "aioqueue", LATENESS, await aioqueue_lateness(dsn, samples))

    run.step("latency: aioqueue, delayed jobs", lateness)
    for name in run.competitors:
        run.step(f"latency: {name}", _competitor(run, name))


def _competitor(run: Run, name: str) -> Measurement:
    async def measure(dsn: str) -> None:
        async with competitor_on(name, dsn) as competitor:
            values = await competitor.wakeup_latency(run.sizes.latency_samples)
        run.results.add_latency("latency", name, FROM_CALL, values)

    return measure


async def aioqueue_latency(
    dsn: str, samples: int, options: dict[str, Any] | None = None
) -> tuple[list[float], list[float]]:
    """Per job, against an idle worker (listening, 1 s poll): seconds from just before the
    enqueue call to handler start, and from the enqueue call's return (its commit seen by the
    caller) to handler start; the second is 0 when the handler started first. ``options``: worker
    options."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    started = anyio.Event()
    start_at = 0.0

    async def ping() -> None:
        nonlocal start_at
        start_at = time.perf_counter()
        started.set()

    task = queue.task(name=TASK)(ping)
    from_call: list[float] = []
    from_commit: list[float] = []
    async with queue:
        worker = queue.worker(concurrency=10, install_signal_handlers=False, **(options or {}))
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                await worker.ready.wait()
            for i in range(samples + 1):
                started = anyio.Event()
                await anyio.sleep(IDLE_GAP)  # idle: the previous outcome is written, nothing in flight
                t0 = time.perf_counter()
                await task.enqueue()
                t1 = time.perf_counter()
                with anyio.fail_after(30):
                    await started.wait()
                if i:  # the first is a warm-up
                    from_call.append(start_at - t0)
                    from_commit.append(max(0.0, start_at - t1))
            worker.stop()
    return from_call, from_commit


async def aioqueue_lateness(dsn: str, samples: int) -> list[float]:
    """Per job enqueued with ``delay=DELAY`` to an idle worker (listening, 1 s poll): seconds
    from its due time to handler start. The due time is taken as just before the enqueue call
    plus the delay (the database's ``now()`` falls inside the call), so this overstates by at
    most the call's own time."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    started = anyio.Event()
    start_at = 0.0

    async def ping() -> None:
        nonlocal start_at
        start_at = time.perf_counter()
        started.set()

    task = queue.task(name=TASK)(ping)
    late: list[float] = []
    async with queue:
        worker = queue.worker(concurrency=10, install_signal_handlers=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                await worker.ready.wait()
            for i in range(samples + 1):
                started = anyio.Event()
                await anyio.sleep(IDLE_GAP)
                t0 = time.perf_counter()
                await task.options(delay=DELAY).enqueue()
                with anyio.fail_after(30):
                    await started.wait()
                if i:  # the first is a warm-up
                    late.append(start_at - t0 - DELAY)
            worker.stop()
    return late
