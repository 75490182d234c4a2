"""aioqueue: an asyncio job queue that lives in the PostgreSQL database you already run."""

# First, before the slow imports: the `aioqueue worker` command must not die of an early SIGTERM.
from . import stop_signals  # noqa: F401
from .app import Queue
from .config import WorkerConfig, WorkerOptions
from .errors import (
    Abort,
    AioqueueError,
    ConfigurationError,
    ConnectError,
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
from .integrations.background import BackgroundWorker
from .job import Job, JobInfo, JobRef, current_job
from .payload import UndecodableValue
from .retry import Backoff
from .task import Enqueuer, NamedTask, Task
from .worker import Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "AioqueueError",
    "BackgroundWorker",
    "Backoff",
    "ConfigurationError",
    "ConnectError",
    "Enqueuer",
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
    "Queue",
    "ResultUnavailable",
    "Retry",
    "SchemaNotReadyError",
    "Snooze",
    "Task",
    "UndecodableValue",
    "Worker",
    "WorkerConfig",
    "WorkerOptions",
    "WorkerStats",
    "WrongDatabaseError",
    "__version__",
    "current_job",
]
