"""The progress scenario: what reporting progress costs. One in-process worker at concurrency
10 drains jobs whose handler calls ``aioqueue.set_progress`` 0, 1 or 100 times (no await in
between, as a loop over rows would); the cost is the ratio to the 0-call drain of the same run.
The calls make no round trip: each job's last value is written with its outcome, in one more
statement per batch of outcomes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from common import Measurement, Run, timed_drain

import aioqueue

#: Calls per job, in the order lined up: the plain drain first, each run of the scenario.
CALLS = (0, 1, 100)


def plan(run: Run) -> None:
    """Line up one drain per number of calls."""
    n = max(200, run.sizes.drain_jobs // 4)
    for k in CALLS:
        run.step(f"progress: {k} calls per job", _drain(run, n, f"{k} set_progress calls per job", _handler(k)))


def _handler(k: int) -> Callable[..., Awaitable[None]]:
    async def handler(i: int = 0) -> None:
        for c in range(k):
            aioqueue.set_progress((c + 1) / k, "rows", data={"row": c})

    return handler


def _drain(run: Run, n: int, metric: str, handler: Callable[..., Awaitable[None]]) -> Measurement:
    async def measure(dsn: str) -> None:
        seconds = await timed_drain(dsn, n, handler, "progress")
        run.results.add_rate("progress", "aioqueue", metric, n, seconds)

    return measure
