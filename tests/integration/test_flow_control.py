"""Flow control across workers: delays, unique jobs, per-queue slots, global concurrency and rate
limits, pause, cancellation, snooze, results and retention."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._maintenance import Maintenance
from tests.support.helpers import eventually, hang_until_cancelled, noop_task, prune_archive, running


async def test_delayed_job_runs_only_after_its_database_time(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    started_at: list[datetime.datetime] = []

    @q.task
    async def later() -> None:
        async with q.connection() as conn:
            started_at.append(await conn.fetchval("SELECT clock_timestamp()"))

    ref = await later.options(delay=0.5).enqueue()
    run_at = await db.fetchval("SELECT run_at FROM aioqueue.jobs WHERE id = $1", ref)
    assert (await q.worker().run_until_empty()).claimed == 0
    async with running(q.worker(poll_interval=0.05)):
        await eventually(lambda: bool(started_at), what="the delayed job to run")
    assert started_at[0] >= run_at


async def test_dedup_key_frees_when_job_finishes_or_dies(q: aioqueue.Queue) -> None:
    @q.task(max_attempts=1)
    async def once(fail: bool) -> None:
        if fail:
            raise RuntimeError("no")

    a = await once.options(key="k").enqueue(fail=False)
    assert await once.options(key="k").enqueue(fail=False) == a
    await q.worker().run_until_empty()
    b = await once.options(key="k").enqueue(fail=True)
    assert b != a
    await q.worker().run_until_empty()  # b is dead now: the key is free again
    c = await once.options(key="k").enqueue(fail=False)
    assert c not in (a, b)


async def test_key_enqueued_while_running_does_not_run_twice(q: aioqueue.Queue) -> None:
    inside = anyio.Event()
    release = anyio.Event()
    runs = 0

    @q.task
    async def report() -> None:
        nonlocal runs
        runs += 1
        inside.set()
        with anyio.fail_after(10):
            await release.wait()

    first = await report.options(key="daily").enqueue()
    worker = q.worker(concurrency=4, poll_interval=0.05)
    async with running(worker):
        with anyio.fail_after(10):
            await inside.wait()
        assert await report.options(key="daily").enqueue() == first
        release.set()
        await eventually(lambda: worker.stats.succeeded == 1, what="the job to finish")
    assert runs == 1


async def test_several_queues_with_their_own_slots(q: aioqueue.Queue) -> None:
    running_now = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}
    release = anyio.Event()

    @q.task(queue="a")
    async def in_a() -> None:
        await _occupy("a")

    @q.task(queue="b")
    async def in_b() -> None:
        await _occupy("b")

    async def _occupy(name: str) -> None:
        running_now[name] += 1
        peak[name] = max(peak[name], running_now[name])
        try:
            with anyio.fail_after(10):
                await release.wait()
        finally:
            running_now[name] -= 1

    await in_a.enqueue_many([{}] * 6)
    await in_b.enqueue_many([{}] * 6)
    worker = q.worker(queues={"a": 2, "b": 1}, concurrency=10, poll_interval=0.05)
    async with running(worker):
        await eventually(lambda: running_now == {"a": 2, "b": 1}, what="both queues to fill their slots")
        release.set()
        await eventually(lambda: worker.stats.succeeded == 12, what="all jobs")
    assert peak == {"a": 2, "b": 1}


async def _run_workers(queues: list[aioqueue.Queue], until: Callable[[], bool], what: str) -> None:
    """Run one worker per queue until ``until()`` holds."""
    async with contextlib.AsyncExitStack() as stack:
        for queue in queues:
            await stack.enter_async_context(queue)
            await stack.enter_async_context(running(queue.worker(concurrency=5, poll_interval=0.02)))
        await eventually(until, timeout=30, what=what)


async def test_global_concurrency_limit_holds_across_workers(dsn: str, q: aioqueue.Queue) -> None:
    state = {"now": 0, "peak": 0, "done": 0}

    async def limited() -> None:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await anyio.sleep(0.02)  # the work itself
        state["now"] -= 1
        state["done"] += 1

    await q.set_limits("lim", concurrency=2)
    queues = [aioqueue.Queue(dsn) for _ in range(3)]
    for queue in queues:
        queue.task(name="limited", queue="lim")(limited)
    await queues[0].tasks["limited"].enqueue_many([{}] * 30)
    await _run_workers(queues, lambda: state["done"] == 30, "30 jobs under the limit")
    assert state["peak"] == 2


async def test_global_rate_limit_holds_across_workers(dsn: str, q: aioqueue.Queue) -> None:
    claimed: list[float] = []  # the claims' times in the queue's clock, where the limit holds

    async def limited() -> None:
        async with q.connection() as conn:
            claimed.append(await conn.fetchval(
                "SELECT extract(epoch FROM locked_at)::float8 FROM aioqueue.jobs WHERE id = $1",
                aioqueue.current_job().id,
            ))

    await q.set_limits("rl", rate=(5, 1.0))
    queues = [aioqueue.Queue(dsn) for _ in range(3)]
    for queue in queues:
        queue.task(name="limited", queue="rl")(limited)
    await queues[0].tasks["limited"].enqueue_many([{}] * 12)
    await _run_workers(queues, lambda: len(claimed) == 12, "12 rate-limited jobs")
    # At most 5 claims in any second, counted at the claims, not at the handlers' starts: on a
    # busy machine a handler can start late after its claim, and the next window's early.
    claimed.sort()
    for i in range(5, 12):
        assert claimed[i] - claimed[i - 5] >= 0.95, claimed
    assert claimed[-1] - claimed[0] >= 1.0  # 12 jobs at 5/s cannot all be claimed in one second


async def test_pause_and_resume(q: aioqueue.Queue) -> None:
    job = noop_task(q, "job", queue="p")

    await q.pause("p")
    await job.enqueue()
    assert (await q.worker().run_until_empty()).claimed == 0
    assert (await q.queue_settings())[0]["paused"] is True
    await q.resume("p")
    assert (await q.worker().run_until_empty()).succeeded == 1


async def test_cancel_pending_job_never_runs(q: aioqueue.Queue) -> None:
    @q.task
    async def never() -> None:
        raise AssertionError("a cancelled job ran")

    ref = await never.enqueue()
    assert await ref.cancel() == "cancelled"
    assert await q.cancel(ref) == "not_found"
    assert (await q.worker().run_until_empty()).claimed == 0
    info = await ref.info()
    assert info is not None
    assert info.status == "cancelled"


@pytest.mark.parametrize("listen", [True, False])
async def test_cancel_running_job(q: aioqueue.Queue, listen: bool) -> None:
    inside = anyio.Event()
    cancelled = anyio.Event()

    @q.task
    async def long() -> None:
        inside.set()
        await hang_until_cancelled(cancelled)

    ref = await long.enqueue()
    # With NOTIFY the poll (60 s) cannot explain a quick cancel; without it, the poll must.
    worker = q.worker(poll_interval=60 if listen else 0.1, listen=listen)
    async with running(worker):
        with anyio.fail_after(10):
            await inside.wait()
        assert await ref.cancel() == "requested"
        with anyio.fail_after(10):
            await cancelled.wait()
        await eventually(lambda: worker.stats.cancelled == 1, what="the cancellation to be recorded")

        async def archived() -> bool:
            info = await ref.info()
            return info is not None and info.status == "cancelled"

        await eventually(archived, what="the job to be archived as cancelled")
    with pytest.raises(aioqueue.JobCancelled):
        await ref.result(timeout=5)


async def test_snooze_reschedules_without_spending_an_attempt(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task(max_attempts=2)
    async def not_yet() -> None:
        raise aioqueue.Snooze(30)

    ref = await not_yet.enqueue()
    stats = await q.worker().run_until_empty()
    assert stats.snoozed == 1
    row = await db.fetchrow(
        "SELECT status, attempts, max_attempts, extract(epoch FROM run_at - now()) AS wait "
        "FROM aioqueue.jobs WHERE id = $1",
        ref,
    )
    assert row is not None
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("pending", 1, 3)
    assert 28 <= row["wait"] <= 30


async def test_results_are_kept_and_awaited(q: aioqueue.Queue) -> None:
    @q.task(archive=True, max_attempts=1)
    async def add(a: int, b: int) -> int:
        if a < 0:
            raise ValueError("negative")
        return a + b

    @q.task
    async def forgetful() -> int:
        return 1

    ok = await add.enqueue(a=2, b=3)
    bad = await add.enqueue(a=-1, b=0)
    gone = await forgetful.enqueue()
    async with running(q.worker(poll_interval=30)):
        assert await ok.result(timeout=10) == 5
        with pytest.raises(aioqueue.JobFailed, match="ValueError: negative"):
            await bad.result(timeout=10)

        async def finished() -> bool:
            async with q.connection() as conn:
                return bool(await conn.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs WHERE id = $1", gone))

        await eventually(finished, what="the unarchived job to finish")
    with pytest.raises(aioqueue.ResultUnavailable):
        await gone.result(timeout=10)
    late = await add.enqueue(a=1, b=1)
    with pytest.raises(TimeoutError):
        await late.result(timeout=0.3)


async def test_retention_prunes_archive_in_bounded_batches(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """Rows of the partition without a day (the archive as it was before partitioning, which
    holds every time before its end) go one by one, a bounded batch per statement."""
    await db.execute(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at, finished_at) "
        "SELECT g, 'default', 't', '{}', 'succeeded', 0, 1, now(), "
        "CASE WHEN g <= 25 THEN now() - interval '8 days' ELSE now() END FROM generate_series(1, 30) AS g"
    )
    # One statement deletes at most one batch...
    assert await prune_archive(db, q.queries.prune_archive, 7 * 86400.0, 10) == (0, 10)
    # ...and prune() repeats it until nothing old is left.
    maintenance = Maintenance(q.database, reap_interval=60, archive_retention=7 * 86400, prune_batch=10)
    assert await maintenance.prune() == 15
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done") == 5
