"""A long transaction held open elsewhere pins the xmin horizon: no dead row version younger
than its snapshot can be vacuumed, in the jobs table or anywhere else. Claims must stay correct
(no job lost, none twice) while it lasts; the slow run measures how throughput and the table's
footprint degrade (docs/explanation/reliability.md says what it does and what to do).

Measure with ``python -m pytest -m slow -s tests/faults/test_long_tx.py``
(``AIOQUEUE_PINNED_SECONDS``, default 300, sets how long the horizon stays pinned).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.fault_tools import Churn, owned_server, sample_sizes
from tests.support.helpers import eventually, running
from tests.support.plans import buffers_touched, explain, function_query

PINNED_SECONDS = float(os.environ.get("AIOQUEUE_PINNED_SECONDS", "300"))


async def _pin(conn: asyncpg.Connection) -> asyncpg.transaction.Transaction:
    """Open a REPEATABLE READ transaction on ``conn`` and take its snapshot; return it."""
    tr = conn.transaction(isolation="repeatable_read")
    await tr.start()
    await conn.fetchval("SELECT count(*) FROM aioqueue.jobs")
    return tr


async def _dead_after_vacuum(db: asyncpg.Connection) -> int:
    await db.execute("VACUUM aioqueue.jobs")
    await db.execute("SELECT pg_stat_clear_snapshot()")
    return int(await db.fetchval(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'aioqueue.jobs'::regclass"
    ))


async def test_claims_stay_correct_while_a_long_transaction_pins_xmin(dsn: str, db: asyncpg.Connection) -> None:
    jobs = 3000
    runs: Counter[int] = Counter()
    queues = [aioqueue.Queue(dsn, pool_max_size=5) for _ in range(2)]
    for queue in queues:

        @queue.task(name="count", retry=aioqueue.Backoff(base=0.01, jitter=0))
        async def count(n: int) -> None:
            runs[n] += 1
            if n % 10 == 0 and aioqueue.current_job().attempt == 1:
                raise RuntimeError("retried once: one more dead version per retry")

    holder = await asyncpg.connect(dsn)
    try:
        pin = await _pin(holder)
        pinned_xmin = await db.fetchval(
            "SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = $1", holder.get_server_pid()
        )
        assert pinned_xmin is not None
        async with queues[0], queues[1]:
            await count.enqueue_many([{"n": n} for n in range(jobs)])
            workers = [q.worker(concurrency=20, poll_interval=0.2, install_signal_handlers=False) for q in queues]
            async with running(workers[0]), running(workers[1]):
                await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=60,
                                 interval=0.05, what="every job to finish under the pinned horizon")
        # The horizon really was pinned: vacuum could remove none of the churn's dead versions.
        pinned_dead = await _dead_after_vacuum(db)
        assert pinned_dead >= jobs, pinned_dead
        await pin.rollback()
    finally:
        await holder.close()
    assert await _dead_after_vacuum(db) < pinned_dead // 10  # released: vacuum catches up at once
    assert sorted(runs) == list(range(jobs))
    assert all(c == (2 if n % 10 == 0 else 1) for n, c in runs.items())


async def _claim_buffers(conn: asyncpg.Connection) -> int:
    claim = await function_query(conn, "aioqueue.claim_jobs")  # what the claim runs, inside claim_jobs
    plan = await explain(conn, claim, ["default"], [20], "probe", 60.0, 20, analyze=True, buffers=True)
    return buffers_touched(plan)


@pytest.mark.slow
@pytest.mark.timeout(PINNED_SECONDS + 900)
async def test_measure_throughput_under_a_pinned_xmin() -> None:
    phases = [("before", 90.0), ("pinned", PINNED_SECONDS), ("released", 120.0)]
    window = 15.0
    rows: list[str] = []
    async with owned_server() as server, aioqueue.Queue(server.dsn, pool_max_size=12) as q:
        churn = Churn(q)
        monitor = await asyncpg.connect(server.dsn)
        holder = await asyncpg.connect(server.dsn)
        try:
            started = time.monotonic()
            workers = [q.worker(concurrency=20, poll_interval=0.5, install_signal_handlers=False) for _ in range(2)]
            async with running(workers[0]), running(workers[1]), anyio.create_task_group() as tg:
                tg.start_soon(churn.feed, started + sum(d for _, d in phases))
                for phase, duration in phases:
                    pin = await _pin(holder) if phase == "pinned" else None
                    phase_end = time.monotonic() + duration
                    while time.monotonic() < phase_end:
                        before = churn.completed
                        await anyio.sleep(window)
                        rate = (churn.completed - before) / window
                        sizes = await sample_sizes(monitor, started, churn.completed)
                        buffers = await _claim_buffers(monitor)
                        rows.append(f"{phase:9s} {rate:7.0f} jobs/s  claim {buffers:6d} buffers  {sizes.row()}")
                        print(rows[-1], flush=True)
                    if pin is not None:
                        await pin.rollback()
                await eventually(lambda: churn.completed >= churn.enqueued, timeout=300, interval=0.2,
                                 what="the backlog to drain")
            left = await monitor.fetchval("SELECT count(*) FROM aioqueue.jobs")
        finally:
            await holder.close()
            await monitor.close()
    print("\n".join(rows))
    assert left == 0
    expected = {n: 2 if n % 50 == 0 or n % 100 == 1 else 1 for n in range(churn.enqueued)}
    assert churn.runs == expected
