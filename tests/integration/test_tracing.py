"""OpenTelemetry: a request that enqueues and the job that runs show up in one trace, recorded
with the SDK's in-memory exporter: the attempt's span continues the producer span's trace and
links to it, the handler's spans nest under the attempt, and outcomes are attributes."""

from __future__ import annotations

import asyncpg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import aioqueue
from aioqueue.integrations.otel import Tracing


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


async def test_a_request_and_the_job_it_enqueues_are_one_trace(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    Tracing(q, tracer_provider=provider)
    tracer = provider.get_tracer("the app")

    @q.task(max_attempts=2, retry=aioqueue.Backoff(base=0.001, jitter=0))
    async def send_mail(to: str) -> str:
        with tracer.start_as_current_span("smtp"):
            pass
        job = aioqueue.current_job()
        if job.attempt == 1:
            raise ConnectionError("smtp down")
        return to

    with tracer.start_as_current_span("POST /signup") as request:
        await send_mail.enqueue("a@example.com")
        await send_mail.enqueue_many([{"to": "b@example.com"}])
    # The handler never sees the headers; the stored arguments carry them.
    stored = await db.fetch("SELECT id, args FROM aioqueue.jobs ORDER BY id")
    assert all("traceparent" in row["args"] for row in stored)
    # The operator's view shows the job's own arguments, as its handler gets them.
    info = await q.get_job(stored[0]["id"])
    assert info is not None and info.args == {"to": "a@example.com"}

    await q.worker().run_until_empty()
    await q.worker().run_until_empty()  # the retries

    spans = _by_name(exporter.get_finished_spans())
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for ss in spans.values() for s in ss} == {trace_id}
    enqueues = spans["enqueue send_mail"]
    assert len(enqueues) == 2 and all(s.kind is SpanKind.PRODUCER for s in enqueues)
    assert all(s.parent is not None and s.parent.span_id == request.get_span_context().span_id for s in enqueues)
    runs = spans["run send_mail"]
    assert len(runs) == 4
    for run in runs:
        assert run.kind is SpanKind.CONSUMER
        assert run.parent is not None and run.parent.span_id in {e.context.span_id for e in enqueues}
        assert [link.context.span_id for link in run.links] == [run.parent.span_id]
        assert run.attributes is not None
        assert run.attributes["aioqueue.task"] == "send_mail"
        assert run.attributes["messaging.destination.name"] == "default"
    outcomes = sorted((r.attributes or {})["aioqueue.outcome"] for r in runs)  # type: ignore[type-var]
    assert outcomes == ["retried", "retried", "succeeded", "succeeded"]
    failed = [r for r in runs if (r.attributes or {})["aioqueue.outcome"] == "retried"]
    assert all(r.status.status_code is StatusCode.ERROR and r.attributes["aioqueue.attempt"] == 1  # type: ignore[index]
               for r in failed)
    smtp = spans["smtp"]
    assert len(smtp) == 4 and {s.parent.span_id for s in smtp if s.parent} == {r.context.span_id for r in runs}


async def test_without_tracing_jobs_carry_no_headers(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def plain(n: int) -> None:
        pass

    await plain.enqueue(1)
    assert await db.fetchval("SELECT args::text FROM aioqueue.jobs") == '{"n": 1}'
