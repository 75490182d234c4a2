"""Bad input to the operator calls and the Queue itself: refused where it is passed, with a
library error naming the value, and nothing written, deleted or leaked from asyncpg."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import aioqueue


async def _dead_jobs(q: aioqueue.Queue, n: int) -> list[int]:
    @q.task(max_attempts=1)
    async def doomed() -> None:
        raise RuntimeError("no")

    ids = [int(i) for i in await doomed.enqueue_many([{}] * n)]
    await q.worker().run_until_empty()
    return ids


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q: q.purge_dead("12"), "job ids must be a list"),
        (lambda q: q.retry_dead("12"), "job ids must be a list"),
        (lambda q: q.retry_dead([1.5]), "a job id must be an int"),
        (lambda q: q.purge_dead([True]), "a job id must be an int"),
        (lambda q: q.purge_dead(1), "pass \\[1\\]"),
        (lambda q: q.purge_dead([2**70]), "a job id must be an int from 1 to"),
        (lambda q: q.get_job(2**70), "a job id must be an int from 1 to"),
        (lambda q: q.get_job("1 OR 1=1"), "a job id must be an int"),
        (lambda q: q.cancel(2**70), "a job id must be an int from 1 to"),
        (lambda q: q.cancel("1"), "a job id must be an int"),
        (lambda q: q.list_dead(limit="5"), "limit must be an int from 1 to 10000"),
        (lambda q: q.list_dead(limit=-1), "limit must be an int from 1 to 10000"),
        (lambda q: q.set_limits("x", rate=(1, 2, 3)), "rate must be a pair"),
        (lambda q: q.set_limits("x", concurrency="2"), "concurrency must be an int"),
        (lambda q: q.pause(""), "queue name must be a non-empty str"),
    ],
)
async def test_operator_calls_refuse_bad_values_and_touch_nothing(
    q: aioqueue.Queue, db: asyncpg.Connection, call: Any, message: str
) -> None:
    ids = await _dead_jobs(q, 12)
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await call(q)
    rows = await db.fetch("SELECT id, status FROM aioqueue.jobs ORDER BY id")
    assert [(r["id"], r["status"]) for r in rows] == [(i, "dead") for i in ids]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.queues") == 0


def test_queue_refuses_what_is_not_a_dsn_or_a_pool() -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="dsn must be a str"):
        aioqueue.Queue(dsn=123)  # type: ignore[arg-type]
    with pytest.raises(aioqueue.ConfigurationError, match=r"pool must be an asyncpg\.Pool"):
        aioqueue.Queue(pool="pool")  # type: ignore[arg-type]
    with pytest.raises(aioqueue.ConfigurationError, match="pool_max_size"):
        aioqueue.Queue("postgresql://x/y", pool_max_size=0)
    with pytest.raises(aioqueue.ConfigurationError, match="connect_timeout"):
        aioqueue.Queue("postgresql://x/y", connect_timeout=-1)
    with pytest.raises(aioqueue.ConfigurationError, match="Queue needs a dsn or a pool"):
        aioqueue.Queue()


async def test_an_options_connection_that_is_not_one_is_refused_at_options(q: aioqueue.Queue) -> None:
    @q.task
    async def noop() -> None:
        pass

    with pytest.raises(aioqueue.ConfigurationError, match="asyncpg"):
        noop.options(conn="x")  # type: ignore[arg-type]
