"""What each way in costs: seconds to enqueue ``n`` jobs through each kind of caller connection
(asyncpg, SQLAlchemy, psycopg async and sync, Django), by name, and through the SQL functions,
one job per call (each call in a transaction of its own, as a request would) and in one bulk
call. The enqueue scenario lines these up; the sync paths run in a thread, with no event loop.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

import anyio
import psycopg
from common import TASK, make_queue, migrated

import aioqueue
from tests.support.django_db import django_connection

#: One measurement: seconds for ``n`` jobs on the database ``dsn``, one per call or in bulk.
PathMeasure = Callable[[str, int, bool], Awaitable[float]]


async def _timed(
    task: aioqueue.Task[..., None], n: int, bulk: bool, transaction: Callable[[], AbstractAsyncContextManager[Any]]
) -> float:
    """Seconds to enqueue ``n`` jobs, each call in a transaction of its own (``bulk``: one call
    in one), on the connection or session that ``transaction()`` begins a transaction on."""
    start = time.perf_counter()
    if bulk:
        async with transaction() as conn:
            await task.enqueue_many([{"i": i} for i in range(n)], conn=conn)
    else:
        for i in range(n):
            async with transaction() as conn:
                await task.options(conn=conn).enqueue(i=i)
    return time.perf_counter() - start


def _transactions(conn: Any) -> Callable[[], AbstractAsyncContextManager[Any]]:
    """A transaction on ``conn`` (asyncpg or psycopg) at each call, yielding ``conn``."""

    @contextlib.asynccontextmanager
    async def transaction() -> AsyncIterator[Any]:
        async with conn.transaction():
            yield conn

    return transaction


async def asyncpg_conn(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    queue, task = make_queue(dsn)
    async with queue, queue.connection() as conn:
        async with conn.transaction():  # prepare the statements outside the clock
            await task.options(conn=conn).enqueue(i=-1)
            await task.enqueue_many([{"i": -1}], conn=conn)
        return await _timed(task, n, bulk, _transactions(conn))


async def sqlalchemy_session(dsn: str, n: int, bulk: bool) -> float:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    await migrated(dsn)
    queue, task = make_queue(dsn)
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1), pool_size=1)
    session_for = async_sessionmaker(engine)
    try:
        async with queue:
            async with session_for.begin() as session:
                await task.options(conn=session).enqueue(i=-1)
                await task.enqueue_many([{"i": -1}], conn=session)
            return await _timed(task, n, bulk, session_for.begin)  # a session per call, as per request
    finally:
        await engine.dispose()


async def psycopg_async(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    _, task = make_queue(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            await task.options(conn=conn).enqueue(i=-1)
        return await _timed(task, n, bulk, _transactions(conn))


def _timed_sync(
    task: aioqueue.Task[..., None], n: int, bulk: bool, transaction: Callable[[], AbstractContextManager[Any]],
    conn: Any,
) -> float:
    """:func:`_timed` on a sync connection ``conn``, each call in a ``transaction()`` of its own."""
    start = time.perf_counter()
    if bulk:
        with transaction():
            task.options(conn=conn).enqueue_many_sync([{"i": i} for i in range(n)])
    else:
        for i in range(n):
            with transaction():
                task.options(conn=conn).enqueue_sync(i=i)
    return time.perf_counter() - start


async def psycopg_sync(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    _, task = make_queue(dsn)

    def measure() -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.transaction():
                task.options(conn=conn).enqueue_sync(i=-1)
            return _timed_sync(task, n, bulk, conn.transaction, conn)

    return await anyio.to_thread.run_sync(measure)


async def django_atomic(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    _, task = make_queue(dsn)

    def measure() -> float:
        from django.db import transaction

        connection = django_connection(dsn)
        try:
            with transaction.atomic():
                task.options(conn=connection).enqueue_sync(i=-1)
            return _timed_sync(task, n, bulk, transaction.atomic, connection)
        finally:
            connection.close()

    return await anyio.to_thread.run_sync(measure)


async def by_name(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    import aioqueue

    # No handler registered, and no worker has recorded the task's queue: name it.
    async with aioqueue.Queue(dsn, pool_max_size=1) as producer:
        await producer.enqueue_by_name(TASK, {"i": -1}, queue="default")
        await producer.enqueue_many_by_name(TASK, [{"i": -1}], queue="default")
        start = time.perf_counter()
        if bulk:
            await producer.enqueue_many_by_name(TASK, [{"i": i} for i in range(n)], queue="default")
        else:
            for i in range(n):
                await producer.enqueue_by_name(TASK, {"i": i}, queue="default")
        return time.perf_counter() - start


async def sql_function(dsn: str, n: int, bulk: bool) -> float:
    await migrated(dsn)
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        one = "SELECT aioqueue.add_job($1, $2::jsonb, 'default')"
        many = "SELECT count(*) FROM aioqueue.add_jobs($1::jsonb)"
        await conn.fetchval(one, TASK, '{"i": -1}')
        await conn.fetchval(many, json.dumps([{"task": TASK, "args": {"i": -1}, "queue": "default"}]))
        start = time.perf_counter()
        if bulk:
            jobs = [{"task": TASK, "args": {"i": i}, "queue": "default"} for i in range(n)]
            await conn.fetchval(many, json.dumps(jobs))
        else:
            for i in range(n):
                await conn.fetchval(one, TASK, json.dumps({"i": i}))
        return time.perf_counter() - start
    finally:
        await conn.close()


#: Every way in, by the name the results use.
PATHS: dict[str, PathMeasure] = {
    "asyncpg conn=": asyncpg_conn,
    "SQLAlchemy AsyncSession": sqlalchemy_session,
    "psycopg async": psycopg_async,
    "psycopg sync": psycopg_sync,
    "Django atomic": django_atomic,
    "by name": by_name,
    "SQL add_job/add_jobs": sql_function,
}
