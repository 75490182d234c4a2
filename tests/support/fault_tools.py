"""Tools the fault tests share: a PostgreSQL server a test owns and may stop and start, backend
termination, table-size sampling, and a steady job load for churn and soak runs.

Nothing here mocks the database: every fault is a real one (a signal, a stopped server, a
terminated backend, a transaction held open).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from anyio.abc import Process

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue.embedded import embedded_server, pg_ctl


@dataclasses.dataclass
class OwnedServer:
    """An embedded PostgreSQL cluster that a test owns: it may be stopped and started again,
    keeping its data directory and its port, so its DSN stays valid across restarts."""

    dsn: str
    data_dir: Path

    async def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back open transactions and close every connection;
        ``immediate``: like a crash, no shutdown checkpoint, recovery on the next start)."""
        await anyio.to_thread.run_sync(pg_ctl, self.data_dir, "-m", mode, "stop")

    async def start(self) -> None:
        """Start the server again on the same data directory and port."""
        await anyio.to_thread.run_sync(pg_ctl, self.data_dir, "start")


@contextlib.asynccontextmanager
async def owned_server() -> AsyncIterator[OwnedServer]:
    """Run a fresh embedded cluster for one test; yield it migrated; delete it afterwards (its
    exit stops the server whoever started it last)."""
    cm = embedded_server()
    dsn = await anyio.to_thread.run_sync(cm.__enter__)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await migrate.migrate(conn, "aioqueue")
            data_dir = str(await conn.fetchval("SHOW data_directory"))
        finally:
            await conn.close()
        yield OwnedServer(dsn, Path(data_dir))
    finally:
        await anyio.to_thread.run_sync(cm.__exit__, None, None, None)


async def terminate_backends(conn: asyncpg.Connection) -> int:
    """Terminate every other backend connected to ``conn``'s database; return how many."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    )


@dataclasses.dataclass(frozen=True)
class Sizes:
    """One sample of the jobs table's footprint."""

    at: float
    table_bytes: int
    index_bytes: int
    live_rows: int
    dead_rows: int
    completed: int

    def row(self) -> str:
        return (
            f"{self.at:8.0f}s  table {self.table_bytes / 1024:9.0f} KiB  indexes "
            f"{self.index_bytes / 1024:9.0f} KiB  live {self.live_rows:7d}  dead {self.dead_rows:8d}  "
            f"completed {self.completed:9d}"
        )


async def sample_sizes(conn: asyncpg.Connection, started: float, completed: int) -> Sizes:
    """Measure the jobs table: heap bytes, index bytes, live and dead tuples (statistics)."""
    row = await conn.fetchrow(
        "SELECT pg_relation_size('aioqueue.jobs') AS t, pg_indexes_size('aioqueue.jobs') AS i, "
        "coalesce(s.n_live_tup, 0) AS live, coalesce(s.n_dead_tup, 0) AS dead "
        "FROM pg_stat_user_tables AS s WHERE s.relid = 'aioqueue.jobs'::regclass"
    )
    assert row is not None
    return Sizes(time.monotonic() - started, row["t"], row["i"], row["live"], row["dead"], completed)


class Churn:
    """A steady load: keeps about ``backlog`` jobs waiting, run by in-process workers.

    Jobs of ``churn`` succeed; every 50th fails once and is retried; every 100th snoozes once;
    every 10th is archived (``churn_archived``). ``completed`` counts handler successes and
    ``runs`` counts starts per job key, so a test can check that nothing ran twice.
    """

    def __init__(self, queue: aioqueue.Queue, backlog: int = 2000, batch: int = 200) -> None:
        self.queue = queue
        self.backlog = backlog
        self.batch = batch
        self.enqueued = 0
        self.completed = 0
        self.runs: dict[int, int] = {}
        self.wanted = anyio.Event()
        retry = aioqueue.Backoff(base=0.05, jitter=0.0)

        async def handle(n: int) -> None:
            self.runs[n] = self.runs.get(n, 0) + 1
            job = aioqueue.current_job()
            if n % 50 == 0 and job.attempt == 1:
                raise RuntimeError("transient failure, retried")
            if n % 100 == 1 and job.attempt == 1 and job.max_attempts == 5:
                raise aioqueue.Snooze(0.05)
            self.completed += 1
            if self.enqueued - self.completed < self.backlog // 2:
                self.wanted.set()

        self.churn = queue.task(name="churn", retry=retry)(handle)
        self.archived = queue.task(name="churn_archived", retry=retry, archive=True)(handle)

    async def feed(self, until: float) -> None:
        """Enqueue in batches, topping the backlog up, until ``time.monotonic() >= until``."""
        while time.monotonic() < until:
            while self.enqueued - self.completed < self.backlog and time.monotonic() < until:
                items: list[dict[str, Any]] = [{"n": self.enqueued + i} for i in range(self.batch)]
                plain = [i for i in items if i["n"] % 10]
                archived = [i for i in items if not i["n"] % 10]
                await self.churn.enqueue_many(plain)
                await self.archived.enqueue_many(archived)
                self.enqueued += self.batch
            self.wanted = anyio.Event()
            with anyio.move_on_after(1.0):
                await self.wanted.wait()


async def stop_processes(procs: Sequence[Process], grace: float = 15.0) -> None:
    """SIGTERM every process, give them ``grace`` seconds together, kill those left, close all."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    with anyio.move_on_after(grace):
        for proc in procs:
            await proc.wait()
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()
