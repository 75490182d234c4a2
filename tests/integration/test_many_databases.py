"""Beyond one database: Queues in two databases of the local server, served by one process
(``run_workers``, or ``aioqueue worker A:qa B:qb``); each task enqueues into its own Queue's
database, and a job in another database cannot join the caller's transaction."""

from __future__ import annotations

import functools
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue.worker_group import run_workers
from tests.support.cli_tools import TWO_QUEUES, cli_env
from tests.support.helpers import eventually


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def test_one_process_serves_queues_of_two_databases(dsn: str, other_dsn: str) -> None:
    app, heavy = aioqueue.Queue(dsn), aioqueue.Queue(other_dsn)
    ran: list[str] = []

    @app.task(queue="mail")
    async def send_mail(n: int) -> None:
        ran.append(f"mail {n}")

    @heavy.task(queue="thumbnails")
    async def thumbnail(n: int) -> None:
        ran.append(f"thumb {n}")

    async with app, heavy:
        await send_mail.enqueue_many([{"n": n} for n in range(20)])
        await thumbnail.enqueue_many([{"n": n} for n in range(30)])
        # Each task's jobs are in its own Queue's database.
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'mail'") == 20
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'thumbnails'") == 0
        assert await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs WHERE queue = 'thumbnails'") == 30

        workers = [q.worker(install_signal_handlers=False, poll_interval=0.05) for q in (app, heavy)]
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_workers, workers)
            await eventually(lambda: len(ran) == 50, timeout=20, what="both databases' jobs to run")
            for w in workers:
                w.stop()
        # What is lost: a job in the other database cannot join the caller's transaction.
        # Rolled back, the app database's job is gone; the other database's was committed alone.
        async def failing_request() -> None:
            async with app.pool.acquire() as conn, conn.transaction():
                await send_mail.options(conn=conn).enqueue(99)
                await thumbnail.enqueue(99)
                raise RuntimeError("the request fails")

        with pytest.raises(RuntimeError):
            await failing_request()
        assert await _count(dsn, "SELECT count(*) FROM aioqueue.jobs") == 0
        assert await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs") == 1
    assert sorted(ran) == sorted([f"mail {n}" for n in range(20)] + [f"thumb {n}" for n in range(30)])


async def test_run_workers_refuses_workers_that_watch_signals(q: aioqueue.Queue) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="install_signal_handlers=False"):
        await run_workers([q.worker()])
    with pytest.raises(aioqueue.ConfigurationError, match="serves health probes itself"):
        await run_workers([q.worker(install_signal_handlers=False, health_port=0)], health_port=0)
    with pytest.raises(aioqueue.ConfigurationError, match="health_port"):
        await run_workers([q.worker(install_signal_handlers=False)], health_port=70000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{port}{path}")
    return response.status_code, response.json()


async def test_a_group_answers_health_probes_as_one(dsn: str, other_dsn: str) -> None:
    """One server for the group: ready only while every worker is, each named in the body."""
    app, heavy = aioqueue.Queue(dsn), aioqueue.Queue(other_dsn)
    app.task(queue="mail", name="send_mail")(_job)
    heavy.task(queue="thumbnails", name="thumbnail")(_job)
    port = _free_port()
    async with app, heavy:
        workers = [q.worker(install_signal_handlers=False, poll_interval=0.1) for q in (app, heavy)]
        names = [w.name for w in workers]
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(run_workers, workers, handle_signals=False, health_port=port,
                                            health_addr="127.0.0.1", unready_after=1))

            async def ready() -> bool:
                try:
                    code, body = await _probe(port, "/ready")
                except httpx.ConnectError:  # not listening yet
                    return False
                return code == 200 and body["status"] == "ok"

            await eventually(ready, timeout=15, interval=0.05, what="the group to be ready")
            code, body = await _probe(port, "/live")
            assert code == 200 and sorted(body["workers"]) == sorted(names)
            # The heavy database's schema falls behind: the group is unready, and says which.
            latest = migrate.latest_version()
            await _count(other_dsn, f"WITH d AS (DELETE FROM aioqueue.migrations WHERE version = {latest} "
                                    "RETURNING 1) SELECT count(*) FROM d")

            async def heavy_behind() -> bool:
                code, body = await _probe(port, "/ready")
                return code == 503 and body["workers"][names[1]]["schema"] == (
                    f"at version {latest - 1}, code needs {latest}")

            await eventually(heavy_behind, timeout=15, interval=0.05, what="/ready to name the worker behind")
            code, body = await _probe(port, "/ready")
            assert body["status"] == "failing" and body["workers"][names[0]]["status"] == "ok"
            assert (await _probe(port, "/live"))[0] == 200  # alive: both workers still run
            await _count(other_dsn, f"WITH i AS (INSERT INTO aioqueue.migrations (version, name) VALUES ({latest}, "
                                    "'back') RETURNING 1) SELECT count(*) FROM i")
            await eventually(ready, timeout=15, interval=0.05, what="the group to be ready again")
            for w in workers:
                w.stop()


async def test_the_worker_command_serves_several_targets(dsn: str, other_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "two_queues.py").write_text(TWO_QUEUES)
    async with aioqueue.Queue(dsn) as app, aioqueue.Queue(other_dsn) as heavy:
        await app.task(queue="mail", name="send_mail")(_job).enqueue_many([{"n": n} for n in range(20)])
        await heavy.task(queue="thumbnails", name="thumbnail")(_job).enqueue_many([{"n": n} for n in range(20)])
    port = _free_port()
    command = [sys.executable, "-m", "aioqueue", "worker", "two_queues:app", "two_queues:heavy",
               "--poll-interval", "0.1", "--health-port", str(port), "--health-addr", "127.0.0.1"]
    env = {**cli_env(dsn), "HEAVY_DSN": other_dsn}
    async with await anyio.open_process(command, env=env, cwd=tmp_path, stdout=None, stderr=None) as process:
        async def drained() -> bool:
            return (await _count(dsn, "SELECT count(*) FROM aioqueue.jobs")
                    + await _count(other_dsn, "SELECT count(*) FROM aioqueue.jobs")) == 0

        await eventually(drained, timeout=30, what="both databases to drain")
        code, body = await _probe(port, "/ready")  # one server answers for both workers
        assert code == 200 and len(body["workers"]) == 2, body
        assert all(w["status"] == "ok" for w in body["workers"].values()), body
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            assert await process.wait() == 0


async def _job(n: int) -> None:
    pass
