"""Drive the dashboard in process, as a browser would: a client of the ASGI app at a served
address, the CSRF token of a page, and a dead job to act on."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import httpx

#: Where the in-process app is served, as far as it can tell: a loopback address and port.
SERVED = "http://127.0.0.1:8000"


def client_for(app: Any, base_url: str = SERVED, **headers: str) -> httpx.AsyncClient:
    """A client of ``app`` in process; the ASGI scope's server is ``base_url``'s host and port,
    as a server bound there would give."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, headers=headers)


async def csrf(client: httpx.AsyncClient, page: str = "/") -> str:
    """The CSRF token of ``page``'s forms (its cookie is now the client's)."""
    response = await client.get(page)
    assert response.status_code == 200, response.text
    found = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert found, "no CSRF token in the page"
    return found.group(1)


async def kill(db: asyncpg.Connection, job_id: int, error: str = "boom") -> None:
    """Make a job dead as the worker does when attempts are spent."""
    await db.execute("UPDATE aioqueue.jobs SET status = 'dead', attempts = 5, last_error = $2 WHERE id = $1",
                     job_id, error)
