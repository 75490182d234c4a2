"""What the dashboard's listing indexes cost the hot path, measured in one run, alternating:

* bulk enqueue: one ``enqueue_many`` of N jobs, with and without the three listing indexes on
  ``jobs`` that migration 0005 first had (``status <> 'running'``: every pending row entered
  them), recreated here for the "with" runs;
* archiving completion: claim and complete N jobs of an archiving task in batches of 500 with
  the library's statements, with and without the three listing indexes on ``jobs_done``.

Each figure is the median of ``--repeat`` runs; the two variants alternate so that drift in
the machine hits both. Run it with ``PYTHONPATH`` on the tree to measure::

    python benchmarks/index_cost.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

import aioqueue
from aioqueue._dsn import with_database
from aioqueue._queries import for_schema
from aioqueue._statements import int_array

DATABASE = "aioqueue_index_cost"
Q = for_schema("aioqueue")

#: The listing indexes on jobs as migration 0005 first defined them (now gone).
OLD_JOBS_INDEXES = [
    "CREATE INDEX jobs_list_status_idx ON aioqueue.jobs (status, id) WHERE status <> 'running'",
    "CREATE INDEX jobs_list_queue_idx ON aioqueue.jobs (queue, status, id) WHERE status <> 'running'",
    "CREATE INDEX jobs_list_task_idx ON aioqueue.jobs (task, status, id) WHERE status <> 'running'",
]
#: The listing indexes on jobs_done that migration 0005 keeps.
DONE_INDEXES = [
    "CREATE INDEX jobs_done_list_status_idx ON aioqueue.jobs_done (status, id)",
    "CREATE INDEX jobs_done_list_queue_idx ON aioqueue.jobs_done (queue, status, id)",
    "CREATE INDEX jobs_done_list_task_idx ON aioqueue.jobs_done (task, status, id)",
]


def _name(create: str) -> str:
    return create.split()[2]


async def _set_indexes(conn: asyncpg.Connection, creates: list[str], present: bool) -> None:
    for create in creates:
        await conn.execute(f"DROP INDEX IF EXISTS aioqueue.{_name(create)}")
        if present:
            await conn.execute(create)


async def _reset(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE aioqueue.jobs, aioqueue.jobs_done, aioqueue.queue_stats")
    await conn.execute("VACUUM ANALYZE aioqueue.jobs")
    await conn.execute("CHECKPOINT")


async def enqueue_seconds(dsn: str, n: int) -> float:
    """Seconds for one enqueue_many of ``n`` jobs (statement prepared before the clock)."""
    queue = aioqueue.Queue(dsn)

    @queue.task(name="cost")
    async def cost(i: int) -> None:
        pass

    async with queue:
        await cost.enqueue_many([{"i": -1}])
        items = [{"i": i} for i in range(n)]
        start = time.perf_counter()
        ids = await cost.enqueue_many(items)
        elapsed = time.perf_counter() - start
    assert len(ids) == n
    return elapsed


async def complete_seconds(dsn: str, conn: asyncpg.Connection, n: int, batch: int = 500) -> float:
    """Seconds to claim and complete ``n`` jobs of an archiving task, ``batch`` per statement."""
    queue = aioqueue.Queue(dsn)

    @queue.task(name="kept", archive=True)
    async def kept(i: int) -> None:
        pass

    async with queue:
        await kept.enqueue_many([{"i": i} for i in range(n)])
    await conn.execute("VACUUM ANALYZE aioqueue.jobs")
    done = 0
    start = time.perf_counter()
    while rows := await conn.fetch(Q.claim, ["default"], [batch], "cost", 300.0, batch):
        await conn.execute(Q.complete, int_array([r["id"] for r in rows]), int_array([r["attempts"] for r in rows]),
                           ["null"] * len(rows), "cost", "cost")
        done += len(rows)
    elapsed = time.perf_counter() - start
    assert done == n
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True, help="a server's admin DSN (a database is created)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    admin = await asyncpg.connect(args.dsn)
    await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    await admin.execute(f"CREATE DATABASE {DATABASE}")
    dsn = with_database(args.dsn, DATABASE)
    try:
        async with aioqueue.Queue(dsn) as q:
            await q.migrate()
        conn = await asyncpg.connect(dsn)
        try:
            enqueue: dict[bool, list[float]] = {True: [], False: []}
            complete: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeat):
                for present in (True, False):
                    await _set_indexes(conn, OLD_JOBS_INDEXES, present)
                    await _reset(conn)
                    enqueue[present].append(args.jobs / await enqueue_seconds(dsn, args.jobs))
                await _set_indexes(conn, OLD_JOBS_INDEXES, False)
                for present in (True, False):
                    await _set_indexes(conn, DONE_INDEXES, present)
                    await _reset(conn)
                    complete[present].append(args.jobs / await complete_seconds(dsn, conn, args.jobs))
            await _set_indexes(conn, DONE_INDEXES, True)
        finally:
            await conn.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await admin.close()

    def line(what: str, runs: dict[bool, list[float]], with_: str, without: str) -> None:
        w, wo = statistics.median(runs[True]), statistics.median(runs[False])
        print(f"{what}:")
        print(f"  {with_:<44} {w:>9,.0f} jobs/s  (runs: {', '.join(f'{v:,.0f}' for v in runs[True])})")
        print(f"  {without:<44} {wo:>9,.0f} jobs/s  (runs: {', '.join(f'{v:,.0f}' for v in runs[False])})")
        print(f"  the indexes cost {100 * (1 - w / wo):.0f}% of the rate")

    print(f"{args.jobs:,} jobs, median of {args.repeat}")
    line("bulk enqueue (enqueue_many)", enqueue, "with the three old listing indexes on jobs", "without (now)")
    line("claim + complete, archiving task, 500 a batch", complete,
         "with the three listing indexes on jobs_done (now)", "without")


if __name__ == "__main__":
    asyncio.run(main())
