"""Guard the plans of the dashboard's page queries on big tables: every listing, count and lookup
reads an index, never scans ``jobs`` or ``jobs_done``, and reads a bounded number of rows however
many jobs there are (the counts stop at their bound, the pages are keyset pages that read at most
``PAGE_SCAN`` rows). 50,000 pending and 50,000 archived jobs by default; a million of each under
``-m slow``. No index lists pending jobs (an enqueue would pay for it): their pages walk the
primary key, so a filter that matches few of them reads the bound and says so.

Plans and rows read only, never timings: the benchmark's ``dashboard`` scenario times the pages.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest

import aioqueue
from aioqueue._admin import PAGE_SCAN, JobFilter, rows_to_read
from aioqueue._queries import for_schema
from tests.support.plans import explain, explain_generic, nodes, scans

Q = for_schema("aioqueue")
#: The indexes a lookup by id may read: the primary key of jobs, and of each archive partition
#: its index on id (the pre-partitioning table's primary key, or jobs_done_id_idx's copy).
BY_ID = re.compile(r"jobs_pkey|jobs_done_legacy_pkey|jobs_done_(\d{8}|default)_id_idx")


def big(relation: str | None) -> bool:
    """jobs, or the archive: jobs_done's partitions (plans name them, never the parent)."""
    return relation == "jobs" or (relation or "").startswith("jobs_done")


async def fill(db: asyncpg.Connection, pending: int, archived: int) -> dict[str, int]:
    """Pending jobs over two queues, three tasks (one in a thousand of task 'rare') and 100
    partition keys, dead and running ones, an archive; analysed."""
    # Dead and running jobs are older than the backlog behind them, as a claim takes the oldest.
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, locked_by, lease_expires_at, partition_key) "
        "SELECT 'bulk', 'odd', '{}', 'running', 1, 'w1', now() + interval '5 minutes', 'tenant-' || (g % 2 * 7) "
        "FROM generate_series(1, 20) AS g")
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, last_error) "
        "SELECT 'bulk', 'odd', jsonb_build_object('n', g), 'dead', 5, 'boom' FROM generate_series(1, 2000) AS g")
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, run_at, partition_key) "
        "SELECT CASE WHEN g % 10 = 0 THEN 'rare' ELSE 'bulk' END, "
        "CASE WHEN g % 1000 = 0 THEN 'rare' WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, "
        "jsonb_build_object('user', g % 1000, 'n', g), now() - interval '1 minute' + (g % 3) * interval '1 hour', "
        "'tenant-' || (g % 100) FROM generate_series(1, $1) AS g", pending)
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
    on_big = [s for s in scans(plan, executed=True) if big(s.relation)]
    # A Seq Scan that found no row and threw none away read an empty table (an archive day not
    # begun, the default partition): nothing. Any other reads the table whole.
    whole = [n for n in nodes(plan) if n["Node Type"] == "Seq Scan" and big(n.get("Relation Name"))
             and (n.get("Actual Rows", 0) or n.get("Rows Removed by Filter", 0))]
    assert not whole, (what, on_big)
    # Rows a scan returned and rows it read and threw away: both cost.
    read = sum((int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0))) * int(n.get("Actual Loops", 1))
               for n in nodes(plan) if big(n.get("Relation Name")) and n["Node Type"] != "ModifyTable")
    assert read <= bound, (what, read, on_big)


PAGE = 50


def listing(
    what: str, status: str, queue: str | None = None, task: str | None = None,
    before: int | None = None, args: str | None = None, *, key: str | None = None, reads: int = PAGE,
) -> tuple[str, str, tuple[Any, ...], int]:
    """One listing as Admin.list_jobs runs it: (what, statement, parameters, rows it may read)."""
    sql = {"running": Q.list_running_jobs, "succeeded": Q.list_archived_jobs,
           "cancelled": Q.list_archived_jobs}.get(status, Q.list_jobs)
    scan = rows_to_read(JobFilter(status, queue, task, None if args is None else {}, key), PAGE)  # type: ignore[arg-type]
    return what, sql, (status, queue, task, before, args, scan, PAGE, key), reads


def listings(top: int) -> list[tuple[str, str, tuple[Any, ...], int]]:
    """The listings the pages run, and the rows each may read. Pending jobs are read from the
    primary key newest first: a filter that matches one row in ten (the rare queue) reads about
    ten rows per row shown; one that matches one in a thousand (the rare task) reads the bound,
    PAGE_SCAN. Dead and archived jobs are read through an index that matches their filter; with
    both a queue and a task, the task is a filter on what the queue's index gives."""
    return [
        listing("pending, newest", "pending"),
        listing("pending, page 10", "pending", before=top - 500),
        listing("pending of a rare queue", "pending", "rare", reads=PAGE * 10),
        listing("pending of a task", "pending", None, "even", reads=PAGE * 2),
        listing("pending of a rare task", "pending", None, "rare", reads=PAGE_SCAN),
        listing("pending of a queue and task", "pending", "rare", "even", reads=PAGE * 10),
        listing("pending by arguments", "pending", args='{"user": 7}', reads=PAGE_SCAN),
        listing("pending of a key", "pending", key="tenant-7", reads=PAGE_SCAN),
        listing("running of a key", "running", key="tenant-7", reads=100),
        listing("dead, newest", "dead"),
        listing("dead of a queue", "dead", "bulk"),
        listing("dead of a task", "dead", None, "odd"),
        listing("dead of a queue and task", "dead", "bulk", "odd"),
        listing("running", "running", reads=100),
        listing("succeeded, newest", "succeeded"),
        listing("cancelled", "cancelled"),
        listing("succeeded of a queue", "succeeded", "rare"),
        listing("succeeded of a task", "succeeded", None, "odd"),
        listing("succeeded of a queue and task", "succeeded", "bulk", "odd", reads=PAGE * 2),
    ]


#: The listings' parameter types and a value for each, for the generic plan (see explain_generic).
LIST_TYPES = "text, text, text, bigint, jsonb, bigint, bigint, text"
LIST_VALUES = "'pending', 'rare', NULL, NULL, NULL, 5000, 50, NULL"


@pytest.mark.parametrize(
    ("pending", "archived"),
    [(50_000, 50_000), pytest.param(1_000_000, 1_000_000, marks=pytest.mark.slow)],
    ids=["50k", "1M"],
)
async def test_dashboard_page_queries_read_indexes_and_bounded_rows(
    db: asyncpg.Connection, q: aioqueue.Queue, pending: int, archived: int
) -> None:
    facts = await fill(db, pending, archived)
    for what, sql, params, bound in listings(facts["top"]):
        plan = await explain(db, sql, *params, analyze=True)
        # The candidates (a little more than the estimate allows for the mix), then the page by key.
        assert_indexed_and_bounded(plan, min(PAGE_SCAN, 2 * bound) + PAGE, what)
        rows = await db.fetch(sql, *params)
        assert len([r for r in rows if r["id"] is not None]) > 0, what  # the case has rows to show
        # The plan a prepared statement may switch to after a few runs reads indexes too.
        generic = await explain_generic(db, sql, LIST_TYPES, LIST_VALUES.replace("'pending'", repr(params[0])))
        assert all(s.node_type != "Seq Scan" for s in scans(generic) if big(s.relation)), (what, "generic")

    # A rare task: the page reads PAGE_SCAN rows of the primary key, shows the few that match and
    # says so; the next page goes on from the last row read, never past a match.
    admin = q.admin
    page = await admin.list_jobs(JobFilter(status="pending", task="rare"), limit=PAGE)
    rare = [r["id"] for r in await db.fetch(
        "SELECT id FROM aioqueue.jobs WHERE task = 'rare' AND status = 'pending' ORDER BY id DESC")]
    assert page.searched == PAGE_SCAN and 0 < len(page.jobs) < PAGE
    assert [j["id"] for j in page.jobs] == [i for i in rare if i > facts["top"] - PAGE_SCAN]
    assert page.next_before == facts["top"] - PAGE_SCAN + 1
    after = page.next_before
    following = await admin.list_jobs(JobFilter(status="pending", task="rare"), before=after, limit=PAGE)
    assert [j["id"] for j in following.jobs] == [i for i in rare if after - PAGE_SCAN <= i < after]

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
    # The tables that hold rows (empty partitions may be read whole: there is nothing to read).
    by_id = [s.index_name for s in scans(detail) if s.relation in ("jobs", "jobs_done_legacy")]
    assert by_id and all(BY_ID.fullmatch(name or "") for name in by_id), by_id
    ids = [facts["top"] - i for i in range(1000)]
    for what, sql, params in [
        ("retry a batch", Q.retry_dead, (ids, None)),
        ("cancel a batch", Q.cancel_jobs, (ids, "c", "d")),
        ("delete a batch", Q.delete_jobs, (ids,)),
    ]:
        plan = await explain(db, sql, *params, analyze=True)  # rolled back
        assert_indexed_and_bounded(plan, 5_000, what)
