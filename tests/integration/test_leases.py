"""Leases: the heartbeat keeps a live worker's jobs, the reaper recovers a dead worker's."""

from __future__ import annotations

import os
import signal

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.helpers import eventually, hang_until_cancelled, holding_task, recording_task, running
from tests.support.worker import command


async def test_heartbeat_extends_lease_of_a_long_job(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    release = anyio.Event()

    @q.task
    async def long() -> None:
        with anyio.fail_after(20):
            await release.wait()

    job_id = await long.enqueue()
    worker = q.worker(lease=1.0, heartbeat_interval=0.1, reap_interval=0.1)
    async with running(worker):
        first = None

        async def extended_twice() -> bool:
            nonlocal first
            value = await db.fetchval("SELECT lease_expires_at FROM aioqueue.jobs WHERE id = $1", job_id)
            if value is None:
                return False
            first = first or value
            return bool(value > first) and worker.heartbeat is not None and worker.heartbeat.beats >= 5

        # Several lease lengths pass; the reaper runs all the while and must not take the job.
        await eventually(extended_twice, timeout=10, what="the heartbeat to extend the lease")
        # Nothing signals "the reaper did not act": wait until, in database time, a lease
        # taken after the extensions seen so far would have expired unrenewed, and the reaper
        # has made several passes since; then look.
        assert worker.maintenance is not None
        maintenance = worker.maintenance
        seen = await db.fetchval("SELECT lease_expires_at FROM aioqueue.jobs WHERE id = $1", job_id)
        await eventually(lambda: db.fetchval("SELECT now() > $1::timestamptz + interval '0.5 s'", seen),
                         timeout=10, what="a lease length to pass in database time")
        passes = maintenance.passes
        await eventually(lambda: maintenance.passes >= passes + 3, timeout=10, what="three reaper passes")
        row = await db.fetchrow("SELECT status, attempts FROM aioqueue.jobs WHERE id = $1", job_id)
        assert row is not None
        assert (row["status"], row["attempts"]) == ("running", 1)
        release.set()
        await eventually(lambda: worker.stats.succeeded == 1, what="the job to finish")
    assert await q.get_job(job_id) is None


async def test_heartbeat_never_waits_for_a_row_lock(q: aioqueue.Queue, db: asyncpg.Connection, dsn: str) -> None:
    # A heartbeat that waited for row locks, taken in no set order, could deadlock with this
    # worker's completer writing thousands of outcomes; leases then expired and jobs ran twice.
    release = anyio.Event()

    @q.task
    async def long(n: int) -> None:
        with anyio.fail_after(30):
            await release.wait()

    a, b = await long.enqueue_many([{"n": 1}, {"n": 2}])
    lease_sql = "SELECT lease_expires_at FROM aioqueue.jobs WHERE id = $1"
    worker = q.worker(lease=30, heartbeat_interval=0.1, reap_interval=3600)
    async with running(worker):
        await eventually(lambda: len(worker.executor.running if worker.executor else {}) == 2,
                         what="both handlers to start")
        assert worker.heartbeat is not None
        locker = await asyncpg.connect(dsn)
        try:
            async with locker.transaction():
                await locker.execute("SELECT FROM aioqueue.jobs WHERE id = $1 FOR UPDATE", a)
                a_before, b_before = await db.fetchval(lease_sql, a), await db.fetchval(lease_sql, b)
                beats = worker.heartbeat.beats
                await eventually(lambda: worker.heartbeat is not None and worker.heartbeat.beats >= beats + 3,
                                 timeout=5, what="heartbeats to go on while a row is locked")
                assert await db.fetchval(lease_sql, b) > b_before  # the free row was renewed
                assert await db.fetchval(lease_sql, a) == a_before  # the locked one skipped...
                # ...and not taken for lost: its handler still runs while the lock is held...
                assert (a, 1) in (worker.executor.running if worker.executor else {})
            # ...and its lease is renewed once the lock is gone.
            await eventually(lambda: _later(db, lease_sql, a, a_before), what="the skipped lease to be renewed")
        finally:
            await locker.close()
        release.set()
        await eventually(lambda: worker.stats.succeeded == 2, what="both jobs to finish")


async def _later(db: asyncpg.Connection, sql: str, job_id: int, than: object) -> bool:
    return bool(await db.fetchval(sql, job_id) > than)


async def test_reaper_returns_expired_jobs_or_kills_spent_ones(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task(max_attempts=2)
    async def noop() -> None:
        pass

    a, b = await noop.enqueue_many([{}, {}])
    await db.execute(
        "UPDATE aioqueue.jobs SET status = 'running', attempts = CASE WHEN id = $1 THEN 1 ELSE 2 END, "
        "locked_by = 'ghost', lease_expires_at = now() - interval '1 second'",
        a,
    )
    assert await q.reap() == 2
    rows = {r["id"]: r for r in await db.fetch("SELECT * FROM aioqueue.jobs")}
    assert rows[a]["status"] == "pending"
    assert rows[b]["status"] == "dead"
    assert "LeaseExpired: worker ghost" in rows[b]["last_error"]
    assert rows[a]["lease_expires_at"] is None
    assert await q.reap() == 0


async def test_a_worker_started_after_a_crash_reaps_before_its_first_claim(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    work, ran = recording_task(q, "work")
    await work.enqueue_many([{"n": 1}, {"n": 2}])
    # A worker died holding both: their leases ran out, nobody has reaped them yet.
    await db.execute("UPDATE aioqueue.jobs SET status = 'running', attempts = 1, locked_by = 'ghost', "
                     "lease_expires_at = now() - interval '1 second'")
    worker = q.worker(reap_interval=3600)
    stats = await worker.run_until_empty()
    # Reaped first, so this burst's first claim found them: they ran here, not an hour later.
    assert sorted(ran) == [1, 2] and stats.succeeded == 2
    assert worker.maintenance is not None and worker.maintenance.reaped == 2
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    # A burst shorter than reap_interval runs no other upkeep: none raced its end.
    assert worker.maintenance.passes == 0


async def test_upkeep_waits_until_the_worker_has_caught_up_with_a_burst(q: aioqueue.Queue) -> None:
    seen: list[tuple[int, bool]] = []  # per job: upkeep passes done, and whether claiming had caught up
    worker = q.worker(reap_interval=3600)

    @q.task
    async def work(n: int) -> None:
        assert worker.maintenance is not None and worker.producer is not None
        seen.append((worker.maintenance.passes, worker.producer.caught_up.is_set()))

    await work.enqueue_many([{"n": i} for i in range(2000)])
    async with running(worker):
        await eventually(lambda: len(seen) == 2000 and worker.maintenance is not None
                         and worker.maintenance.passes == 1, timeout=20,
                         what="every job run, and an upkeep pass once the backlog was drained")
    # No pass took the server beside the burst while claims still found all they asked for.
    assert seen[0] == (0, False)
    assert all(caught_up for passes, caught_up in seen if passes)


async def test_lost_lease_interrupts_the_handler(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    cancelled = anyio.Event()

    @q.task
    async def long() -> None:
        await hang_until_cancelled(cancelled)

    job_id = await long.enqueue()
    worker = q.worker(lease=30, heartbeat_interval=0.1, reap_interval=3600)
    async with running(worker):
        await eventually(lambda: (job_id, 1) in (worker.executor.running if worker.executor else {}),
                         what="the handler to start")
        # Another worker reaped and re-claimed it: this worker's claim is gone.
        await db.execute("UPDATE aioqueue.jobs SET attempts = attempts + 1, locked_by = 'other'")
        with anyio.fail_after(10):
            await cancelled.wait()
    row = await db.fetchrow("SELECT status, locked_by FROM aioqueue.jobs")
    assert row is not None
    assert (row["status"], row["locked_by"]) == ("running", "other")  # untouched by the loser


async def test_killed_worker_process_job_is_completed_by_another(dsn: str, db: asyncpg.Connection) -> None:
    await db.execute("CREATE TABLE started (job_id bigint, pid int)")
    async with aioqueue.Queue(dsn) as q:
        finished = anyio.Event()
        attempts: list[int] = []

        @q.task(name="hang")
        async def hang(n: int) -> None:
            attempts.append(aioqueue.current_job().attempt)
            finished.set()

        job_id = await hang.enqueue(n=1)
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        proc = await anyio.open_process(command("hang", dsn, 1.0), env=env)
        async with proc:
            try:
                await eventually(
                    lambda: db.fetchval("SELECT count(*) = 1 FROM started"), timeout=30,
                    what="the child worker to start the job",
                )
            finally:
                proc.send_signal(signal.SIGKILL)
                with anyio.fail_after(10):
                    assert await proc.wait() == -signal.SIGKILL
        assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", job_id) == "running"
        # Another worker takes over once the dead worker's 1s lease has expired.
        worker = q.worker(lease=5, reap_interval=0.2, poll_interval=0.2)
        async with running(worker):
            with anyio.fail_after(20):
                await finished.wait()
            await eventually(lambda: worker.stats.succeeded == 1, what="the completion")
            # Counted while the worker runs: a stop may cancel the reaper between its statement
            # and its count, while the job it handed back already ran.
            await eventually(lambda: worker.maintenance is not None and worker.maintenance.reaped >= 1,
                             what="the reaper to count the job it handed back")
        assert attempts == [2]  # the killed worker's claim was attempt 1
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


@pytest.mark.slow
async def test_ten_thousand_running_jobs_keep_their_leases(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    # One worker with 10,000 handlers awaiting at once, a 10 s lease: the heartbeat renews
    # every lease in one statement a beat, and the reaper, running every second all the while,
    # takes none of them back.
    n = 10_000
    holding = holding_task(q, n)
    await holding.task.enqueue_many([{"i": i} for i in range(n)])
    worker = q.worker(concurrency=n, lease=10.0, reap_interval=1.0)
    overdue_sql = "SELECT count(*) FROM aioqueue.jobs WHERE status = 'running' AND lease_expires_at < now()"
    async with running(worker, timeout=60):
        with anyio.fail_after(120):
            await holding.all_in.wait()
        assert worker.heartbeat is not None and worker.executor is not None
        assert len(worker.executor.running) == n
        beats = worker.heartbeat.beats
        # Hold every handler across more than a lease length (four beats of lease/3), looking
        # for a lease run out while its handler still runs.
        with anyio.fail_after(60):
            while worker.heartbeat.beats < beats + 4:
                assert await db.fetchval(overdue_sql) == 0
                await anyio.sleep(0.5)
        row = await db.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'running') AS running, max(attempts) AS attempts "
            "FROM aioqueue.jobs"
        )
        assert row is not None
        assert (row["running"], row["attempts"]) == (n, 1)
        assert len(worker.executor.running) == n  # no handler interrupted for a lost lease
        holding.release.set()
        await eventually(lambda: worker.stats.succeeded == n, timeout=120, what="every job to finish")
    assert worker.stats.claimed == n and worker.stats.interrupted == 0
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
