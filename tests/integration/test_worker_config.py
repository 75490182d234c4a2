"""Worker configuration on a queue: a misspelt option is refused naming it, and a large
concurrency costs nothing before jobs arrive (the checks themselves: tests/unit/test_config.py)."""

from __future__ import annotations

import time

import pytest

import aioqueue


def test_queue_worker_refuses_a_misspelt_option_naming_it(q: aioqueue.Queue) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=r"'concurency'.*the options are:.*concurrency"):
        q.worker(concurency=5)  # type: ignore[call-arg]
    with pytest.raises(aioqueue.ConfigurationError, match="concurrency"):
        aioqueue.BackgroundWorker(q, concurrency=0)


async def test_setting_up_a_large_concurrency_costs_nothing_before_jobs_arrive(q: aioqueue.Queue) -> None:
    ran: list[int] = []

    @q.task
    async def one(i: int) -> None:
        ran.append(i)

    await one.enqueue_many([{"i": i} for i in range(3)])
    worker = q.worker(concurrency=10_000)
    started = time.perf_counter()
    stats = await worker.run_until_empty()
    # Runners start as jobs arrive: 10,000 slots with 3 jobs set up 3 runners, not 10,000.
    assert stats.succeeded == 3 and sorted(ran) == [0, 1, 2]
    assert time.perf_counter() - started < 5.0
