"""The dashboard as an ASGI app, driven over HTTP in process (httpx) against a real database:
every page, filters and keyset pages, actions through Admin with CSRF and confirmation, bulk
actions in batches, escaping of user data, authentication, read-only, and the standalone CLI."""

from __future__ import annotations

import base64
import json
import logging
import re
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from starlette.requests import Request

import aioqueue
from aioqueue._admin import JobFilter
from aioqueue.dashboard import create_app
from tests.support import dashboard_tools
from tests.support.cli_tools import aioqueue_cli, dashboard_process
from tests.support.dashboard_tools import SERVED, csrf, kill

HOSTILE = '<script>alert("x")</script> \' " &amp;'


def client_for(app: Any, prefix: str = "") -> httpx.AsyncClient:
    """A client of ``app`` as a browser on the loopback address it is served at: every request
    says it comes from there (``Origin``), as a browser's forms do."""
    return dashboard_tools.client_for(app, SERVED + prefix, origin=SERVED)


@pytest.fixture
async def tasks(q: aioqueue.Queue) -> dict[str, aioqueue.Task[..., None]]:
    @q.task(queue="mail")
    async def send(to: str, n: int = 0) -> None:
        pass

    @q.task(queue="video")
    async def encode(n: int) -> None:
        pass

    return {"send": send, "encode": encode}


async def test_every_page_renders_mounted_under_a_path_in_fastapi(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    @q.periodic(every=3600, name="hourly")
    async def hourly() -> None:
        pass

    send = tasks["send"]
    ids = [await send.enqueue(to=f"u{i}@x", n=i) for i in range(3)]
    await kill(db, ids[0])
    await q.worker(queues=["video"], concurrency=2).run_until_empty()
    app = FastAPI()
    app.mount("/ops/queue", create_app(q))
    async with client_for(app) as client:
        pages = ["/", "/jobs", "/jobs?status=dead", "/jobs?status=running", "/jobs?status=succeeded",
                 "/jobs?status=cancelled", f"/jobs/{ids[1]}", f"/jobs/{ids[0]}", "/dead", "/periodic", "/workers"]
        for page in pages:
            response = await client.get("/ops/queue" + page)
            assert response.status_code == 200, (page, response.text)
            assert 'href="/ops/queue/jobs"' in response.text  # links stay under the mount path
            assert "default-src 'none'" in response.headers["content-security-policy"]
        queues = (await client.get("/ops/queue/")).text
        assert 'data-queue="mail"' in queues and 'data-queue="video"' in queues  # registered, even if empty
        assert "<svg" in queues
        assert "hourly" in (await client.get("/ops/queue/periodic")).text
        assert (await client.get("/ops/queue/jobs/999999")).status_code == 404
        response = await client.get(f"/ops/queue/jobs?id={ids[2]}", follow_redirects=False)
        assert response.headers["location"] == f"/ops/queue/jobs/{ids[2]}"
        assert (await client.get("/ops/queue/static/dashboard.js")).status_code == 200


async def test_user_data_is_escaped_everywhere(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    @q.task(queue="mail")
    async def note(subject: str, body: dict[str, Any], tags: list[str]) -> None:
        pass

    job_id = await tasks["send"].enqueue(to=HOSTILE)
    await kill(db, job_id, f"ValueError: {HOSTILE}\nTraceback line <b>bold</b>")
    # Hostile text in every argument, in a dict's key and value and in a list, of a second job.
    note_id = await note.enqueue(subject=HOSTILE, body={HOSTILE: HOSTILE}, tags=[HOSTILE, "<b>bold</b>"])
    async with client_for(create_app(q)) as client:
        # (path, query parameters, the status the page must answer): httpx encodes the
        # parameters, so the whole hostile string reaches the app, `&` included.
        pages: list[tuple[str, dict[str, str], int]] = [
            ("/dead", {}, 200),
            (f"/jobs/{job_id}", {}, 200),
            (f"/jobs/{note_id}", {}, 200),
            ("/jobs", {"status": "dead"}, 200),
            ("/jobs", {"status": "pending", "task": note.name}, 200),
            ("/jobs", {"status": "dead", "args": json.dumps({"to": HOSTILE})}, 200),
            ("/jobs", {"args": HOSTILE}, 400),  # not JSON: refused, naming it
            ("/jobs", {"queue": HOSTILE}, 200),
            ("/jobs", {"task": HOSTILE}, 200),
            ("/", {"notice": HOSTILE}, 200),
        ]
        for path, params, status in pages:
            response = await client.get(path, params=params)
            where = (path, params)
            assert response.status_code == status, (where, response.text[:2000])
            text = response.text
            assert "<script>alert" not in text and "<b>bold" not in text, where
        text = (await client.get(f"/jobs/{job_id}")).text
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in text
        assert "&lt;b&gt;bold&lt;/b&gt;" in text
        response = await client.get("/", params={"notice": HOSTILE})
        assert "<script>alert" not in response.text
        # The hostile values are shown, escaped, not dropped: each argument of the second job.
        shown = (await client.get(f"/jobs/{note_id}")).text
        assert shown.count("&lt;script&gt;alert(") >= 4, shown
        listing = (await client.get("/jobs", params={"status": "dead", "args": json.dumps({"to": HOSTILE})})).text
        assert f"/jobs/{job_id}" in listing  # the filter matched the hostile value, whole


async def test_a_sparse_filter_reads_the_bound_and_says_so(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending jobs are read from the primary key: a page whose filter matches few of them reads
    at most PAGE_SCAN rows (20 here), shows what they held, says so and goes on from there."""
    send, encode = tasks["send"], tasks["encode"]
    rare = [await encode.enqueue(n=0)]
    await send.enqueue_many([{"to": "a@x", "n": i} for i in range(30)])
    rare.append(await encode.enqueue(n=1))
    await send.enqueue_many([{"to": "a@x", "n": i} for i in range(10)])
    monkeypatch.setattr("aioqueue._admin.PAGE_SCAN", 20)
    page = await q.admin.list_jobs(JobFilter(status="pending", task=encode.name), limit=5)
    assert [j["id"] for j in page.jobs] == [rare[1]] and page.searched == 20 and page.next_before
    seen = [j["id"] for j in page.jobs]
    before: int | None = page.next_before
    while before is not None:
        more = await q.admin.list_jobs(JobFilter(status="pending", task=encode.name), before=before, limit=5)
        seen, before = seen + [j["id"] for j in more.jobs], more.next_before
    assert seen == [rare[1], rare[0]]  # every match once, newest first
    async with client_for(create_app(q, page_size=5)) as client:
        text = (await client.get("/jobs", params={"task": encode.name})).text
        assert "This page read 20 jobs, the most a page reads, and shows the 1 that match" in text
        assert re.search(r'rel="next" href="[^"]+before=', text)
        full = (await client.get("/jobs")).text
        assert "the most a page reads" not in full  # a full page says nothing of the kind


async def test_filters_and_keyset_pages(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    send, encode = tasks["send"], tasks["encode"]
    mail = [await send.enqueue(to=f"user{i % 3}@x", n=i) for i in range(120)]
    await encode.enqueue_many([{"n": i} for i in range(30)])
    for job_id in mail[:10]:
        await kill(db, job_id)
    admin = q.admin
    seen: list[int] = []
    before = None
    while True:
        page = await admin.list_jobs(JobFilter(status="pending", queue="mail"), before=before, limit=25)
        seen += [j["id"] for j in page.jobs]
        if page.next_before is None:
            break
        before = page.next_before
    assert seen == sorted(mail[10:], reverse=True)  # every one once, newest first
    only = await admin.list_jobs(JobFilter(status="pending", args={"to": "user1@x"}), limit=1000)
    assert {j["id"] for j in only.jobs} == {i for n, i in enumerate(mail) if n % 3 == 1 and n >= 10}
    by_task = await admin.list_jobs(JobFilter(status="pending", task=encode.name), limit=1000)
    assert len(by_task.jobs) == 30
    dead = await admin.list_jobs(JobFilter(status="dead"), limit=1000)
    assert sorted(j["id"] for j in dead.jobs) == mail[:10]
    async with client_for(create_app(q, page_size=50)) as client:
        first = await client.get("/jobs", params={"queue": "mail"})
        assert first.status_code == 200
        more = re.search(r'rel="next" href="([^"]+)"', first.text)
        assert more, "a full page links to the next"
        second = await client.get(more.group(1).replace("&amp;", "&"))
        shown = [int(n) for n in re.findall(r'href="/jobs/(\d+)"', first.text + second.text)]
        assert shown == sorted(mail[10:], reverse=True)[:100]
        contain = await client.get("/jobs", params={"args": '{"to": "user2@x"}'})
        matched = {int(n) for n in re.findall(r'href="/jobs/(\d+)"', contain.text)}
        assert matched == {int(i) for n, i in enumerate(mail) if n % 3 == 2 and n >= 10}
        bad = await client.get("/jobs", params={"args": "[1, 2"})
        assert bad.status_code == 400 and "not JSON" in bad.text


async def test_actions_need_csrf_confirm_destructive_ones_go_through_admin_and_are_logged(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    send = tasks["send"]
    dead_id, pending_id, other_id = [await send.enqueue(to="a", n=i) for i in range(3)]
    await kill(db, dead_id)
    async with client_for(create_app(q)) as client:
        token = await csrf(client, f"/jobs/{dead_id}")
        refused = await client.post("/actions/jobs", data={"action": "retry", "ids": str(dead_id)})
        assert refused.status_code == 403 and "CSRF" in refused.text
        forged = await client.post("/actions/jobs", data={"action": "retry", "ids": str(dead_id), "csrf": token},
                                   headers={"origin": "https://evil.example"})
        assert forged.status_code == 403
        assert (await q.get_job(dead_id)).status == "dead"  # type: ignore[union-attr]

        with caplog.at_level(logging.INFO, logger="aioqueue.dashboard"):
            done = await client.post("/actions/jobs", data={
                "action": "retry", "ids": str(dead_id), "csrf": token, "next": f"/jobs/{dead_id}"})
        assert done.status_code == 303 and done.headers["location"].startswith(f"/jobs/{dead_id}?notice=")
        assert (await q.get_job(dead_id)).status == "pending"  # type: ignore[union-attr]
        assert any("retry" in r.getMessage() and str(dead_id) in r.getMessage() for r in caplog.records)

        ask = await client.post("/actions/jobs", data={"action": "delete", "ids": str(pending_id), "csrf": token})
        assert ask.status_code == 200 and "Confirm" in ask.text and 'name="confirmed" value="1"' in ask.text
        assert await q.get_job(pending_id) is not None  # nothing happened before the confirmation
        gone = await client.post("/actions/jobs", data={
            "action": "delete", "ids": str(pending_id), "csrf": token, "confirmed": "1"})
        assert gone.status_code == 303
        assert await q.get_job(pending_id) is None

        await client.post("/actions/jobs", data={"action": "cancel", "ids": str(other_id), "csrf": token,
                                                 "confirmed": "1"})
        assert (await q.get_job(other_id)).status == "cancelled"  # type: ignore[union-attr]

        offsite = await client.post("/actions/queues", data={
            "action": "pause", "queue": "mail", "csrf": token, "next": "//evil.example/x"})
        assert offsite.headers["location"].startswith("/?notice=")  # never redirected off the app
        assert await q.queue_settings() == [
            {"name": "mail", "paused": True, "concurrency_limit": None, "rate_limit": None, "rate_period": None,
             "fair": False, "key_concurrency_limit": None, "key_rate_limit": None, "key_rate_period": None}]
        await client.post("/actions/queues", data={
            "action": "limits", "queue": "mail", "csrf": token, "concurrency": "3", "rate_count": "10",
            "rate_period": "2"})
        await client.post("/actions/queues", data={"action": "resume", "queue": "mail", "csrf": token})
        assert await q.queue_settings() == [
            {"name": "mail", "paused": False, "concurrency_limit": 3, "rate_limit": 10, "rate_period": 2.0,
             "fair": False, "key_concurrency_limit": None, "key_rate_limit": None, "key_rate_period": None}]
        bad = await client.post("/actions/queues", data={
            "action": "limits", "queue": "mail", "csrf": token, "concurrency": "-1"})
        assert "refused" in bad.headers["location"]


async def test_bulk_actions_over_a_filter_run_in_bounded_batches(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    send, encode = tasks["send"], tasks["encode"]
    await send.enqueue_many([{"to": "x", "n": i} for i in range(2500)])
    await encode.enqueue_many([{"n": i} for i in range(5)])
    await db.execute("UPDATE aioqueue.jobs SET status = 'dead', last_error = 'boom' WHERE queue = 'mail'")
    batches: list[int] = []
    original = q.admin.retry_dead

    async def counting(ids: Any = None, **kw: Any) -> list[int]:
        batches.append(len(list(ids)))
        return await original(ids, **kw)

    q.admin.retry_dead = counting  # type: ignore[method-assign]  # observe the batches, the real call runs
    assert await q.admin.bulk("retry", JobFilter(status="dead", queue="mail"), batch=1000) == 2500
    assert batches == [1000, 1000, 500]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending' AND queue = 'mail'") == 2500

    async with client_for(create_app(q, bulk_batch=700)) as client:
        token = await csrf(client, "/jobs?queue=mail")
        form = {"scope": "filter", "status": "pending", "queue": "mail", "task": "", "args": '{"n": 7}',
                "action": "delete", "csrf": token}
        ask = await client.post("/actions/jobs", data=form)
        assert "Confirm" in ask.text and "every pending job" in ask.text
        await client.post("/actions/jobs", data={**form, "confirmed": "1"})
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE queue = 'mail'") == 2499
        done = await client.post("/actions/jobs", data={**form, "args": "", "action": "cancel", "confirmed": "1"})
        assert "cancel%3A+2499" in done.headers["location"]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 5  # the other queue untouched
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE status = 'cancelled'") == 2499


async def test_read_only_hides_and_refuses_every_action(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    job_id = await tasks["send"].enqueue(to="a")
    await kill(db, job_id)
    async with client_for(create_app(q, read_only=True)) as client:
        for page in ["/", "/dead", f"/jobs/{job_id}", "/jobs?status=dead"]:
            text = (await client.get(page)).text
            assert 'method="post"' not in text and "read-only" in text, page
        token = client.cookies.get("aioqueue_csrf")
        refused = await client.post("/actions/jobs", data={"action": "retry", "ids": str(job_id), "csrf": token})
        assert refused.status_code == 403
        refused = await client.post("/actions/queues", data={"action": "pause", "queue": "mail", "csrf": token})
        assert refused.status_code == 403
    assert (await q.get_job(job_id)).status == "dead"  # type: ignore[union-attr]
    assert await q.queue_settings() == []


async def test_the_auth_hook_decides_per_action(
    q: aioqueue.Queue, tasks: dict[str, aioqueue.Task[..., None]], db: asyncpg.Connection
) -> None:
    job_id = await tasks["send"].enqueue(to="a")
    await kill(db, job_id)

    async def auth(request: Request, action: str) -> bool:
        role = request.headers.get("x-role")
        return role == "admin" or (role == "viewer" and action == "view") or (role == "ops" and action == "retry")

    async with client_for(create_app(q, auth=auth)) as client:
        assert (await client.get("/")).status_code == 403
        client.headers["x-role"] = "viewer"
        token = await csrf(client, f"/jobs/{job_id}")
        denied = await client.post("/actions/jobs", data={"action": "retry", "ids": str(job_id), "csrf": token})
        assert denied.status_code == 403
        client.headers["x-role"] = "ops"
        assert (await client.get("/")).status_code == 403  # may retry, may not look
        denied = await client.post("/actions/jobs", data={"action": "delete", "ids": str(job_id), "csrf": token,
                                                          "confirmed": "1"})
        assert denied.status_code == 403
        allowed = await client.post("/actions/jobs", data={"action": "retry", "ids": str(job_id), "csrf": token})
        assert allowed.status_code == 303
    assert (await q.get_job(job_id)).status == "pending"  # type: ignore[union-attr]


async def test_basic_credentials_from_the_environment(q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_USER", "ops")
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_PASSWORD", "s3cret")
    app = create_app(q)
    assert app.state.dashboard.protected
    async with client_for(app) as client:
        response = await client.get("/")
        assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Basic")
        wrong = base64.b64encode(b"ops:nope").decode()
        assert (await client.get("/", headers={"authorization": f"Basic {wrong}"})).status_code == 401
        right = base64.b64encode(b"ops:s3cret").decode()
        assert (await client.get("/", headers={"authorization": f"Basic {right}"})).status_code == 200
    monkeypatch.delenv("AIOQUEUE_DASHBOARD_PASSWORD")
    with pytest.raises(aioqueue.ConfigurationError, match="both"):
        create_app(q)


async def test_standalone_refuses_a_public_address_without_credentials(dsn: str) -> None:
    status, _out, err = await aioqueue_cli("dashboard", "--host", "0.0.0.0", "--port", "8099", dsn=dsn)
    assert status == 2
    assert "refusing to serve the dashboard on 0.0.0.0" in err and "AIOQUEUE_DASHBOARD_USER" in err


async def test_standalone_serves_on_loopback(dsn: str, tmp_path: Path) -> None:
    async with dashboard_process(dsn, tmp_path) as (client, _port):
        assert "Queues" in (await client.get("/")).text
