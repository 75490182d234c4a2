"""A worker process for the limit tests: ``python -m tests.limit_worker DSN SECONDS``.

Its task ``limited`` (queue ``lim``) sleeps ``SECONDS`` and records its start and end as a
committed row in ``spans``, so a test can tell from the database how many ran at once across
every process, and when.
"""

from __future__ import annotations

import asyncio
import sys

import anyio

import aioqueue

SPANS_TABLE = "CREATE TABLE spans (job_id bigint, started timestamptz, ended timestamptz)"


async def main(dsn: str, seconds: float) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=4)

    @queue.task(name="limited", queue="lim")
    async def limited() -> None:
        async with queue.connection() as conn:
            started = await conn.fetchval("SELECT clock_timestamp()")
        await anyio.sleep(seconds)
        async with queue.connection() as conn:
            await conn.execute(
                "INSERT INTO spans VALUES ($1, $2, clock_timestamp())", aioqueue.current_job().id, started
            )

    async with queue:
        await queue.worker(concurrency=5, poll_interval=5.0).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
