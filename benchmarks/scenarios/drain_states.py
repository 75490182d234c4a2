"""The drain-states scenario: the one-process drain at concurrency 10 in the table states that
have misled the planner (fresh statistics, statistics older than the burst, dead entries at
the head of the ready index), with each worker setting of ``CONFIGS``."""

from __future__ import annotations

from typing import get_args

from common import CONFIGS, Measurement, Run, aioqueue_system

from .drain import TableState, aioqueue_drain


def plan(run: Run) -> None:
    """Line up one drain per table state and worker setting."""
    for state in get_args(TableState):
        for config in CONFIGS:
            metric = f"concurrency 10, {state}"
            run.step(f"drain-states: aioqueue {config} {metric}", _drain(run, metric, config, state))


def _drain(run: Run, metric: str, config: str, state: TableState) -> Measurement:
    n = run.sizes.drain_jobs

    async def measure(dsn: str) -> None:
        seconds = await aioqueue_drain(dsn, n, 10, CONFIGS[config], state)
        run.results.add_rate("drain-states", aioqueue_system(config), metric, n, seconds)

    return measure
