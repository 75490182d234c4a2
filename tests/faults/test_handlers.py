"""Handlers that misbehave: the worker survives each one, keeps running other jobs, and records
the documented outcome (docs/explanation/reliability.md).

| handler | outcome of the attempt |
|---|---|
| raises an exception | failed: retried with backoff, dead after max_attempts; last_error: type, message, frames |
| runs past its timeout | failed: ``TimeoutError: handler exceeded its timeout of Ns`` |
| swallows the timeout's cancellation and returns late | failed as a timeout; its result is discarded |
| raises KeyboardInterrupt, SystemExit, CancelledError or another BaseException | failed, like an exception |
| raises with a message holding NUL, unpaired surrogates, or a ``__str__`` that raises | failed; the text is escaped |
| blocks the event loop briefly | succeeded (its lease outlives the block) |
| returns a value JSON cannot hold (archived task) | succeeded; ``result`` is NULL |
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg

import aioqueue
from tests.support.helpers import eventually, running


class _UserInterrupt(BaseException):
    """A BaseException that is not an Exception, as some libraries raise."""


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


async def test_each_misbehaving_handler_gets_its_outcome_and_the_worker_survives(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    def task(name: str, **options: Any) -> Callable[[Callable[[], Awaitable[Any]]], aioqueue.Task[[], Any]]:
        return q.task(name=name, max_attempts=1, **options)

    @task("raises")
    async def raises() -> None:
        raise ValueError("boom")

    @task("hangs", timeout=0.2)
    async def hangs() -> None:
        await anyio.sleep(60)

    @task("swallows_timeout", timeout=0.2, archive=True)
    async def swallows_timeout() -> str:
        try:
            await anyio.sleep(60)
        except BaseException:
            return "pretends it finished"
        return "finished"

    @task("keyboard_interrupt")
    async def keyboard_interrupt() -> None:
        raise KeyboardInterrupt

    @task("system_exit")
    async def system_exit() -> None:
        raise SystemExit(3)

    @task("own_base_exception")
    async def own_base_exception() -> None:
        raise _UserInterrupt("stop everything")

    @task("cancelled_error")
    async def cancelled_error() -> None:
        # As when awaiting a future that something else cancelled: nothing cancels the worker.
        raise asyncio.CancelledError

    @task("nul_message")
    async def nul_message() -> None:
        raise ValueError("a\x00b")

    @task("surrogate_abort")
    async def surrogate_abort() -> None:
        raise aioqueue.Abort("bad \ud800 text")

    @task("nul_retry")
    async def nul_retry() -> None:
        raise aioqueue.Retry(reason="again\x00")

    @task("unprintable")
    async def unprintable() -> None:
        raise _Unprintable

    @task("blocks_loop")
    async def blocks_loop() -> None:
        time.sleep(0.3)  # noqa: ASYNC251 - the misbehaviour under test

    class _Opaque:
        pass

    @task("returns_object", archive=True)
    async def returns_object() -> object:
        return _Opaque()

    @task("returns_nan", archive=True)
    async def returns_nan() -> float:
        return float("nan")

    @task("returns_nul_string", archive=True)
    async def returns_nul_string() -> str:
        return "a\x00b"

    @task("returns_json", archive=True)
    async def returns_json() -> dict[str, Any]:
        return {"a": [1, "x", None], "b": 2.5}

    good_runs: list[int] = []

    @q.task
    async def good(i: int) -> None:
        good_runs.append(i)

    ids: dict[str, int] = {}
    for name, registered in q.tasks.items():
        if name != "good":
            ids[name] = await registered.enqueue()
    await good.enqueue_many([{"i": i} for i in range(50)])

    with anyio.fail_after(60):
        stats = await q.worker(concurrency=4, lease=5).run_until_empty()
    assert sorted(good_runs) == list(range(50))

    live = {r["task"]: r for r in await db.fetch("SELECT task, status, last_error FROM aioqueue.jobs")}
    done = {r["task"]: r for r in await db.fetch("SELECT task, status, result::text FROM aioqueue.jobs_done")}
    expected_dead = {
        "raises": "ValueError: boom",
        "hangs": "TimeoutError: handler exceeded its timeout of 0.2s",
        "swallows_timeout": "TimeoutError: handler exceeded its timeout of 0.2s",
        "keyboard_interrupt": "KeyboardInterrupt: ",
        "system_exit": "SystemExit: 3",
        "own_base_exception": "_UserInterrupt: stop everything",
        "cancelled_error": "CancelledError: ",
        "nul_message": "ValueError: a\\x00b",
        "surrogate_abort": "Abort: bad \\ud800 text",
        "nul_retry": "Retry: again\\x00",
        "unprintable": "_Unprintable: <str() of the exception failed>",
    }
    assert set(live) == set(expected_dead), (set(live), set(expected_dead))
    for name, error in expected_dead.items():
        assert live[name]["status"] == "dead", name
        assert live[name]["last_error"].startswith(error), (name, live[name]["last_error"])
    assert "Traceback" not in live["raises"]["last_error"]  # frames only, no header noise
    assert 'raise ValueError("boom")' in live["raises"]["last_error"]
    assert done["returns_object"]["result"] is None
    assert done["returns_nan"]["result"] is None
    assert done["returns_nul_string"]["result"] is None
    assert json.loads(done["returns_json"]["result"]) == {"a": [1, "x", None], "b": 2.5}
    assert set(done) == {"returns_object", "returns_nan", "returns_nul_string", "returns_json"}
    assert stats.dead == len(expected_dead)
    assert stats.succeeded == 50 + 1 + len(done)  # good jobs, blocks_loop, the archived ones
    assert await q.get_job(ids["blocks_loop"]) is None


async def test_handler_that_swallows_cancellation_keeps_its_slot_until_it_returns(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    release = anyio.Event()
    swallowed = 0

    @q.task(timeout=0.2, max_attempts=1)
    async def stubborn() -> None:
        nonlocal swallowed
        while not release.is_set():
            try:
                await release.wait()
            except BaseException:
                swallowed += 1  # anyio re-delivers the cancellation at every await

    good_runs: list[int] = []

    @q.task
    async def good(i: int) -> None:
        good_runs.append(i)

    job_id = await stubborn.enqueue()
    worker = q.worker(concurrency=2, lease=5, heartbeat_interval=0.2)
    async with running(worker):
        await eventually(lambda: swallowed > 0, what="the handler to swallow its timeout")
        # The other slot keeps working while the stubborn handler holds its own.
        await good.enqueue_many([{"i": i} for i in range(20)])
        await eventually(lambda: len(good_runs) == 20, timeout=20, what="the other jobs to run")
        assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", job_id) == "running"
        release.set()
        await eventually(
            lambda: db.fetchval("SELECT status = 'dead' FROM aioqueue.jobs WHERE id = $1", job_id),
            what="the late return to be recorded as a timeout",
        )
    error = await db.fetchval("SELECT last_error FROM aioqueue.jobs WHERE id = $1", job_id)
    assert error.startswith("TimeoutError: handler exceeded its timeout of 0.2s")
