"""aioqueue: an asyncio job queue that lives in the PostgreSQL database you already run."""

from .app import Queue
from .errors import (
    Abort,
    AioqueueError,
    ConfigurationError,
    ConnectError,
    JobArgumentsError,
    JobSignal,
    NotRegisteredError,
    PayloadTooLargeError,
    Retry,
    SchemaNotReadyError,
    Snooze,
)
from .job import Job, JobInfo, current_job
from .retry import Backoff
from .task import Enqueuer, Task
from .worker import Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "AioqueueError",
    "Backoff",
    "ConfigurationError",
    "ConnectError",
    "Enqueuer",
    "Job",
    "JobArgumentsError",
    "JobInfo",
    "JobSignal",
    "NotRegisteredError",
    "PayloadTooLargeError",
    "Queue",
    "Retry",
    "SchemaNotReadyError",
    "Snooze",
    "Task",
    "Worker",
    "WorkerStats",
    "__version__",
    "current_job",
]
