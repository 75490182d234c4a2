"""What every scenario shares: the workload sizes, the worker settings measured, the results
table, a fresh database per measurement, the benchmark's queue and task, and the event loop.

Nothing here measures anything; the scenarios in ``scenarios/`` do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib.metadata
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

import anyio
import asyncpg
from compare import Competitor, load_competitor

import aioqueue
from aioqueue._dsn import with_database
from aioqueue._job import Connection

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is optional
    uvloop = None  # type: ignore[assignment]

TASK = "bench_noop"


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
    outbox_events: int
    io_jobs: int
    io_noop_concurrencies: tuple[int, ...]
    io_sleep_concurrencies: tuple[int, ...]
    io_busy_slots: int


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
    outbox_events=100_000,
    io_jobs=50_000,
    io_noop_concurrencies=(10, 100, 1000),
    io_sleep_concurrencies=(100, 1000, 5000),
    io_busy_slots=10_000,
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
    outbox_events=10_000,
    io_jobs=5_000,
    io_noop_concurrencies=(10, 1000),
    io_sleep_concurrencies=(1000,),
    io_busy_slots=1_000,
)

#: aioqueue worker settings the drains run with: the defaults; the defaults with claims and
#: outcomes waiting for their WAL flush (what skipping it buys); and a setting tuned for many
#: short jobs (a deeper buffer, larger and fewer outcome writes).
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "durable_claims": {"durable_claims": True},
    "tuned": {"prefetch": 4000, "completion_batch": 4000, "completion_interval": 0.005},
}


def aioqueue_system(config: str) -> str:
    """The results' name for aioqueue run with one of ``CONFIGS``."""
    return f"aioqueue ({config})"


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

    def add_rate(self, scenario: str, system: str, metric: str, jobs: int, seconds: float) -> None:
        """Record ``jobs`` done in ``seconds`` as jobs/s, and say it on stderr."""
        self.add(scenario, system, metric, jobs / seconds, "jobs/s", higher_is_better=True)
        progress(f"    {jobs / seconds:12,.0f} jobs/s")

    def add_latency(self, scenario: str, system: str, metric: str, samples: list[float]) -> None:
        """Record the p50, p95 and p99 of ``samples`` (seconds) in ms, and say them on stderr."""
        figures = {pct: percentile(samples, pct) * 1e3 for pct in (50, 95, 99)}
        for pct, value in figures.items():
            self.add(scenario, system, f"{metric}, p{pct}", value, "ms", higher_is_better=False)
        progress(f"    {metric}: " + ", ".join(f"p{pct} {value:.2f} ms" for pct, value in figures.items()))


#: Decimals shown per unit, the same everywhere a figure is printed (report, targets,
#: BENCHMARKS.md): rates as whole jobs, times to the microsecond, ratios to the hundredth.
_DECIMALS = {"jobs/s": 0, "ms": 3, "MB": 1, "KB": 1, "us": 1, "conns": 0, "x": 2}


def figure(value: float, unit: str) -> str:
    """``value`` as the benchmark prints a figure in ``unit``: grouped thousands, fixed decimals
    per unit (``66,443``, ``0.325``, ``1.07``), never an exponent."""
    return f"{value:,.{_DECIMALS.get(unit, 1)}f}"


def progress(message: str) -> None:
    """One line of progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]


# -- the run ---------------------------------------------------------------------------------

Measurement = Callable[[str], Awaitable[None]]


@dataclasses.dataclass
class Run:
    """One benchmark run: where and how big, which other queues, the results so far, and the
    measurements the scenarios have lined up (each gets a fresh database of its own)."""

    admin_dsn: str
    sizes: Sizes
    competitors: list[str]
    sustained_seconds: float = 600.0
    """How long the sustained scenario enqueues and works."""
    per_key_flood: int | None = None
    """The per-key scenario's flood, if not its size's (``--flood``)."""
    results: Results = dataclasses.field(default_factory=Results)
    steps: list[tuple[str, Measurement]] = dataclasses.field(default_factory=list)

    def step(self, label: str, measure: Measurement) -> None:
        """Line up ``measure(dsn)``, to run in a database created for it and dropped after."""
        self.steps.append((label, measure))

    async def run_steps(self, repeat: int) -> None:
        """Run every lined-up measurement, all of them once per repeat."""
        total = len(self.steps) * repeat
        for r, (k, (label, measure)) in itertools.product(range(repeat), enumerate(self.steps)):
            progress(f"[{r * len(self.steps) + k + 1}/{total}] run {r + 1}/{repeat}: {label}")
            async with fresh_database(self.admin_dsn) as dsn:
                await measure(dsn)


# -- databases, queues, workers --------------------------------------------------------------

_db_names = itertools.count()


@contextlib.asynccontextmanager
async def fresh_database(admin_dsn: str) -> AsyncIterator[str]:
    """Create an empty database for one measurement; drop it afterwards."""
    name = f"aioqueue_bench_{os.getpid()}_{next(_db_names)}"
    await admin_execute(admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    try:
        yield with_database(admin_dsn, name)
    finally:
        await admin_execute(admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def admin_execute(admin_dsn: str, *statements: str) -> None:
    """Run ``statements`` (CREATE or DROP DATABASE) one by one on a connection of their own."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        for statement in statements:
            await admin.execute(statement)
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


def worker_for(queue: aioqueue.Queue, concurrency: int, options: dict[str, Any]) -> aioqueue.Worker:
    """A worker the benchmark drives itself (no signal handlers)."""
    return queue.worker(concurrency=concurrency, install_signal_handlers=False, **options)


async def migrated(dsn: str) -> None:
    """Install aioqueue's schema in the (fresh) database."""
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


async def preload(task: aioqueue.Task[..., None], n: int, group: aioqueue.Group | None = None) -> None:
    """Enqueue ``n`` jobs (members of ``group``, if given) through the library's bulk call,
    10,000 per call."""
    for start in range(0, n, 10_000):
        await task.options(group=group).enqueue_many([{"i": i} for i in range(start, min(n, start + 10_000))])


async def analyze(queue: aioqueue.Queue) -> None:
    """ANALYZE the jobs table, as autovacuum soon would after a load."""
    async with queue.connection() as conn:
        await conn.execute("ANALYZE aioqueue.jobs")


async def timed_until_empty(worker: aioqueue.Worker, n: int, what: str) -> float:
    """Run ``worker`` until no job is left and return its seconds; raise, naming ``what``,
    unless it ran ``n`` jobs."""
    # Else the process's one full collection (40-170 ms) fell in the same lane's drain each run.
    gc.collect()
    start = time.perf_counter()
    stats = await worker.run_until_empty()
    seconds = time.perf_counter() - start
    if stats.succeeded != n:
        raise RuntimeError(f"{what} ran {stats.succeeded} jobs of {n}")
    return seconds


async def timed_drain(
    dsn: str, n: int, handler: Callable[..., Awaitable[None]], what: str, pool_size: int = 10
) -> float:
    """Migrate the (fresh) database, preload ``n`` jobs of ``handler``, ANALYZE, and drain them
    with one in-process worker at concurrency 10; return the drain's seconds (raising, naming
    ``what``, if it did not run every job)."""
    await migrated(dsn)
    queue, task = make_queue(dsn, pool_size=pool_size, handler=handler)
    async with queue:
        await preload(task, n)
        await analyze(queue)
        return await timed_until_empty(worker_for(queue, 10, {}), n, f"{what} drain")


async def preloaded(dsn: str, n: int) -> None:
    """Migrate the (fresh) database, enqueue ``n`` jobs of the benchmark's task in bulk, and
    ANALYZE, as autovacuum soon would: the table a drain starts from."""
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        await preload(task, n)
        await analyze(queue)


@contextlib.asynccontextmanager
async def competitor_on(name: str, dsn: str) -> AsyncIterator[Competitor]:
    """Another queue's adapter, set up on ``dsn`` for the body and torn down after."""
    competitor = load_competitor(name)
    await competitor.setup(dsn)
    try:
        yield competitor
    finally:
        await competitor.teardown()


# -- processes and the event loop ------------------------------------------------------------


@contextlib.contextmanager
def child_process(target: Callable[..., None], *args: Any) -> Iterator[multiprocessing.connection.Connection]:
    """Start ``target(*args, pipe)`` in a spawned process; yield this end of its pipe; after the
    body, give it 30 s to exit, then kill it."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    try:
        yield parent
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


async def recv(pipe: multiprocessing.connection.Connection, timeout: float, what: str) -> Any:
    """Receive from a child's pipe within ``timeout`` seconds."""
    ready = await anyio.to_thread.run_sync(pipe.poll, timeout)
    if not ready:
        raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
    return pipe.recv()


def event_loop_name() -> str:
    """The event loop the benchmark runs on, for the report."""
    return f"uvloop {importlib.metadata.version('uvloop')}" if uvloop is not None else "asyncio"


def run_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on uvloop when installed, else asyncio."""
    if uvloop is not None:
        uvloop.run(main())
    else:
        asyncio.run(main())
