"""Run one claimed job's handler and turn what happened into an outcome for the completer.

The executor holds no connection and no transaction while a handler runs. It applies the
task's timeout (here, and only here) and the queue's middleware (``aioqueue.middleware``),
decides what the attempt's end means (succeeded, retried, dead, snoozed, interrupted, cancelled:
:func:`~aioqueue._outcome.decide`, the rule it shares with middleware), counts it, and hands the outcome to the
completer, even when the handler is cancelled (shutdown, a lost lease, a cancel request), so a
cancellation never skips the bookkeeping. It tracks running handlers by claim (job id and
attempt), so two attempts of one job are never confused. It never writes to the database itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import traceback
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from . import _payload as payload
from ._claims import ClaimKey
from ._errors import Abort, Retry, Snooze
from ._job import Job, _current
from ._outcome import HandlerTimeout, Interrupt, Outcome, _Attempt, _attempt, decide
from ._retry import Backoff
from ._steps import Suspended, stored_by
from .middleware import call_with_middleware

if TYPE_CHECKING:
    from ._completer import Completer
    from ._task import Task
    from .middleware import Middleware

logger = logging.getLogger("aioqueue.worker")

_MAX_ERROR_CHARS = 8000


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frames of the traceback, bounded in size."""
    try:
        message = str(exc)
    except Exception:  # a hostile __str__ must not take the worker down with the job
        message = "<str() of the exception failed>"
    head = f"{type(exc).__name__}: {message}"
    frames = traceback.format_tb(exc.__traceback__)[-5:]
    text = head + ("\n" + "".join(frames) if frames else "")
    return text[:_MAX_ERROR_CHARS]


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL ``text`` can hold it: NUL and unpaired surrogates escaped, so an
    odd error message cannot make the outcome's write fail (and retry) forever."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


#: The worker's count of each kind of durable step its handlers stored (see WorkerStats).
STORED_COUNTS = {"step": "steps", "sleep": "sleeps", "event": "event_waits"}


class Executor:
    """Runs handlers for one worker, keeps each running attempt's cancel scope, counts outcomes."""

    def __init__(
        self,
        tasks: Mapping[str, Task[Any, Any]],
        middleware: Sequence[Middleware],
        completer: Completer,
    ) -> None:
        self.tasks = tasks
        self.middleware = middleware
        self.completer = completer
        # Outcomes and stored steps so far, by WorkerStats field. A plain dict, not a Counter
        # (whose item assignment goes through a Python-level slot): one update per job.
        self.counts: dict[str, int] = {"succeeded": 0}
        # The running attempts by job id, and apart those of a job whose id another attempt
        # running here holds already (reaped, then claimed again while the first still runs):
        # keyed by an int rather than by the claim, a tuple a job that would be alive, for the
        # collector to walk, as long as its handler.
        self._by_id: dict[int, _Attempt] = {}
        self._more: list[_Attempt] = []

    @property
    def running(self) -> dict[ClaimKey, _Attempt]:
        """The attempts running now, by claim (a new dict)."""
        return {(job.id, job.attempt): a for a in [*self._by_id.values(), *self._more] if (job := a.job) is not None}

    def interrupt(self, claim: ClaimKey, reason: Interrupt) -> bool:
        """Cancel the running handler of ``claim``; return whether one was running."""
        job_id, number = claim
        for attempt in self._attempts_of(job_id):
            if attempt.job is not None and attempt.job.attempt == number:
                attempt.cancel(reason)
                return True
        return False

    def interrupt_job(self, job_id: int, reason: Interrupt) -> int:
        """Cancel every running attempt of job ``job_id``; return how many."""
        attempts = self._attempts_of(job_id)
        for attempt in attempts:
            attempt.cancel(reason)
        return len(attempts)

    def interrupt_all(self, reason: Interrupt) -> int:
        """Cancel every running handler; return how many."""
        attempts = [a for a in [*self._by_id.values(), *self._more] if a.job is not None]
        for attempt in attempts:
            attempt.cancel(reason)
        return len(attempts)

    def _attempts_of(self, job_id: int) -> list[_Attempt]:
        """The attempts of job ``job_id`` running now: found by its id, not by a walk of them all."""
        return [a for a in (self._by_id.get(job_id), *self._more)
                if a is not None and (job := a.job) is not None and job.id == job_id]

    def attempt_of(self, runner: asyncio.Task[Any]) -> _Attempt:
        """The record of the attempts the runner task ``runner`` runs, one at a time (see
        :meth:`start`); call it in that task, which keeps it for every job it takes."""
        attempt = _Attempt(None, runner)
        if self.middleware:  # only middleware read the attempt from the context
            _attempt.set(attempt)
        return attempt

    def start(self, job: Job, attempt: _Attempt) -> Awaitable[Any] | None:
        """Start ``job``'s attempt in the runner of ``attempt``: return the handler's call (its
        middleware and timeout included) for the runner to await and hand to :meth:`ended`,
        or None if there is nothing to call (its outcome is recorded already).

        The runner awaits the handler itself, with no coroutine of the executor's between:
        at thousands of slots a frame per job is a share of what the collector walks."""
        task = self.tasks.get(job.task)
        if task is None:
            self._fail(
                job, "dead",
                f"UnknownTask: no task named {job.task!r} is registered on this worker "
                f"(known: {', '.join(sorted(self.tasks)) or 'none'})",
                dead=True,
            )
            return None
        # Jobs enqueued by name or by SQL: checked here (fits() first, the common answer).
        if not task.fits(job.args) and (problem := task.arguments_problem(job.args)) is not None:
            self._fail(job, "dead", f"TypeError: {problem}", task=task, dead=True)
            return None
        # The attempt begins: its record's fields set here rather than by a method (a call a job).
        attempt.job, attempt.started = job, time.perf_counter()
        attempt.interrupt, attempt.cancel_sent = None, False
        if self._by_id.setdefault(job.id, attempt) is not attempt:
            self._more.append(attempt)
        # Not reset when the handler ends: only the runner's own code runs in its context
        # until the next job replaces it, and a reset would build the context's map once more.
        # The set costs more than its map: under uvloop a fired timer (the handler's last sleep)
        # keeps the context it copied, so the last job's map, until the loop's iteration ends,
        # after the runners' steps. Freed then, after the collector counted the new maps, the
        # old ones are not counted back: a young collection each few hundred jobs. A yield
        # before the set (the map freed in time) costs as much as it saves.
        _current.set(job)
        try:
            if self.middleware:
                # A partial, not a lambda: a closure would make cells of this frame's
                # variables on every call, middleware or not (garbage the collector scans).
                return call_with_middleware(self.middleware, job, functools.partial(self._call, task, job))
            if task.timeout is None:
                return task.fn(**job.args)  # no timeout to apply: no wrapper either
            return self._call(task, job)
        except BaseException as exc:  # calling it raised before it ran: an attempt that failed
            self.ended(attempt, exc)
            return None

    def ended(self, attempt: _Attempt, error: BaseException | None, result: Any = None) -> None:
        """The handler :meth:`start` called in the runner of ``attempt`` returned ``result``
        or raised ``error``: hand its outcome to the completer. Re-raises ``error`` when it is
        the runner's own cancellation (the worker is being cancelled), once that is recorded."""
        job, started = attempt.job, attempt.started
        assert job is not None
        alone = not attempt.cancel_sent or attempt.taken_back()
        if (first := self._by_id.pop(job.id, None)) is not attempt:  # it was one of _more
            if first is not None:
                self._by_id[job.id] = first
            self._more.remove(attempt)
        attempt.job = None
        written = stored_by(job)  # durable steps, sleeps and waits this run stored
        if written:
            for kind, n in written.items():
                self._count(STORED_COUNTS[kind], n)
        if error is None:
            self.counts["succeeded"] += 1
            if logger.isEnabledFor(logging.DEBUG):
                fields = _fields(job, time.perf_counter() - started, "succeeded")
                logger.debug("job %d succeeded", job.id, extra=fields)
            # A task that does not archive may still be a workflow's dependency, whose result is
            # archived for its dependants (the database decides): send any result there is.
            stored = None if result is None else payload.encode_result(result, f"job {job.id} (task {job.task!r})")
            self.completer.succeeded(job, stored)
            return
        task = self.tasks[job.task]
        if isinstance(error, asyncio.CancelledError):
            if attempt.cancel_sent and alone:
                # The worker interrupted this handler, and nothing else cancels the runner.
                self._interrupted(job, attempt.interrupt or Interrupt.SHUTDOWN, started)
                return
            outcome = decide(job, error)
            if outcome == "interrupted" or attempt.cancel_sent:
                # The worker itself is being cancelled: record the interruption, then unwind.
                self._count("interrupted")
                self.completer.rescheduled(job, 0.0, f"Interrupted: {Interrupt.SHUTDOWN.value}")
                raise error
            # Raised by the handler itself while nothing cancels this worker: a failed attempt.
            self._fail(job, outcome, describe_error(error), task=task, started=started)
        elif isinstance(error, Snooze):
            self._count("snoozed")
            if isinstance(error, Suspended):  # at a sleep or an event wait: due when it wakes
                self._count("suspended")
                self.completer.suspended(job)
            else:
                self.completer.rescheduled(job, error.delay)
        elif isinstance(error, Retry):
            reason = error.reason or "handler asked for a retry"
            self._fail(job, decide(job, error), f"Retry: {reason}", task=task, delay=error.delay, started=started)
        elif isinstance(error, Abort):
            self._fail(job, "dead", f"Abort: {error.reason}", task=task, dead=True, started=started)
        elif isinstance(error, HandlerTimeout):
            self._fail(job, decide(job, error), f"TimeoutError: {error}", task=task, started=started)
        else:  # a handler's error, of any kind, must never stop the worker
            self._fail(job, decide(job, error), describe_error(error), task=task, started=started)

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    async def _call(self, task: Task[Any, Any], job: Job) -> Any:
        """Call the handler under the task's timeout (the one place it is applied)."""
        if task.timeout is None:
            return await task.fn(**job.args)
        with anyio.move_on_after(task.timeout) as deadline:
            result = await task.fn(**job.args)
        # cancel_called, not cancelled_caught: a handler that swallowed the timeout's
        # cancellation and returned late still timed out.
        if deadline.cancel_called:
            raise HandlerTimeout(task.timeout)
        return result

    def _interrupted(self, job: Job, reason: Interrupt, started: float) -> None:
        outcome = decide(job, None, reason)
        self._count(outcome)
        fields = _fields(job, time.perf_counter() - started, outcome)
        if reason is Interrupt.LEASE_LOST:
            # The job is no longer ours: any write would be fenced out. Just stop.
            logger.warning("job %d attempt %d: %s", job.id, job.attempt, reason.value, extra=fields)
        elif reason is Interrupt.CANCELLED:
            self.completer.cancelled(job)
            logger.info("job %d cancelled on request", job.id, extra=fields)
        else:
            self.completer.rescheduled(job, 0.0, f"Interrupted: {reason.value}")
            logger.warning("job %d interrupted: %s; back to pending", job.id, reason.value, extra=fields)

    def _fail(
        self,
        job: Job,
        outcome: Outcome,
        error: str,
        *,
        task: Task[Any, Any] | None = None,
        delay: float | None = None,
        dead: bool = False,
        started: float | None = None,
    ) -> None:
        self._count(outcome)
        error = storable_text(error) or "(no message)"
        self.completer.failed(job, error, task.retry if task is not None else Backoff(), delay=delay, dead=dead)
        duration = None if started is None else time.perf_counter() - started
        logger.warning(
            "job %d attempt %d/%d failed%s: %s",
            job.id, job.attempt, job.max_attempts, " (dead)" if outcome == "dead" else "",
            error.splitlines()[0], extra=_fields(job, duration, outcome),
        )



def _fields(job: Job, duration: float | None = None, outcome: str | None = None) -> dict[str, object]:
    """Structured log fields for a job: ``job_id``, ``task``, ``queue``, ``attempt``,
    ``max_attempts``, and when known ``duration`` (seconds) and ``outcome``."""
    fields: dict[str, object] = {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }
    if duration is not None:
        fields["duration"] = duration
    if outcome is not None:
        fields["outcome"] = outcome
    return fields

