"""The operator's view of partition keys against the real server: a queue's busiest keys (running
jobs exact, pending and ready counted up to a bound), listings filtered by key, the ``keys``
command, and bad arguments refused at the call."""

from __future__ import annotations

import json
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._admin import JobFilter
from tests.support.cli_tools import aioqueue_cli
from tests.support.helpers import eventually, running


async def test_busiest_keys_count_running_pending_and_ready_jobs_per_key(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    release = anyio.Event()

    @q.task(queue="sync")
    async def sync(account: str) -> None:
        await release.wait()

    @q.task(queue="other")
    async def elsewhere(account: str) -> None:
        pass

    await q.set_key_limits("sync", concurrency=1)
    await sync.options(partition_key="acme").enqueue_many([{"account": "acme"}] * 5)
    await sync.options(partition_key="globex").enqueue_many([{"account": "globex"}] * 3)
    await sync.options(partition_key="initech", delay=3600).enqueue(account="initech")  # pending, not ready
    await sync.enqueue(account="nobody")  # no key: in no key's counts
    await elsewhere.options(partition_key="acme").enqueue_many([{"account": "acme"}] * 9)  # another queue

    async with running(q.worker(queues=["sync"], concurrency=4)):
        await eventually(lambda: _running(db, 3), what="one job of each ready key, and the keyless one, running")
        keys = await q.busiest_keys("sync")
        assert keys == [
            {"key": "acme", "running": 1, "pending": 4, "ready": 4},
            {"key": "globex", "running": 1, "pending": 2, "ready": 2},
            {"key": "initech", "running": 0, "pending": 1, "ready": 0},
        ]
        # Counts stop at the bound; the order is running and pending together, most first.
        assert await q.busiest_keys("sync", limit=2, bound=3) == [
            {"key": "acme", "running": 1, "pending": 3, "ready": 3},
            {"key": "globex", "running": 1, "pending": 2, "ready": 2},
        ]
        # The listing of one key's jobs, live ones by status; the other queue's acme jobs are apart.
        page = await q.admin.list_jobs(JobFilter(status="pending", queue="sync", partition_key="acme"))
        assert len(page.jobs) == 4 and {j["partition_key"] for j in page.jobs} == {"acme"}
        page = await q.admin.list_jobs(JobFilter(status="running", partition_key="globex"))
        assert [j["task"] for j in page.jobs] == [sync.name]
        assert len((await q.admin.list_jobs(JobFilter(status="pending", partition_key="acme"))).jobs) == 13
        release.set()
        await eventually(lambda: _running(db, 0), what="the ready jobs drained")
        assert await q.busiest_keys("sync") == [{"key": "initech", "running": 0, "pending": 1, "ready": 0}]
    assert await q.busiest_keys("no-such-queue") == []


async def _running(db: asyncpg.Connection, n: int) -> bool:
    """Whether ``n`` jobs of queue sync run and none is left ready."""
    return bool(await db.fetchval(
        "SELECT count(*) FILTER (WHERE status = 'running') = $1 AND count(*) FILTER "
        "(WHERE status = 'pending' AND run_at <= now()) = CASE WHEN $1 = 0 THEN 0 ELSE 6 END "
        "FROM aioqueue.jobs WHERE queue = 'sync'", n))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queue": ""}, "queue name must be a non-empty str"),
        ({"queue": "a\x00b"}, "NUL"),
        ({"queue": "sync", "limit": 0}, "limit"),
        ({"queue": "sync", "limit": 101}, "limit"),
        ({"queue": "sync", "limit": True}, "limit"),
        ({"queue": "sync", "limit": 2.5}, "limit"),
        ({"queue": "sync", "bound": 0}, "bound"),
        ({"queue": "sync", "bound": 100_001}, "bound"),
    ],
)
async def test_bad_arguments_are_refused_naming_them(q: aioqueue.Queue, kwargs: dict[str, Any], message: str) -> None:
    queue = kwargs.pop("queue")
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.busiest_keys(queue, **kwargs)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"status": "succeeded", "partition_key": "acme"}, "the archive keeps no partition key"),
        ({"status": "pending", "partition_key": ""}, "partition key must be a non-empty str"),
        ({"status": "pending", "partition_key": "x" * 256}, "the limit is 255"),
    ],
)
def test_bad_key_filters_are_refused(where: dict[str, Any], message: str) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        JobFilter(**where)


async def test_the_keys_command_prints_the_busiest_keys(dsn: str, q: aioqueue.Queue) -> None:
    @q.task(queue="sync")
    async def sync(account: str) -> None:
        pass

    await q.set_key_limits("sync", concurrency=2)
    await sync.options(partition_key="acme").enqueue_many([{"account": "acme"}] * 3)
    await sync.options(partition_key="globex").enqueue(account="globex")
    status, out, err = await aioqueue_cli("keys", "sync", "--json", dsn=dsn)
    assert status == 0, err
    assert json.loads(out) == {
        "queue": "sync", "key_concurrency_limit": 2, "bound": 1000,
        "keys": [{"key": "acme", "running": 0, "pending": 3, "ready": 3},
                 {"key": "globex", "running": 0, "pending": 1, "ready": 1}],
    }
    status, out, err = await aioqueue_cli("keys", "sync", "--bound", "2", dsn=dsn)
    assert status == 0, err
    assert out.split("\n")[0].split() == ["KEY", "RUNNING", "PENDING", "READY"]
    assert out.split("\n")[1].split() == ["acme", "0/2", "2+", "2+"]
    status, _out, err = await aioqueue_cli("keys", "sync", "--limit", "500", dsn=dsn)
    assert status == 2 and "limit" in err
