"""How run_until_empty() ends: it skips the claim after the last outcome write only when the
outcomes written since its empty claim cannot have made a job ready."""

from __future__ import annotations

import aioqueue
from aioqueue import chain, chord
from tests.support.helpers import burst_of_noops


async def test_a_retry_due_at_once_from_the_last_outcome_runs_before_the_burst_ends(q: aioqueue.Queue) -> None:
    attempts: list[int] = []

    @q.task(max_attempts=3)
    async def flaky() -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise aioqueue.Retry(delay=0)

    await flaky.enqueue()
    stats = await q.worker(concurrency=1).run_until_empty()
    assert attempts == [1, 2, 3]
    assert (stats.retried, stats.succeeded) == (2, 1)


async def test_a_dependant_released_by_the_last_success_runs_before_the_burst_ends(q: aioqueue.Queue) -> None:
    seen: list[str] = []

    @q.task
    async def step(name: str) -> None:
        seen.append(name)

    await chain(step.s(name="a"), step.s(name="b"), step.s(name="c")).enqueue()
    stats = await q.worker(concurrency=1).run_until_empty()
    assert seen == ["a", "b", "c"]
    assert stats.succeeded == 3


async def test_a_group_callback_released_by_the_last_member_runs_before_the_burst_ends(q: aioqueue.Queue) -> None:
    seen: list[str] = []

    @q.task
    async def member() -> None:
        seen.append("member")

    @q.task
    async def callback() -> None:
        seen.append("callback")

    await chord([member.s()], callback.s()).enqueue()
    await q.worker(concurrency=1).run_until_empty()
    assert seen == ["member", "callback"]


async def test_plain_successes_end_the_burst_without_claiming_again(q: aioqueue.Queue) -> None:
    producer = await burst_of_noops(q, 3, concurrency=8)
    # One claim takes the three; after their outcomes, the claims that found nothing while
    # they ran stand: no claim follows the last write of successes that woke nothing.
    assert producer.completer is not None
    assert producer.completer.stirs == 0


async def test_the_last_outcomes_are_written_without_waiting_for_more_to_gather(q: aioqueue.Queue) -> None:
    # Outcomes gather for up to completion_interval before a write; once the burst's last
    # handler is done none can come, so the end does not wait that interval out: the burst
    # must end within 5 seconds.
    await burst_of_noops(q, 3, timeout=5, concurrency=8, completion_interval=10.0)
