"""The example apps (``examples/``) under test: each imported afresh against a test database,
its ASGI lifespan driven as a server drives it, and the order flow the web examples share
(an order and its job commit together; a refused order leaves neither)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from tests.support.helpers import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_loaded = itertools.count()

Message = MutableMapping[str, Any]


def load_example(name: str, dsn: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``examples/<name>.py`` afresh (its own Queue and tasks), pointed at ``dsn``."""
    monkeypatch.setenv("AIOQUEUE_DSN", dsn)
    spec = importlib.util.spec_from_file_location(f"example_{name}_{next(_loaded)}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.asynccontextmanager
async def asgi_lifespan(app: Any, timeout: float = 20.0) -> AsyncIterator[None]:
    """Drive the ASGI lifespan protocol, as a server does: startup, then shutdown on exit."""
    to_app, app_receives = anyio.create_memory_object_stream[Message](4)
    app_sends, from_app = anyio.create_memory_object_stream[Message](4)
    async with to_app, app_receives, app_sends, from_app, anyio.create_task_group() as tg:
        scope: MutableMapping[str, Any] = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        tg.start_soon(app, scope, app_receives.receive, app_sends.send)
        with anyio.fail_after(timeout):
            await to_app.send({"type": "lifespan.startup"})
            message = await from_app.receive()
        assert message["type"] == "lifespan.startup.complete", message
        try:
            yield
        finally:
            with anyio.fail_after(timeout):
                await to_app.send({"type": "lifespan.shutdown"})
                message = await from_app.receive()
            assert message["type"] == "lifespan.shutdown.complete", message


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` with its lifespan started, and an HTTP client of it (in process, no network)."""
    transport = httpx.ASGITransport(app=app)
    async with asgi_lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http


async def assert_one_job_ever(db: asyncpg.Connection) -> None:
    """Check that the first order's job was the only one: the refused request left none.

    Once the table is empty, a job of the refused request would have to have succeeded (and
    been counted in queue_stats) or still be there (pending, running or dead).
    """

    async def empty() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0)

    await eventually(empty, what="the completer to delete the finished job")
    assert await db.fetchval("SELECT sum(succeeded) FROM aioqueue.queue_stats") == 1


async def order_then_refusal(
    http: httpx.AsyncClient, db: asyncpg.Connection, *, confirmed: Callable[[dict[str, Any]], bool],
    orders: str, available: str, what: str,
) -> None:
    """The web examples' flow: an order is created and its job confirms it; an order the stock
    cannot cover is refused (409) after its job was enqueued, and leaves neither order nor job.
    ``orders`` counts the orders, ``available`` reads the widget's stock (SQL)."""
    created = await http.post("/orders", json={"item": "widget", "quantity": 3})
    assert created.status_code == 201, created.text
    order_id = created.json()["order_id"]

    async def is_confirmed() -> bool:
        return confirmed((await http.get(f"/orders/{order_id}")).json())

    await eventually(is_confirmed, what=what)
    # The stock update fails its CHECK after the job was enqueued: nothing is left.
    refused = await http.post("/orders", json={"item": "widget", "quantity": 1000})
    assert refused.status_code == 409, refused.text
    assert await db.fetchval(orders) == 1
    assert await db.fetchval(available) == 97
    await assert_one_job_ever(db)
