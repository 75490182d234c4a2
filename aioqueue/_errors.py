"""The exceptions aioqueue raises, and the ones a handler raises to steer its own job.

Errors derive from :class:`AioqueueError`. The handler signals (:class:`Retry`,
:class:`Abort`, :class:`Snooze`) derive from :class:`JobSignal`: they are not errors but
instructions to the worker about the job that raised them.
"""

from __future__ import annotations


class AioqueueError(Exception):
    """Base class of every error aioqueue raises."""


class ConfigurationError(AioqueueError, ValueError):
    """An option or name given to aioqueue is not valid."""


class NotInTransactionError(ConfigurationError):
    """A ``conn=`` given to enqueue has no transaction open, so the job would commit on its own
    and survive a rollback of the caller's work: open a transaction, or omit ``conn``."""


class WrongDatabaseError(ConfigurationError):
    """A ``conn=`` given to enqueue reaches another database than the task's Queue: the job
    would wait there forever, since no worker of that Queue looks in it. The message names both
    databases."""


class DependencyError(ConfigurationError):
    """A workflow link refused at enqueue: a dependency that does not exist, is gone, is dead or
    cancelled, belongs to another database, a cycle, or a group that is closed. Nothing was
    written."""


class JobArgumentsError(AioqueueError, TypeError):
    """A job's arguments do not fit its task, or cannot be stored as JSON.

    Raised at enqueue, before anything is written; the message names the task and the argument.
    """


class PayloadTooLargeError(JobArgumentsError):
    """A job's arguments, serialised to JSON, exceed the queue's ``max_payload_bytes``."""


class SchemaNotReadyError(AioqueueError):
    """The aioqueue schema is missing or older than this code: run ``aioqueue migrate``."""


class ConnectError(AioqueueError, ConnectionError):
    """PostgreSQL could not be reached; the message names the host."""


class NotRegisteredError(AioqueueError, LookupError):
    """A task name is not registered on this queue."""


class JobFailed(AioqueueError):
    """The job whose result was awaited is dead; ``last_error`` says why."""

    def __init__(self, job_id: int, last_error: str | None) -> None:
        self.job_id = job_id
        self.last_error = last_error
        super().__init__(f"job {job_id} is dead: {last_error}")


class JobCancelled(AioqueueError):
    """The job whose result was awaited was cancelled."""


class ResultUnavailable(AioqueueError, LookupError):
    """The job is gone without a kept result: its task does not archive, it was pruned or
    purged, or it never existed."""


class JobSignal(Exception):
    """Base of the exceptions a handler raises to tell the worker what to do with its job."""


class Retry(JobSignal):
    """Retry this job after ``delay`` seconds (default: the task's backoff); spends an attempt.

    When the job has no attempts left it becomes dead, as with any other failure.
    """

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and not 0 <= delay <= 10 * 365 * 86400:
            raise ConfigurationError(f"Retry delay must be 0..10 years in seconds, got {delay!r}")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay})")


class Abort(JobSignal):
    """Send this job straight to dead, keeping ``reason`` as its last error; no more attempts."""

    def __init__(self, reason: str = "aborted by handler") -> None:
        self.reason = reason
        super().__init__(reason)


class Snooze(JobSignal):
    """Run this job again after ``delay`` seconds without spending an attempt."""

    def __init__(self, delay: float) -> None:
        if not 0 <= delay <= 10 * 365 * 86400:
            raise ConfigurationError(f"Snooze delay must be 0..10 years in seconds, got {delay!r}")
        self.delay = delay
        super().__init__(f"snoozed for {delay}s")
