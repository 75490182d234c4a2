"""Rolling upgrades: workers of an older release keep working while the schema is migrated
under them, one migration at a time, and then beside workers of this release.

The older release is the package as it was just before the next migration was added, taken
from git history (``git archive``) and run in a process of its own; it migrates an empty
database to its own version, then enqueues and works jobs without pause. Each later migration is
applied by this code while it runs; finally a worker of this code joins and both enqueue.
A job run twice would fail on the primary key of ``seen`` and end dead: none may.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue._queries import for_schema
from tests.support.helpers import eventually, running, terminated_after
from tests.support.releases import old_release

OLD_WORKER = '''
import asyncio, os, sys
sys.path.insert(0, os.environ["OLD_CODE"])
import aioqueue
assert aioqueue.__file__.startswith(os.environ["OLD_CODE"]), aioqueue.__file__

queue = aioqueue.Queue(os.environ["DSN"])


@queue.task(queue="up", **({"archive": True} if os.environ.get("ARCHIVE") else {}))
async def mark(n: int) -> None:
    async with queue.pool.acquire() as conn:
        await conn.execute("INSERT INTO seen (n, who) VALUES ($1, 'old')", n)


async def enqueue_forever() -> None:
    n = 0
    while True:
        await mark.enqueue(1_000_000 + n)
        n += 1
        await asyncio.sleep(0.01)


async def main() -> None:
    async with queue:
        await queue.migrate()
        feeder = asyncio.ensure_future(enqueue_forever())
        try:
            await queue.worker(poll_interval=0.05).run()
        finally:
            feeder.cancel()


asyncio.run(main())
'''


@contextlib.asynccontextmanager
async def _old_worker(dsn: str, code: Path, *, archive: bool = False) -> AsyncIterator[anyio.abc.Process]:
    env = {"DSN": dsn, "OLD_CODE": str(code), "PATH": "/usr/bin:/bin", **({"ARCHIVE": "1"} if archive else {})}
    process = await anyio.open_process([sys.executable, "-c", OLD_WORKER], env=env, stdout=None, stderr=None)
    async with terminated_after(process, 30):
        yield process


async def _apply(db: asyncpg.Connection, version: int) -> None:
    """Apply migration ``version`` alone, through ``migrate`` (which tries again after a deadlock)."""
    assert await migrate.migrate(db, "aioqueue", to=version) == [version]


async def _done(db: asyncpg.Connection, who: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM seen WHERE who = $1", who))


@pytest.mark.parametrize("old_version", range(1, migrate.latest_version()))
async def test_old_workers_keep_working_across_each_migration_and_beside_new_ones(
    empty_dsn: str, tmp_path: Path, old_version: int
) -> None:
    code = await anyio.to_thread.run_sync(old_release, old_version, tmp_path)
    db = await asyncpg.connect(empty_dsn)
    try:
        await db.execute("CREATE TABLE seen (n bigint PRIMARY KEY, who text NOT NULL)")
        async with _old_worker(empty_dsn, code) as old:
            await eventually(lambda: _at_least(db, "old", 1), timeout=30, what="the old release to run jobs")
            assert await migrate.applied_version(db, "aioqueue") == old_version
            for version in range(old_version + 1, migrate.latest_version() + 1):
                await _apply(db, version)
                before = await _done(db, "old")
                await eventually(lambda b=before: _more(db, b), timeout=20,
                                 what=f"the old release to keep working after migration {version}")
            # This release's worker joins; both enqueue into one queue, both work it.
            queue = aioqueue.Queue(empty_dsn)

            @queue.task(queue="up")
            async def mark(n: int) -> None:
                async with queue.pool.acquire() as conn:
                    await conn.execute("INSERT INTO seen (n, who) VALUES ($1, 'new')", n)

            async with queue, running(queue.worker(poll_interval=0.05)):
                await mark.enqueue_many([{"n": n} for n in range(300)])
                await eventually(lambda: _at_least(db, "new", 50), timeout=30, what="the new release to run jobs")
                before = await _done(db, "old")
                await eventually(lambda: _more(db, before), timeout=20, what="the old release beside the new")
            assert old.returncode is None  # still running: it never crashed on the newer schema
        dead = await db.fetch("SELECT id, last_error FROM aioqueue.jobs WHERE status = 'dead'")
        assert dead == [], dead  # no job failed, none ran twice
    finally:
        await db.close()


ARCHIVED = 200_000


async def test_partitioning_the_archive_keeps_it_under_archiving_workers_of_the_release_before(
    empty_dsn: str, tmp_path: Path
) -> None:
    """The release before the archive was partitioned runs a task that archives, over an archive
    of ARCHIVED jobs; the migration keeps every one of them (in place: the old table becomes a
    partition), the old workers go on archiving into the partitioned table, and get_job finds
    jobs archived before and after."""
    [version] = [m.version for m in migrate.migrations() if m.name == "archive_partitions"]
    code = await anyio.to_thread.run_sync(old_release, version - 1, tmp_path)
    db = await asyncpg.connect(empty_dsn)
    q = for_schema("aioqueue")
    try:
        await db.execute("CREATE TABLE seen (n bigint PRIMARY KEY, who text NOT NULL)")
        async with _old_worker(empty_dsn, code, archive=True) as old:
            await eventually(lambda: _at_least(db, "old", 1), timeout=30, what="the old release to run jobs")
            await db.execute(
                "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at, "
                "finished_at) SELECT 50000000 + g, 'up', 'mark', jsonb_build_object('n', g), 'succeeded', 0, 1, "
                "now() - interval '3 days', now() - g * interval '1 second' FROM generate_series(1, $1) AS g",
                ARCHIVED)
            await _apply(db, version)
            assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done_legacy WHERE id > 50000000") == ARCHIVED
            assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE id > 50000000") == ARCHIVED
            archived = int(await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE id < 50000000"))
            assert archived > 0
            await eventually(lambda: _archived_more(db, archived), timeout=20,
                             what="the old release to keep archiving after the migration")
            # This release's get_job reads the columns of the later migrations too.
            for later in [m.version for m in migrate.migrations() if m.version > version]:
                await _apply(db, later)
            row = await db.fetchrow(q.get_job, 50000001)
            assert row is not None and row["status"] == "succeeded"
            newest = await db.fetchval("SELECT max(id) FROM aioqueue.jobs_done WHERE id < 50000000")
            row = await db.fetchrow(q.get_job, newest)
            assert row is not None and row["status"] == "succeeded"
            assert old.returncode is None
        dead = await db.fetch("SELECT id, last_error FROM aioqueue.jobs WHERE status = 'dead'")
        assert dead == [], dead
    finally:
        await db.close()


async def _archived_more(db: asyncpg.Connection, than: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE id < 50000000")) >= than + 20


async def _more(db: asyncpg.Connection, than: int) -> bool:
    return await _done(db, "old") >= than + 20


async def _at_least(db: asyncpg.Connection, who: str, count: int) -> bool:
    return await _done(db, who) >= count


async def test_a_migration_that_deadlocks_with_a_running_worker_is_tried_again(empty_dsn: str) -> None:
    # Migration 0018 alters jobs, then queues; a worker of the release before may hold a queue's
    # settings and then read jobs (a claim of a limited queue). The server fails one side of that
    # cycle: the migration (this side's deadlock_timeout is the shorter), which then runs again.
    db = await asyncpg.connect(empty_dsn)
    worker = await asyncpg.connect(empty_dsn, server_settings={"deadlock_timeout": "20s"})
    try:
        assert await migrate.migrate(db, "aioqueue", to=17) == list(range(1, 18))
        async with worker.transaction():
            await worker.execute("LOCK TABLE aioqueue.queues IN ROW SHARE MODE")
            migrating = asyncio.ensure_future(migrate.migrate(db, "aioqueue", to=18))
            try:
                await eventually(lambda: _waits_for_a_lock(worker, db.get_server_pid()), timeout=20,
                                 what="the migration to wait for the queues table")
                assert await worker.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
            except BaseException:
                migrating.cancel()
                raise
        with anyio.fail_after(20):
            assert await migrating == [18]
        assert await migrate.applied_version(db, "aioqueue") == 18
    finally:
        await worker.close()
        await db.close()


async def _waits_for_a_lock(db: asyncpg.Connection, pid: int) -> bool:
    return bool(await db.fetchval("SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid))
