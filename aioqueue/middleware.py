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
from typing import Any, Literal, TypeAlias

import anyio

from .errors import Abort, Snooze
from .job import Job

Middleware: TypeAlias = Callable[[Job], AbstractAsyncContextManager[object]]
"""A callable that takes a job and returns an async context manager to run its handler in."""

Outcome: TypeAlias = Literal["succeeded", "retried", "dead", "snoozed", "interrupted"]


class HandlerTimeout(TimeoutError):
    """A handler ran past its task's ``timeout``; seen by middleware, recorded as a failure."""


async def call_with_middleware(
    middleware: Sequence[Middleware],
    job: Job,
    handler: Callable[[], Awaitable[Any]],
    timeout: float | None,
) -> Any:
    """Run ``handler`` under ``timeout`` inside every middleware; return its result.

    The timeout sits inside the middleware, so they see it fire as :class:`HandlerTimeout`.
    """
    async with contextlib.AsyncExitStack() as stack:
        for factory in middleware:
            await stack.enter_async_context(factory(job))
        if timeout is None:
            return await handler()
        with anyio.move_on_after(timeout) as deadline:
            result = await handler()
        if deadline.cancel_called:  # even if the handler swallowed the cancellation
            raise HandlerTimeout(f"handler exceeded its timeout of {timeout}s")
        return result
    return None  # a middleware suppressed the handler's exception


def outcome(job: Job, error: BaseException | None) -> Outcome:
    """Name what the worker does with ``job``'s attempt that ended with ``error`` (None: returned).

    A middleware uses it to tell a retry from a dead job, as the executor decides: ``Abort`` or
    a failure on the last attempt is dead, ``Snooze`` is snoozed, a cancellation is interrupted.
    """
    if error is None:
        return "succeeded"
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return "interrupted"
    if isinstance(error, Snooze):
        return "snoozed"
    if isinstance(error, Abort) or job.attempt >= job.max_attempts:
        return "dead"
    return "retried"
