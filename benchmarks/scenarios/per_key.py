"""The per-key scenario: partition keys under load (see docs/howto/per-key.md).

- Fairness: one key floods the queue (its jobs written first) beside many small keys of 10
  jobs each. The same jobs drain first in, first out and with keys in turn (``fair``), each
  step on two worker processes; the ratio of the two rates is what fairness costs. Then, with
  the flood pending, the small keys enqueue their jobs over a span of time (``add_jobs``, a
  batch every 50 ms, a key per job) while the workers run: how long each small key's first job
  waits to start, from the enqueue of that job.
- Per-key concurrency 1: 1,000 keys, their jobs written key after key, drained by four worker
  processes with no per-key limit and with a limit of 1. Every handler records its span on the
  system-wide monotonic clock; the parent counts, per key, the spans that overlap another one of
  the same key: none may under the limit (the unlimited drain shows that the check sees them).

The flood is 100,000 jobs in a full run, not the 1,000,000 of the goal: a drain of a million
jobs, twice per repeat, does not fit a few minutes on the shared two-core machine the benchmark
runs on; the small keys and their arrival are the goal's own. ``--flood 1000000`` runs the
goal's flood.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import multiprocessing.connection
import time
from typing import Any

import anyio
import asyncpg
from common import TASK, Measurement, Run, child_process, make_queue, migrated, percentile, progress, recv, run_loop

SCENARIO = "per-key"
TICK = 0.05


@dataclasses.dataclass(frozen=True)
class Shape:
    """How big the per-key workloads are."""

    flood: int
    keys: int
    per_key: int
    arrival: float
    exclusive_keys: int
    exclusive_per_key: int


FULL = Shape(flood=100_000, keys=10_000, per_key=10, arrival=60.0, exclusive_keys=1_000, exclusive_per_key=20)
QUICK = Shape(flood=10_000, keys=1_000, per_key=10, arrival=10.0, exclusive_keys=200, exclusive_per_key=10)


def plan(run: Run) -> None:
    """Line up the two drains of the fairness workload, the flood latency, and the two drains of
    the per-key limit; the before/after pairs run next to each other in every repeat."""
    shape = FULL if run.sizes.drain_jobs >= 20_000 else QUICK
    if run.per_key_flood is not None:
        shape = dataclasses.replace(shape, flood=run.per_key_flood)
    for fair in (False, True):
        run.step(f"per-key: flood drain, {'fair' if fair else 'first in, first out'}", _flood_drain(run, shape, fair))
    run.step("per-key: small keys' first start under a flood", _flood_latency(run, shape))
    for limit in (None, 1):
        run.step(f"per-key: {shape.exclusive_keys} keys, {'limit 1' if limit else 'no limit'}",
                 _exclusive(run, shape, limit))


# -- the workers, in processes of their own ------------------------------------------------------

SPANS: list[tuple[str, float, float, float, float]] = []
"""This process's handler spans: key, monotonic start and end, enqueue and start wall times."""


async def keyed(k: str, t: float = 0.0) -> None:
    """The handler: yields once (so that a span has a width) and records its span."""
    start, wall = time.monotonic(), time.time()
    await asyncio.sleep(0)
    SPANS.append((k, start, time.monotonic(), t, wall))


def _worker_process(dsn: str, until_empty: bool, pipe: multiprocessing.connection.Connection) -> None:
    """Run a worker (concurrency 10) from "go" until the queue is empty or "stop"; send the spans."""

    async def main() -> None:
        queue, _ = make_queue(dsn, handler=keyed)
        async with queue:
            async with queue.connection() as conn:
                await conn.fetchval("SELECT 1")
            pipe.send("ready")
            await anyio.to_thread.run_sync(pipe.recv)
            worker = queue.worker(concurrency=10, install_signal_handlers=False)
            if until_empty:
                await worker.run_until_empty()
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker.run)
                    await anyio.to_thread.run_sync(pipe.recv)
                    worker.stop()
            pipe.send(SPANS)

    run_loop(main)


@contextlib.contextmanager
def _workers(dsn: str, processes: int, until_empty: bool) -> Any:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(child_process(_worker_process, dsn, until_empty)) for _ in range(processes)]


async def _drain(dsn: str, processes: int, jobs: int) -> tuple[list[Any], float]:
    """Drain the preloaded ``jobs`` with ``processes`` worker processes, timed from "go" until
    every process found the queue empty: the spans, and the seconds."""
    with _workers(dsn, processes, until_empty=True) as pipes:
        for pipe in pipes:
            await recv(pipe, 60.0, "a worker process to start")
        start = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        spans = await _gather(pipes, "a worker process to drain")
        seconds = time.perf_counter() - start
    if len(spans) != jobs:
        raise RuntimeError(f"{processes} worker processes ran {len(spans)} jobs of {jobs}")
    return spans, seconds


async def _gather(pipes: list[multiprocessing.connection.Connection], what: str) -> list[Any]:
    spans: list[Any] = []
    for pipe in pipes:
        spans += await recv(pipe, 900.0, what)
    return spans


async def _setup(dsn: str, sql: str, *args: Any, fair: bool = False, limit: int | None = None) -> None:
    await migrated(dsn)
    queue, _ = make_queue(dsn)
    async with queue:
        async with queue.connection() as conn:
            await conn.execute(sql, *args)
            await conn.execute("ANALYZE aioqueue.jobs")
        if fair or limit is not None:
            await queue.set_key_limits("default", concurrency=limit, fair=fair)


FLOOD_SQL = (
    "INSERT INTO aioqueue.jobs (queue, task, args, partition_key) "
    "SELECT 'default', $1, '{\"k\": \"flood\"}', 'flood' FROM generate_series(1, $2)"
)


# -- fairness ------------------------------------------------------------------------------------


def _flood_drain(run: Run, shape: Shape, fair: bool) -> Measurement:
    jobs = shape.flood + shape.keys * shape.per_key
    system = "aioqueue (fair)" if fair else "aioqueue (first in, first out)"

    async def measure(dsn: str) -> None:
        await _setup(dsn, FLOOD_SQL, TASK, shape.flood, fair=fair)
        async with _connection(dsn) as conn:
            await conn.execute(
                "INSERT INTO aioqueue.jobs (queue, task, args, partition_key) "
                "SELECT 'default', $1, jsonb_build_object('k', 'key-' || k), 'key-' || k "
                "FROM generate_series(1, $3) AS j, generate_series(1, $2) AS k ORDER BY j, k",
                TASK, shape.keys, shape.per_key)
            await conn.execute("ANALYZE aioqueue.jobs")
        _, seconds = await _drain(dsn, 2, jobs)
        run.results.add_rate(SCENARIO, system, f"flood of {shape.flood:,} + {shape.keys:,} keys x {shape.per_key}",
                             jobs, seconds)

    return measure


def _flood_latency(run: Run, shape: Shape) -> Measurement:
    async def measure(dsn: str) -> None:
        await _setup(dsn, FLOOD_SQL, TASK, shape.flood, fair=True)
        with _workers(dsn, 2, until_empty=False) as pipes:
            for pipe in pipes:
                await recv(pipe, 60.0, "a worker process to start")
            for pipe in pipes:
                pipe.send("go")
            async with _connection(dsn) as conn:
                await _arrive(conn, shape)
                with anyio.fail_after(600):  # until every small key's job has run
                    while True:
                        left = await conn.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE partition_key <> 'flood'")
                        if not left:
                            break
                        await anyio.sleep(0.2)
            for pipe in pipes:
                pipe.send("stop")
            spans = await _gather(pipes, "a worker process to stop")
        first_enqueued: dict[str, float] = {}
        first_started: dict[str, float] = {}
        for k, _, _, t, wall in spans:
            if k != "flood":
                first_enqueued[k] = min(first_enqueued.get(k, t), t)
                first_started[k] = min(first_started.get(k, wall), wall)
        if len(first_started) != shape.keys:
            raise RuntimeError(f"{len(first_started)} small keys ran of {shape.keys}")
        waits = [first_started[k] - first_enqueued[k] for k in first_started]
        run.results.add_latency(SCENARIO, "aioqueue (fair)", f"small key's first start, flood of {shape.flood:,}",
                                waits)
        progress(f"    flood jobs run meanwhile: {sum(1 for s in spans if s[0] == 'flood'):,}; "
                 f"max wait {max(waits):.3f} s, p99 {percentile(waits, 99):.3f} s")

    return measure


async def _arrive(conn: Any, shape: Shape) -> None:
    """Each small key's jobs, spread over ``shape.arrival`` seconds: one batch (``add_jobs``, a
    key per job) every tick, with the jobs whose time has come."""
    total = shape.keys * shape.per_key
    start = time.monotonic()
    sent = 0
    while sent < total:
        due = min(total, int(total * (time.monotonic() - start) / shape.arrival) + 1)
        if due > sent:
            now = time.time()
            batch = [{"task": TASK, "queue": "default", "partition_key": f"key-{i % shape.keys + 1}",
                      "args": {"k": f"key-{i % shape.keys + 1}", "t": now}} for i in range(sent, due)]
            await conn.execute("SELECT count(*) FROM aioqueue.add_jobs($1::jsonb)", json.dumps(batch))
            sent = due
        await anyio.sleep(TICK)


# -- per-key concurrency -------------------------------------------------------------------------


def _exclusive(run: Run, shape: Shape, limit: int | None) -> Measurement:
    jobs = shape.exclusive_keys * shape.exclusive_per_key
    system = "aioqueue (per-key limit 1)" if limit else "aioqueue (no per-key limit)"

    async def measure(dsn: str) -> None:
        await _setup(
            dsn,
            "INSERT INTO aioqueue.jobs (queue, task, args, partition_key) "
            "SELECT 'default', $1, jsonb_build_object('k', 'key-' || k), 'key-' || k "
            "FROM generate_series(1, $2) AS k, generate_series(1, $3) AS j ORDER BY k, j",
            TASK, shape.exclusive_keys, shape.exclusive_per_key, limit=limit)
        spans, seconds = await _drain(dsn, 4, jobs)
        metric = f"{shape.exclusive_keys:,} keys x {shape.exclusive_per_key}, 4 processes"
        run.results.add_rate(SCENARIO, system, metric, jobs, seconds)
        overlaps = _overlaps(spans)
        run.results.add(SCENARIO, system, f"{metric}: jobs of one key running together", float(overlaps), "jobs",
                        higher_is_better=False)
        progress(f"    jobs that ran beside another of their key: {overlaps}")

    return measure


def _overlaps(spans: list[tuple[str, float, float, float, float]]) -> int:
    """How many spans start before the end of an earlier span of the same key."""
    by_key: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for k, start, end, _, _ in spans:
        by_key[k].append((start, end))
    count = 0
    for runs in by_key.values():
        runs.sort()
        latest_end = -1.0
        for start, end in runs:
            if start < latest_end:
                count += 1
            latest_end = max(latest_end, end)
    return count


@contextlib.asynccontextmanager
async def _connection(dsn: str) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()
