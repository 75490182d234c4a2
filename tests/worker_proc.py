"""A worker process for crash tests: ``python -m tests.worker_proc DSN LEASE``.

Its task ``hang`` records that it started (a row in ``started``, committed) and then never
returns, so the test can kill the process with the job in flight.
"""

from __future__ import annotations

import asyncio
import sys

import anyio

import aioqueue


async def main(dsn: str, lease: float) -> None:
    queue = aioqueue.Queue(dsn)

    @queue.task(name="hang")
    async def hang(n: int) -> None:
        job = aioqueue.current_job()
        async with queue.connection() as conn:
            await conn.execute("INSERT INTO started (job_id, pid) VALUES ($1, pg_backend_pid())", job.id)
        await anyio.sleep_forever()

    async with queue:
        await queue.worker(concurrency=4, lease=lease, poll_interval=0.1).run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
