"""Claims and outcomes commit without waiting for their WAL flush (``synchronous_commit = off``
set inside each statement, for its own transaction only), unless the worker is told
``durable_claims=True``; enqueues and everything else keep the session's setting."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import aioqueue

CHANNELS = ("c", "d")


def _calls(q: aioqueue.Queue, mode: str | None) -> dict[str, tuple[str, tuple[Any, ...]]]:
    s = q.database.queries
    one, att = "{1}", "{1}"  # claims go as array literals (see aioqueue._statements.int_array)
    return {
        "claim": (s.claim, (["default"], [10], "probe", 60.0, 10, mode)),
        "claim_unlimited": (s.claim_unlimited, (["default"], [10], "probe", 60.0, 10, mode)),
        "claim_keyed_timed": (s.claim_keyed_timed, (["default"], [10], "probe", 60.0, 10, mode)),
        "complete": (s.complete, (one, att, [None], *CHANNELS, mode)),
        "fail": (s.fail, (one, att, ["x"], [None], [False], [1.0], [2.0], [60.0], [0.1], "c", "d", "e", mode)),
        "reschedule": (s.reschedule, (one, att, [0.0], [None], *CHANNELS, mode)),
        "finish_cancelled": (s.finish_cancelled, (one, att, *CHANNELS, mode)),
    }


async def _setting_after(db: asyncpg.Connection, sql: str, args: tuple[Any, ...]) -> str:
    tx = db.transaction()
    await tx.start()
    try:
        await db.fetch(sql, *args)
        return str(await db.fetchval("SHOW synchronous_commit"))
    finally:
        await tx.rollback()


@pytest.mark.parametrize("statement", ["claim", "claim_unlimited", "claim_keyed_timed", "complete", "fail",
                                       "reschedule", "finish_cancelled"])
async def test_claims_and_outcomes_skip_the_wal_flush_unless_durable(
    q: aioqueue.Queue, db: asyncpg.Connection, statement: str
) -> None:
    @q.task
    async def noop() -> None: ...

    await noop.enqueue()
    await db.execute("UPDATE aioqueue.jobs SET status = 'running', attempts = 1")  # something to finish
    assert await db.fetchval("SHOW synchronous_commit") == "on"
    sql, args = _calls(q, "off")[statement]
    assert await _setting_after(db, sql, args) == "off"
    sql, args = _calls(q, None)[statement]  # durable_claims=True: the session's setting stays
    assert await _setting_after(db, sql, args) == "on"
    assert await db.fetchval("SHOW synchronous_commit") == "on"  # only for that transaction


async def test_a_stopping_worker_removes_its_registry_row_without_the_wal_flush(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    # The last statement of a worker's run: a server crash that lost it leaves a row that expires.
    await db.execute("INSERT INTO aioqueue.workers (name, host, pid, queues, concurrency, version) "
                     "VALUES ('w', 'h', 1, '{default}', 1, 'v')")
    tx = db.transaction()
    await tx.start()
    try:
        await db.execute(q.database.queries.unregister_worker, "w", "off")
        assert await db.fetchval("SELECT count(*) FROM aioqueue.workers") == 0
        assert await db.fetchval("SHOW synchronous_commit") == "off"
    finally:
        await tx.rollback()


async def test_enqueue_stays_durable(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def noop() -> None: ...

    async with q.connection() as conn, conn.transaction():
        await noop.options(conn=conn).enqueue()
        await noop.enqueue_many([{}] * 3, conn=conn)
        assert await conn.fetchval("SHOW synchronous_commit") == "on"


def test_the_worker_passes_its_commit_mode() -> None:
    assert aioqueue.WorkerConfig().commit_mode == "off"
    assert aioqueue.WorkerConfig(durable_claims=True).commit_mode is None
