"""The dashboard scenario: how long each dashboard page takes to serve (its queries and its
template, through the ASGI app in process) with a deep backlog of pending jobs and a deep
archive, the sizes of the claim scenario's deepest states. The median of several loads each."""

from __future__ import annotations

import statistics
import time

import httpx
from common import TASK, Measurement, Run, insert_pending, migrated, progress

import aioqueue
from aioqueue.dashboard import create_app

WARM_UP = 3


def plan(run: Run) -> None:
    """Line up one measurement: every page on one big table."""
    sizes = run.sizes
    label = f"{sizes.claim_deep_backlog:,} pending + {sizes.claim_archived:,} archived"
    run.step(f"dashboard: {label}", _measure(run, label))


def _measure(run: Run, label: str) -> Measurement:
    async def measure(dsn: str) -> None:
        sizes = run.sizes
        timings = await page_times(dsn, sizes.claim_deep_backlog, sizes.claim_archived,
                                   max(10, sizes.claim_samples // 10))
        for page, seconds in timings.items():
            run.results.add("dashboard", "aioqueue", f"page {page}, {label}", seconds * 1e3, "ms",
                            higher_is_better=False)
            progress(f"    {page}: {seconds * 1e3:.2f} ms")

    return measure


async def page_times(dsn: str, pending: int, archived: int, samples: int) -> dict[str, float]:
    """The median time, in seconds, to serve each dashboard page with ``pending`` pending jobs
    (a tenth of them dead) and ``archived`` archived ones."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    async with queue, queue.connection() as conn:
        await insert_pending(conn, pending)
        await conn.execute(
            "UPDATE aioqueue.jobs SET status = 'dead', last_error = 'boom' WHERE id % 10 = 0 AND id <= $1",
            pending // 10,
        )
        await conn.execute(
            "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at) "
            "SELECT 1000000000 + g, 'default', $1, jsonb_build_object('i', g), 'succeeded', 0, 1, now() "
            "FROM generate_series(1, $2) AS g",
            TASK,
            archived,
        )
        await conn.execute("VACUUM ANALYZE aioqueue.jobs")
        await conn.execute("VACUUM ANALYZE aioqueue.jobs_done")
        some_job = await conn.fetchval("SELECT max(id) FROM aioqueue.jobs")
    pages = {
        "queues": "/",
        "jobs (pending)": "/jobs",
        "jobs of a task": f"/jobs?task={TASK}",
        "jobs of a task with none pending": "/jobs?task=absent",  # reads the bound, 5,000 rows
        "jobs by arguments": '/jobs?args={"i": 7}',
        "dead": "/dead",
        "succeeded": "/jobs?status=succeeded",
        "job": f"/jobs/{some_job}",
        "workers": "/workers",
    }
    times: dict[str, float] = {}
    # Served, as far as the app can tell, at a loopback address: without credentials it answers no other.
    async with queue, httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(queue)),
                                        base_url="http://127.0.0.1:8000") as client:
        for name, path in pages.items():
            samples_taken: list[float] = []
            for i in range(samples + WARM_UP):
                start = time.perf_counter()
                response = await client.get(path)
                elapsed = time.perf_counter() - start
                assert response.status_code == 200, (path, response.status_code)
                if i >= WARM_UP:
                    samples_taken.append(elapsed)
            times[name] = statistics.median(samples_taken)
    return times
