"""Run one claimed job's handler and turn what happened into an outcome for the completer.

The executor holds no connection and no transaction while a handler runs. It applies the
task's timeout and the queue's middleware (``aioqueue.middleware``), maps the handler's return
or exception to succeeded / retry / dead / rescheduled, and records an outcome even when the
handler is cancelled (shutdown, a lost lease, a cancel request), so a cancellation never skips
the bookkeeping. It never writes to the database itself.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import time
import traceback
from typing import TYPE_CHECKING

import anyio

from . import payload
from .errors import Abort, Retry, Snooze
from .job import Job, _current
from .middleware import HandlerTimeout, call_with_middleware
from .retry import Backoff

if TYPE_CHECKING:
    from .app import Queue
    from .completer import Completer

logger = logging.getLogger("aioqueue.worker")

_MAX_ERROR_CHARS = 8000


class Interrupt(enum.Enum):
    """Why the worker cancelled a running handler."""

    SHUTDOWN = "the worker shut down before the handler finished"
    LEASE_LOST = "the worker lost the job's lease (it was reaped and may run elsewhere)"
    CANCELLED = "the job was cancelled on request"


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


class Executor:
    """Runs handlers for one worker and keeps the cancel scope of each running job."""

    def __init__(self, app: Queue, completer: Completer, counts: dict[str, int]) -> None:
        self.app = app
        self.completer = completer
        self.counts = counts
        self.running: dict[int, tuple[anyio.CancelScope, list[Interrupt]]] = {}
        self._scope_type: type[anyio.CancelScope] | None = None

    def interrupt(self, job_id: int, reason: Interrupt) -> bool:
        """Cancel the running handler of ``job_id``; return whether one was running."""
        entry = self.running.get(job_id)
        if entry is None:
            return False
        scope, reasons = entry
        reasons.append(reason)
        scope.cancel()
        return True

    def interrupt_all(self, reason: Interrupt) -> int:
        """Cancel every running handler; return how many."""
        return sum(self.interrupt(job_id, reason) for job_id in list(self.running))

    async def execute(self, job: Job) -> None:
        """Run ``job``'s handler to an outcome and hand that outcome to the completer."""
        task = self.app.tasks.get(job.task)
        if task is None:
            self._count("dead")
            self.completer.failed(
                job,
                f"UnknownTask: no task named {job.task!r} is registered on this worker "
                f"(known: {', '.join(sorted(self.app.tasks)) or 'none'})",
                Backoff(),
                dead=True,
            )
            logger.error("job %d: unknown task %r, marked dead", job.id, job.task, extra=_fields(job, None, "dead"))
            return

        if self._scope_type is None:
            # anyio.CancelScope() looks up the running backend on every call, a few µs per job;
            # the class it returns makes the same scopes directly.
            self._scope_type = type(anyio.CancelScope())
        scope = self._scope_type()
        reasons: list[Interrupt] = []
        self.running[job.id] = (scope, reasons)
        token = _current.set(job)
        started = time.perf_counter()
        timed_out = False
        try:
            with scope:
                if self.app.middleware:
                    result = await call_with_middleware(
                        self.app.middleware, job, functools.partial(task.fn, **job.args), task.timeout
                    )
                elif task.timeout is None:
                    result = await task.fn(**job.args)
                else:
                    with anyio.move_on_after(task.timeout) as deadline:
                        result = await task.fn(**job.args)
                    # cancel_called, not cancelled_caught: a handler that swallowed the
                    # timeout's cancellation and returned late still timed out.
                    timed_out = deadline.cancel_called
        except HandlerTimeout:
            self._failed(
                job, task.retry, f"TimeoutError: handler exceeded its timeout of {task.timeout}s",
                started=started,
            )
        except Retry as exc:
            reason = exc.reason or "handler asked for a retry"
            self._failed(job, task.retry, f"Retry: {reason}", delay=exc.delay, started=started)
        except Abort as exc:
            self._failed(job, task.retry, f"Abort: {exc.reason}", dead=True, started=started)
        except Snooze as exc:
            self._count("snoozed")
            self.completer.rescheduled(job, exc.delay)
        except anyio.get_cancelled_exc_class() as exc:
            if anyio.current_effective_deadline() != -math.inf:
                # Raised by the handler itself (say, a future someone else cancelled) while
                # nothing cancels this worker: a failed attempt, like any other exception.
                self._failed(job, task.retry, describe_error(exc), started=started)
                return
            # The worker itself is being cancelled: record the interruption, then let it unwind.
            self._count("interrupted")
            self.completer.rescheduled(job, 0.0, f"Interrupted: {Interrupt.SHUTDOWN.value}")
            raise
        except BaseException as exc:  # a handler's error, of any kind, must never stop the worker
            self._failed(job, task.retry, describe_error(exc), started=started)
        else:
            if scope.cancelled_caught:
                self._interrupted(job, reasons, started)
            elif timed_out:
                self._failed(
                    job, task.retry, f"TimeoutError: handler exceeded its timeout of {task.timeout}s",
                    started=started,
                )
            else:
                self._count("succeeded")
                self.completer.succeeded(job, payload.encode_result(result) if task.archive else None)
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug(
                        "job %d succeeded", job.id,
                        extra=_fields(job, time.perf_counter() - started, "succeeded"),
                    )
        finally:
            del self.running[job.id]
            _current.reset(token)

    def _interrupted(self, job: Job, reasons: list[Interrupt], started: float) -> None:
        reason = reasons[0] if reasons else Interrupt.SHUTDOWN
        self._count("cancelled" if reason is Interrupt.CANCELLED else "interrupted")
        fields = _fields(job, time.perf_counter() - started, "interrupted")
        if reason is Interrupt.LEASE_LOST:
            # The job is no longer ours: any write would be fenced out. Just stop.
            logger.warning("job %d: %s", job.id, reason.value, extra=fields)
            return
        if reason is Interrupt.CANCELLED:
            self.completer.cancelled(job)
            logger.info("job %d cancelled on request", job.id, extra=fields)
            return
        self.completer.rescheduled(job, 0.0, f"Interrupted: {reason.value}")
        logger.warning("job %d interrupted: %s; back to pending", job.id, reason.value, extra=fields)

    def _failed(
        self,
        job: Job,
        retry: Backoff,
        error: str,
        *,
        delay: float | None = None,
        dead: bool = False,
        started: float | None = None,
    ) -> None:
        final = dead or job.attempt >= job.max_attempts
        self._count("dead" if final else "retried")
        error = storable_text(error) or "(no message)"
        self.completer.failed(job, error, retry, delay=delay, dead=dead)
        duration = None if started is None else time.perf_counter() - started
        logger.warning(
            "job %d attempt %d/%d failed%s: %s",
            job.id, job.attempt, job.max_attempts, " (dead)" if final else "",
            error.splitlines()[0], extra=_fields(job, duration, "dead" if final else "retried"),
        )

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1


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
