"""The reference lane: the drain and the bulk enqueue done by the smallest asyncpg code that
does them well, with no framework, on aioqueue's own table. aioqueue's ratio to it is the figure
that survives a noisy machine: both run in the same run, one after the other, on the same
server, with the same rows.

The drain claims ``CLAIM`` ready rows with ``FOR UPDATE SKIP LOCKED`` on one connection, calls
the no-op handler for each, and deletes the finished ids in batches on a second connection
while the next claim runs. The bulk enqueue encodes the arguments with ``json.dumps`` and sends
one ``INSERT ... SELECT FROM unnest(...)``. Both commit with the session's settings (durable).
The same INSERT timed alone, its arguments encoded before the clock, is the server's floor for
a bulk enqueue of these rows: no client can insert them faster than that on this machine.
"""

from __future__ import annotations

import gc
import json
import time

import anyio
import asyncpg
from common import TASK, migrated, noop, preloaded

SYSTEM = "reference"
CLAIM = 100

_CLAIM = """
UPDATE aioqueue.jobs AS j SET status = 'running', attempts = j.attempts + 1, locked_at = now()
WHERE j.id IN (
    SELECT c.id FROM aioqueue.jobs AS c
    WHERE c.status = 'pending' AND c.queue = 'default' AND c.run_at <= now()
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
RETURNING j.id, j.args::text
"""
_DELETE = "DELETE FROM aioqueue.jobs WHERE id = ANY($1::bigint[])"
_INSERT = """
INSERT INTO aioqueue.jobs (queue, task, args)
SELECT 'default', $1, a::jsonb FROM unnest($2::text[]) AS a
RETURNING id
"""


async def reference_drain(dsn: str, n: int) -> float:
    """Seconds for the reference loop to run ``n`` preloaded jobs and delete every one."""
    await preloaded(dsn, n)
    claimer = await asyncpg.connect(dsn)
    deleter = await asyncpg.connect(dsn)
    finished: list[int] = []
    have = anyio.Event()
    claiming = True
    deleted = 0

    async def delete() -> None:
        nonlocal have, deleted
        while claiming or finished:
            await have.wait()
            have = anyio.Event()
            while finished:
                batch = finished[:]
                finished.clear()
                await deleter.execute(_DELETE, batch)
                deleted += len(batch)

    try:
        gc.collect()  # as before aioqueue's drains (timed_until_empty), its pair
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(delete)
            while rows := await claimer.fetch(_CLAIM, CLAIM):
                for row in rows:
                    await noop(**json.loads(row[1]))
                    finished.append(row[0])
                have.set()
            claiming = False
            have.set()
        elapsed = time.perf_counter() - start
    finally:
        await claimer.close()
        await deleter.close()
    if deleted != n:
        raise RuntimeError(f"the reference drain ran {deleted} jobs of {n}")
    return elapsed


async def reference_bulk_insert(dsn: str, n: int, *, statement_alone: bool = False) -> float:
    """Seconds to encode and insert ``n`` jobs with one plain unnest INSERT, ids returned
    (``statement_alone``: the arguments encoded before the clock starts)."""
    await migrated(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.fetch(_INSERT, TASK, [json.dumps({"i": -1})])  # prepare outside the clock
        items = [{"i": i} for i in range(n)]
        encoded = [json.dumps(item) for item in items] if statement_alone else []
        start = time.perf_counter()
        ids = await conn.fetch(_INSERT, TASK, encoded or [json.dumps(item) for item in items])
        elapsed = time.perf_counter() - start
    finally:
        await conn.close()
    if len(ids) != n:
        raise RuntimeError(f"the reference insert returned {len(ids)} ids for {n} jobs")
    return elapsed
