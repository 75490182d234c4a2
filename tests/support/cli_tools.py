"""Run the ``aioqueue`` command in tests, as a user would (``python -m aioqueue`` in a
subprocess): a small app module for its worker, one-shot commands, a background worker process
whose output a test can wait on, and stand-ins for the app's tasks to enqueue from the test."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import anyio
import httpx
import psutil  # type: ignore[import-untyped]
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

import aioqueue

from .helpers import eventually

APP = '''
"""A queue for the CLI tests: its one task records which process ran it."""
import os

import anyio

import aioqueue

queue = aioqueue.Queue(os.environ["AIOQUEUE_DSN"])


@queue.task(queue="cli")
async def record(n: int, sleep: float = 0.0) -> None:
    async with queue.pool.acquire() as conn:
        await conn.execute("INSERT INTO begun (n) VALUES ($1)", n)
    await anyio.sleep(sleep)
    async with queue.pool.acquire() as conn:
        await conn.execute("INSERT INTO seen (n, pid) VALUES ($1, $2)", n, os.getpid())


@queue.task(queue="cli")
async def stuck() -> None:
    async with queue.pool.acquire() as conn:
        await conn.execute("INSERT INTO begun (n) VALUES (-1)")
    await anyio.sleep_forever()
'''

#: Two Queues, each on its own database (``AIOQUEUE_DSN``, ``HEAVY_DSN``), with a task each.
TWO_QUEUES = '''
import os
import aioqueue

app = aioqueue.Queue(os.environ["AIOQUEUE_DSN"])
heavy = aioqueue.Queue(os.environ["HEAVY_DSN"])


@app.task(queue="mail")
async def send_mail(n: int) -> None:
    pass


@heavy.task(queue="thumbnails")
async def thumbnail(n: int) -> None:
    pass
'''


def cli_env(dsn: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AIOQUEUE_DSN", "DATABASE_URL")}
    if dsn is not None:
        env["AIOQUEUE_DSN"] = dsn
    return env


async def aioqueue_cli(
    *args: str, dsn: str | None, cwd: Path | None = None, timeout: float = 20.0
) -> tuple[int, str, str]:
    """Run ``python -m aioqueue ARGS``; return (exit status, stdout, stderr)."""
    with anyio.fail_after(timeout):
        result = await anyio.run_process(
            [sys.executable, "-m", "aioqueue", *args], env=cli_env(dsn), cwd=cwd, check=False
        )
    assert result.returncode is not None
    return result.returncode, result.stdout.decode(), result.stderr.decode()


class Output:
    """Collects a running process's stderr; waits for text to appear in it."""

    def __init__(self) -> None:
        self.text = ""
        self._changed = anyio.Event()

    async def pump(self, process: Process) -> None:
        assert process.stderr is not None
        async for chunk in TextReceiveStream(process.stderr):
            self.text += chunk
            self._changed.set()
            self._changed = anyio.Event()

    async def wait_for(self, needle: str, count: int = 1, timeout: float = 20.0) -> None:
        with anyio.fail_after(timeout):
            while self.text.count(needle) < count:
                await self._changed.wait()


@contextlib.asynccontextmanager
async def cli_process(
    args: Sequence[str], dsn: str, cwd: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[Process, Output]]:
    """Start ``python -m aioqueue ARGS`` in the background (``env``: variables to add); kill it,
    and the children it started, if the test leaves it running."""
    output = Output()
    process = await anyio.open_process(
        [sys.executable, "-m", "aioqueue", *args], env={**cli_env(dsn), **(env or {})}, cwd=cwd, stdout=None
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(output.pump, process)
            try:
                yield process, output
            finally:
                if process.returncode is None:
                    for child in psutil.Process(process.pid).children(recursive=True):
                        child.kill()
                    process.kill()
                with anyio.fail_after(10):
                    await process.wait()
    finally:
        print(output.text, file=sys.stderr)  # shown by pytest when the test fails


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def dashboard_process(dsn: str, cwd: Path) -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    """Serve ``aioqueue dashboard`` on a free loopback port; yield a client of it once it
    answers, and the port."""
    port = free_port()
    async with cli_process(["dashboard", "--port", str(port)], dsn, cwd) as (_process, output):
        await output.wait_for("serving the aioqueue dashboard")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def up() -> bool:
                try:
                    return (await client.get("/")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(up, timeout=20, interval=0.1, what="the dashboard to answer")
            yield client, port


def app_task(queue: aioqueue.Queue, name: str, queue_name: str) -> aioqueue.Task[..., None]:
    """A stand-in for the app module's task, for enqueueing from the test (same name and queue)."""
    sources: dict[str, Callable[..., Awaitable[None]]] = {"record": _record_signature, "stuck": _stuck_signature}
    source = sources[name]
    return queue.task(name=name, queue=queue_name)(source)


async def _record_signature(n: int, sleep: float = 0.0) -> None:
    raise AssertionError("runs in the worker process")


async def _stuck_signature() -> None:
    raise AssertionError("runs in the worker process")
