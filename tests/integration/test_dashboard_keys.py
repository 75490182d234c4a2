"""The dashboard's queue page and key filter against a real database: the busiest keys of a
queue with their running jobs against the per-key limit, the job listing and bulk actions
filtered by key, and hostile keys and queue names escaped everywhere."""

from __future__ import annotations

import re

import asyncpg
import httpx

import aioqueue
from aioqueue.dashboard import create_app
from tests.support import dashboard_tools
from tests.support.dashboard_tools import SERVED, csrf

HOSTILE = '<script>alert("x")</script> \' " &amp; ?#/'


def client_for(q: aioqueue.Queue) -> httpx.AsyncClient:
    return dashboard_tools.client_for(create_app(q), SERVED, origin=SERVED)


def job_links(page: str) -> set[int]:
    return {int(n) for n in re.findall(r'href="/jobs/(\d+)"', page)}


async def test_the_queue_page_shows_the_busiest_keys_against_the_per_key_limit(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    @q.task(queue="sync")
    async def sync(account: str) -> None:
        pass

    await q.set_key_limits("sync", concurrency=1)
    acme = await sync.options(partition_key="acme").enqueue_many([{"account": "acme"}] * 3)
    globex = await sync.options(partition_key="globex").enqueue(account="globex")
    await db.execute("UPDATE aioqueue.jobs SET status = 'running', locked_by = 'w1' WHERE id = $1", acme[0])
    async with client_for(q) as client:
        queues = (await client.get("/")).text
        assert 'href="/queue?name=sync"' in queues
        page = await client.get("/queue", params={"name": "sync"})
        assert page.status_code == 200, page.text
        rows = re.findall(r'<tr data-key="([^"]+)">(.*?)</tr>', page.text, re.S)
        assert [key for key, _ in rows] == ["acme", "globex"]
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)]
        assert cells == ["acme", "1 / 1", "2", "2"]  # running at its limit, two held back
        assert 'class="num at-limit"' in rows[0][1] and "at-limit" not in rows[1][1]
        assert "≤ 1 running per key" in page.text and "keys in turn" in page.text
        # Each key links to its jobs: the listing filtered by key shows those and no other.
        assert 'href="/jobs?queue=sync&amp;key=acme"' in page.text
        listing = (await client.get("/jobs", params={"queue": "sync", "key": "acme"})).text
        assert job_links(listing) == set(acme[1:]) and 'value="acme"' in listing
        running = (await client.get("/jobs", params={"queue": "sync", "key": "acme", "status": "running"})).text
        assert job_links(running) == {acme[0]}
        assert job_links((await client.get("/jobs", params={"key": "globex"})).text) == {globex}
        # A bulk action over the filter acts on that key's jobs only.
        token = await csrf(client, "/jobs?key=acme")
        form = {"scope": "filter", "status": "pending", "queue": "sync", "task": "", "args": "", "key": "acme",
                "action": "cancel", "csrf": token}
        ask = await client.post("/actions/jobs", data=form)
        assert "every pending job" in ask.text and "key=&#39;acme&#39;" in ask.text
        done = await client.post("/actions/jobs", data={**form, "confirmed": "1"})
        assert "cancel%3A+2" in done.headers["location"]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 1  # globex's


async def test_hostile_keys_and_queue_names_are_escaped_and_bad_ones_refused(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    @q.task(queue=HOSTILE)
    async def note(n: int) -> None:
        pass

    ids = await note.options(partition_key=HOSTILE).enqueue_many([{"n": 1}, {"n": 2}])
    other = await note.options(partition_key="plain").enqueue(n=3)
    async with client_for(q) as client:
        pages: list[tuple[str, dict[str, str], int]] = [
            ("/", {}, 200),
            ("/queue", {"name": HOSTILE}, 200),
            ("/jobs", {"queue": HOSTILE, "key": HOSTILE}, 200),
            ("/jobs", {"key": HOSTILE, "status": "running"}, 200),
            ("/jobs", {"key": HOSTILE, "status": "dead"}, 200),
            (f"/jobs/{ids[0]}", {}, 200),
            ("/jobs", {"key": HOSTILE, "status": "succeeded"}, 400),  # the archive keeps no key
            ("/jobs", {"key": "a\x00b"}, 400),
            ("/jobs", {"key": "k" * 256}, 400),
            ("/queue", {"name": ""}, 400),
            ("/queue", {"name": HOSTILE, "top": HOSTILE}, 400),
            ("/queue", {"name": HOSTILE, "top": "101"}, 400),
        ]
        for path, params, status in pages:
            response = await client.get(path, params=params)
            where = (path, params)
            assert response.status_code == status, (where, response.text[:2000])
            assert "<script>alert" not in response.text, where
        page = (await client.get("/queue", params={"name": HOSTILE})).text
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page  # shown, escaped, not dropped
        assert page.count('<tr data-key="') == 2
        # The key's link carries it whole (encoded), so the listing finds its jobs and no other.
        link = re.search(r'<tr data-key="[^"]+">\s*<td><a href="([^"]+)"', page)
        assert link is not None
        listing = (await client.get(link.group(1).replace("&amp;", "&"))).text
        assert job_links(listing) == set(ids) and other not in job_links(listing)
        refused = (await client.get("/jobs", params={"key": HOSTILE, "status": "succeeded"})).text
        assert "the archive keeps no partition key" in refused
