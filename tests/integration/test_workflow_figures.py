"""Workflows counted, against the real server: what a worker's handlers stored (steps, sleeps,
event waits) and how many runs stopped at them, in its stats, its registry row and the
dashboard's workers page; the workflow work in flight (groups not done, jobs waiting for jobs,
sleeping or awaiting an event) from ``workflow_status()`` and the Prometheus gauges; the steps
stored per queue, task and kind as a Prometheus counter."""

from __future__ import annotations

from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

import aioqueue
from aioqueue.dashboard import create_app
from aioqueue.metrics import PrometheusMetrics
from tests.support import dashboard_tools
from tests.support.dashboard_tools import SERVED
from tests.support.helpers import eventually, running


async def test_workers_and_metrics_count_steps_waits_groups_and_dependants(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    q.use(metrics)

    async def one() -> int:
        return 1

    @q.task(queue="flows")
    async def staged() -> None:
        await aioqueue.step("a", one)
        await aioqueue.step("b", one)
        await aioqueue.sleep(3600)

    @q.task(queue="flows")
    async def listens() -> None:
        await aioqueue.wait_for_event("ping", timeout=3600)

    @q.task(queue="flows")
    async def after() -> None:
        pass

    @q.task(queue="flows")
    async def done() -> None:
        pass

    first = await staged.enqueue()
    await listens.enqueue()
    await after.options(after=[first]).enqueue()  # waits for the sleeping job
    open_group = await q.open_group(on_success=done.s(), name="open")
    closed_group = await q.open_group(on_success=done.s(), name="closed")
    await after.options(group=closed_group, delay=3600).enqueue()  # a member that has not run
    await closed_group.close()

    worker = q.worker(queues=["flows"], concurrency=2)
    async with running(worker):
        await eventually(lambda: worker.stats.suspended == 2, what="both handlers suspended")
        assert worker.registry is not None
        await worker.registry.refresh()  # as every interval: the row carries the counts
        [row] = await q.admin.list_workers()
        async with dashboard_tools.client_for(create_app(q), SERVED) as client:
            page = (await client.get("/workers")).text
    stats = worker.stats
    assert (stats.steps, stats.sleeps, stats.event_waits, stats.suspended, stats.snoozed) == (2, 1, 1, 2, 2)
    counts: dict[str, Any] = row["counts"]
    assert {k: counts[k] for k in ("claimed", "steps", "sleeps", "event_waits", "suspended")} == {
        "claimed": 2, "steps": 2, "sleeps": 1, "event_waits": 1, "suspended": 2}
    assert "stored 2 steps, 1 sleeps, 1 event waits" in page and "2 suspended" in page

    assert await q.workflow_status() == {
        "groups_open": 1, "groups_closed": 1, "waiting": 1, "sleeping": 1, "awaiting_event": 1}
    await metrics.refresh(q)
    sample = registry.get_sample_value
    assert sample("aioqueue_groups", {"state": "open"}) == 1
    assert sample("aioqueue_groups", {"state": "closed"}) == 1
    assert sample("aioqueue_jobs_waiting_for_jobs") == 1
    assert sample("aioqueue_jobs_awaiting", {"kind": "sleep"}) == 1
    assert sample("aioqueue_jobs_awaiting", {"kind": "event"}) == 1
    labels = {"queue": "flows", "task": staged.name}
    assert sample("aioqueue_steps_stored_total", {**labels, "kind": "step"}) == 2
    assert sample("aioqueue_steps_stored_total", {**labels, "kind": "sleep"}) == 1
    assert sample("aioqueue_steps_stored_total", {"queue": "flows", "task": listens.name, "kind": "event"}) == 1

    # The empty group closed is done at once; an event received still counts until its job runs
    # and takes it.
    assert await q.send_event("ping") == 1
    await open_group.close()
    assert await q.workflow_status() == {
        "groups_open": 0, "groups_closed": 1, "waiting": 1, "sleeping": 1, "awaiting_event": 1}
    await q.worker(queues=["flows"]).run_until_empty()
    assert (await q.workflow_status())["awaiting_event"] == 0


async def test_a_worker_row_of_a_previous_release_shows_no_counts(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    await db.execute("INSERT INTO aioqueue.workers (name, host, pid, queues, concurrency, version) "
                     "VALUES ('old-1', 'h', 1, '{default}', 4, '0.0.9')")
    [row] = await q.admin.list_workers()
    assert row["counts"] == {}
    async with dashboard_tools.client_for(create_app(q), SERVED) as client:
        page = await client.get("/workers")
    assert page.status_code == 200 and 'class="did">-</td>' in page.text
