"""The sustained scenario: producers in processes of their own enqueue while a worker process
works, for minutes, at the defaults (the server's ``synchronous_commit``, the worker's default
settings); against the same worker draining a preloaded backlog alone, in the same run.

Reported: the jobs the worker started per second over the whole run and in each third; the time
from an enqueue's commit (seen by its producer) to the start of its first job, p50 and p99,
over the run and in each third; the ``jobs`` table's and its indexes' sizes at the end of each
third. Producers keep at most ``BACKLOG`` jobs waiting between them (they pause above it, as an
application held back by a full queue would), so a run measures the rate the worker sustains,
not how long a backlog grows. Run on request only (``--scenarios sustained``): it lasts
``--duration`` seconds (600; 30 with ``--quick``) plus the drain.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
from multiprocessing.sharedctypes import Synchronized
from typing import Any

import anyio
import asyncpg
from common import Run, child_process, make_queue, migrated, preload, progress, recv, run_loop, worker_for

PRODUCERS = 2
#: Jobs per enqueue call: an application that enqueues what one request produced.
BATCH = 100
#: Jobs waiting at most (producers pause above it).
BACKLOG = 10_000
CONCURRENCY = 100
#: The preloaded backlog drained alone (``--quick``: a tenth).
DRAIN_JOBS = 200_000
SYSTEM = "aioqueue (defaults)"
DRAIN_ALONE = "drain alone, 1 worker process"
SUSTAINED = f"enqueue and work, 1 worker process, {PRODUCERS} producer processes"
THIRDS = ("first third", "second third", "last third")


async def sampled(s: int = -1, i: int = 0) -> None:
    """The benchmark's handler here: ``s`` marks the first job of an enqueue call (``i``: a
    preloaded job's number)."""


def plan(run: Run) -> None:
    """Line up the drain alone, then the sustained run (``run.sustained_seconds`` long)."""
    duration = run.sustained_seconds
    quick = run.sizes.drain_jobs < 20_000
    jobs = DRAIN_JOBS // 10 if quick else DRAIN_JOBS

    async def alone(dsn: str) -> None:
        run.results.add_rate("sustained", SYSTEM, DRAIN_ALONE, jobs, await drain_alone(run, dsn, jobs))

    async def sustained(dsn: str) -> None:
        await sustained_run(run, dsn, duration)

    run.step(f"sustained: drain of {jobs:,} jobs alone", alone)
    run.step(f"sustained: enqueue and work for {duration:g} s", sustained)


def _counter() -> Synchronized[int]:
    return multiprocessing.get_context("spawn").Value("q", 0)


async def _wait_for(counter: Synchronized[int], at_least: int, timeout: float) -> None:
    with anyio.fail_after(timeout):
        # Another process writes the counter in shared memory: there is nothing to await.
        while counter.value < at_least:  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def drain_alone(run: Run, dsn: str, jobs: int) -> float:
    """Seconds for the worker process to start ``jobs`` preloaded jobs (and its profile)."""
    await migrated(dsn)
    queue, task = make_queue(dsn, handler=sampled)
    async with queue:
        await preload(task, jobs)
        async with queue.connection() as conn:
            await conn.execute("VACUUM ANALYZE aioqueue.jobs")
    started = _counter()
    with child_process(_worker_process, _named(dsn, "worker"), started) as worker:
        profile = Profile(dsn, {await recv(worker, 60.0, "the worker process to start"): "worker process"})
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(profile.run, done)
            begin = time.perf_counter()
            worker.send("go")
            await _wait_for(started, jobs, 600.0)
            elapsed = time.perf_counter() - begin
            done.set()
        worker.send("stop")
        await recv(worker, 60.0, "the worker process to stop")
    profile.record(run, DRAIN_ALONE, jobs)
    return elapsed


async def sustained_run(run: Run, dsn: str, duration: float) -> None:
    """Producers and the worker for ``duration`` seconds; record rate, latency, sizes, profile."""
    await migrated(dsn)
    started, enqueued = _counter(), _counter()
    with contextlib.ExitStack() as stack:
        worker = stack.enter_context(child_process(_worker_process, _named(dsn, "worker"), started))
        producers = [stack.enter_context(child_process(
            _producer_process, _named(dsn, "producer"), i, duration, enqueued, started)) for i in range(PRODUCERS)]
        pids = {await recv(worker, 60.0, "the worker process to start"): "worker process"}
        for pipe in producers:
            pids[await recv(pipe, 60.0, "a producer process to start")] = "producer processes"
        profile = Profile(dsn, pids)
        done = anyio.Event()
        counts = [0]
        async with anyio.create_task_group() as tg:
            tg.start_soon(profile.run, done)
            begin = time.monotonic()
            for pipe in (worker, *producers):
                pipe.send("go")
            for third in THIRDS:
                await anyio.sleep(begin + duration * (len(counts)) / 3 - time.monotonic())
                counts.append(started.value)
                rate = (counts[-1] - counts[-2]) / (duration / 3)
                sizes = await _sizes(dsn)
                progress(f"    {third}: {rate:,.0f} jobs/s started, {enqueued.value - started.value:,} waiting; "
                         + ", ".join(f"{k} {v:.1f} MB" for k, v in sizes.items() if v >= 0.1))
                for name, mb in sizes.items():
                    run.results.add("sustained", SYSTEM, f"{name} at the end of the {third}", mb, "MB",
                                    higher_is_better=False)
                run.results.add("sustained", SYSTEM, f"{SUSTAINED}, {third}", rate, "jobs/s", higher_is_better=True)
            done.set()
        commits: dict[int, float] = {}
        for pipe in producers:
            commits.update(await recv(pipe, 120.0, "a producer to finish"))
        worker.send("stop")
        starts: list[tuple[int, float]] = await recv(worker, 120.0, "the worker process to stop")
    run.results.add_rate("sustained", SYSTEM, SUSTAINED, counts[-1], duration)
    profile.record(run, SUSTAINED, counts[-1])
    waits = sorted((commits[b] - begin, max(0.0, s - commits[b])) for b, s in starts if b in commits)
    run.results.add_latency("sustained", SYSTEM, "commit seen -> handler start", [w for _, w in waits])
    for k, third in enumerate(THIRDS):
        part = [w for t, w in waits if duration * k / 3 <= t < duration * (k + 1) / 3]
        if part:
            run.results.add_latency("sustained", SYSTEM, f"commit seen -> handler start, {third}", part)


def _named(dsn: str, role: str) -> str:
    """``dsn`` with the connections' application_name set to ``role``, so the profile can tell
    whose backend is whose."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name=bench_{role}"


def _cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user and system) process ``pid`` of this machine has used, or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Profile:
    """Where the CPU went while jobs ran (each benchmark process, and the server backends of
    this database by the application_name their process set: the server must run on this
    machine), and what the active backends waited on (``pg_stat_activity``, sampled)."""

    def __init__(self, dsn: str, processes: dict[int, str]) -> None:
        self.dsn = dsn
        self.processes = processes
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, float] = {}
        self.waits: collections.Counter[str] = collections.Counter()

    def _see(self, pid: int, group: str) -> None:
        cpu = _cpu_seconds(pid)
        if cpu is not None:
            self.first.setdefault(pid, (group, cpu))
            self.last[pid] = cpu

    async def sample(self, conn: Any) -> None:
        for pid, group in self.processes.items():
            self._see(pid, group)
        rows = await conn.fetch(
            "SELECT pid, application_name, state, wait_event_type, wait_event FROM pg_stat_activity "
            "WHERE (datname = current_database() AND pid <> pg_backend_pid()) OR backend_type IN "
            "('walwriter', 'checkpointer', 'background writer', 'autovacuum worker')")
        for r in rows:
            self._see(r["pid"], (r["application_name"] or "server").removeprefix("bench_") + " backends")
            if r["state"] == "active":
                self.waits[f"{r['wait_event_type']}:{r['wait_event']}" if r["wait_event"] else "CPU"] += 1

    async def run(self, until: anyio.Event) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not until.is_set():
                await self.sample(conn)
                await anyio.sleep(0.05)
            await self.sample(conn)
        finally:
            await conn.close()

    def cpu(self) -> dict[str, float]:
        """CPU seconds per group."""
        out: collections.defaultdict[str, float] = collections.defaultdict(float)
        for pid, (group, start) in self.first.items():
            out[group] += self.last[pid] - start
        return dict(out)

    def record(self, run: Run, metric: str, jobs: int) -> None:
        """Add CPU ms per 1,000 jobs per group, and the waits, to the results and say them."""
        cpu = self.cpu()
        for group, seconds in sorted(cpu.items()):
            run.results.add("sustained", SYSTEM, f"{metric}: CPU of {group}, per 1,000 jobs", 1e6 * seconds / jobs,
                            "ms", higher_is_better=False)
        total = sum(self.waits.values()) or 1
        waits = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in self.waits.most_common(5))
        progress("    CPU ms per 1,000 jobs: " + ", ".join(f"{g} {1e6 * c / jobs:.0f}" for g, c in sorted(cpu.items()))
                 + f"; active backends: {waits}")


async def _sizes(dsn: str) -> dict[str, float]:
    """MB of the jobs table and of each of its indexes."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, pg_relation_size(c.oid) / 1048576.0 AS mb FROM pg_class AS c "
            "WHERE c.relnamespace = 'aioqueue'::regnamespace AND (c.oid = 'aioqueue.jobs'::regclass OR c.oid IN "
            "(SELECT indexrelid FROM pg_index WHERE indrelid = 'aioqueue.jobs'::regclass)) ORDER BY c.relname")
    finally:
        await conn.close()
    return {r["relname"]: float(r["mb"]) for r in rows}


def _worker_process(dsn: str, started: Synchronized[int], pipe: multiprocessing.connection.Connection) -> None:
    """Worker process at the defaults: on go, work until stop; count handler starts in
    ``started`` (every few ms) and send back when each call's first job started."""

    async def main() -> None:
        count = 0
        starts: list[tuple[int, float]] = []

        async def handler(s: int = -1, i: int = 0) -> None:
            nonlocal count
            count += 1
            if s >= 0:
                starts.append((s, time.monotonic()))

        queue, _ = make_queue(dsn, handler=handler)
        async with queue:
            async with queue.connection() as conn:
                await conn.fetchval("SELECT 1")
            pipe.send(os.getpid())
            await anyio.to_thread.run_sync(pipe.recv)
            worker = worker_for(queue, CONCURRENCY, {})
            async with anyio.create_task_group() as tg:

                async def publish() -> None:
                    while True:
                        started.value = count
                        await anyio.sleep(0.002)

                tg.start_soon(publish)
                async with anyio.create_task_group() as working:
                    working.start_soon(worker.run)
                    await anyio.to_thread.run_sync(pipe.recv)
                    worker.stop()
                tg.cancel_scope.cancel()
            pipe.send(starts)

    run_loop(main)


def _producer_process(
    dsn: str, index: int, duration: float, enqueued: Synchronized[int], started: Synchronized[int],
    pipe: multiprocessing.connection.Connection,
) -> None:
    """Producer: on go, enqueue BATCH jobs per call for ``duration`` seconds, pausing while
    BACKLOG jobs wait; send back when each call's commit was seen, by the call's mark."""

    async def main() -> None:
        queue, task = make_queue(dsn, pool_size=2, handler=sampled)
        commits: dict[int, float] = {}
        async with queue:
            async with queue.connection() as conn:
                await conn.fetchval("SELECT 1")
            pipe.send(os.getpid())
            await anyio.to_thread.run_sync(pipe.recv)
            end = time.monotonic() + duration
            seq = 0
            filler: list[dict[str, Any]] = [{}] * (BATCH - 1)
            while time.monotonic() < end:
                if enqueued.value - started.value >= BACKLOG:
                    await anyio.sleep(0.002)
                    continue
                mark = index * 1_000_000_000 + seq
                await task.enqueue_many([{"s": mark}, *filler])
                commits[mark] = time.monotonic()
                with enqueued.get_lock():
                    enqueued.value += BATCH
                seq += 1
        pipe.send(commits)

    run_loop(main)
