"""The memory scenario: the peak resident memory of a fresh worker process that runs a number
of jobs off a deep backlog, with each worker setting of ``CONFIGS``."""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import resource
from pathlib import Path
from typing import Any

import asyncpg
from common import (
    CONFIGS,
    Measurement,
    Run,
    aioqueue_system,
    child_process,
    insert_pending,
    make_queue,
    migrated,
    progress,
    recv,
    run_loop,
    worker_for,
)

import aioqueue


def plan(run: Run) -> None:
    """Line up one measurement per worker setting."""
    for config in CONFIGS:
        run.step(f"memory: aioqueue {config}", _measure(run, config))


def _measure(run: Run, config: str) -> Measurement:
    sizes = run.sizes
    metric = f"peak RSS, {sizes.memory_backlog:,} pending, {sizes.memory_jobs:,} run"

    async def measure(dsn: str) -> None:
        peak = await aioqueue_memory(dsn, sizes.memory_backlog, sizes.memory_jobs, CONFIGS[config])
        run.results.add("memory", aioqueue_system(config), metric, peak / 2**20, "MB", higher_is_better=False)
        progress(f"    {peak / 2**20:.1f} MB")

    return measure


async def aioqueue_memory(dsn: str, backlog: int, jobs: int, options: dict[str, Any]) -> float:
    """Peak RSS in bytes of a fresh worker process that runs ``jobs`` jobs off ``backlog``."""
    await migrated(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await insert_pending(conn, backlog)
        await conn.execute("VACUUM ANALYZE aioqueue.jobs")
    finally:
        await conn.close()
    with child_process(_memory_process, dsn, jobs, options) as pipe:
        return float(await recv(pipe, 600.0, "the memory worker"))


def _memory_process(
    dsn: str, jobs: int, options: dict[str, Any], pipe: multiprocessing.connection.Connection
) -> None:
    """Worker process: run ``jobs`` jobs off a deep backlog, report peak RSS in bytes."""

    async def main() -> None:
        done = 0
        worker: aioqueue.Worker | None = None

        async def counting(i: int = 0) -> None:
            nonlocal done
            done += 1
            if done >= jobs and worker is not None:
                worker.stop()

        queue, _ = make_queue(dsn, handler=counting)
        async with queue:
            worker = worker_for(queue, 10, {**options, "listen": False})
            await worker.run()
        pipe.send(peak_rss())

    run_loop(main)


def peak_rss() -> int:
    """This process's peak resident set size in bytes: VmHWM, which starts afresh at exec
    (ru_maxrss does not: a spawned child would report its parent's peak)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
