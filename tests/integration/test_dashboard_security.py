"""What the dashboard refuses at its doors, over HTTP against a real database: requests for a
host it does not serve and forms from an origin it does not serve (DNS rebinding), credentials
that cannot work, and filters and ids a request carries that PostgreSQL or Python cannot take.
Every refusal names what was wrong and changes nothing."""

from __future__ import annotations

import base64
import math
import secrets
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import aioqueue
from aioqueue._admin import JobFilter
from aioqueue.dashboard import create_app
from tests.support.cli_tools import aioqueue_cli, dashboard_process, free_port
from tests.support.dashboard_tools import SERVED, client_for, csrf, kill


@pytest.fixture
async def send(q: aioqueue.Queue) -> aioqueue.Task[..., None]:
    @q.task(queue="mail")
    async def send(to: str, n: int = 0) -> None:
        pass

    return send


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
        token = await csrf(client)
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
        token = await csrf(client)
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


# -- hosts and origins (DNS rebinding) -----------------------------------------------------------


async def test_a_rebinding_page_can_neither_read_a_token_nor_delete_a_job(
    q: aioqueue.Queue, send: aioqueue.Task[..., None], dsn: str, tmp_path: Path
) -> None:
    """The attack as it happens: ``aioqueue dashboard`` on loopback with no credentials, and a
    page on rebind.evil.example whose name now resolves to 127.0.0.1. The browser sends that
    name as Host and Origin; the page may even have set its own CSRF cookie for its name."""
    job_id = await send.enqueue(to="victim@x")
    async with dashboard_process(dsn, tmp_path) as (client, port):
        evil = f"rebind.evil.example:{port}"
        read = await client.get(f"/jobs/{job_id}", headers={"host": evil})
        assert read.status_code == 400 and "rebind.evil.example" in read.text
        assert 'name="csrf"' not in read.text and "set-cookie" not in read.headers

        minted = secrets.token_urlsafe(32)  # a cookie the page's own server set for its name
        delete = await client.post(
            "/actions/jobs",
            data={"action": "delete", "ids": str(job_id), "csrf": minted, "confirmed": "1"},
            headers={"host": evil, "origin": f"http://{evil}", "cookie": f"aioqueue_csrf={minted}"},
        )
        assert delete.status_code == 400
        assert await q.get_job(job_id) is not None

        # The served names still work, and only forms from the served address act.
        for name in ("127.0.0.1", "localhost"):
            assert (await client.get("/", headers={"host": f"{name}:{port}"})).status_code == 200
        token = await csrf(client)
        form = {"action": "delete", "ids": str(job_id), "csrf": token, "confirmed": "1"}
        other_port = await client.post("/actions/jobs", data=form,
                                       headers={"origin": f"http://127.0.0.1:{free_port()}"})
        assert other_port.status_code == 403
        assert await q.get_job(job_id) is not None
        done = await client.post("/actions/jobs", data=form, headers={"origin": f"http://127.0.0.1:{port}"})
        assert done.status_code == 303
        assert await q.get_job(job_id) is None


async def test_without_credentials_only_loopback_names_on_the_served_port_are_answered(q: aioqueue.Queue) -> None:
    app = create_app(q)
    async with client_for(app) as client:
        for host in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "[::1]:8000", "127.0.0.2:8000"):
            assert (await client.get("/", headers={"host": host})).status_code == 200, host
        for host in ("rebind.evil.example:8000", "127.0.0.1:9000", "127.0.0.1", "localhost.evil.example:8000",
                     "127.1:8000", "0177.0.0.1:8000", "", "127.0.0.1:8000:8000", "[::1:8000", "[::1]"):
            refused = await client.get("/", headers={"host": host})
            assert refused.status_code == 400, host
            assert "127.0.0.1 or localhost or [::1] (or another loopback address) on port 8000" in refused.text
            assert "set-cookie" not in refused.headers
        assert (await client.get("/static/dashboard.js", headers={"host": "rebind.evil.example:8000"})).status_code \
            == 400
    async with client_for(app, "http://localhost") as client:  # port 80: browsers send no port
        assert (await client.get("/")).status_code == 200


async def test_forms_must_come_from_the_served_address(
    q: aioqueue.Queue, send: aioqueue.Task[..., None], db: asyncpg.Connection
) -> None:
    job_id = await send.enqueue(to="a")
    await kill(db, job_id)
    async with client_for(create_app(q)) as client:
        token = await csrf(client)
        form = {"action": "retry", "ids": str(job_id), "csrf": token}
        for headers in ({"origin": "null"}, {"origin": "http://rebind.evil.example:8000"},
                        {"origin": "http://127.0.0.1:9000"}, {"origin": "file://"},
                        {"referer": "http://evil.example/page"}, {"referer": "null"}, {}):
            refused = await client.post("/actions/jobs", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert "origin" in refused.text.lower()
        assert (await q.get_job(job_id)).status == "dead"  # type: ignore[union-attr]
        by_referer = await client.post("/actions/jobs", data=form,
                                       headers={"referer": f"{SERVED}/jobs/{job_id}"})
        assert by_referer.status_code == 303
        assert (await q.get_job(job_id)).status == "pending"  # type: ignore[union-attr]
        await kill(db, job_id)
        # Another served name is the same served address (the browser keeps its own cookie).
        by_name = await client.post("/actions/jobs", data=form, headers={"origin": "http://localhost:8000"})
        assert by_name.status_code == 303


async def test_allowed_hosts_names_what_a_dashboard_behind_a_proxy_answers(
    q: aioqueue.Queue, send: aioqueue.Task[..., None]
) -> None:
    app = create_app(q, allowed_hosts=["queue.internal.example", "Ops.Example:8443"])
    async with client_for(app, "https://queue.internal.example") as client:
        token = await csrf(client)
        done = await client.post("/actions/queues", data={"action": "pause", "queue": "mail", "csrf": token},
                                 headers={"origin": "https://queue.internal.example"})
        assert done.status_code == 303
        assert (await client.get("/", headers={"host": "ops.example:8443"})).status_code == 200
        assert (await client.get("/", headers={"host": "127.0.0.1:443"})).status_code == 400  # not listed
    bad_hosts: list[tuple[Any, str]] = [("localhost:8000", "list"), ([""], "host"), (["http://x.example"], "host"),
                                        (["x.example:99999"], "port"), (["x.example/path"], "host"), ([7], "host"),
                                        ([], "empty")]
    for bad, why in bad_hosts:
        with pytest.raises(aioqueue.ConfigurationError, match=why):
            create_app(q, allowed_hosts=bad)


async def test_with_credentials_any_host_is_answered_and_forms_must_come_from_it(
    q: aioqueue.Queue, send: aioqueue.Task[..., None]
) -> None:
    """Behind a proxy, under a name of its own: a rebinding page gets no credentials, since a
    browser keeps them per name; forms must still come from the host asked for."""
    auth = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    job_id = await send.enqueue(to="a")
    async with client_for(create_app(q, credentials=("ops", "s3cret")), "https://queue.example.com",
                          authorization=auth) as client:
        token = await csrf(client)
        form = {"action": "delete", "ids": str(job_id), "csrf": token, "confirmed": "1"}
        for headers in ({"origin": "null"}, {"origin": "https://evil.example"}, {}):
            assert (await client.post("/actions/jobs", data=form, headers=headers)).status_code == 403, headers
        assert await q.get_job(job_id) is not None
        done = await client.post("/actions/jobs", data=form, headers={"origin": "https://queue.example.com"})
        assert done.status_code == 303
        assert await q.get_job(job_id) is None
