"""The outcome rule (``aioqueue._outcome.decide``): what the end of an attempt means for its job,
with no worker and no database: returned, raised with attempts left or none, snoozed, aborted,
interrupted by the worker or cancelled on request."""

from __future__ import annotations

import asyncio
import datetime

import anyio
import anyio.lowlevel
import pytest

import aioqueue
from aioqueue._outcome import HandlerTimeout, Interrupt, decide

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def job(attempt: int, max_attempts: int = 3) -> aioqueue.Job:
    return aioqueue.Job(id=1, queue="default", task="t", args={}, priority=0, attempt=attempt,
                        max_attempts=max_attempts, run_at=NOW, created_at=NOW)


@pytest.mark.parametrize(("attempt", "error", "expected"), [
    (1, None, "succeeded"),
    (3, None, "succeeded"),  # the last attempt returning still succeeds
    (1, ValueError("boom"), "retried"),
    (2, ValueError("boom"), "retried"),
    (3, ValueError("boom"), "dead"),  # no attempt left
    (5, ValueError("boom"), "dead"),  # past the limit (it was lowered): dead, never retried
    (1, HandlerTimeout(1.0), "retried"),  # a timeout is a failure like any other
    (3, HandlerTimeout(1.0), "dead"),
    (1, aioqueue.Snooze(5), "snoozed"),
    (3, aioqueue.Snooze(5), "snoozed"),  # a snooze spends no attempt, even the last
    (1, aioqueue.Abort("no"), "dead"),  # straight to dead with attempts left
])
async def test_an_attempts_end_decides_its_outcome(attempt: int, error: BaseException | None, expected: str) -> None:
    assert decide(job(attempt), error) == expected


@pytest.mark.parametrize(("interrupt", "expected"), [
    (Interrupt.SHUTDOWN, "interrupted"),
    (Interrupt.LEASE_LOST, "interrupted"),
    (Interrupt.CANCELLED, "cancelled"),
])
@pytest.mark.parametrize("error", [None, ValueError("boom"), asyncio.CancelledError()])
async def test_an_interruption_by_the_worker_overrides_what_the_handler_did(
    interrupt: Interrupt, expected: str, error: BaseException | None
) -> None:
    assert decide(job(3), error, interrupt) == expected


async def test_a_cancellation_the_handler_raised_itself_is_a_failure() -> None:
    # Nothing cancels the surrounding scope: a CancelledError the handler raised by itself is
    # its own failure, retried or dead on the last attempt.
    assert decide(job(1), asyncio.CancelledError()) == "retried"
    assert decide(job(3), asyncio.CancelledError()) == "dead"


async def test_a_cancellation_from_a_cancelled_scope_is_an_interruption() -> None:
    with anyio.CancelScope() as scope:
        scope.cancel()
        assert decide(job(1), asyncio.CancelledError()) == "interrupted"
        assert decide(job(3), asyncio.CancelledError()) == "interrupted"  # spends no last attempt
        await anyio.lowlevel.checkpoint()
    assert scope.cancelled_caught


async def test_a_cancel_request_to_the_plain_task_is_an_interruption() -> None:
    # The worker's runners are plain asyncio tasks: its shutdown cancels them by request, with
    # no anyio scope around them.
    decided: list[str] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError as exc:
            decided.append(decide(job(3), exc))
            raise

    task = asyncio.get_running_loop().create_task(handler())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert decided == ["interrupted"]  # spends no last attempt


def test_interrupt_reasons_name_the_cause() -> None:
    assert "shut down" in Interrupt.SHUTDOWN.value
    assert "lease" in Interrupt.LEASE_LOST.value
    assert "cancelled" in Interrupt.CANCELLED.value
    assert str(HandlerTimeout(2.5)) == "handler exceeded its timeout of 2.5s"
