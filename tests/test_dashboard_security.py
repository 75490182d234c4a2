"""What the dashboard refuses at its doors, over HTTP against a real database: credentials that
cannot work, and filters and ids a request carries that PostgreSQL or Python cannot take. Every
refusal names what was wrong and changes nothing."""

from __future__ import annotations

import math
import re
import socket
from typing import Any

import asyncpg
import httpx
import pytest

import aioqueue
from aioqueue.admin import JobFilter
from aioqueue.dashboard import create_app

from .cli_tools import aioqueue_cli

SERVED = "http://127.0.0.1:8000"


def client_for(app: Any, base_url: str = SERVED, **headers: str) -> httpx.AsyncClient:
    """A client of ``app`` in process; the ASGI scope's server is ``base_url``'s host and port,
    as a server bound there would give."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, headers=headers)


async def token_of(client: httpx.AsyncClient, page: str = "/") -> str:
    response = await client.get(page)
    assert response.status_code == 200, response.text
    found = re.search(r'name="csrf" value="([^"]+)"', response.text)
    assert found, "no CSRF token in the page"
    return found.group(1)


@pytest.fixture
async def send(q: aioqueue.Queue) -> aioqueue.Task[..., None]:
    @q.task(queue="mail")
    async def send(to: str, n: int = 0) -> None:
        pass

    return send


async def kill(db: asyncpg.Connection, job_id: int) -> None:
    await db.execute("UPDATE aioqueue.jobs SET status = 'dead', attempts = 5, last_error = 'boom' WHERE id = $1",
                     job_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- credentials ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("credentials", "why"), [
    ("ops:pw", "tuple"),
    (("ops", ""), "password"),
    (("", ""), "user"),
    (("ops", None), "password"),
    ((None, "pw"), "user"),
    (("a:b", "pw"), "':'"),
    (("ops",), "tuple"),
    (("ops", "pw", "x"), "tuple"),
    ((b"ops", b"pw"), "user"),
    (["ops", "pw"], "tuple"),
])
async def test_credentials_that_cannot_work_are_refused_at_create_app(
    q: aioqueue.Queue, credentials: Any, why: str
) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=why):
        create_app(q, credentials=credentials)


async def test_credentials_from_the_environment_are_checked_too(
    q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_USER", "ops:admin")
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_PASSWORD", "pw")
    with pytest.raises(aioqueue.ConfigurationError, match="AIOQUEUE_DASHBOARD_USER"):
        create_app(q)


async def test_the_command_refuses_unusable_credentials_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it loads anything or connects: the DSN here leads nowhere."""
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_USER", "ops:admin")
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_PASSWORD", "pw")
    status, _out, err = await aioqueue_cli(
        "dashboard", "--port", str(free_port()), dsn="postgresql://nobody@127.0.0.1:1/none")
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("aioqueue: error: ") and "AIOQUEUE_DASHBOARD_USER" in err
    assert "':'" in err


# -- what a request carries ----------------------------------------------------------------------

DEEP = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
BAD_FILTERS = [
    ('{"a": NaN}', "is nan"),
    ('{"a": 1e999}', "is inf"),
    ('{"a": "\\u0000"}', "NUL character"),
    ('{"\\ud800": 1}', "unpaired surrogate"),
    (DEEP, "levels deep"),
]
BAD_IDS = ["²", "9" * 5000, "0", "9223372036854775808", "-1", "1e3", "٣", "7x"]


async def test_a_bad_filter_gets_a_400_naming_it_and_changes_nothing(
    q: aioqueue.Queue, send: aioqueue.Task[..., None], db: asyncpg.Connection
) -> None:
    ids = [await send.enqueue(to="a", n=i) for i in range(3)]
    await kill(db, ids[0])
    async with client_for(create_app(q)) as client:
        token = await token_of(client)
        for text, why in BAD_FILTERS:
            for page in ("/jobs", "/dead"):
                for params in ({"args": text}, {"args": text, "before": str(ids[-1])}):
                    response = await client.get(page, params=params)
                    assert response.status_code == 400 and why in response.text, (page, text[:20])
            for status, action in (("pending", "delete"), ("pending", "cancel"), ("dead", "retry"),
                                   ("dead", "delete")):
                form = {"scope": "filter", "status": status, "queue": "", "task": "", "args": text,
                        "action": action, "csrf": token, "confirmed": "1"}
                response = await client.post("/actions/jobs", data=form, headers={"origin": SERVED})
                assert response.status_code == 400 and why in response.text, (action, text[:20])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 2
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'dead'") == 1
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done") == 0
    # The check is JobFilter's, so the Python API refuses the same values.
    with pytest.raises(aioqueue.ConfigurationError, match="is nan"):
        await q.admin.bulk("delete", JobFilter(args={"a": math.nan}))


async def test_a_bad_id_gets_a_400_naming_it_and_changes_nothing(
    q: aioqueue.Queue, send: aioqueue.Task[..., None], db: asyncpg.Connection
) -> None:
    job_id = await send.enqueue(to="a")
    async with client_for(create_app(q)) as client:
        token = await token_of(client)
        for bad in BAD_IDS:
            for page, params in (("/jobs", {"id": bad}), ("/jobs", {"before": bad}), ("/dead", {"before": bad}),
                                 (f"/jobs/{bad}", {})):
                response = await client.get(page, params=params)
                assert response.status_code == 400 and "job id" in response.text, (page, params, bad[:20])
                assert "9" * 100 not in response.text  # a long id is shown cut short
            for action in ("delete", "cancel", "retry"):
                form = {"action": action, "ids": [str(job_id), bad], "csrf": token, "confirmed": "1"}
                response = await client.post("/actions/jobs", data=form, headers={"origin": SERVED})
                assert response.status_code == 400 and "job id" in response.text, (action, bad[:20])
        # Typed into the jump box with spaces around it: still that job.
        jump = await client.get("/jobs", params={"id": f" {job_id} "}, follow_redirects=False)
        assert jump.status_code == 303 and jump.headers["location"] == f"/jobs/{job_id}"
    assert (await q.get_job(job_id)).status == "pending"  # type: ignore[union-attr]
