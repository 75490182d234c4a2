"""The steps scenario: what a durable step costs. One in-process worker at concurrency 10
drains jobs whose handler runs 0, 1 or 5 steps (``aioqueue.step`` of a no-op); the per-step
cost is the difference from the 0-step drain, per step. Also a sleep's round trip: jobs that
sleep 0 seconds once (suspended, put back, claimed and run again)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from common import Measurement, Run, timed_drain

import aioqueue

#: Steps per job, in the order lined up: the plain drain first, each run of the scenario.
STEPS = (0, 1, 5)


def plan(run: Run) -> None:
    """Line up one drain per step count, and one of sleeping jobs."""
    n = max(200, run.sizes.drain_jobs // 4)
    for k in STEPS:
        run.step(f"steps: {k} steps per job", _drain(run, n, f"{k} steps per job", _handler(k)))
    run.step("steps: one sleep per job", _drain(run, n, "one 0 s sleep per job", _sleeper))


async def _nothing() -> None:
    """A step that does nothing: what is measured is the step's own storing."""


def _handler(k: int) -> Callable[..., Awaitable[None]]:
    async def handler(i: int = 0) -> None:
        for s in range(k):
            await aioqueue.step(f"s{s}", _nothing)

    return handler


async def _sleeper(i: int = 0) -> None:
    await aioqueue.sleep(0)


def _drain(run: Run, n: int, metric: str, handler: Callable[..., Awaitable[None]]) -> Measurement:
    async def measure(dsn: str) -> None:
        # Room in the pool for every handler's step beside the worker's own connections, for
        # every variant alike: what is measured is the step, not a wait for a connection.
        seconds = await timed_drain(dsn, n, handler, "steps", pool_size=20)
        run.results.add_rate("steps", "aioqueue", metric, n, seconds)

    return measure
