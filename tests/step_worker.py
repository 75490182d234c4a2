"""A worker process for the steps crash test: ``python -m tests.step_worker DSN CONCURRENCY LEASE``.

Its task ``flow`` runs five durable steps, each writing its side effect (a row of
``effects``) on the step's own connection, with a 0 s durable sleep after the second, so that
kills land before, inside and after steps, and between a suspension and its resumption.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys

import anyio

import aioqueue

EFFECTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS effects (job_id bigint, step int, pid int, at timestamptz DEFAULT clock_timestamp())"
)


def register(queue: aioqueue.Queue) -> aioqueue.Task[..., int]:
    @queue.task(name="flow", max_attempts=100)
    async def flow(n: int) -> int:
        job = aioqueue.current_job()
        total = 0
        for step in range(1, 6):
            async with queue.connection() as conn:

                async def effect(step: int = step, conn: object = conn) -> int:
                    await conn.execute(  # type: ignore[attr-defined]
                        "INSERT INTO effects (job_id, step, pid) VALUES ($1, $2, $3)", job.id, step, os.getpid()
                    )
                    await anyio.sleep(random.uniform(0.0, 0.01))  # a kill may land inside the step
                    return step

                total += int(await aioqueue.step(f"effect {step}", effect, connection=conn))
            if step == 2:
                await aioqueue.sleep(0, name="pause")
        return total

    return flow


async def main(dsn: str, concurrency: int, lease: float) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=concurrency + 4)
    register(queue)
    async with queue:
        await queue.worker(
            concurrency=concurrency, lease=lease, heartbeat_interval=lease / 6, reap_interval=0.25,
            poll_interval=0.2, grace_period=5.0,
        ).run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
