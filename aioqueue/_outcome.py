"""The outcome rule: what the end of a handler's attempt means for its job (succeeded, retried,
dead, snoozed, interrupted, cancelled), and why the worker interrupted a running handler.

The executor applies it to every attempt and middleware read it through
:func:`aioqueue.middleware.outcome`; both import it from here, so the rule has one home and
neither imports the other for it. It holds no state beyond the running attempt in the context.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import math
from typing import Any, Literal, TypeAlias

import anyio

from ._errors import Abort, Snooze
from ._job import Job

Outcome: TypeAlias = Literal["succeeded", "retried", "dead", "snoozed", "interrupted", "cancelled"]


class Interrupt(enum.Enum):
    """Why the worker cancelled a running handler."""

    SHUTDOWN = "the worker shut down before the handler finished"
    LEASE_LOST = "the worker lost the job's lease (it was reaped and may run elsewhere)"
    CANCELLED = "the job was cancelled on request"


class HandlerTimeout(TimeoutError):
    """A handler ran past its task's ``timeout``; seen by middleware, recorded as a failure."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"handler exceeded its timeout of {timeout}s")


@dataclasses.dataclass(slots=True)
class _Attempt:
    """The attempt one runner task is running now: its job, when it started, and why the worker
    interrupted it, if it did.

    Each runner keeps one for its whole life and reuses it for every job it takes (``job`` is
    None between jobs): a busy slot then holds no object of the executor's own for the
    collector to walk. An interruption cancels the runner's task natively, once, and the
    executor takes the cancellation back (``uncancel``) when the handler ends: no cancel scope
    is entered per job, which costs as much as a no-op job's whole claim and outcome share of
    the worker's CPU.
    """

    job: Job | None
    task: asyncio.Task[Any]
    interrupt: Interrupt | None = None
    cancel_sent: bool = False
    started: float = 0.0

    def cancel(self, reason: Interrupt) -> None:
        if self.interrupt is None:
            self.interrupt = reason
        if not self.cancel_sent:
            self.cancel_sent = True
            self.task.cancel()

    def taken_back(self) -> bool:
        """Withdraw this attempt's cancellation, if one was sent; return whether nothing else
        (a shutdown) cancels the task too."""
        return not self.cancel_sent or self.task.uncancel() == 0


_attempt: contextvars.ContextVar[_Attempt] = contextvars.ContextVar("aioqueue_attempt")


def decide(job: Job, error: BaseException | None, interrupt: Interrupt | None = None) -> Outcome:
    """What the worker does with ``job``'s attempt that ended with ``error`` (None: returned).

    ``interrupt`` is why the worker cancelled the handler, if it did. A cancellation the handler
    raised by itself, while nothing cancels the worker, is a failure like any other exception.
    """
    if interrupt is not None:
        return "cancelled" if interrupt is Interrupt.CANCELLED else "interrupted"
    if error is None:
        return "succeeded"
    if isinstance(error, anyio.get_cancelled_exc_class()):
        if _cancelled_from_outside():
            return "interrupted"
    elif isinstance(error, Snooze):
        return "snoozed"
    elif isinstance(error, Abort):
        return "dead"
    return "dead" if job.attempt >= job.max_attempts else "retried"


def _cancelled_from_outside() -> bool:
    """Whether something outside the handler cancels it: a cancel request to its task (the
    worker's runners are plain asyncio tasks) or an enclosing anyio cancel scope."""
    task = asyncio.current_task()
    return (task is not None and task.cancelling() > 0) or anyio.current_effective_deadline() == -math.inf


def current_decision(job: Job, error: BaseException | None) -> Outcome:
    """:func:`decide` for ``job``'s attempt running in this context, with the interruption the
    executor recorded for it (what middleware reads through ``aioqueue.middleware.outcome``)."""
    attempt = _attempt.get(None)
    interrupt = attempt.interrupt if attempt is not None and attempt.job is job else None
    return decide(job, error, interrupt)
