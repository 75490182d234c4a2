"""A worker process for the prefetch tests: ``python -m tests.prefetch_worker DSN SECONDS``.

A default worker (only ``concurrency=5``) whose task ``nap`` sleeps ``SECONDS`` and records its
start, end and process as a committed row in ``naps``, so a test can tell from the database
which process ran each job, and when.
"""

from __future__ import annotations

import asyncio
import os
import sys

import anyio

import aioqueue

NAPS_TABLE = "CREATE TABLE naps (job_id bigint, pid int, started timestamptz, ended timestamptz)"


async def main(dsn: str, seconds: float) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=4)

    @queue.task(name="nap", queue="naps")
    async def nap() -> None:
        async with queue.connection() as conn:
            started = await conn.fetchval("SELECT clock_timestamp()")
        await anyio.sleep(seconds)
        async with queue.connection() as conn:
            await conn.execute(
                "INSERT INTO naps VALUES ($1, $2, $3, clock_timestamp())",
                aioqueue.current_job().id, os.getpid(), started,
            )

    async with queue:
        await queue.worker(concurrency=5).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
