"""The built-in array types aioqueue's statements bind and read are known to each connection of
its pool as the connection opens: no statement waits for asyncpg to ask the server what they
are (a catalog query a new backend runs cold, once per connection and type)."""

from __future__ import annotations

import datetime
import json

import anyio
import asyncpg

import aioqueue
from aioqueue import _array_types as array_types


async def test_a_declared_connection_binds_and_reads_arrays_without_asking(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        assert array_types.declare(conn)
        sent: list[str] = []
        conn.add_query_logger(lambda record: sent.append(record.query))
        row = await conn.fetchrow(
            "SELECT $1::int[] AS i, $2::bigint[] AS b, $3::float8[] AS f, $4::bool[] AS t, $5::jsonb[] AS j, "
            "$6::smallint[] AS s, ARRAY['2026-01-02 03:04:05+00'::timestamptz] AS ts",
            [1, None, -2], [2**40], [0.5], [True, False], [json.dumps({"k": 1})], [7],
        )
        await anyio.sleep(0.01)  # the logger is called soon after, not at once
        assert len(sent) == 1  # the statement alone: no type introspection before it
    finally:
        await conn.close()
    assert row is not None
    assert dict(row) == {
        "i": [1, None, -2], "b": [2**40], "f": [0.5], "t": [True, False], "j": ['{"k": 1}'], "s": [7],
        "ts": [datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)],
    }


async def test_the_pools_connections_claim_and_finish_without_asking(q: aioqueue.Queue) -> None:
    @q.task
    async def noop() -> None:
        pass

    ids = await noop.enqueue_many([{}, {}])
    sent: list[str] = []

    def log(record: asyncpg.connection.LoggedQuery) -> None:
        sent.append(record.query)

    db = q.database
    async with db.connection() as conn:
        conn.add_query_logger(log)
        b = db.statements.claim(queues=["default"], wants=[2], worker="w", lease=30.0, limit=2,
                                commit_mode="off", limited=False)
        rows = await conn.fetch(b.sql, *b.args)
        b = db.statements.complete(ids=[r["id"] for r in rows], attempts=[r["attempts"] for r in rows],
                                   results=[None, None], commit_mode="off")
        await conn.execute(b.sql, *b.args)
        await anyio.sleep(0.01)
        conn.remove_query_logger(log)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert len(sent) == 2, sent  # the claim and the write: nothing asked in between
