"""Guard the plans of the dashboard's page queries on big tables: every listing, count and lookup
reads an index, never scans ``jobs`` or ``jobs_done``, and reads a bounded number of rows however
many jobs there are (the counts stop at their bound, the pages are keyset pages). 50,000 pending
and 50,000 archived jobs by default; a million of each under ``-m slow``.

Plans and rows read only, never timings: the benchmark's ``dashboard`` scenario times the pages.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from aioqueue.plans import explain, nodes, scans
from aioqueue.queries import for_schema

Q = for_schema("aioqueue")
BIG = ("jobs", "jobs_done")


async def fill(db: asyncpg.Connection, pending: int, archived: int) -> dict[str, int]:
    """Pending jobs over two queues and tasks, dead and running ones, an archive; analysed."""
    # Dead and running jobs are older than the backlog behind them, as a claim takes the oldest.
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, locked_by, lease_expires_at) "
        "SELECT 'bulk', 'odd', '{}', 'running', 1, 'w1', now() + interval '5 minutes' FROM generate_series(1, 20)")
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, last_error) "
        "SELECT 'bulk', 'odd', jsonb_build_object('n', g), 'dead', 5, 'boom' FROM generate_series(1, 2000) AS g")
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, run_at) "
        "SELECT CASE WHEN g % 10 = 0 THEN 'rare' ELSE 'bulk' END, CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, "
        "jsonb_build_object('user', g % 1000, 'n', g), now() - interval '1 minute' + (g % 3) * interval '1 hour' "
        "FROM generate_series(1, $1) AS g", pending)
    await db.execute(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at) "
        "SELECT 10000000 + g, CASE WHEN g % 10 = 0 THEN 'rare' ELSE 'bulk' END, "
        "CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, jsonb_build_object('n', g), "
        "CASE WHEN g % 100 = 0 THEN 'cancelled' ELSE 'succeeded' END, 0, 1, now() "
        "FROM generate_series(1, $1) AS g", archived)
    await db.execute("VACUUM ANALYZE aioqueue.jobs")
    await db.execute("VACUUM ANALYZE aioqueue.jobs_done")
    top = await db.fetchval("SELECT max(id) FROM aioqueue.jobs")
    return {"top": int(top)}


def assert_indexed_and_bounded(plan: dict[str, Any], bound: int, what: str) -> None:
    on_big = [s for s in scans(plan, executed=True) if s.relation in BIG]
    assert all(s.node_type != "Seq Scan" for s in on_big), (what, on_big)
    # Rows a scan returned and rows it read and threw away: both cost.
    read = sum((int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0))) * int(n.get("Actual Loops", 1))
               for n in nodes(plan) if n.get("Relation Name") in BIG and n["Node Type"] != "ModifyTable")
    assert read <= bound, (what, read, on_big)


PAGE = 50


def listings(top: int) -> list[tuple[str, str, tuple[Any, ...], int]]:
    """(what, statement, parameters, rows it may read) for the listings the pages run. A filter
    that matches one row in ten (the rare queue) may be applied while walking the primary key,
    about ten rows read per row shown; the planner takes the filter's index when it is rarer."""
    args_filter = '{"user": 7}'
    return [
        ("pending, newest", Q.list_jobs, ("pending", None, None, None, None, PAGE, PAGE), PAGE),
        ("pending, page 10", Q.list_jobs, ("pending", None, None, top - 500, None, PAGE, PAGE), PAGE),
        ("pending of a rare queue", Q.list_jobs, ("pending", "rare", None, None, None, PAGE, PAGE), PAGE * 10),
        ("pending of a task", Q.list_jobs, ("pending", None, "even", None, None, PAGE, PAGE), PAGE),
        ("pending of a queue and task", Q.list_jobs, ("pending", "rare", "even", None, None, PAGE, PAGE), PAGE * 10),
        ("dead, newest", Q.list_jobs, ("dead", None, None, None, None, PAGE, PAGE), PAGE),
        ("dead of a queue", Q.list_jobs, ("dead", "bulk", None, None, None, PAGE, PAGE), PAGE),
        ("pending by arguments", Q.list_jobs, ("pending", None, None, None, args_filter, 5000, PAGE), 5000),
        ("running", Q.list_running_jobs, ("running", None, None, None, None, PAGE, PAGE), 100),
        ("succeeded, newest", Q.list_archived_jobs, ("succeeded", None, None, None, None, PAGE, PAGE), PAGE),
        ("cancelled", Q.list_archived_jobs, ("cancelled", None, None, None, None, PAGE, PAGE), PAGE),
        ("succeeded of a queue", Q.list_archived_jobs, ("succeeded", "rare", None, None, None, PAGE, PAGE), PAGE * 10),
        ("succeeded of a task", Q.list_archived_jobs, ("succeeded", None, "odd", None, None, PAGE, PAGE), PAGE),
    ]


@pytest.mark.parametrize(
    ("pending", "archived"),
    [(50_000, 50_000), pytest.param(1_000_000, 1_000_000, marks=pytest.mark.slow)],
    ids=["50k", "1M"],
)
async def test_dashboard_page_queries_read_indexes_and_bounded_rows(
    db: asyncpg.Connection, pending: int, archived: int
) -> None:
    facts = await fill(db, pending, archived)
    for what, sql, params, bound in listings(facts["top"]):
        plan = await explain(db, sql, *params, analyze=True)
        # The candidates, then the page by key; a filter that matches half the rows may be
        # applied while walking the primary key, which reads a few rows per match.
        assert_indexed_and_bounded(plan, 3 * bound + PAGE, what)
        rows = await db.fetch(sql, *params)
        assert len([r for r in rows if r["id"] is not None]) > 0, what  # the case has rows to show

    overview = await explain(db, Q.queue_overview, ["bulk", "idle"], 10_000, analyze=True)
    # Each queue: ready, scheduled and dead counted up to the bound, the head and running probed.
    assert_indexed_and_bounded(overview, 3 * 2 * 10_000 + 2_000 + 200, "queue overview")
    counts = {r["queue"]: r for r in await db.fetch(Q.queue_overview, ["idle"], 10_000)}
    assert set(counts) == {"bulk", "rare", "idle"}
    for queue in ("bulk", "rare"):
        exact = await db.fetchval("SELECT count(*) FROM aioqueue.jobs "
                                  "WHERE queue = $1 AND status = 'pending' AND run_at <= now()", queue)
        assert counts[queue]["ready"] == min(10_000, exact), queue  # exact below the bound, the bound above
    assert counts["idle"]["ready"] == 0 and counts["bulk"]["dead"] == 2000 and counts["bulk"]["running"] == 20

    detail = await explain(db, Q.get_job_detail, facts["top"], analyze=True)
    assert {s.index_name for s in scans(detail) if s.relation in BIG} <= {"jobs_pkey", "jobs_done_pkey"}
    ids = [facts["top"] - i for i in range(1000)]
    for what, sql, params in [
        ("retry a batch", Q.retry_dead, (ids, None)),
        ("cancel a batch", Q.cancel_jobs, (ids, "c")),
        ("delete a batch", Q.delete_jobs, (ids,)),
    ]:
        plan = await explain(db, sql, *params, analyze=True)  # rolled back
        assert_indexed_and_bounded(plan, 5_000, what)
