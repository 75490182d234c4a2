"""Wake-ups: NOTIFY starts an idle worker at once; the poll covers lost notifications; the
listener comes back after its connection is killed, or gets in late at start, and catches up."""

from __future__ import annotations

import secrets
import time
import urllib.parse

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._notifier import Notifier
from tests.support.helpers import eventually, running


def _timed_task(q: aioqueue.Queue, starts: list[float]) -> aioqueue.Task[[], None]:
    @q.task
    async def ping() -> None:
        starts.append(time.perf_counter())

    return ping


async def test_idle_worker_wakes_on_notify_within_milliseconds(q: aioqueue.Queue) -> None:
    starts: list[float] = []
    ping = _timed_task(q, starts)
    # A poll of a minute: only the notification can explain a fast start.
    worker = q.worker(poll_interval=60)
    latencies = []
    async with running(worker):
        for i in range(20):
            sent = time.perf_counter()
            await ping.enqueue()
            await eventually(lambda i=i: len(starts) > i, timeout=5, interval=0.0005, what="the handler to start")
            latencies.append(starts[i] - sent)
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.1, latencies  # generous: the benchmark measures it


async def test_poll_finds_jobs_when_no_notification_comes(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    done = anyio.Event()

    @q.task
    async def quiet() -> None:
        done.set()

    async with running(q.worker(poll_interval=0.2)):
        # Written behind aioqueue's back: no NOTIFY is sent.
        await db.execute("INSERT INTO aioqueue.jobs (task, args) VALUES ('quiet', '{}')")
        with anyio.fail_after(10):
            await done.wait()


async def test_listener_reconnects_after_being_killed(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    starts: list[float] = []
    ping = _timed_task(q, starts)
    worker = q.worker(poll_interval=60, ping_interval=0.5)
    async with running(worker):
        notifier = worker.notifier
        assert notifier is not None and notifier.connected
        for round_ in range(1, 4):
            pid = notifier.backend_pid
            assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
            await eventually(
                lambda r=round_: notifier.connects == r + 1 and notifier.connected,
                timeout=15, what="the listener to reconnect",
            )
            assert notifier.backend_pid != pid
            await ping.enqueue()
            await eventually(lambda r=round_: len(starts) == r, timeout=5, what="a job after the reconnect")


async def test_jobs_enqueued_while_listener_is_down_are_caught_up(
    q: aioqueue.Queue, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[float] = []
    ping = _timed_task(q, starts)
    monkeypatch.setattr(Notifier, "reconnect_delay", 1.0)  # a window in which the listener is down
    worker = q.worker(poll_interval=60, ping_interval=0.5)
    async with running(worker):
        notifier = worker.notifier
        assert notifier is not None
        await db.execute("SELECT pg_terminate_backend($1)", notifier.backend_pid)
        await eventually(lambda: not notifier.connected, what="the listener to notice it was killed")
        await ping.enqueue()  # its NOTIFY reaches nobody
        await eventually(lambda: len(starts) == 1, timeout=15, what="the missed job to be caught up")
        assert notifier.connects == 2  # it was the reconnect that found it, not a notification


async def test_a_job_enqueued_before_the_listener_first_gets_in_is_caught_up(
    dsn: str, db: asyncpg.Connection
) -> None:
    """The listener's first attempt to connect fails (its role may not log in yet), so the worker
    starts, claims and is ready without it, and a job enqueued then notifies no one. Once the
    listener gets in, the worker looks again at once, not at its poll of a minute."""
    role = f"aioqueue_listener_{secrets.token_hex(4)}"
    await db.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        url = urllib.parse.urlsplit(dsn)
        listen_dsn = url._replace(netloc=f"{role}@{url.hostname}:{url.port}").geturl()
        async with aioqueue.Queue(dsn, listen_dsn=listen_dsn) as q:
            starts: list[float] = []
            ping = _timed_task(q, starts)
            worker = q.worker(poll_interval=60)
            async with running(worker):
                notifier = worker.notifier
                assert notifier is not None and notifier.connects == 0  # ready, and not listening
                await ping.enqueue()  # its NOTIFY reaches nobody
                await db.execute(f"ALTER ROLE {role} LOGIN")
                await eventually(lambda: len(starts) == 1, timeout=15, what="the job to be caught up")
                assert notifier.connects == 1
    finally:
        await db.execute(f"DROP ROLE {role}")


async def test_a_burst_held_back_by_a_key_limit_wakes_when_the_key_frees(q: aioqueue.Queue) -> None:
    """Two bursts on a queue with a per-key limit of 1: the one whose claim finds the key's next
    job held back (the other runs its first) is woken by the outcome that frees the key, not at
    its poll of a minute, and so is the other if it is held back in turn."""
    gate, first_started = anyio.Event(), anyio.Event()
    ran: list[int] = []

    @q.task(queue="tenants")
    async def work(n: int) -> None:
        if n == 1:
            first_started.set()
            with anyio.fail_after(30):
                await gate.wait()
        ran.append(n)

    await q.set_key_limits("tenants", concurrency=1)
    await work.options(partition_key="a").enqueue_many([{"n": 1}, {"n": 2}])
    holder = q.worker(concurrency=1, prefetch=0, poll_interval=60)
    held = q.worker(concurrency=1, poll_interval=60)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder.run_until_empty)
            await first_started.wait()
            tg.start_soon(held.run_until_empty)
            await held.ready.wait()  # its first claim found job 2 held back
            gate.set()
    assert sorted(ran) == [1, 2]
