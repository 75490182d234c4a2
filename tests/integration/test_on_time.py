"""On time and never idle: limited queues keep their allowed slots busy across workers, delayed
jobs, retries and snoozes start when due, and result() wakes at once for every final outcome.

Every worker here polls only every 5 s, so a timing the tests accept cannot come from a poll.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.helpers import eventually, running

SLOW_POLL = 5.0


@pytest.fixture
async def queues(dsn: str) -> AsyncIterator[list[aioqueue.Queue]]:
    """Three queues on the same database: three workers' worth of pools and listeners."""
    opened = [aioqueue.Queue(dsn, pool_max_size=4) for _ in range(3)]
    for q in opened:
        await q.open()
    try:
        yield opened
    finally:
        for q in opened:
            await q.close()


def limited_task(q: aioqueue.Queue, running_now: list[int], peak: list[int], seconds: float) -> None:
    @q.task(name="limited", queue="lim")
    async def limited() -> None:
        running_now[0] += 1
        peak[0] = max(peak[0], running_now[0])
        try:
            await anyio.sleep(seconds)
        finally:
            running_now[0] -= 1


async def test_a_freed_slot_lets_a_waiting_claim_go_at_once_across_workers(queues: list[aioqueue.Queue]) -> None:
    running_now, peak = [0], [0]
    for q in queues:
        limited_task(q, running_now, peak, 0.2)
    await queues[0].set_limits("lim", concurrency=2)
    await queues[0].tasks["limited"].enqueue_many([{}] * 30)
    workers = [q.worker(concurrency=5, poll_interval=SLOW_POLL) for q in queues]
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for w in workers:
            tg.start_soon(w.run)
        await eventually(lambda: sum(w.stats.succeeded for w in workers) == 30, timeout=30,
                         what="30 limited jobs to finish")
        elapsed = time.monotonic() - started
        for w in workers:
            w.stop()
    # 30 jobs of 0.2 s through 2 slots: 3 s when the slots never idle (a poll-bound run: ~15 s+).
    assert elapsed < 6.0, elapsed
    assert peak[0] == 2  # the limit held


async def test_one_worker_keeps_a_limited_queue_busy_and_run_until_empty_drains_it(q: aioqueue.Queue) -> None:
    running_now, peak = [0], [0]
    limited_task(q, running_now, peak, 0.1)
    await q.set_limits("lim", concurrency=2)
    await q.tasks["limited"].enqueue_many([{}] * 10)
    started = time.monotonic()
    stats = await q.worker(concurrency=5, poll_interval=SLOW_POLL).run_until_empty()
    elapsed = time.monotonic() - started
    assert stats.succeeded == 10 and peak[0] == 2
    assert elapsed < 2.5, elapsed  # 10 x 0.1 s through 2 slots is 0.5 s
    async with q.connection() as conn:
        assert await conn.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_a_rate_limited_queue_claims_again_when_its_window_allows(q: aioqueue.Queue) -> None:
    starts: list[float] = []
    claimed: list[float] = []  # the claims' times in the queue's clock, where the limit holds

    @q.task(queue="rated")
    async def tick() -> None:
        starts.append(time.monotonic())
        async with q.connection() as conn:
            claimed.append(await conn.fetchval(
                "SELECT extract(epoch FROM locked_at)::float8 FROM aioqueue.jobs WHERE id = $1",
                aioqueue.current_job().id,
            ))

    await q.set_limits("rated", rate=(2, 0.5))
    await tick.enqueue_many([{}] * 6)
    began = time.monotonic()
    stats = await q.worker(concurrency=4, poll_interval=SLOW_POLL).run_until_empty()
    assert stats.succeeded == 6
    # Three windows of 0.5 s: about 1 s in all; waiting for polls would take 10 s.
    assert starts[-1] - began < 2.5, starts[-1] - began
    # Never more than 2 claims in a window. Counted at the claims, not at the handlers' starts:
    # on a busy machine a handler can start late after its claim, and the next window's early.
    claimed.sort()
    for i in range(2, 6):
        assert claimed[i] - claimed[i - 2] >= 0.45, claimed


async def test_paused_queue_jobs_are_not_ready_for_run_until_empty(q: aioqueue.Queue) -> None:
    @q.task(queue="held")
    async def held() -> None:
        pass

    await q.pause("held")
    await held.enqueue()
    with anyio.fail_after(5):
        stats = await q.worker(poll_interval=SLOW_POLL).run_until_empty()
    assert stats.claimed == 0


async def test_delayed_jobs_retries_and_snoozes_start_when_due(q: aioqueue.Queue) -> None:
    starts: dict[str, list[float]] = {"delayed": [], "retried": [], "snoozed": []}

    @q.task
    async def delayed() -> None:
        starts["delayed"].append(time.monotonic())

    @q.task
    async def retried() -> None:
        starts["retried"].append(time.monotonic())
        if len(starts["retried"]) == 1:
            raise aioqueue.Retry(delay=0.5)

    @q.task
    async def snoozed() -> None:
        starts["snoozed"].append(time.monotonic())
        if len(starts["snoozed"]) == 1:
            raise aioqueue.Snooze(0.5)

    worker = q.worker(poll_interval=SLOW_POLL)
    async with running(worker):
        enqueued = time.monotonic()
        await delayed.options(delay=0.5).enqueue()
        await retried.enqueue()
        await snoozed.enqueue()
        await eventually(lambda: all(len(s) == (1 if k == "delayed" else 2) for k, s in starts.items()),
                         timeout=4, what="the delayed job, the retry and the snooze to run")
    lateness = {
        "delayed": starts["delayed"][0] - enqueued - 0.5,
        "retried": starts["retried"][1] - starts["retried"][0] - 0.5,
        "snoozed": starts["snoozed"][1] - starts["snoozed"][0] - 0.5,
    }
    for kind, late in lateness.items():
        assert -0.05 < late < 0.25, (kind, lateness)  # due time kept; a poll would be ~4.5 s late


class _LateStart:
    """A pooled connection whose question for the next due time reaches the server ``delay``
    seconds late, as on a loaded machine, after the producer has stamped when it asked."""

    def __init__(self, conn: Any, next_wakeup: str, delay: float) -> None:
        self._conn, self._next_wakeup, self._delay = conn, next_wakeup, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        if sql == self._next_wakeup:
            await anyio.sleep(self._delay)
        return await self._conn.fetchval(sql, *args)


async def test_a_job_due_between_a_claim_and_the_next_question_still_starts_on_time(
    q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker knows the earliest due time only; after it, it asks the database what comes
    # next "since its last claim". A job that fell due after the claim but before that question
    # started on the server was neither claimed nor told of, and waited for the poll (the test
    # above timed out so, once in a few hundred runs on a loaded machine).
    started: dict[str, float] = {}

    @q.task
    async def mark(tag: str) -> None:
        started[tag] = time.monotonic()

    db = q.database
    real = db.connection

    @contextlib.asynccontextmanager
    async def connection(conn: Any = None) -> AsyncIterator[Any]:
        async with real(conn) as pooled:
            yield _LateStart(pooled, db.queries.next_wakeup, 0.3)

    monkeypatch.setattr(db, "connection", connection)
    worker = q.worker(poll_interval=SLOW_POLL)
    async with running(worker):
        enqueued = time.monotonic()
        await mark.options(delay=0.6).enqueue(tag="second")  # told, then dropped for the earlier one
        await mark.options(delay=0.5).enqueue(tag="first")
        await eventually(lambda: len(started) == 2, timeout=4, what="both delayed jobs to run")
    assert started["second"] - enqueued < 0.6 + 0.3 + 0.5  # due, plus the question's delay: not the poll


async def test_a_delayed_job_due_before_one_already_known_still_starts_on_time(q: aioqueue.Queue) -> None:
    started: list[tuple[str, float]] = []

    @q.task
    async def mark(tag: str) -> None:
        started.append((tag, time.monotonic()))

    worker = q.worker(poll_interval=SLOW_POLL)
    async with running(worker):
        await mark.options(delay=3.0).enqueue(tag="late")
        enqueued = time.monotonic()
        await mark.options(delay=0.3).enqueue(tag="early")
        await eventually(lambda: len(started) == 1, timeout=3, what="the earlier job")
    tag, at = started[0]
    assert tag == "early" and at - enqueued < 0.3 + 0.25


@pytest.mark.parametrize("ending", ["dead", "cancelled"])
async def test_result_wakes_at_once_for_dead_and_cancelled_jobs(
    q: aioqueue.Queue, db: asyncpg.Connection, ending: str
) -> None:
    gate = anyio.Event()

    @q.task(archive=True, max_attempts=1)
    async def ends() -> None:
        await gate.wait()
        raise RuntimeError("no")

    ref = await ends.options(delay=0 if ending == "dead" else 60).enqueue()
    outcome: list[tuple[str, float]] = []

    async def wait_for_it() -> None:
        try:
            await ref.result(timeout=10)
        except (aioqueue.JobFailed, aioqueue.JobCancelled) as exc:
            outcome.append((type(exc).__name__, time.monotonic()))

    worker = q.worker(poll_interval=SLOW_POLL)
    async with running(worker), anyio.create_task_group() as tg:
        tg.start_soon(wait_for_it)
        # result() polls only every second: wait until it listens, so only NOTIFY can be fast.
        await eventually(lambda: db.fetchval(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'LISTEN %aioqueue_done%'"
        ), what="result() to listen")
        if ending == "dead":
            await eventually(lambda: worker.active == 1, what="the job to start")
            event_at = time.monotonic()
            gate.set()
        else:
            event_at = time.monotonic()
            assert await ref.cancel() == "cancelled"
        await eventually(lambda: bool(outcome), timeout=5, what="result() to return")
    kind, at = outcome[0]
    assert kind == ("JobFailed" if ending == "dead" else "JobCancelled")
    assert at - event_at < 0.5, at - event_at  # by NOTIFY, not result()'s 1 s poll


async def test_three_worker_processes_keep_two_limited_slots_busy(dsn: str, db: asyncpg.Connection) -> None:
    from tests.support.worker import SPANS_TABLE, worker_processes

    await db.execute(SPANS_TABLE)
    q = aioqueue.Queue(dsn)

    @q.task(name="limited", queue="lim")
    async def limited() -> None: ...

    async with q:
        await q.set_limits("lim", concurrency=2)
        async with worker_processes(db, 3, "limited", dsn, 0.2):
            await limited.enqueue_many([{}] * 30)
            await eventually(lambda: db.fetchval("SELECT count(*) = 30 FROM spans"), timeout=30,
                             what="30 limited jobs across three processes")
    took = await db.fetchval("SELECT extract(epoch FROM max(ended) - min(started))::float8 FROM spans")
    # 30 jobs of 0.2 s through 2 slots: 3 s when a freed slot is taken at once (~15 s by polls).
    assert took < 6.0, took
    peak = await db.fetchval(
        "SELECT max(n) FROM (SELECT (SELECT count(*) FROM spans AS o WHERE o.started <= s.started "
        "AND o.ended > s.started) AS n FROM spans AS s) AS t"
    )
    assert peak <= 2  # measured inside the handlers, so it is at most the slots in use
