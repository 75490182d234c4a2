"""Health probes: /live while the loop and services run, /ready while the database answers and
the schema is current; unready once the database has been away longer than ``unready_after``
(tested by stopping a server the test owns), ready again when it is back."""

from __future__ import annotations

import anyio
import asyncpg
import httpx
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from tests.support.fault_tools import owned_server
from tests.support.helpers import eventually, running


async def _probe(port: int, path: str) -> tuple[int, dict[str, object]]:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"http://127.0.0.1:{port}{path}")
    return response.status_code, response.json()


async def test_ready_and_live_then_unready_while_the_server_is_down() -> None:
    async with owned_server() as server:
        queue = aioqueue.Queue(server.dsn, connect_timeout=1)

        @queue.task
        async def noop() -> None:
            pass

        # unready_after: long enough that a check delayed on a busy machine is not an outage.
        async with queue, running(queue.worker(health_port=0, health_addr="127.0.0.1", unready_after=3,
                                               poll_interval=0.2)) as worker:
            assert worker.health is not None
            port = worker.health.port
            assert port > 0
            assert await _probe(port, "/live") == (200, {"status": "ok", "services": "running"})
            code, body = await _probe(port, "/ready")
            assert (code, body["database"], body["schema"]) == (200, "ok", "current")
            assert (await _probe(port, "/nothing"))[0] == 404

            await server.stop()

            async def unready() -> bool:
                code, body = await _probe(port, "/ready")
                return code == 503 and str(body["database"]).startswith("no answer for")

            await eventually(unready, timeout=15, interval=0.1, what="/ready to report the database gone")
            assert (await _probe(port, "/live"))[0] == 200  # alive: waiting for the database is its job

            await server.start()

            async def ready() -> bool:
                return (await _probe(port, "/ready"))[0] == 200

            await eventually(ready, timeout=20, interval=0.1, what="/ready once the database is back")
            await noop.enqueue()


async def test_unready_when_the_schema_is_behind_and_while_draining(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    began, release = anyio.Event(), anyio.Event()

    @q.task
    async def slow() -> None:
        began.set()
        with anyio.move_on_after(30):  # running until the probes below are done
            await release.wait()

    async with running(q.worker(health_port=0, health_addr="127.0.0.1", unready_after=1, grace_period=5)) as worker:
        assert worker.health is not None
        port = worker.health.port
        latest = migrate.latest_version()
        await db.execute("DELETE FROM aioqueue.migrations WHERE version = $1", latest)

        async def behind() -> bool:
            code, body = await _probe(port, "/ready")
            return code == 503 and body["schema"] == f"at version {latest - 1}, code needs {latest}"

        await eventually(behind, timeout=10, interval=0.05, what="/ready to report the schema behind")
        await db.execute("INSERT INTO aioqueue.migrations (version, name) VALUES ($1, 'back')", latest)
        await slow.enqueue()
        with anyio.fail_after(10):
            await began.wait()
        worker.stop()
        code, body = await _probe(port, "/ready")
        assert (code, body["services"]) == (503, "stopping")
        assert (await _probe(port, "/live"))[0] == 200
        release.set()


@pytest.mark.parametrize("value", [-1, 70000])
def test_bad_health_port_is_refused(value: int) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match="health_port"):
        aioqueue.WorkerConfig(health_port=value)
