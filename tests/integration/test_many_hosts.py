"""Workers on many hosts: each is told apart by its name (``host:pid:random``) in ``locked_by``
and its logs, and a host's clock cannot change an outcome, because every time aioqueue acts on
is the database's. Two worker processes run with their wall clocks three hours apart (libfaketime;
``.ci/run`` installs it): delays, leases and heartbeats still hold, and no job runs twice."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
from anyio.abc import Process

import aioqueue
from tests.support.cli_tools import app_task, cli_env
from tests.support.helpers import eventually, terminated_after

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _skewed_env(dsn: str, offset: str) -> dict[str, str]:
    if not os.path.exists(LIBFAKETIME):
        raise RuntimeError(f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run installs it)")
    # Only the wall clock moves: the event loop's monotonic clock is not the host's time of day.
    return {**cli_env(dsn), "LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@contextlib.asynccontextmanager
async def _skewed_worker(dsn: str, cwd: Path, offset: str, *args: str) -> AsyncIterator[Process]:
    command = [sys.executable, "-m", "aioqueue", "worker", "cli_app:queue", "--poll-interval", "0.1", *args]
    process = await anyio.open_process(
        command, env=_skewed_env(dsn, offset), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    async with terminated_after(process):
        yield process


async def test_the_skew_is_real(dsn: str) -> None:
    result = await anyio.run_process(
        [sys.executable, "-c", "import time; print(time.time())"], env=_skewed_env(dsn, "+3h")
    )
    conn = await asyncpg.connect(dsn)
    try:
        db_now = float(await conn.fetchval("SELECT extract(epoch FROM now())"))
    finally:
        await conn.close()
    assert abs(float(result.stdout) - db_now - 3 * 3600) < 60


async def test_workers_with_skewed_clocks_keep_every_outcome(dsn: str, app_dir: Path, db: asyncpg.Connection) -> None:
    await db.execute("ALTER TABLE seen ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp()")
    async with (
        _skewed_worker(dsn, app_dir, "+3h", "--lease", "1.5", "-c", "4") as ahead,
        _skewed_worker(dsn, app_dir, "-3h", "--lease", "1.5", "-c", "4") as behind,
        aioqueue.Queue(dsn) as q,
    ):
        record = app_task(q, "record", "cli")
        # A long job under a short lease: only heartbeats in database time keep it ours.
        await record.enqueue(n=1000, sleep=4)
        await eventually(lambda: db.fetchval("SELECT count(*) = 1 FROM begun WHERE n = 1000"), timeout=20,
                         what="the long job to start")
        locked_by = str(await db.fetchval("SELECT locked_by FROM aioqueue.jobs WHERE status = 'running'"))
        host, pid, _ = locked_by.split(":")
        assert host == socket.gethostname() and int(pid) in (ahead.pid, behind.pid)
        # Delayed jobs run when the database says so, not earlier or hours later.
        enqueued_at = await db.fetchval("SELECT clock_timestamp()")
        await record.options(delay=2).enqueue_many([{"n": n} for n in range(100, 110)])
        await record.enqueue_many([{"n": n} for n in range(40)])
        await eventually(lambda: db.fetchval("SELECT count(*) = 51 FROM seen"), timeout=30,
                         what="every job to run")
        waits = await db.fetch("SELECT extract(epoch FROM at - $1) AS wait FROM seen WHERE n >= 100 AND n < 110",
                               enqueued_at)
        assert all(2.0 <= float(r["wait"]) < 8.0 for r in waits), waits
        assert await db.fetchval("SELECT count(DISTINCT n) FROM seen") == 51  # none twice
        assert await db.fetchval("SELECT count(*) FROM begun WHERE n = 1000") == 1  # the lease held
        # A handler's own write commits before its outcome does: wait for the last outcome.
        await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=10,
                         what="every outcome to be written")
