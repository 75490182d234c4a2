"""The claim scenario: what one claim of 10 jobs costs with a small backlog, beside a deep
history of archived and dead jobs, and with a deep backlog. Two statements: ``claim_unlimited``,
the one workers run when no queue has a global limit, and ``claim``, the one they run for
queues that have one. For each, the server's execution time (EXPLAIN ANALYZE, rolled back, so
no commit in it), the round trip of the real claim with its commit, and the indexes it reads."""

from __future__ import annotations

import statistics
import time
from typing import Literal

from common import TASK, Measurement, Run, insert_pending, migrated, progress

import aioqueue
from aioqueue._job import Connection
from aioqueue._statements import int_array
from tests.support import plans

Statement = Literal["claim_unlimited", "claim"]
#: The statements measured, the one workers run most first.
STATEMENTS: tuple[Statement, ...] = ("claim_unlimited", "claim")
WARM_UP = 10


def plan(run: Run) -> None:
    """Line up one measurement per table state; each measures both statements."""
    sizes = run.sizes
    states = [
        ("empty history", sizes.claim_backlog, 0, 0),
        (f"{sizes.claim_archived:,} archived + {sizes.claim_dead:,} dead", sizes.claim_backlog,
         sizes.claim_archived, sizes.claim_dead),
        (f"{sizes.claim_deep_backlog:,} pending", sizes.claim_deep_backlog, 0, 0),
    ]
    for label, backlog, archived, dead in states:
        run.step(f"claim: {label}", _measure(run, label, backlog, archived, dead))


def _measure(run: Run, label: str, backlog: int, archived: int, dead: int) -> Measurement:
    async def measure(dsn: str) -> None:
        costs = await aioqueue_claim_cost(dsn, backlog, archived, dead, run.sizes.claim_samples)
        for statement, (execution, round_trip, indexes) in costs.items():
            metric = f"{statement} 10, {label}"
            run.results.add("claim", "aioqueue", f"{metric}: server execution", execution * 1e3, "ms",
                            higher_is_better=False, note=f"reads {indexes}")
            run.results.add("claim", "aioqueue", f"{metric}: round trip with commit", round_trip * 1e3, "ms",
                            higher_is_better=False)
            progress(f"    {statement}: {execution * 1e3:.3f} ms execution, {round_trip * 1e3:.3f} ms round trip, "
                     f"via {indexes}")

    return measure


async def aioqueue_claim_cost(
    dsn: str, backlog: int, archived: int, dead: int, samples: int
) -> dict[Statement, tuple[float, float, str]]:
    """Per statement, the cost of claiming 10 jobs with ``backlog`` pending jobs, ``archived``
    rows in jobs_done and ``dead`` dead jobs: the median server execution time in seconds, the
    median round trip of the real claim (commit included) in seconds, and the indexes it reads
    ``jobs`` through. Each claim's jobs are completed, as a worker would, and as many new ones
enqueued, so the backlog stays the size its label says."""
    await migrated(dsn)
    queue = aioqueue.Queue(dsn)
    async with queue, queue.connection() as conn:
        await _history(conn, archived, dead)
        await insert_pending(conn, backlog)
        await conn.execute("VACUUM ANALYZE aioqueue.jobs")
        await conn.execute("VACUUM ANALYZE aioqueue.jobs_done")
        q = queue.queries
        args = (["default"], [10], "bench", 300.0, 10, "off")
        executions: dict[Statement, list[float]] = {s: [] for s in STATEMENTS}
        round_trips: dict[Statement, list[float]] = {s: [] for s in STATEMENTS}
        indexes: dict[Statement, set[str]] = {s: set() for s in STATEMENTS}
        for _ in range(samples + WARM_UP):
            for statement in STATEMENTS:
                sql = getattr(q, statement)
                plan = await plans.explain(conn, sql, *args, analyze=True, timing=False)
                executions[statement].append(float(plan["Execution Time"]) / 1e3)
                if not indexes[statement]:  # inside claim_jobs: the statement's own plan shows a function
                    nested = await plans.explain_nested(conn, sql, *args)
                    indexes[statement].add(",".join(filter(None, map(_jobs_indexes, nested))) or "?")
                start = time.perf_counter()
                rows = await conn.fetch(sql, *args)
                round_trips[statement].append(time.perf_counter() - start)
                await conn.execute(
                    q.complete, int_array([r["id"] for r in rows]), int_array([r["attempts"] for r in rows]), None,
                    "bench", "bench", "off",
                )
                await insert_pending(conn, len(rows))  # two statements claim: keep the backlog as labelled
    return {
        s: (
            statistics.median(executions[s][WARM_UP:]),
            statistics.median(round_trips[s][WARM_UP:]),
            " | ".join(sorted(indexes[s])),
        )
        for s in STATEMENTS
    }


async def _history(conn: Connection, archived: int, dead: int) -> None:
    """``archived`` succeeded jobs in jobs_done and ``dead`` dead jobs in jobs."""
    if archived:
        await conn.execute(
            "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, "
            "created_at, finished_at) SELECT 1000000000 + g, 'default', $1, '{}', 'succeeded', 0, 1, "
            "now() - interval '1 day', now() - interval '1 hour' FROM generate_series(1, $2) AS g",
            TASK,
            archived,
        )
    if dead:
        await conn.execute(
            "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, last_error) "
            "SELECT 'default', $1, '{}', 'dead', 5, 'boom' FROM generate_series(1, $2) AS g",
            TASK,
            dead,
        )


def _jobs_indexes(plan: plans.Plan) -> str:
    """The indexes (or ``seq scan``) a run claim read ``jobs`` through, in plan order."""
    names = [
        scan.index_name or "seq scan"
        for scan in plans.scans(plan, executed=True)
        if scan.relation == "jobs" and (scan.index_name or scan.node_type == "Seq Scan")
    ]
    return ",".join(names)
