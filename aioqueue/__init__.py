"""aioqueue: an asyncio job queue that lives in the PostgreSQL database you already run."""

# First, before the slow imports: the `aioqueue worker` command must not die of an early SIGTERM.
from . import _stop_signals  # noqa: F401
from ._app import Queue
from ._config import WorkerConfig, WorkerOptions
from ._errors import (
    Abort,
    AioqueueError,
    ConfigurationError,
    ConnectError,
    DependencyError,
    JobArgumentsError,
    JobCancelled,
    JobFailed,
    JobSignal,
    NotInTransactionError,
    NotRegisteredError,
    PayloadTooLargeError,
    ResultUnavailable,
    Retry,
    SchemaNotReadyError,
    Snooze,
    WrongDatabaseError,
)
from ._job import Job, JobInfo, JobRef, Progress, current_job
from ._links import Call, Dependency
from ._payload import UndecodableValue
from ._progress import set_progress
from ._relay import Relay, RelayStats
from ._retry import Backoff
from ._step_admin import StepInfo
from ._steps import EventTimeout, StepNotRecorded, sleep, sleep_until, step, wait_for_event
from ._task import Enqueuer, NamedTask, Task
from ._version import __version__
from ._worker import Worker, WorkerStats
from ._workflows import Group, GroupCounts, Upstream, Workflow, chain, chord, group
from .integrations.background import BackgroundWorker

__all__ = [
    "Abort",
    "AioqueueError",
    "BackgroundWorker",
    "Backoff",
    "Call",
    "ConfigurationError",
    "ConnectError",
    "Dependency",
    "DependencyError",
    "Enqueuer",
    "EventTimeout",
    "Group",
    "GroupCounts",
    "Job",
    "JobArgumentsError",
    "JobCancelled",
    "JobFailed",
    "JobInfo",
    "JobRef",
    "JobSignal",
    "NamedTask",
    "NotInTransactionError",
    "NotRegisteredError",
    "PayloadTooLargeError",
    "Progress",
    "Queue",
    "Relay",
    "RelayStats",
    "ResultUnavailable",
    "Retry",
    "SchemaNotReadyError",
    "Snooze",
    "StepInfo",
    "StepNotRecorded",
    "Task",
    "UndecodableValue",
    "Upstream",
    "Worker",
    "WorkerConfig",
    "WorkerOptions",
    "WorkerStats",
    "Workflow",
    "WrongDatabaseError",
    "__version__",
    "chain",
    "chord",
    "current_job",
    "group",
    "set_progress",
    "sleep",
    "sleep_until",
    "step",
    "wait_for_event",
]
