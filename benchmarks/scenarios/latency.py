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


async def _idle_samples(
    dsn: str, samples: int, delay: float, options: dict[str, Any] | None = None
) -> list[tuple[float, float, float]]:
    """Per job enqueued (with ``delay``) to an idle worker (listening, 1 s poll, concurrency 10):
    the times just before the enqueue call, when it returned, and when the handler started. The
    first job is a warm-up and left out. ``options``: worker options."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    started = anyio.Event()
    start_at = 0.0

    async def ping() -> None:
        nonlocal start_at
        start_at = time.perf_counter()
        started.set()

    task = queue.task(name=TASK)(ping)
    out: list[tuple[float, float, float]] = []
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
                await (task.options(delay=delay).enqueue() if delay else task.enqueue())
                t1 = time.perf_counter()
                with anyio.fail_after(30):
                    await started.wait()
                if i:
                    out.append((t0, t1, start_at))
            worker.stop()
    return out


async def aioqueue_latency(
    dsn: str, samples: int, options: dict[str, Any] | None = None
) -> tuple[list[float], list[float]]:
    """Seconds from just before the enqueue call to handler start, and from the call's return
    (its commit seen by the caller) to handler start (0 when the handler started first)."""
    timings = await _idle_samples(dsn, samples, 0.0, options)
    return [s - t0 for t0, _, s in timings], [max(0.0, s - t1) for _, t1, s in timings]


async def aioqueue_lateness(dsn: str, samples: int) -> list[float]:
    """Per job enqueued with ``delay=DELAY``: seconds from its due time to handler start. The due
    time is taken as just before the enqueue call plus the delay (the database's ``now()`` falls
    inside the call), so this overstates by at most the call's own time."""
    return [s - t0 - DELAY for t0, _, s in await _idle_samples(dsn, samples, DELAY)]
