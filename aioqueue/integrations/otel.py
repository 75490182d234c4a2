"""OpenTelemetry tracing (``pip install "aioqueue[otel]"``): a request's trace follows it into
the jobs it enqueues.

``Tracing(queue)`` registers an enqueue hook and a middleware. Each enqueue call runs in a
``PRODUCER`` span (``enqueue TASK``) whose context is injected into the jobs' headers with the
global propagator (W3C ``traceparent`` by default). Each attempt runs in a ``CONSUMER`` span
(``run TASK``) that continues that trace, is linked to the producer span, and is current while
the handler runs, so the handler's own spans nest under it. Attributes: the task, queue, job id,
attempt, and outcome (see :func:`aioqueue.middleware.outcome`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from .._job import Job
from ..middleware import outcome

if TYPE_CHECKING:
    from .._app import Queue
    from .._task import NamedTask, Task

__all__ = ["Tracing"]

_FAILED = ("retried", "dead")


class Tracing:
    """Trace ``queue``'s enqueues and job attempts with ``tracer_provider`` (default: global)."""

    def __init__(self, queue: Queue, *, tracer_provider: TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("aioqueue", tracer_provider=tracer_provider)
        queue.enqueue_hooks.append(self.enqueue_span)
        queue.use(self.attempt_span)

    @contextlib.contextmanager
    def enqueue_span(self, task: Task[Any, Any] | NamedTask, count: int) -> Iterator[Mapping[str, str]]:
        """The producer span around one enqueue call; yields the headers to store in its jobs."""
        attributes: dict[str, AttributeValue] = {
            "messaging.system": "aioqueue",
            "messaging.operation.type": "send",
            "messaging.batch.message_count": count,
            "aioqueue.task": task.name,
        }
        if task.queue is not None:  # None: a task known by name, whose queue is looked up as it is written
            attributes["messaging.destination.name"] = task.queue
        with self.tracer.start_as_current_span(f"enqueue {task.name}", kind=SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier

    @contextlib.asynccontextmanager
    async def attempt_span(self, job: Job) -> AsyncIterator[None]:
        """The consumer span of one attempt of ``job``, current while its handler runs."""
        parent = propagate.extract(job.headers) if job.headers else None
        producer = trace.get_current_span(parent).get_span_context() if parent is not None else None
        links = [Link(producer)] if producer is not None and producer.is_valid else []
        attributes: dict[str, AttributeValue] = {
            "messaging.system": "aioqueue",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "aioqueue.task": job.task,
            "aioqueue.attempt": job.attempt,
            "aioqueue.max_attempts": job.max_attempts,
        }
        with self.tracer.start_as_current_span(
            f"run {job.task}", context=parent, kind=SpanKind.CONSUMER, links=links, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                yield
            except BaseException as exc:
                decided = outcome(job, exc)
                span.set_attribute("aioqueue.outcome", decided)
                if decided in _FAILED:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise
            span.set_attribute("aioqueue.outcome", outcome(job, None))
