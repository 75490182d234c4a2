"""A queue that opens its pool warms the connection it opened for a worker's first statements
(the schema check and the claim), so a burst's first claim waits neither for a prepare round
trip nor for a cold plan; on a database without the schema, opening still works."""

from __future__ import annotations

import aioqueue
from aioqueue import _warm as warm


async def prepared(queue: aioqueue.Queue) -> dict[str, int]:
    """The statements prepared on the pool's (one idle) connection, with how often each ran."""
    async with queue.connection() as conn:
        rows = await conn.fetch("SELECT statement, generic_plans + custom_plans AS ran FROM pg_prepared_statements")
    return {row["statement"]: row["ran"] for row in rows}


async def test_an_opened_queue_is_ready_for_a_workers_first_claim(dsn: str) -> None:
    async with aioqueue.Queue(dsn, pool_max_size=1) as queue:
        q = queue.database.queries
        first = await prepared(queue)
        assert first[q.limited_queues_at_version] == 1
        assert first[q.claim_unlimited_timed] == 1

        @queue.task
        async def noop() -> None:
            pass

        await noop.enqueue_many([{}] * 3)
        assert (await queue.worker(install_signal_handlers=False).run_until_empty()).succeeded == 3
        after = await prepared(queue)
        # The worker's check and claims ran on the prepared statements (none prepared again).
        assert after[q.limited_queues_at_version] == 2
        assert after[q.claim_unlimited_timed] > 1


async def test_a_queue_opens_on_a_database_without_the_schema(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn) as queue:
        assert queue.database.is_open
        await queue.migrate()
        await warm.warm_up(queue.database.pool, queue.database.statements)  # once there is one, it warms
        assert queue.database.queries.claim_unlimited_timed in await prepared(queue)
