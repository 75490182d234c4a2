"""A fair queue's claim marks the jobs it took running by their rows' addresses (a TID scan, the
rows its walk or its take locked), not by a descent of the primary key a job."""

from __future__ import annotations

import asyncpg
import pytest

import aioqueue
from tests.support.helpers import add_keyed_jobs

CLAIM_IDS = "SELECT c.id FROM aioqueue.claim_keyed(ARRAY['tenants'], ARRAY[$1::int], 'w', 30, $1::int, NULL) AS c"
PKEY = "SELECT pg_stat_get_xact_tuples_returned('aioqueue.jobs_pkey'::regclass)"


@pytest.mark.parametrize(("keys", "per_key"), [(200, 1), (3, 50)], ids=["walk", "take"])
async def test_a_fair_claim_reads_no_primary_key_entry(
    q: aioqueue.Queue, db: asyncpg.Connection, keys: int, per_key: int
) -> None:
    """A claim of 100: over 200 keys, each key's job as the walk locked it; over 3 keys of 50,
    turns of 34 taken after the walk. Either way not one entry of jobs_pkey is read (until
    0047, one a job, to mark it running), and every job returned is running."""

    @q.task(queue="tenants")
    async def work() -> None:
        pass

    await q.set_key_limits("tenants", fair=True)
    await add_keyed_jobs(db, work.name, range(1, keys + 1), per_key)
    await db.execute("ANALYZE aioqueue.jobs")
    async with db.transaction():
        before = await db.fetchval(PKEY)
        ids = [r["id"] for r in await db.fetch(CLAIM_IDS, 100)]
        read = await db.fetchval(PKEY) - before
    running = await db.fetch("SELECT id FROM aioqueue.jobs WHERE status = 'running'")
    assert len(ids) == 100 and sorted(ids) == sorted(r["id"] for r in running)
    assert read == 0, read
