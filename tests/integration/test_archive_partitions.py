"""The archive partitioned by day: the partitions are made ahead, a row no day covers is kept
(and moved to its day when the day is made), retention drops days whole without reading or
deleting a row of the days it keeps, and with a month of days, a big archive, or the planner's
statistics of 100 million archived jobs, the claim, the lookups by id, the dashboard's pages and
the finishing writes keep their index plans and bounded reads.

Plans, rows read and rows written only, never timings: the benchmark times statements.
"""

from __future__ import annotations

import datetime

import asyncpg
import pytest

import aioqueue
from aioqueue._maintenance import Maintenance
from aioqueue._queries import for_schema
from tests.integration.test_dashboard_plans import (
    BY_ID,
    LIST_TYPES,
    LIST_VALUES,
    assert_indexed_and_bounded,
    big,
    listings,
)
from tests.integration.test_query_plan import assert_claim_plans_read_ready_index, pending
from tests.support.helpers import prune_archive
from tests.support.plans import explain, explain_generic, scans

Q = for_schema("aioqueue")
DAYS = 31
SIMULATED = 100_000_000


async def partitions(db: asyncpg.Connection) -> dict[str, str]:
    """Each partition of jobs_done and its bound."""
    rows = await db.fetch(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound FROM pg_inherits AS i "
        "JOIN pg_class AS c ON c.oid = i.inhrelid WHERE i.inhparent = 'aioqueue.jobs_done'::regclass")
    return {r["relname"]: r["bound"] for r in rows}


def day_name(day: datetime.date) -> str:
    return f"jobs_done_{day:%Y%m%d}"


async def mature(db: asyncpg.Connection, per_day: int) -> datetime.date:
    """An installation that has archived for a month: the pre-partitioning table (empty here)
    gone, a partition for each of the last DAYS days (the maintenance's days ahead kept), and
    ``per_day`` archived jobs finished in each, a tenth of them cancelled. Returns today (UTC)."""
    today: datetime.date = (await db.fetchval("SELECT now() AT TIME ZONE 'UTC'")).date()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done_legacy") == 0
    await db.execute("DROP TABLE aioqueue.jobs_done_legacy")
    for back in range(DAYS):
        day = today - datetime.timedelta(days=back)
        await db.execute(
            f"CREATE TABLE aioqueue.{day_name(day)} PARTITION OF aioqueue.jobs_done "
            f"FOR VALUES FROM ('{day} 00:00+00') TO ('{day + datetime.timedelta(days=1)} 00:00+00')")
    await db.execute(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at, finished_at) "
        "SELECT 10000000 + g, CASE WHEN g % 10 = 0 THEN 'rare' ELSE 'bulk' END, "
        "CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, jsonb_build_object('n', g), "
        "CASE WHEN g % 100 = 0 THEN 'cancelled' ELSE 'succeeded' END, 0, 1, now(), "
        # Ids rise with the finish time, as they do when jobs finish in the order they came.
        "date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
        "  - ($2::int - 1 - (g - 1) / $1::int) * interval '1 day' + ((g - 1) % $1::int) * interval '1 second' "
        "FROM generate_series(1, $1::int * $2::int) AS g", per_day, DAYS)
    await db.execute("VACUUM ANALYZE aioqueue.jobs_done")
    return today


async def simulate_statistics(db: asyncpg.Connection, rows: int) -> None:
    """Make the planner see ``rows`` archived jobs spread over the day partitions (each table and
    index's reltuples; the planner scales a table's pages from its size on disk and the density
    this gives), the way statistics of such an archive would read."""
    await db.execute(
        "UPDATE pg_class AS c SET reltuples = $1::float8 / $2 "
        "FROM pg_inherits AS i WHERE c.oid = i.inhrelid AND i.inhparent IN "
        "(SELECT 'aioqueue.jobs_done'::regclass UNION ALL "
        " SELECT x.indexrelid FROM pg_index AS x WHERE x.indrelid = 'aioqueue.jobs_done'::regclass) "
        "AND c.relname ~ '^jobs_done_[0-9]{8}'", rows, DAYS)


async def test_the_archive_is_partitioned_by_day_with_days_made_ahead(db: asyncpg.Connection) -> None:
    assert await db.fetchval("SELECT relkind FROM pg_class WHERE oid = 'aioqueue.jobs_done'::regclass") == b"p"
    today = (await db.fetchval("SELECT now() AT TIME ZONE 'UTC'")).date()
    parts = await partitions(db)
    # The pre-partitioning table holds everything before tomorrow; the migration made two days.
    tomorrow = today + datetime.timedelta(days=1)
    assert parts["jobs_done_legacy"].startswith("FOR VALUES FROM (MINVALUE) TO ")
    assert parts["jobs_done_default"] == "DEFAULT"
    assert {day_name(tomorrow), day_name(tomorrow + datetime.timedelta(days=1))} <= set(parts)
    assert await db.fetchval(Q.archive_partitions, 2) == 0  # nothing missing: nothing made
    assert await db.fetchval(Q.archive_partitions, 4) == 2
    assert day_name(today + datetime.timedelta(days=4)) in await partitions(db)
    # Every partition has an index on id, and the lists' indexes.
    for name in await partitions(db):
        indexed = {r["cols"] for r in await db.fetch(
            "SELECT pg_get_indexdef(indexrelid) AS cols FROM pg_index WHERE indrelid = $1::regclass",
            f"aioqueue.{name}")}
        assert any(d.endswith("USING btree (id)") for d in indexed), (name, indexed)
        assert any(d.endswith("USING btree (queue, status, id)") for d in indexed), (name, indexed)


async def test_a_row_no_day_covers_is_kept_and_moves_to_its_day(db: asyncpg.Connection) -> None:
    await db.execute(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at, finished_at) "
        "VALUES (7, 'default', 't', '{}', 'succeeded', 0, 1, now(), now() + interval '10 days')")
    assert await db.fetchval("SELECT tableoid::regclass::text FROM aioqueue.jobs_done WHERE id = 7") == (
        "aioqueue.jobs_done_default")
    assert await db.fetchval(Q.archive_partitions, 12) >= 10
    day = (await db.fetchval("SELECT (now() + interval '10 days') AT TIME ZONE 'UTC'")).date()
    assert await db.fetchval("SELECT tableoid::regclass::text FROM aioqueue.jobs_done WHERE id = 7") == (
        f"aioqueue.{day_name(day)}")
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done_default") == 0
    assert await db.fetchval("SELECT status FROM (" + Q.get_job.rstrip().rstrip(";") + ") AS j", 7) == "succeeded"


async def test_retention_drops_whole_days_and_reads_or_deletes_no_row_it_keeps(
    db: asyncpg.Connection, q: aioqueue.Queue
) -> None:
    today = await mature(db, per_day=200)
    before = await partitions(db)
    await db.execute("SELECT pg_stat_force_next_flush()")
    await db.execute("SELECT 1")  # earlier transactions' counts leave this session's pending ones
    async with db.transaction():
        dropped, deleted = await prune_archive(db, Q.prune_archive, 7 * 86400.0, 1000)
        # Within the transaction, the statement's own reads and writes of each table it kept.
        touched = await db.fetch(
            "SELECT relname, seq_scan, coalesce(idx_scan, 0) AS idx_scan, n_tup_del FROM pg_stat_xact_user_tables "
            "WHERE schemaname = 'aioqueue' AND relname LIKE 'jobs_done%'")
    # The days that ended before a week ago: now() - 7 days falls in the 7th day back.
    gone = {day_name(today - datetime.timedelta(days=back)) for back in range(8, DAYS)}
    assert (dropped, deleted) == (len(gone), 0)
    assert set(before) - set(await partitions(db)) == gone
    # No day it kept was read; only the default partition (empty: rows no day covers) is.
    assert [r for r in touched if (r["seq_scan"] or r["idx_scan"] or r["n_tup_del"])
            and r["relname"] != "jobs_done_default"] == []
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done") == 200 * 8
    assert await db.fetchrow(Q.get_job, 10000001) is None  # the oldest job went with its day
    # prune() makes the days ahead and retires; run again, it has nothing left to drop.
    maintenance = Maintenance(q.database, reap_interval=60, archive_retention=7 * 86400)
    assert await maintenance.prune() == 0 and maintenance.partitions_dropped == 0


async def assert_archive_plans(db: asyncpg.Connection, top: int, filled: set[str], *, analyze: bool) -> None:
    """The claim reads the ready index, never the archive; get_job and the job page probe each
    partition's id index (the days ``filled``, that hold jobs; an empty one may be read whole,
    its nothing); the dashboard's listings read indexes, a bounded number of rows."""
    await assert_claim_plans_read_ready_index(db)
    for statement in (Q.get_job, Q.get_job_detail):
        plan = await explain(db, statement, top, analyze=analyze)
        on_archive = [s for s in scans(plan) if big(s.relation) and s.relation != "jobs"]
        days = [s for s in on_archive if s.relation in filled]
        assert len(days) == DAYS, on_archive  # every day that holds jobs is probed...
        assert all(BY_ID.fullmatch(s.index_name or "") for s in days), days  # ...through its index
        generic = await explain_generic(db, statement, "bigint", str(top))
        assert all(BY_ID.fullmatch(s.index_name or "") for s in scans(generic) if s.relation in filled)
    for what, sql, params, bound in listings(top):
        if params[0] not in ("succeeded", "cancelled"):
            continue
        plan = await explain(db, sql, *params, analyze=True)
        # Each day's index scan returns at least its first row to the merge, and stops there.
        assert_indexed_and_bounded(plan, min(5000, 2 * bound) + 50 + 2 * DAYS, what)
        generic = await explain_generic(db, sql, LIST_TYPES, LIST_VALUES.replace("'pending'", repr(params[0])))
        assert all(s.node_type != "Seq Scan" for s in scans(generic) if s.relation in filled), what


@pytest.mark.parametrize("statistics", ["actual", "100M"])
async def test_a_month_of_days_costs_the_claim_lookups_and_pages_their_plans(
    db: asyncpg.Connection, statistics: str
) -> None:
    today = await mature(db, per_day=2000)
    filled = {day_name(today - datetime.timedelta(days=back)) for back in range(DAYS)}
    await pending(db, 1000)
    await db.execute("ANALYZE aioqueue.jobs")
    if statistics == "100M":
        await simulate_statistics(db, SIMULATED)
        plan = await explain(db, "SELECT * FROM aioqueue.jobs_done")
        assert plan["Plan"]["Plan Rows"] >= SIMULATED * 0.9  # the planner believes it
    await assert_archive_plans(db, 10000000 + 2000 * DAYS, filled, analyze=statistics == "actual")
