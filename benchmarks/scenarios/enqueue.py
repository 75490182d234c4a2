"""The enqueue scenario: jobs per second put in the queue one per call from one caller and
from several concurrent callers, and in one bulk ``enqueue_many`` call (without and with a
dedup key per job); then through each way in (a caller's asyncpg, SQLAlchemy, psycopg or
Django connection, by name, SQL: see ``enqueue_paths``), one per call and in bulk; and the
same through the other queues asked for with ``--compare``."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from common import Measurement, Run, competitor_on, make_queue, migrated
from compare import Competitor
from compare.base import concurrent_callers

from . import reference
from .enqueue_paths import PATHS, PathMeasure

FLOOR = "the INSERT alone, arguments encoded before the clock"


def plan(run: Run) -> None:
    """Line up aioqueue's three enqueue measurements, then each other queue's."""
    sizes = run.sizes
    callers = sizes.enqueue_callers
    one, many = "one per call, 1 caller", f"one per call, {callers} callers"
    bulk = f"bulk, {sizes.enqueue_bulk} per call"

    async def one_caller(dsn: str) -> None:
        seconds = await aioqueue_enqueue_single(dsn, sizes.enqueue_single, 1)
        run.results.add_rate("enqueue", "aioqueue", one, sizes.enqueue_single, seconds)

    async def many_callers(dsn: str) -> None:
        seconds = await aioqueue_enqueue_single(dsn, sizes.enqueue_concurrent, callers)
        run.results.add_rate("enqueue", "aioqueue", many, sizes.enqueue_concurrent, seconds)

    async def one_call(dsn: str) -> None:
        seconds = await aioqueue_enqueue_bulk(dsn, sizes.enqueue_bulk)
        run.results.add_rate("enqueue", "aioqueue", bulk, sizes.enqueue_bulk, seconds)

    run.step("enqueue: aioqueue one per call", one_caller)
    run.step(f"enqueue: aioqueue {callers} callers", many_callers)

    async def reference_call(dsn: str) -> None:
        seconds = await reference.reference_bulk_insert(dsn, sizes.enqueue_bulk)
        run.results.add_rate("enqueue", reference.SYSTEM, bulk, sizes.enqueue_bulk, seconds)

    async def keyed_call(dsn: str) -> None:
        seconds = await aioqueue_enqueue_bulk(dsn, sizes.enqueue_bulk, keyed=True)
        run.results.add_rate("enqueue", "aioqueue", f"{bulk}, a dedup key each", sizes.enqueue_bulk, seconds)

    run.step("enqueue: aioqueue bulk", one_call)
    # Right after aioqueue's own bulk call, so the ratio of the two sees the same machine.
    run.step("enqueue: reference lane bulk", reference_call)

    async def floor_call(dsn: str) -> None:
        seconds = await reference.reference_bulk_insert(dsn, sizes.enqueue_bulk, statement_alone=True)
        run.results.add_rate("enqueue", reference.SYSTEM, f"{bulk}, {FLOOR}", sizes.enqueue_bulk, seconds)

    # What the server's INSERT of these rows costs by itself: the ceiling for any client.
    run.step("enqueue: reference lane bulk, statement alone", floor_call)
    run.step("enqueue: aioqueue bulk, a dedup key each", keyed_call)
    for path, measure in PATHS.items():
        for bulk_call, n in ((False, sizes.enqueue_single), (True, sizes.enqueue_bulk)):
            metric = f"{path}, " + (f"bulk, {n} per call" if bulk_call else "one per call, a transaction each")
            run.step(f"enqueue: aioqueue {metric}", _path(run, metric, measure, n, bulk_call))

    for name in run.competitors:
        cases: list[tuple[str, int, Callable[[Competitor], Awaitable[float]]]] = [
            (one, sizes.enqueue_single, lambda c: c.enqueue_one_by_one(sizes.enqueue_single, 1)),
            (many, sizes.enqueue_concurrent, lambda c: c.enqueue_one_by_one(sizes.enqueue_concurrent, callers)),
            (bulk, sizes.enqueue_bulk, lambda c: c.enqueue_bulk(sizes.enqueue_bulk)),
        ]
        for metric, n, call in cases:
            run.step(f"enqueue: {name} {metric}", _competitor(run, name, metric, n, call))


def _path(run: Run, metric: str, measure: PathMeasure, n: int, bulk: bool) -> Measurement:
    async def measured(dsn: str) -> None:
        run.results.add_rate("enqueue", "aioqueue", metric, n, await measure(dsn, n, bulk))

    return measured


def _competitor(
    run: Run, name: str, metric: str, n: int, call: Callable[[Competitor], Awaitable[float]]
) -> Measurement:
    async def measure(dsn: str) -> None:
        async with competitor_on(name, dsn) as competitor:
            seconds = await call(competitor)
        run.results.add_rate("enqueue", name, metric, n, seconds)

    return measure


async def aioqueue_enqueue_single(dsn: str, n: int, callers: int) -> float:
    """Seconds to enqueue ``n`` jobs one per call from ``callers`` concurrent callers."""
    await migrated(dsn)
    queue, task = make_queue(dsn, pool_size=max(callers, 1))
    async with queue:
        async with queue.connection() as conn:  # open the pool's connections before the clock
            await conn.fetchval("SELECT 1")

        async def caller(count: int) -> int:
            for i in range(count):
                await task.enqueue(i=i)
            return count

        await concurrent_callers(callers, callers, caller)  # warm every connection
        seconds, _ = await concurrent_callers(n, callers, caller)
        return seconds


async def aioqueue_enqueue_bulk(dsn: str, n: int, *, keyed: bool = False) -> float:
    """Seconds for one ``enqueue_many`` call of ``n`` jobs (one statement, one NOTIFY);
    ``keyed``: each job with a dedup key of its own."""
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue:
        await task.enqueue_many([{"i": -1}], keys=["warm-up"] if keyed else None)  # prepare outside the clock
        items = [{"i": i} for i in range(n)]
        keys = [f"order-{i}" for i in range(n)] if keyed else None
        start = time.perf_counter()
        ids = await task.enqueue_many(items, keys=keys)
        elapsed = time.perf_counter() - start
    if len(ids) != n:
        raise RuntimeError(f"enqueue_many returned {len(ids)} ids for {n} jobs")
    return elapsed
