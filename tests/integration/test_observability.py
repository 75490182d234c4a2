"""Observability: job middleware (order, outcomes, context, zero cost when unused), structured
log fields, and the Prometheus metrics scraped over HTTP, in-process and from the CLI worker."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import aioqueue
from aioqueue.metrics import PrometheusMetrics
from aioqueue.middleware import outcome
from tests.support.cli_tools import app_task, cli_process
from tests.support.helpers import eventually

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse a Prometheus exposition into {(sample name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_middleware_wraps_handlers_in_order_and_sees_every_outcome(q: aioqueue.Queue) -> None:
    events: list[tuple[str, ...]] = []
    errors: dict[str, BaseException] = {}
    seen_ids: dict[str, str] = {}

    @q.use
    @contextlib.asynccontextmanager
    async def outer(job: aioqueue.Job) -> AsyncIterator[None]:
        events.append(("outer in", job.task))
        request_id.set(f"job-{job.id}")  # visible to the handler
        try:
            yield
        except BaseException as exc:
            errors[job.task] = exc
            events.append(("outer out", job.task, outcome(job, exc)))
            raise
        events.append(("outer out", job.task, outcome(job, None)))

    @q.use
    @contextlib.asynccontextmanager
    async def inner(job: aioqueue.Job) -> AsyncIterator[None]:
        events.append(("inner in", job.task))
        try:
            yield
        finally:
            events.append(("inner out", job.task))

    @q.task
    async def ok() -> str:
        seen_ids["ok"] = request_id.get()
        return "fine"

    @q.task(max_attempts=1)
    async def boom() -> None:
        raise ValueError("boom")

    @q.task(max_attempts=1, timeout=0.05)
    async def slow() -> None:
        await anyio.sleep(10)

    @q.task
    async def later() -> None:
        raise aioqueue.Snooze(3600)

    @q.task(max_attempts=3)
    async def again() -> None:
        raise aioqueue.Retry(delay=3600)

    ok_id = await ok.enqueue()
    slow_id = await slow.enqueue()
    for task in (boom, later, again):
        await task.enqueue()
    with anyio.fail_after(20):
        await q.worker(concurrency=5).run_until_empty()

    outcomes = {e[1]: e[2] for e in events if e[0] == "outer out"}
    assert outcomes == {"ok": "succeeded", "boom": "dead", "slow": "dead", "later": "snoozed", "again": "retried"}
    assert [e for e in events if e[1] == "ok"] == [
        ("outer in", "ok"), ("inner in", "ok"), ("inner out", "ok"), ("outer out", "ok", "succeeded")
    ]
    assert seen_ids["ok"] == f"job-{ok_id}"
    assert isinstance(errors["slow"], TimeoutError)  # the task's timeout fires inside middleware
    assert isinstance(errors["boom"], ValueError)
    info = await q.get_job(slow_id)
    assert info is not None and info.last_error is not None
    assert info.status == "dead" and info.last_error.startswith("TimeoutError: handler exceeded its timeout")


async def test_without_middleware_the_handler_is_called_directly(q: aioqueue.Queue) -> None:
    stacks: list[list[str]] = []

    @q.task
    async def where() -> None:
        stacks.append([frame.function for frame in inspect.stack()])

    await where.enqueue()
    await q.worker().run_until_empty()

    @q.use
    @contextlib.asynccontextmanager
    async def noop(job: aioqueue.Job) -> AsyncIterator[None]:
        yield

    await where.enqueue()
    await q.worker().run_until_empty()
    plain, wrapped = stacks
    assert "call_with_middleware" not in plain
    assert "call_with_middleware" in wrapped


async def test_job_logs_carry_structured_fields(q: aioqueue.Queue, caplog: pytest.LogCaptureFixture) -> None:
    @q.task(queue="mail")
    async def fine() -> None:
        pass

    @q.task(queue="mail", max_attempts=1)
    async def broken() -> None:
        raise RuntimeError("no")

    fine_id = await fine.enqueue()
    broken_id = await broken.enqueue()
    with caplog.at_level(logging.DEBUG, logger="aioqueue"):
        await q.worker().run_until_empty()
    by_job = {getattr(r, "job_id", None): r for r in caplog.records if hasattr(r, "outcome")}
    succeeded, failed = by_job[fine_id], by_job[broken_id]
    for record, task, result in ((succeeded, "fine", "succeeded"), (failed, "broken", "dead")):
        fields = record.__dict__
        assert (fields["task"], fields["queue"], fields["attempt"], fields["outcome"]) == (task, "mail", 1, result)
        assert fields["max_attempts"] >= 1
        assert 0 <= fields["duration"] < 5
    assert failed.levelno == logging.WARNING and "RuntimeError: no" in failed.getMessage()


async def test_prometheus_metrics_scraped_over_http(q: aioqueue.Queue) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    q.use(metrics)

    @q.task(queue="mail")
    async def send(n: int) -> None:
        await anyio.sleep(0.01)

    @q.task(queue="mail", max_attempts=1)
    async def bounce() -> None:
        raise ValueError("mailbox full")

    await send.enqueue_many([{"n": i} for i in range(3)])
    await bounce.enqueue()
    await send.options(delay=3600).enqueue(n=99)
    await q.worker(concurrency=4).run_until_empty()
    await metrics.refresh(q)

    server = metrics.serve(0)
    try:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        await anyio.to_thread.run_sync(server.shutdown)
        server.server_close()
    assert response.status_code == 200
    values = samples(response.text)
    send_labels = (("queue", "mail"), ("task", "send"))
    bounce_labels = (("queue", "mail"), ("task", "bounce"))
    assert values[("aioqueue_jobs_started_total", send_labels)] == 3
    assert values[("aioqueue_jobs_completed_total", send_labels)] == 3
    assert values[("aioqueue_jobs_started_total", bounce_labels)] == 1
    assert values[("aioqueue_jobs_failed_total", bounce_labels)] == 1
    assert values[("aioqueue_jobs_dead_total", bounce_labels)] == 1
    assert values.get(("aioqueue_jobs_failed_total", send_labels), 0) == 0
    assert values[("aioqueue_job_duration_seconds_count", send_labels)] == 3
    assert values[("aioqueue_job_duration_seconds_sum", send_labels)] >= 0.03
    depth = {state: values[("aioqueue_queue_depth", (("queue", "mail"), ("state", state)))]
             for state in ("pending", "ready", "scheduled", "running", "dead", "waiting")}
    assert depth == {"pending": 1, "ready": 0, "scheduled": 1, "running": 0, "dead": 1, "waiting": 0}


async def test_depth_gauges_drop_to_zero_when_a_queue_empties(q: aioqueue.Queue) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    ready = {"queue": "tmp", "state": "ready"}

    @q.task(queue="tmp")
    async def t() -> None:
        pass

    await t.enqueue()
    await metrics.refresh(q)
    assert registry.get_sample_value("aioqueue_queue_depth", ready) == 1
    await q.worker().run_until_empty()
    async with q.connection() as conn:
        await conn.execute("DELETE FROM aioqueue.queue_stats")  # the queue no longer shows at all
    await metrics.refresh(q)
    assert registry.get_sample_value("aioqueue_queue_depth", ready) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_cli_worker_serves_metrics(dsn: str, app_dir: Path) -> None:
    port = _free_port()
    args = ["worker", "cli_app:queue", "--poll-interval", "0.2", "--metrics-port", str(port)]
    async with cli_process(args, dsn, app_dir) as (_process, output):
        await output.wait_for("started: queues=cli")
        async with aioqueue.Queue(dsn) as queue:
            await app_task(queue, "record", "cli").enqueue_many([{"n": n} for n in range(2)])

        async def scraped_two() -> bool:
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            key = ("aioqueue_jobs_completed_total", (("queue", "cli"), ("task", "record")))
            return samples(text).get(key) == 2

        await eventually(scraped_two, what="the worker's /metrics to count two jobs")
        assert f"serving Prometheus metrics at http://127.0.0.1:{port}/metrics" in output.text
