"""Prometheus metrics for workers: a middleware that counts and times every job, and gauges of
queue depth refreshed from ``Queue.status()``.

Optional: needs ``prometheus-client`` (``pip install "aioqueue[prometheus]"``). Register the
middleware with ``queue.use(metrics)``; run ``metrics.poll(queue)`` beside the worker to keep
the depth gauges fresh; expose the registry with ``metrics.serve(port)`` or your web
framework's own ``/metrics`` route (``prometheus_client.generate_latest``). The per-job cost is
a few dictionary lookups and counter increments; nothing here touches the database per job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

import anyio

try:
    import prometheus_client
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aioqueue.metrics needs prometheus-client: pip install "aioqueue[prometheus]"'
    ) from exc

from ._job import Job
from ._steps import Suspended, stored_by
from .middleware import outcome

if TYPE_CHECKING:
    from ._app import Queue

logger = logging.getLogger("aioqueue.metrics")

DEFAULT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_DEPTH_STATES = ("pending", "ready", "scheduled", "running", "dead", "waiting")


class PrometheusMetrics:
    """Job counters and durations (a middleware), and queue depth gauges.

    Metrics, each labelled by ``queue`` and ``task``:
    ``aioqueue_jobs_started_total``, ``aioqueue_jobs_completed_total`` (succeeded),
    ``aioqueue_jobs_failed_total`` (failed attempts, retried or dead), ``aioqueue_jobs_dead_total``,
    ``aioqueue_job_duration_seconds`` (histogram, every attempt that ran to an end),
    ``aioqueue_jobs_suspended_total`` (runs that stopped at a durable sleep or event wait and
    gave their slot back, see ``aioqueue.sleep``); by ``queue``, ``task`` and ``kind`` (step,
    sleep, event): ``aioqueue_steps_stored_total``. By ``queue`` and ``state`` (pending, ready,
    scheduled, running, dead, waiting): ``aioqueue_queue_depth``; by ``queue``:
    ``aioqueue_queue_oldest_ready_age_seconds``. Workflow work in flight: ``aioqueue_groups``
    by ``state`` (open, closed), ``aioqueue_jobs_waiting_for_jobs``, and
    ``aioqueue_jobs_awaiting`` by ``kind`` (sleep, event).
    """

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry | None = None,
        *,
        namespace: str = "aioqueue",
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        labels = ("queue", "task")
        common: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        self.started = prometheus_client.Counter("jobs_started", "Job attempts started.", labels, **common)
        self.completed = prometheus_client.Counter(
            "jobs_completed", "Job attempts that succeeded.", labels, **common
        )
        self.failed = prometheus_client.Counter(
            "jobs_failed", "Job attempts that failed (to be retried, or dead).", labels, **common
        )
        self.dead = prometheus_client.Counter(
            "jobs_dead", "Jobs that failed for good (attempts spent, or aborted).", labels, **common
        )
        self.duration = prometheus_client.Histogram(
            "job_duration_seconds", "Time a handler ran, per attempt.", labels, buckets=buckets, **common
        )
        self.suspended = prometheus_client.Counter(
            "jobs_suspended", "Handler runs that stopped at a durable sleep or event wait.", labels, **common
        )
        self.steps_stored = prometheus_client.Counter(
            "steps_stored", "Durable steps, sleeps and event waits stored by handlers.", (*labels, "kind"), **common
        )
        self.groups = prometheus_client.Gauge("groups", "Groups not done, by state.", ("state",), **common)
        self.waiting_for_jobs = prometheus_client.Gauge(
            "jobs_waiting_for_jobs", "Jobs waiting for other jobs to finish.", **common
        )
        self.suspended_now = prometheus_client.Gauge(
            "jobs_awaiting", "Jobs stopped at a durable sleep or event wait, by kind.", ("kind",), **common
        )
        self.depth = prometheus_client.Gauge(
            "queue_depth", "Jobs in the queue, by state.", ("queue", "state"), **common
        )
        self.oldest_ready_age = prometheus_client.Gauge(
            "queue_oldest_ready_age_seconds", "How long the oldest ready job has waited.", ("queue",),
            **common,
        )
        self.outbox_lag = prometheus_client.Gauge(
            "outbox_lag_seconds", "How long the oldest unpublished outbox event has waited.", ("stream",), **common
        )
        self.outbox_waiting = prometheus_client.Gauge(
            "outbox_waiting", "Outbox events not yet published.", ("stream",), **common
        )
        self.outbox_published = prometheus_client.Gauge(
            "outbox_published", "Outbox events relayed so far.", ("stream",), **common
        )
        self._series: dict[tuple[str, str], _Series] = {}
        self._queues: set[str] = set()

    def __call__(self, job: Job) -> _Observation:
        """The middleware: count and time ``job``'s attempt."""
        key = (job.queue, job.task)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self, job.queue, job.task)
        return _Observation(self, series, job)

    async def refresh(self, queue: Queue) -> None:
        """Set the depth gauges from ``queue.status()`` (one query; queues now empty go to 0), the
        outbox gauges from ``queue.outbox_status()`` (one query), and the workflow gauges from
        ``queue.workflow_status()`` (one query)."""
        rows = await queue.status()
        seen = set()
        for row in rows:
            name = row["queue"]
            seen.add(name)
            for state in _DEPTH_STATES:
                self.depth.labels(name, state).set(row[state])
            self.oldest_ready_age.labels(name).set(row["oldest_ready_age"] or 0.0)
        for name in self._queues - seen:
            for state in _DEPTH_STATES:
                self.depth.labels(name, state).set(0)
            self.oldest_ready_age.labels(name).set(0.0)
        self._queues |= seen
        for row in await queue.outbox_status():
            self.outbox_lag.labels(row["stream"]).set(row["lag"])
            self.outbox_waiting.labels(row["stream"]).set(row["waiting"])
            self.outbox_published.labels(row["stream"]).set(row["published"])
        flows = await queue.workflow_status()
        self.groups.labels("open").set(flows["groups_open"])
        self.groups.labels("closed").set(flows["groups_closed"])
        self.waiting_for_jobs.set(flows["waiting"])
        self.suspended_now.labels("sleep").set(flows["sleeping"])
        self.suspended_now.labels("event").set(flows["awaiting_event"])

    async def poll(self, queue: Queue, interval: float = 15.0) -> None:
        """Refresh the depth gauges every ``interval`` seconds until cancelled; log failures."""
        while True:
            try:
                await self.refresh(queue)
            except Exception as exc:
                logger.warning("refreshing queue depth metrics failed (%s: %s)", type(exc).__name__, exc)
            await anyio.sleep(interval)

    def serve(self, port: int, addr: str = "127.0.0.1") -> WSGIServer:
        """Serve this registry at ``http://addr:port/metrics`` from a daemon thread; return the
        server (``server.server_port`` is the port when ``port`` is 0; ``shutdown()`` stops it,
        then ``server_close()`` closes its socket)."""
        server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        return server


class _Series:
    """The labelled children of one (queue, task), looked up once."""

    __slots__ = ("completed", "dead", "duration", "failed", "started", "suspended")

    def __init__(self, metrics: PrometheusMetrics, queue: str, task: str) -> None:
        self.started = metrics.started.labels(queue, task)
        self.completed = metrics.completed.labels(queue, task)
        self.failed = metrics.failed.labels(queue, task)
        self.dead = metrics.dead.labels(queue, task)
        self.duration = metrics.duration.labels(queue, task)
        self.suspended = metrics.suspended.labels(queue, task)


class _Observation:
    """One attempt under observation: an async context manager around its handler."""

    __slots__ = ("_job", "_metrics", "_series", "_started")

    def __init__(self, metrics: PrometheusMetrics, series: _Series, job: Job) -> None:
        self._metrics = metrics
        self._series = series
        self._job = job
        self._started = 0.0

    async def __aenter__(self) -> None:
        self._series.started.inc()
        self._started = time.perf_counter()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        series = self._series
        written = stored_by(self._job)  # durable steps this run stored
        if written:
            for kind, n in written.items():
                self._metrics.steps_stored.labels(self._job.queue, self._job.task, kind).inc(n)
        result = outcome(self._job, exc)
        if result == "interrupted" or result == "snoozed":
            if isinstance(exc, Suspended):
                series.suspended.inc()
            return  # not an ending: the attempt runs again
        series.duration.observe(time.perf_counter() - self._started)
        if result == "succeeded":
            series.completed.inc()
            return
        series.failed.inc()
        if result == "dead":
            series.dead.inc()
