"""A first end-to-end pass: enqueue, drain, gone."""

from __future__ import annotations

import asyncpg

import aioqueue


async def test_enqueue_and_drain(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    seen: list[int] = []

    @q.task
    async def record(n: int) -> None:
        seen.append(n)

    ids = [await record.enqueue(n=i) for i in range(5)]
    assert len(set(ids)) == 5
    stats = await q.worker(concurrency=3).run_until_empty()
    assert sorted(seen) == list(range(5))
    assert stats.succeeded == 5
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
