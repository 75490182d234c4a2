"""Job middleware: code the user wraps around every handler a worker runs.

A middleware is a callable that takes the claimed :class:`~aioqueue.Job` and returns an async
context manager. The executor enters the queue's middleware (first registered outermost) just
before the handler and exits it when the handler returns or raises, inside the handler's own
context, so context variables a middleware sets are visible to the handler, and the handler's
exception passes through it: a ``TimeoutError`` when the task's timeout fires, ``Retry``,
``Abort`` or ``Snooze``, a cancellation when the worker interrupts the job. A middleware should
let exceptions propagate; one it suppresses makes the attempt count as succeeded. With none
registered the executor calls the handler directly: middleware costs nothing unless used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeAlias

from ._job import Job
from ._outcome import HandlerTimeout, Outcome, current_decision

__all__ = ["HandlerTimeout", "Middleware", "Outcome", "call_with_middleware", "outcome"]

Middleware: TypeAlias = Callable[[Job], AbstractAsyncContextManager[object]]
"""A callable that takes a job and returns an async context manager to run its handler in."""


async def call_with_middleware(
    middleware: Sequence[Middleware], job: Job, handler: Callable[[], Awaitable[Any]]
) -> Any:
    """Run ``handler`` inside every middleware, first registered outermost; return its result.

    ``handler`` is the executor's call, timeout included, so middleware see the timeout fire as
    :class:`HandlerTimeout`.
    """
    async with contextlib.AsyncExitStack() as stack:
        for factory in middleware:
            await stack.enter_async_context(factory(job))
        return await handler()
    return None  # a middleware suppressed the handler's exception


def outcome(job: Job, error: BaseException | None) -> Outcome:
    """Name what the worker does with ``job``'s attempt that ended with ``error`` (None: returned):
    ``"succeeded"``, ``"retried"``, ``"dead"``, ``"snoozed"``, ``"interrupted"`` or ``"cancelled"``.

    Called in a middleware, it reads the executor's own decision for the running attempt (the
    same rule, with the reason the worker interrupted it, if it did): ``Abort`` or a failure on
    the last attempt is dead, ``Snooze`` is snoozed, a cancellation by the worker is interrupted
    (or cancelled, on a cancel request).
    """
    return current_decision(job, error)
