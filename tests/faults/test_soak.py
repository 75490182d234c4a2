"""Slow fault runs on a PostgreSQL server the test owns (embedded, autovacuum on, defaults):
a soak of at least ten minutes of churn that must keep the jobs table and its indexes bounded,
and a claim over a million archived and a hundred thousand dead jobs that must read no more
than it does on an empty table.

Run with ``python -m pytest -m slow -s tests/faults/test_soak.py`` (``-s`` prints the figures);
``AIOQUEUE_SOAK_SECONDS`` shortens or lengthens the soak (default 600).
"""

from __future__ import annotations

import os
import statistics
import time

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support import plans
from tests.support.fault_tools import Churn, Sizes, owned_server, sample_sizes
from tests.support.helpers import eventually, running

pytestmark = pytest.mark.slow

SOAK_SECONDS = float(os.environ.get("AIOQUEUE_SOAK_SECONDS", "600"))


@pytest.mark.timeout(SOAK_SECONDS + 600)
async def test_soak_keeps_jobs_table_and_indexes_bounded() -> None:
    sizes: list[Sizes] = []
    interval = max(5.0, SOAK_SECONDS / 40)
    async with owned_server() as server, aioqueue.Queue(server.dsn, pool_max_size=12) as q:
        churn = Churn(q)
        monitor = await asyncpg.connect(server.dsn)
        try:
            started = time.monotonic()
            workers = [q.worker(concurrency=20, poll_interval=0.5, lease=30) for _ in range(2)]
            async with running(workers[0]), running(workers[1]), anyio.create_task_group() as tg:

                async def sample() -> None:
                    while True:
                        sizes.append(await sample_sizes(monitor, started, churn.completed))
                        print(sizes[-1].row(), flush=True)
                        await anyio.sleep(interval)

                tg.start_soon(sample)
                await churn.feed(started + SOAK_SECONDS)
                await eventually(
                    lambda: churn.completed >= churn.enqueued, timeout=120, interval=0.2,
                    what="the backlog to drain",
                )
                tg.cancel_scope.cancel()
            sizes.append(await sample_sizes(monitor, started, churn.completed))
            print(sizes[-1].row(), flush=True)
            left = await monitor.fetchval("SELECT count(*) FROM aioqueue.jobs")
        finally:
            await monitor.close()

    print(f"soak: {SOAK_SECONDS:.0f}s, {churn.enqueued} jobs enqueued, {churn.completed} completed, "
          f"{churn.completed / SOAK_SECONDS:.0f} jobs/s", flush=True)
    assert left == 0, "every job finished"
    expected = {n: 2 if n % 50 == 0 or n % 100 == 1 else 1 for n in range(churn.enqueued)}
    assert churn.runs == expected, "each job ran once (plus its one planned retry or snooze)"
    warm = [s for s in sizes if s.at >= SOAK_SECONDS * 0.2]
    third = max(1, len(warm) // 3)
    early, late = warm[:third], warm[-third:]
    for field in ("table_bytes", "index_bytes"):
        early_max = max(getattr(s, field) for s in early)
        late_max = max(getattr(s, field) for s in late)
        print(f"{field}: max in the first third {early_max / 1024:.0f} KiB, "
              f"in the last third {late_max / 1024:.0f} KiB")
        assert late_max <= 1.5 * early_max + 512 * 1024, f"{field} kept growing: {early_max} -> {late_max}"


async def _claim_profile(conn: asyncpg.Connection, rounds: int = 30) -> tuple[int, float, set[str]]:
    """Run the claim (20 of the pending jobs) under EXPLAIN ANALYZE, rolled back each time;
    return the most buffers one claim touched, the median execution time, and the indexes used."""
    buffers: list[int] = []
    times: list[float] = []
    indexes: set[str] = set()
    claim = await plans.function_query(conn, "aioqueue.claim_jobs")  # what the claim runs, inside claim_jobs
    for _ in range(rounds):
        plan = await plans.explain(conn, claim, ["default"], [20], "probe", 60.0, 20, analyze=True, buffers=True)
        buffers.append(plans.buffers_touched(plan))
        times.append(float(plan["Execution Time"]))
        indexes |= plans.indexes(plan)
    return max(buffers), statistics.median(times), indexes


async def _drain_rate(q: aioqueue.Queue, noop: aioqueue.Task[..., None], jobs: int) -> float:
    await noop.enqueue_many([{}] * jobs)
    started = time.perf_counter()
    stats = await q.worker(concurrency=20).run_until_empty()
    assert stats.succeeded == jobs
    return jobs / (time.perf_counter() - started)


@pytest.mark.timeout(1800)
async def test_claim_over_a_million_archived_and_100k_dead_reads_what_an_empty_table_does() -> None:
    async with owned_server() as server, aioqueue.Queue(server.dsn) as q:

        @q.task
        async def noop() -> None:
            pass

        conn = await asyncpg.connect(server.dsn)
        try:
            await noop.enqueue_many([{}] * 1000)
            await conn.execute("VACUUM ANALYZE aioqueue.jobs")
            empty_buffers, empty_ms, empty_idx = await _claim_profile(conn)
            await conn.execute("DELETE FROM aioqueue.jobs")
            empty_rate = await _drain_rate(q, noop, 10_000)

            loaded = time.perf_counter()
            await conn.execute(
                "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, "
                "created_at, finished_at) SELECT 1000000000000 + g, 'default', 'noop', "
                "jsonb_build_object('n', g), 'succeeded', 0, 1, now() - interval '1 hour', now() "
                "FROM generate_series(1, 1000000) AS g"
            )
            await conn.execute(
                "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, max_attempts, last_error) "
                "SELECT 'default', 'noop', jsonb_build_object('n', g), 'dead', 5, 5, 'boom' "
                "FROM generate_series(1, 100000) AS g"
            )
            await conn.execute("VACUUM ANALYZE aioqueue.jobs")
            await conn.execute("VACUUM ANALYZE aioqueue.jobs_done")
            print(f"loaded 1,000,000 archived and 100,000 dead jobs in {time.perf_counter() - loaded:.1f}s")

            await noop.enqueue_many([{}] * 1000)
            await conn.execute("ANALYZE aioqueue.jobs")
            big_buffers, big_ms, big_idx = await _claim_profile(conn)
            await conn.execute("DELETE FROM aioqueue.jobs WHERE status = 'pending'")
            big_rate = await _drain_rate(q, noop, 10_000)
            dead = await conn.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'dead'")
            archived = await conn.fetchval("SELECT count(*) FROM aioqueue.jobs_done")
        finally:
            await conn.close()

    print(f"claim of 20 from 1000 ready, empty history: {empty_buffers} buffers, {empty_ms:.2f} ms "
          f"median, indexes {sorted(empty_idx)}; drain {empty_rate:.0f} jobs/s")
    print(f"claim of 20 from 1000 ready, 1M archived + 100k dead: {big_buffers} buffers, {big_ms:.2f} ms "
          f"median, indexes {sorted(big_idx)}; drain {big_rate:.0f} jobs/s")
    assert dead == 100_000 and archived >= 1_000_000
    # The claim reads the ready index and the rows it takes: history adds nothing to read.
    assert big_buffers <= empty_buffers * 1.25 + 8, (empty_buffers, big_buffers)
