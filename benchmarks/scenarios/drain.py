"""The drain scenario: how many preloaded jobs a worker runs per second, outcomes written, in
one process at each concurrency and in several processes, with each worker setting of
``CONFIGS``; and the same drain through the other queues asked for with ``--compare``.

``drain_states`` reuses :func:`aioqueue_drain` to drain in other table states. The reference
lane (see ``reference.py``) drains the same jobs at the first concurrency, alternating with
aioqueue's defaults for ``PAIRED_ROUNDS`` rounds each, before the other settings and queues.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import time
from typing import Any, Literal

import anyio
from common import (
    CONFIGS,
    Measurement,
    Run,
    aioqueue_system,
    analyze,
    child_process,
    competitor_on,
    fresh_database,
    make_queue,
    migrated,
    preload,
    preloaded,
    recv,
    run_loop,
    timed_until_empty,
    worker_for,
)

from . import reference

#: ``analyzed``: ANALYZE after the load, as autovacuum would soon do. ``stale``: statistics
#: taken on the empty table, then the burst (no ANALYZE, autovacuum off). ``dead-head``: a first
#: fast drain leaves dead entries at the head of the ready index; a second burst is drained
#: before any vacuum (autovacuum off).
TableState = Literal["analyzed", "stale", "dead-head"]


#: Rounds of the headline pair (aioqueue's defaults and the reference lane, one after the
#: other, in turn first) in each repeat: their ratio is the figure a reader takes away, so even
#: a single ``--quick`` run gives it as a median of alternating drains of the same size.
PAIRED_ROUNDS = 3


def plan(run: Run) -> None:
    """Line up the drains: one process at each concurrency, then several processes."""
    sizes = run.sizes
    for concurrency in sizes.concurrencies:
        metric = f"1 process, concurrency {concurrency}"
        headline = concurrency == sizes.concurrencies[0]  # the others there only (time)
        if headline:
            run.step(f"drain: aioqueue defaults and the reference lane, alternating, {PAIRED_ROUNDS} rounds "
                     f"({metric})", _paired(run, metric, concurrency))
        for config in CONFIGS:
            if not (headline and config == "defaults"):
                run.step(f"drain: aioqueue {config} {metric}", _in_process(run, metric, concurrency, config))
        if headline:
            for name in run.competitors:
                run.step(f"drain: {name} concurrency {concurrency}", _competitor(run, name, metric, concurrency))
    metric = f"{sizes.processes} processes, concurrency 10 each"
    for config in CONFIGS:
        run.step(f"drain: aioqueue {config} {metric}", _processes(run, metric, config))


def _in_process(run: Run, metric: str, concurrency: int, config: str) -> Measurement:
    n = run.sizes.drain_jobs

    async def measure(dsn: str) -> None:
        seconds = await aioqueue_drain(dsn, n, concurrency, CONFIGS[config], "analyzed")
        run.results.add_rate("drain", aioqueue_system(config), metric, n, seconds)

    return measure


def _processes(run: Run, metric: str, config: str) -> Measurement:
    sizes = run.sizes

    async def measure(dsn: str) -> None:
        seconds = await aioqueue_drain_processes(dsn, sizes.drain_jobs, sizes.processes, 10, CONFIGS[config])
        run.results.add_rate("drain", aioqueue_system(config), metric, sizes.drain_jobs, seconds)

    return measure


def _paired(run: Run, metric: str, concurrency: int) -> Measurement:
    """aioqueue's defaults and the reference lane, ``PAIRED_ROUNDS`` times each, alternating
    which goes first, each drain in a database of its own."""
    n = run.sizes.drain_jobs

    async def aioqueue_lane() -> None:
        async with fresh_database(run.admin_dsn) as dsn:
            seconds = await aioqueue_drain(dsn, n, concurrency, CONFIGS["defaults"], "analyzed")
        run.results.add_rate("drain", aioqueue_system("defaults"), metric, n, seconds)

    async def reference_lane() -> None:
        async with fresh_database(run.admin_dsn) as dsn:
            seconds = await reference.reference_drain(dsn, n)
        run.results.add_rate("drain", reference.SYSTEM, metric, n, seconds)

    async def measure(_dsn: str) -> None:
        for r in range(PAIRED_ROUNDS):
            for lane in (aioqueue_lane, reference_lane) if r % 2 == 0 else (reference_lane, aioqueue_lane):
                await lane()

    return measure


def _competitor(run: Run, name: str, metric: str, concurrency: int) -> Measurement:
    n = run.sizes.drain_jobs

    async def measure(dsn: str) -> None:
        async with competitor_on(name, dsn) as competitor:
            seconds = await competitor.drain(n, concurrency)
        run.results.add_rate("drain", name, metric, n, seconds)

    return measure


async def aioqueue_drain(dsn: str, n: int, concurrency: int, options: dict[str, Any], state: TableState) -> float:
    """Seconds for one in-process worker to run ``n`` preloaded jobs and write every outcome,
    with the jobs table in ``state`` (see :data:`TableState`)."""
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        async with queue.connection() as conn:
            if state != "analyzed":
                await conn.execute("ALTER TABLE aioqueue.jobs SET (autovacuum_enabled = false)")
                await conn.execute("ANALYZE aioqueue.jobs")  # statistics of an empty table
        if state == "dead-head":
            await preload(task, n)
            await analyze(queue)
            await worker_for(queue, concurrency, options).run_until_empty()
        await preload(task, n)
        if state == "analyzed":
            await analyze(queue)
        return await timed_until_empty(worker_for(queue, concurrency, options), n, "drain")


async def aioqueue_drain_processes(
    dsn: str, n: int, processes: int, concurrency: int, options: dict[str, Any]
) -> float:
    """Seconds for ``processes`` worker processes to run ``n`` preloaded jobs between them."""
    await preloaded(dsn, n)
    with contextlib.ExitStack() as children:
        pipes = [children.enter_context(child_process(_drain_process, dsn, concurrency, options))
                 for _ in range(processes)]
        for pipe in pipes:
            await recv(pipe, 60.0, "a worker process to start")
        start = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        done = [int(await recv(pipe, 600.0, "a worker process to drain")) for pipe in pipes]
        elapsed = time.perf_counter() - start
    if sum(done) < n:
        raise RuntimeError(f"{processes} processes ran {sum(done)} jobs of {n}")
    return elapsed


def _drain_process(
    dsn: str, concurrency: int, options: dict[str, Any], pipe: multiprocessing.connection.Connection
) -> None:
    """Worker process: open the queue, say ready, wait for go, drain, report jobs run."""

    async def main() -> None:
        queue, _ = make_queue(dsn)
        async with queue:
            async with queue.connection() as conn:
                await conn.fetchval("SELECT 1")
            pipe.send("ready")
            await anyio.to_thread.run_sync(pipe.recv)
            stats = await worker_for(queue, concurrency, options).run_until_empty()
            pipe.send(stats.succeeded)

    run_loop(main)

