"""The executor's running attempts, without a database: two attempts of one job (reaped, then
claimed again by the same worker while the first still runs) are told apart by their claims."""

from __future__ import annotations

import asyncio
import datetime

import aioqueue
from aioqueue._completer import Completer
from aioqueue._executor import Executor
from aioqueue._job import Job
from aioqueue._outcome import Interrupt

_T = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_two_attempts_of_one_job_are_interrupted_and_ended_apart() -> None:
    queue = aioqueue.Queue("postgresql://nobody@127.0.0.1:1/none")

    @queue.task(name="t")
    async def t() -> None:
        await asyncio.sleep(0)

    async def main() -> None:
        completer = Completer(t.app.database)  # never writes here: nothing flushes it
        executor = Executor(t.app.tasks, [], completer)
        first, second = Job(7, "default", "t", {}, 0, 1, 25, _T, _T), Job(7, "default", "t", {}, 0, 2, 25, _T, _T)
        tasks = [asyncio.ensure_future(asyncio.sleep(10)) for _ in range(2)]
        old, new = executor.attempt_of(tasks[0]), executor.attempt_of(tasks[1])
        calls = [executor.start(first, old), executor.start(second, new)]
        assert set(executor.running) == {(7, 1), (7, 2)}
        assert executor.interrupt((7, 1), Interrupt.LEASE_LOST) and old.cancel_sent and not new.cancel_sent
        assert not executor.interrupt((7, 3), Interrupt.LEASE_LOST)
        for call in calls:
            assert call is not None
            await call
        executor.ended(old, None)  # the first attempt ends while the second still runs
        assert set(executor.running) == {(7, 2)}
        assert executor.interrupt((7, 2), Interrupt.CANCELLED) and new.cancel_sent
        executor.ended(new, None)
        assert executor.running == {} and not executor.interrupt_job(7, Interrupt.SHUTDOWN)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
