"""A worker process under load, for the crash tests: ``python -m tests.load_worker DSN CONCURRENCY LEASE``.

Its task ``work`` records each start and each finish of a handler as a committed row in
``runs`` (job id, attempt, this process's pid), sleeping a few milliseconds in between, so a
test that kills this process can tell afterwards which jobs were in flight at the kill.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys

import anyio

import aioqueue

RUNS_TABLE = """
CREATE TABLE runs (
    job_id  bigint NOT NULL,
    n       int    NOT NULL,
    attempt int    NOT NULL,
    pid     int    NOT NULL,
    event   text   NOT NULL CHECK (event IN ('start', 'finish')),
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_RECORD = "INSERT INTO runs (job_id, n, attempt, pid, event) VALUES ($1, $2, $3, $4, $5)"


def register(queue: aioqueue.Queue) -> aioqueue.Task[[int], None]:
    """Register ``work`` on ``queue``: the task the crash tests enqueue and this process runs."""
    pid = os.getpid()

    @queue.task(name="work", max_attempts=1000)
    async def work(n: int) -> None:
        job = aioqueue.current_job()
        async with queue.connection() as conn:
            await conn.execute(_RECORD, job.id, n, job.attempt, pid, "start")
        await anyio.sleep(random.uniform(0.001, 0.02))
        async with queue.connection() as conn:
            await conn.execute(_RECORD, job.id, n, job.attempt, pid, "finish")

    return work


async def main(dsn: str, concurrency: int, lease: float) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=10)
    register(queue)
    async with queue:
        worker = queue.worker(
            concurrency=concurrency,
            lease=lease,
            heartbeat_interval=lease / 6,
            reap_interval=0.25,
            poll_interval=0.2,
            grace_period=5.0,
        )
        await worker.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
