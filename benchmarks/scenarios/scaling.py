"""The scaling scenario: drain throughput of 1, 2, 4 and 8 worker processes (concurrency 10
each, default settings) on one server, with the peak number of server connections the drain
holds and what the busy backends were waiting on (sampled from ``pg_stat_activity``)."""

from __future__ import annotations

import collections

import anyio
import asyncpg
from common import Measurement, Run, progress

from .drain import aioqueue_drain_processes

PROCESSES = (1, 2, 4, 8)


def plan(run: Run) -> None:
    """Line up one drain per process count."""
    for processes in PROCESSES:
        run.step(f"scaling: {processes} processes", _measure(run, processes))


def _measure(run: Run, processes: int) -> Measurement:
    n = run.sizes.drain_jobs * 2
    processes_ = f"{processes} process{'es' if processes > 1 else ''}"
    metric = f"{processes_}, concurrency 10 each"

    async def measure(dsn: str) -> None:
        peak = 0
        waits: collections.Counter[str] = collections.Counter()
        done = anyio.Event()

        async def sample() -> None:
            nonlocal peak
            conn = await asyncpg.connect(dsn)
            try:
                while not done.is_set():
                    rows = await conn.fetch(
                        "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    peak = max(peak, len(rows))
                    for r in rows:
                        if r["state"] == "active":
                            waits[f"{r['wait_event_type']}:{r['wait_event']}" if r["wait_event"] else "CPU"] += 1
                    await anyio.sleep(0.005)
            finally:
                await conn.close()

        seconds = 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            try:
                seconds = await aioqueue_drain_processes(dsn, n, processes, 10, {})
            finally:
                done.set()
        total = sum(waits.values()) or 1
        note = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in waits.most_common(4))
        run.results.add_rate("scaling", "aioqueue (defaults)", metric, n, seconds)
        run.results.add("scaling", "aioqueue (defaults)", f"{processes_}: server connections, peak",
                        float(peak), "conns", higher_is_better=False, note=f"active backends: {note}")
        progress(f"    peak connections {peak}; active backends: {note}")

    return measure
