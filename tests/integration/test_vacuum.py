"""The worker's VACUUM of the queue's tables: once a table's dead rows pass the threshold a
worker vacuums it (seen in the server's own statistics: its vacuum count goes up, its dead rows
go), never below the threshold or with the threshold at 0, and a role that may not vacuum the
tables is told so once in the log and keeps working."""

from __future__ import annotations

import logging
import secrets
import urllib.parse

import asyncpg
import pytest

import aioqueue
from aioqueue._maintenance import Maintenance
from tests.support.helpers import eventually, running


async def table_stats(db: asyncpg.Connection, table: str = "jobs") -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE schemaname = 'aioqueue' AND relname = $1",
        table)
    assert row is not None
    return row


async def dead_rows_counted(db: asyncpg.Connection, at_least: int) -> None:
    """Wait until the server's statistics count ``at_least`` dead rows in ``jobs`` (a backend
    reports its counts when it goes idle, within seconds)."""

    async def counted() -> bool:
        return int((await table_stats(db))["n_dead_tup"]) >= at_least

    await eventually(counted, timeout=30.0, interval=0.05, what=f"{at_least} dead rows counted in jobs")


async def leave_dead_rows(q: aioqueue.Queue, db: asyncpg.Connection, n: int) -> None:
    """Enqueue ``n`` jobs and delete them: ``n`` dead rows in ``jobs``, counted."""
    task = q.task(name="noop")(noop)
    await task.enqueue_many([{}] * n)
    assert await db.execute("DELETE FROM aioqueue.jobs") == f"DELETE {n}"
    await dead_rows_counted(db, n)


async def noop() -> None:
    pass


async def test_a_worker_vacuums_jobs_once_its_dead_rows_pass_the_threshold(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    task = q.task(name="noop")(noop)
    # The server's autovacuum, visiting each of the test run's many databases in turn, could
    # vacuum jobs first: its vacuum resets the dead rows the worker's check reads, without
    # counting in vacuum_count, and the worker would then rightly have nothing to do.
    await db.execute("ALTER TABLE aioqueue.jobs SET (autovacuum_enabled = false)")
    before = await table_stats(db)
    # Each job leaves two dead rows in jobs: its claim's update and its delete.
    await task.enqueue_many([{}] * 1000)
    worker = q.worker(concurrency=20, vacuum_threshold=1000, reap_interval=0.2, install_signal_handlers=False)

    async def vacuumed() -> bool:
        return int((await table_stats(db))["vacuum_count"]) > int(before["vacuum_count"])

    async def reclaimed() -> bool:
        return int((await table_stats(db))["n_dead_tup"]) < 1000

    async with running(worker):
        await eventually(lambda: worker.stats.succeeded >= 1000, timeout=30.0, what="the jobs to run")
        await eventually(vacuumed, timeout=30.0, interval=0.05, what="jobs to be vacuumed")
        # The vacuum reclaimed what the jobs left and reset the count the threshold reads. A
        # backend reports its dead rows a moment after its transactions, so some may be counted
        # after the first vacuum: past the threshold again, they are vacuumed again.
        await eventually(reclaimed, timeout=30.0, interval=0.05, what="the dead rows to be reclaimed")
    assert worker.maintenance is not None and worker.maintenance.vacuums >= 1


async def test_no_vacuum_below_the_threshold_or_with_it_at_zero(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    await leave_dead_rows(q, db, 300)
    before = await table_stats(db)
    assert await Maintenance(q.database, reap_interval=60, archive_retention=None, vacuum_threshold=301).vacuum() == 0
    assert await Maintenance(q.database, reap_interval=60, archive_retention=None, vacuum_threshold=0).vacuum() == 0
    assert (await table_stats(db))["vacuum_count"] == before["vacuum_count"]
    # At the threshold it vacuums jobs (and nothing else: no other table has dead rows).
    maintenance = Maintenance(q.database, reap_interval=60, archive_retention=None, vacuum_threshold=300)
    assert await maintenance.vacuum() == 1
    assert (await table_stats(db))["vacuum_count"] == before["vacuum_count"] + 1


async def test_a_role_that_may_not_vacuum_says_so_once_and_goes_on(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"aioqueue_tenant_{secrets.token_hex(4)}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await db.execute(f"GRANT USAGE ON SCHEMA aioqueue TO {role}; "
                         f"GRANT ALL ON ALL TABLES IN SCHEMA aioqueue TO {role}; "
                         f"GRANT ALL ON ALL SEQUENCES IN SCHEMA aioqueue TO {role}")
        await leave_dead_rows(q, db, 300)
        before = await table_stats(db)
        url = urllib.parse.urlsplit(dsn)
        as_tenant = url._replace(netloc=f"{role}@{url.hostname}:{url.port}").geturl()
        async with aioqueue.Queue(as_tenant) as tenant:
            maintenance = Maintenance(tenant.database, reap_interval=60, archive_retention=None, vacuum_threshold=100)
            with caplog.at_level(logging.WARNING, logger="aioqueue.maintenance"):
                assert await maintenance.vacuum() == 0
                assert await maintenance.vacuum() == 0
        told = [r.getMessage() for r in caplog.records if "may not VACUUM" in r.getMessage()]
        assert len(told) == 1 and told[0].startswith("aioqueue.jobs has "), told
        assert (await table_stats(db))["vacuum_count"] == before["vacuum_count"]
    finally:
        await db.execute(f"DROP OWNED BY {role}")
        await db.execute(f"DROP ROLE {role}")
