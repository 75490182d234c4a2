"""A Queue used under one event loop and then another (``asyncio.run`` twice, as scripts, sync
apps, management commands and test suites do): each loop gets a pool of its own, which closes
when its loop ends, so no later loop meets a pool of a closed one; a pool the application
passed in that belongs to another loop is refused, saying what to do."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.pg import fetchval_once

APP_NAME = "aioqueue-loops-test"


def _queue(dsn: str, **options: Any) -> aioqueue.Queue:
    return aioqueue.Queue(dsn, connect_kwargs={"server_settings": {"application_name": APP_NAME}}, **options)


def _backends(dsn: str, expected: int) -> int:
    """Connections the test's Queues hold on the server (they name themselves), once the count is
    `expected` or 10 s have passed: a closed connection's server process leaves pg_stat_activity a
    moment after the client said goodbye, so one read right after a close can still count it."""

    async def settle() -> int:
        count = -1
        with anyio.move_on_after(10):
            while True:
                count = int(await fetchval_once(
                    dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", APP_NAME))
                if count == expected:
                    break
                await asyncio.sleep(0.05)
        return count

    return asyncio.run(settle())


def _jobs(dsn: str) -> int:
    return int(asyncio.run(fetchval_once(dsn, "SELECT count(*) FROM aioqueue.jobs")))


def test_each_asyncio_run_gets_a_pool_that_closes_with_its_loop(dsn: str) -> None:
    q = _queue(dsn)

    @q.task
    async def work(n: int) -> None:
        pass

    # The implicit open: a script migrates, then runs its main, each under asyncio.run.
    assert asyncio.run(q.migrate()) == []
    assert _backends(dsn, 0) == 0  # the first loop's pool closed with it

    async def main(n: int) -> None:
        async with q:
            await work.enqueue(n)

    asyncio.run(main(1))
    asyncio.run(main(2))
    asyncio.run(work.enqueue(3))  # opened on first use, closed with its loop
    assert _jobs(dsn) == 3
    assert _backends(dsn, 0) == 0

    async def drain() -> aioqueue.WorkerStats:
        return await q.worker(concurrency=2).run_until_empty()

    assert asyncio.run(drain()).succeeded == 3
    assert _backends(dsn, 0) == 0


def test_two_open_loops_each_use_a_pool_of_their_own(dsn: str) -> None:
    q = _queue(dsn)

    @q.task
    async def work(n: int) -> None:
        pass

    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(q.open())
        first_pool = first.run_until_complete(_pool_of(q))
        second_pool = asyncio.run(_enqueue_and_pool(q, work, 1))  # while the first loop is still open
        assert second_pool is not first_pool
        first.run_until_complete(work.enqueue(2))  # the first loop's pool still serves it
        assert first.run_until_complete(_pool_of(q)) is first_pool
        assert _backends(dsn, first_pool.get_size()) == first_pool.get_size()  # the second loop's pool is gone with it
        first.run_until_complete(q.close())
        assert _backends(dsn, 0) == 0
    finally:
        first.close()
    assert _jobs(dsn) == 2


def test_under_uvloop_and_anyio_too(dsn: str) -> None:
    uvloop = pytest.importorskip("uvloop")
    q = _queue(dsn)

    @q.task
    async def work(n: int) -> None:
        pass

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(work.enqueue(1))
    assert _backends(dsn, 0) == 0
    anyio.run(work.enqueue, 2, backend="asyncio", backend_options={"use_uvloop": True})
    anyio.run(work.enqueue, 3, backend="asyncio")
    assert _backends(dsn, 0) == 0
    assert _jobs(dsn) == 3


def test_a_loop_closed_without_finalising_leaves_no_pool_for_the_next(dsn: str) -> None:
    """A loop closed by hand, its async generators never finalised: its pool is lost with it,
    and the next loop opens one of its own."""
    q = _queue(dsn)

    @q.task
    async def work(n: int) -> None:
        pass

    first = asyncio.new_event_loop()
    first.run_until_complete(work.enqueue(1))
    first.close()
    # The lost pool's connections were never closed: the garbage collector finds them, and
    # asyncpg says so (the mistake this test makes on purpose; nothing else may leave one).
    def next_loop_then_collect() -> None:
        asyncio.run(work.enqueue(2))
        gc.collect()

    with pytest.warns(ResourceWarning, match="unclosed"):
        next_loop_then_collect()
    assert _jobs(dsn) == 2


async def _pool_of(q: aioqueue.Queue) -> asyncpg.Pool:
    return q.pool


async def _enqueue_and_pool(q: aioqueue.Queue, task: aioqueue.Task[..., Any], n: int) -> asyncpg.Pool:
    await task.enqueue(n)
    return q.pool


def test_a_borrowed_pool_of_another_loop_is_refused_saying_what_to_do(dsn: str) -> None:
    async def make() -> asyncpg.Pool:
        return await asyncpg.create_pool(dsn, min_size=1, max_size=2)

    first = asyncio.new_event_loop()
    try:
        pool = first.run_until_complete(make())
        q = aioqueue.Queue(pool=pool)

        @q.task
        async def work(n: int) -> None:
            pass

        async def use() -> None:
            async with q:
                await work.enqueue(1)

        with pytest.raises(aioqueue.ConfigurationError, match="another event loop") as refused:
            asyncio.run(use())
        assert "attach_pool" in str(refused.value)
        first.run_until_complete(use())  # on its own loop it serves
        first.run_until_complete(pool.close())
    finally:
        first.close()

    async def attach_a_new_one() -> None:  # what the message says to do
        async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as fresh:
            q.attach_pool(fresh)
            await work.enqueue(2)

    asyncio.run(attach_a_new_one())
    assert _jobs(dsn) == 2
