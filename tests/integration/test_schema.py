"""Migrations and the named queries: the schema the code documents is the schema it builds."""

from __future__ import annotations

import dataclasses

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue import _queries as queries


async def test_migrate_builds_documented_schema(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn) as q:
        assert await q.migrate() == [m.version for m in migrate.migrations()]
        assert await q.migrate() == []  # idempotent
    conn = await asyncpg.connect(empty_dsn)
    try:
        columns = {
            r["column_name"]
            for r in await conn.fetch(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'aioqueue' AND table_name = 'jobs'"
            )
        }
        assert {
            "id", "queue", "task", "args", "status", "priority", "run_at", "attempts",
            "max_attempts", "dedup_key", "lease_expires_at", "locked_at", "locked_by",
            "last_error", "created_at",
        } <= columns
        indexes = {
            r["indexname"]: r["indexdef"]
            for r in await conn.fetch("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'aioqueue'")
        }
        assert "WHERE (status = 'pending'::text)" in indexes["jobs_ready_idx"]
        assert "WHERE (status = 'running'::text)" in indexes["jobs_lease_idx"]
        assert "UNIQUE" in indexes["jobs_dedup_key_idx"]
        assert "dedup_key IS NOT NULL" in indexes["jobs_dedup_key_idx"]
        options = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = 'aioqueue.jobs'::regclass"
        )
        assert "autovacuum_vacuum_scale_factor=0.01" in options
        assert "autovacuum_vacuum_cost_delay=0" in options
        assert "vacuum_truncate=false" in options  # no exclusive lock to give pages back
        versions = await conn.fetch("SELECT version FROM aioqueue.migrations ORDER BY version")
        assert [r["version"] for r in versions] == [m.version for m in migrate.migrations()]
        assert await conn.fetchval("SELECT to_regclass('aioqueue.jobs_done') IS NOT NULL")
        # Where a job enqueued by name without a queue goes: the queue its task's workers recorded.
        assert await conn.fetchval("SELECT to_regclass('aioqueue.tasks') IS NOT NULL")
        assert await conn.fetchval("SELECT aioqueue.task_queue('nobody serves it')") is None
    finally:
        await conn.close()


async def indexes_entered(
    conn: asyncpg.Connection, row: str, columns: str = "queue, task, status, dedup_key"
) -> set[str]:
    """The indexes on jobs that a row inserted with ``row`` (a VALUES list for ``columns``) has
    entries in: those without a predicate, and those whose predicate (``pg_index.indpred``) the
    row satisfies. Inserted and rolled back."""
    names: set[str] = set()
    tr = conn.transaction()
    await tr.start()
    try:
        job_id = await conn.fetchval(f"INSERT INTO aioqueue.jobs ({columns}) VALUES {row} RETURNING id")
        for name, predicate in await conn.fetch(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i "
            "JOIN pg_class AS c ON c.oid = i.indexrelid WHERE i.indrelid = 'aioqueue.jobs'::regclass"
        ):
            where = "true" if predicate is None else predicate
            if await conn.fetchval(f"SELECT EXISTS (SELECT FROM aioqueue.jobs WHERE id = $1 AND ({where}))", job_id):
                names.add(name)
    finally:
        await tr.rollback()
    return names


async def test_a_pending_row_enters_only_the_ready_index_and_the_primary_key(dsn: str) -> None:
    """Enqueue throughput: an enqueued job (and a retry back to pending) writes the ready index,
    the primary key and, with a dedup key, the dedup index; nothing else (no listing index, no
    partition key index without a key). Running and dead rows enter their own indexes."""
    conn = await asyncpg.connect(dsn)
    try:
        assert await indexes_entered(conn, "('q', 't', 'pending', NULL)") == {"jobs_pkey", "jobs_ready_idx"}
        assert await indexes_entered(conn, "('q', 't', 'pending', 'k')") == {
            "jobs_pkey", "jobs_ready_idx", "jobs_dedup_key_idx"}
        assert await indexes_entered(conn, "('q', 't', 'running', NULL)") == {"jobs_pkey", "jobs_lease_idx"}
        assert await indexes_entered(conn, "('q', 't', 'dead', 'k')") == {
            "jobs_pkey", "jobs_dead_idx", "jobs_dead_list_idx", "jobs_dead_task_idx"}
        # A job waiting for others (workflows) stays out of the ready index: the claim never reads it.
        assert await indexes_entered(conn, "('q', 't', 'waiting', NULL)") == {"jobs_pkey", "jobs_waiting_idx"}
        every = {r["indexname"] for r in await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'aioqueue' AND tablename = 'jobs'")}
        assert every == {"jobs_pkey", "jobs_ready_idx", "jobs_lease_idx", "jobs_dedup_key_idx",
                         "jobs_dead_idx", "jobs_dead_list_idx", "jobs_dead_task_idx", "jobs_group_idx",
                         "jobs_waiting_idx", "jobs_partition_ready_idx", "jobs_partition_running_idx"}
        # Only a job with a partition key enters the keyed claim's indexes.
        keyed = "queue, task, status, partition_key"
        assert await indexes_entered(conn, "('q', 't', 'pending', 'tenant')", keyed) == {
            "jobs_pkey", "jobs_ready_idx", "jobs_partition_ready_idx"}
        assert await indexes_entered(conn, "('q', 't', 'running', 'tenant')", keyed) == {
            "jobs_pkey", "jobs_lease_idx", "jobs_partition_running_idx"}
    finally:
        await conn.close()


async def test_concurrent_migrations_all_succeed(empty_dsn: str) -> None:
    results: list[list[int]] = []

    async def one() -> None:
        conn = await asyncpg.connect(empty_dsn)
        try:
            results.append(await migrate.migrate(conn, "aioqueue"))
        finally:
            await conn.close()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
    applied = [r for r in results if r]
    assert len(results) == 6
    assert applied == [[m.version for m in migrate.migrations()]]  # exactly one did the work


async def test_custom_schema_and_plan(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn, schema="jobs_here") as q:
        await q.migrate()
        await q.check_schema()

        @q.task
        async def noop() -> None:
            pass

        await noop.enqueue()
        async with q.connection() as conn:
            assert await conn.fetchval("SELECT count(*) FROM jobs_here.jobs") == 1
    sql = migrate.plan_sql("jobs_here")
    assert "CREATE TABLE jobs_here.jobs" in sql
    assert "{schema}" not in sql


@pytest.mark.parametrize("bad", ["", "Upper", "a;drop", 'q"x', "1abc", "x" * 64, "a b"])
def test_schema_name_is_validated(bad: str) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="schema name"):
        aioqueue.Queue("postgresql://localhost/x", schema=bad)


def test_every_named_query_is_a_field() -> None:
    import dataclasses
    from importlib import resources

    text = resources.files("aioqueue").joinpath("queries.sql").read_text()
    names = set(queries.parse(text))
    fields = {f.name for f in dataclasses.fields(queries.Queries)}
    assert names == fields


async def test_every_named_query_prepares(q: aioqueue.Queue) -> None:
    import dataclasses

    async with q.connection() as conn:
        for field in dataclasses.fields(queries.Queries):
            sql = getattr(q.queries, field.name)
            assert "{schema}" not in sql
            # vacuum_table's {table} is a name the server quoted (vacuum_candidates), put in by the caller.
            await conn.prepare(sql.replace("{table}", "aioqueue.jobs"))  # parses, plans and type-checks


async def test_queue_before_migrate_says_run_migrate(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn) as q:

        @q.task
        async def noop() -> None:
            pass

        with pytest.raises(aioqueue.SchemaNotReadyError, match="aioqueue migrate"):
            await noop.enqueue()
        with pytest.raises(aioqueue.SchemaNotReadyError, match="aioqueue migrate"):
            await q.status()
        with pytest.raises(aioqueue.SchemaNotReadyError, match="aioqueue migrate"):
            await q.worker().run_until_empty()


async def test_older_schema_is_refused_by_worker(q: aioqueue.Queue) -> None:
    async with q.connection() as conn:
        await conn.execute(
            "DELETE FROM aioqueue.migrations WHERE version = (SELECT max(version) FROM aioqueue.migrations)"
        )

    @q.task
    async def noop() -> None:
        pass

    with pytest.raises(aioqueue.SchemaNotReadyError, match="run `aioqueue migrate`"):
        await q.worker().run_until_empty()


async def test_a_schema_too_old_for_the_workers_first_read_is_refused_naming_its_version(q: aioqueue.Queue) -> None:
    # The worker's first read (the schema's version and its queues' limits, one statement) meets
    # a queues table without a later column: the version alone then says what to do.
    async with q.connection() as conn:
        await conn.execute("DELETE FROM aioqueue.migrations WHERE version > 17")
        await conn.execute("ALTER TABLE aioqueue.queues DROP COLUMN key_concurrency_limit CASCADE")

    @q.task
    async def noop() -> None:
        pass

    with pytest.raises(aioqueue.SchemaNotReadyError, match=r"is at version 17; .*run `aioqueue migrate`"):
        await q.worker().run_until_empty()


async def test_a_worker_reads_its_queues_limits_with_its_schema_check(q: aioqueue.Queue) -> None:
    # One round trip before the first claim, not two: the claim does not read the settings again
    # (here it could not) until limits_refresh (poll_interval, here 30 s) has passed.
    db = q.database
    broken = dataclasses.replace(db.queries, limited_queues="SELECT * FROM aioqueue.no_such_table")
    runs: list[int] = []

    @q.task
    async def record(n: int) -> None:
        runs.append(n)

    await record.enqueue_many([{"n": n} for n in range(3)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(db, "queries", broken)
        with anyio.fail_after(20):
            stats = await q.worker(poll_interval=30).run_until_empty()
    assert (stats.succeeded, sorted(runs)) == (3, [0, 1, 2])


async def test_unreachable_dsn_fails_fast_naming_host() -> None:
    with anyio.fail_after(15):
        q = aioqueue.Queue("postgresql://postgres@127.0.0.1:1/nowhere", connect_timeout=5)
        with pytest.raises(aioqueue.ConnectError, match=r"127\.0\.0\.1:1"):
            await q.open()
