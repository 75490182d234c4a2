"""Run a queue's jobs inside a test: ``drain`` runs a real worker in burst mode on the test's
event loop until no job is ready, and reports each attempt and how it ended; ``inline`` runs the
jobs each enqueue call commits before the call returns.

The attempts are recorded by a middleware the drain puts outermost for its run (it sees the
outcome the worker decides, interruptions included) and by a wrapper around each task's
function (it sees what the handler returned). A job that goes dead without its handler being
called (no such task on this queue, arguments that do not fit it, a lease that ran out on its
last attempt) is found in the table afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Unpack

from aioqueue import Job, JobFailed, JobInfo, JobSignal, Queue, WorkerOptions, current_job
from aioqueue.middleware import Outcome, outcome

from ._internals import tick_periodic

_draining: contextvars.ContextVar[bool] = contextvars.ContextVar("aioqueue_testing_draining", default=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job that :func:`drain` ran, and how it ended."""

    id: int
    task: str
    queue: str
    args: dict[str, Any]
    attempt: int
    """Which attempt of the job this was (1 for the first)."""
    outcome: Outcome
    """``"succeeded"``, ``"retried"``, ``"dead"``, ``"snoozed"``, ``"cancelled"`` or ``"interrupted"``."""
    result: Any = None
    """What the handler returned, when it succeeded."""
    error: BaseException | None = None
    """What the handler raised (an exception, or ``Retry``, ``Abort``, ``Snooze``). For a job
    that went dead without its handler being called, a :class:`~aioqueue.JobFailed` holding the
    job's ``last_error``."""


class _Recorder:
    """The attempts of one drain, in the order they ended."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.results: dict[tuple[int, int], Any] = {}

    @contextlib.asynccontextmanager
    async def middleware(self, job: Job) -> AsyncIterator[None]:
        try:
            yield
        except BaseException as exc:
            self.results.pop((job.id, job.attempt), None)
            self.attempts.append(_attempt(job, outcome(job, exc), error=exc))
            raise
        self.attempts.append(_attempt(job, outcome(job, None), result=self.results.pop((job.id, job.attempt), None)))

    def wrap(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Coroutine[Any, Any, Any]]:
        async def recorded(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            try:
                job = current_job()
            except LookupError:  # the task called as a function, outside any job
                return result
            self.results[(job.id, job.attempt)] = result
            return result

        return recorded


def _attempt(job: Job, ended: Outcome, *, result: Any = None, error: BaseException | None = None) -> Attempt:
    return Attempt(job.id, job.task, job.queue, job.args, job.attempt, ended, result, error)


async def drain(
    queue: Queue, /, *, periodic: bool = True, raise_errors: bool = False, **options: Unpack[WorkerOptions]
) -> list[Attempt]:
    """Run ``queue``'s ready jobs in this event loop until none is ready or running, as a worker
    would, jobs that become ready meanwhile included; return each attempt, in the order they
    ended. Jobs due later (delayed, or retrying after a backoff) stay pending: move the queue's
    clock (:class:`~aioqueue.testing.Clock`) to run them. A queue whose rate or concurrency limit
    holds ready jobs back keeps it waiting, as ``run_until_empty()`` does, until the limit lets
    them go (a rate window passes when the clock moves past it).

    ``periodic``: first enqueue the periodic slots the queue's clock has reached, as a running
    worker would have. ``raise_errors``: once done, raise the first exception a handler raised
    on an attempt that was retried or went dead (not ``Retry`` or ``Abort``, which a handler
    raises on purpose), or the :class:`~aioqueue.JobFailed` of a job that went dead without
    its handler being called. ``options``: the worker's (see :class:`~aioqueue.WorkerConfig`);
    here ``concurrency`` is 1 and ``prefetch`` 0 unless given, so jobs run one by one in claim
    order.
    """
    attempts = await _drain(queue, periodic, options)
    if raise_errors:
        _raise_first_error(attempts)
    return attempts


async def _drain(queue: Queue, periodic: bool, options: WorkerOptions) -> list[Attempt]:
    if _draining.get():
        raise RuntimeError("drain() runs the queue's worker: it cannot run inside one of its handlers")
    options = {"concurrency": 1, "prefetch": 0, "install_signal_handlers": False, **options}
    served = options.get("queues")
    recorder = _Recorder()
    token = _draining.set(True)
    wrapped = {task: task.fn for task in queue.tasks.values()}
    queue.middleware.insert(0, recorder.middleware)
    for task, fn in wrapped.items():
        task.fn = recorder.wrap(fn)
    try:
        if periodic:
            await tick_periodic(queue, None if served is None else set(served))
        dead_before = {job.id for job in await _dead(queue)}
        await queue.worker(**options).run_until_empty()
        seen = {(a.id, a.attempt) for a in recorder.attempts}
        for job in await _dead(queue):
            if job.id not in dead_before and (job.id, job.attempts) not in seen:
                recorder.attempts.append(_never_ran(job))
    finally:
        for task, fn in wrapped.items():
            task.fn = fn
        queue.middleware.remove(recorder.middleware)
        _draining.reset(token)
    return recorder.attempts


async def _dead(queue: Queue) -> list[JobInfo]:
    async with queue.connection() as conn:
        return [JobInfo.from_record(row) for row in await conn.fetch(queue.queries.find_jobs, "dead", None, None)]


def _never_ran(job: JobInfo) -> Attempt:
    args = job.args if isinstance(job.args, dict) else {}
    return Attempt(job.id, job.task, job.queue, args, job.attempts, "dead", None, JobFailed(job.id, job.last_error))


def _raise_first_error(attempts: list[Attempt]) -> None:
    for a in attempts:
        if a.outcome in ("retried", "dead") and a.error is not None and not isinstance(a.error, JobSignal):
            raise a.error


@contextlib.asynccontextmanager
async def inline(
    queue: Queue, /, *, raise_errors: bool = False, **options: Unpack[WorkerOptions]
) -> AsyncIterator[list[Attempt]]:
    """Inline mode for the block: every enqueue call on ``queue`` that commits its jobs (one
    without ``conn=``) runs them, and every job they enqueue, before it returns, as
    :func:`drain` does. Yields the list the attempts are added to, in the order they ended.

    The jobs are written as always, and run by a real worker on the test's event loop, on their
    own connections, after their commit: what the handlers see is what a worker would see. What
    differs from production: the enqueue call waits for the handlers; a job enqueued in your
    transaction (``conn=``) cannot run before you commit, and runs at the next enqueue call
    without ``conn=`` or the next :func:`drain`; a job due later (a delay, a retry's backoff,
    a snooze) runs when the queue's clock reaches it and something drains. ``raise_errors``:
    the enqueue call raises the first handler error of its run (see :func:`drain`).
    """
    if queue._after_enqueue is not None:
        raise RuntimeError("inline mode is already on for this queue")
    ran: list[Attempt] = []

    async def run_now() -> None:
        if _draining.get():
            return  # enqueued by a handler: the drain that runs it takes the job too
        attempts = await _drain(queue, False, options)
        ran.extend(attempts)
        if raise_errors:
            _raise_first_error(attempts)

    queue._after_enqueue = run_now
    try:
        yield ran
    finally:
        queue._after_enqueue = None
