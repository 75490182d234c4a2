"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver)
driven by selenium loads every page served by uvicorn against a real database with real jobs,
retries a dead job, pauses a queue and sees the worker stop claiming it, and finds no console
error. It takes the screenshots of docs/howto/dashboard.md (written to docs/ with AIOQUEUE_UPDATE_SCREENSHOTS=1).
A missing Chromium fails the test: it never skips."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import aioqueue
from aioqueue.dashboard import create_app
from tests.support.helpers import eventually, running

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Set to 1 to write the screenshots into docs/ for the documentation (otherwise into the test's tmp_path).
UPDATE_SCREENSHOTS = os.environ.get("AIOQUEUE_UPDATE_SCREENSHOTS") == "1"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,860")
WAIT = 15.0


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port, in a thread with its own event loop."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT)


@contextlib.contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with tempfile.TemporaryDirectory(prefix="aioqueue-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(WAIT)
            yield driver
        finally:
            driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [e["message"] for e in entries if e["level"] in ("SEVERE", "ERROR")]


def wait(driver: webdriver.Chrome, check: Callable[[webdriver.Chrome], Any], what: str) -> Any:
    return WebDriverWait(driver, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(check, what)


def click(driver: webdriver.Chrome, css: str) -> None:
    """Click ``css``; the page refreshes itself, so find it afresh until the click lands."""

    def attempt(d: webdriver.Chrome) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, WebDriverException):
            return False

    wait(driver, attempt, f"a click on {css}")


async def test_the_dashboard_in_chromium(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    shots = DOCS if UPDATE_SCREENSHOTS else tmp_path
    @q.task(queue="mail")
    async def send(to: str, subject: str = "") -> None:
        pass

    @q.task(queue="reports", max_attempts=1)
    async def build(name: str) -> None:
        raise ValueError(f"cannot build <{name}>: the \"source\" table is gone")

    @q.periodic(every=300, name="nightly-digest")
    async def digest() -> None:
        pass

    await send.enqueue_many([{"to": f"user{i}@example.com", "subject": "welcome"} for i in range(240)])
    await q.worker(queues=["mail"], concurrency=20).run_until_empty()  # real throughput for the chart
    dead_id = await build.enqueue(name='<script>alert("q")</script>')
    await q.worker(queues=["reports"]).run_until_empty()  # fails once and dies: a real traceback
    assert (await q.get_job(dead_id)).status == "dead"  # type: ignore[union-attr]
    await build.options(delay=3600).enqueue(name="later")
    await send.enqueue_many([{"to": f"late{i}@example.com"} for i in range(12)])

    served = aioqueue.Queue(dsn)
    served.periodics.update(q.periodics)
    app = create_app(served, refresh=1.0)
    worker = q.worker(queues=["mail"], concurrency=4, name="mail-worker-1")
    async with running(worker):
        await eventually(lambda: _no_pending(db, "mail"), timeout=WAIT, what="the mail backlog to drain")
        with serve(app) as base, chromium() as driver:
            driver.get(base + "/")
            wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"]'), "the queues table")
            shots.mkdir(exist_ok=True)
            assert driver.save_screenshot(str(shots / "dashboard-queues.png"))
            for page, heading in [("/jobs", "Jobs"), ("/jobs?status=succeeded", "Jobs"), ("/dead", "Dead jobs"),
                                  ("/periodic", "Periodic schedules"), ("/workers", "Workers"),
                                  (f"/jobs/{dead_id}", f"Job {dead_id}")]:
                driver.get(base + page)
                wait(driver, _heading_starts(heading), page)
                assert console_errors(driver) == [], page
            assert "nightly-digest" in _page(driver, base + "/periodic")
            assert "mail-worker-1" in _page(driver, base + "/workers")

            driver.get(base + f"/jobs/{dead_id}")
            error = driver.find_element(By.ID, "job-error").text
            assert 'ValueError: cannot build <<script>alert("q")</script>>' in error  # shown as text, not run
            assert driver.save_screenshot(str(shots / "dashboard-job.png"))

            # Retry the dead job with its button; the page comes back showing it pending.
            click(driver, 'button[data-action="retry"]')
            wait(driver, lambda d: d.find_element(By.ID, "job-status").text == "pending", "the job to be pending")
            assert (await q.get_job(dead_id)).status == "pending"  # type: ignore[union-attr]

            # The page refreshes itself: a job enqueued now appears without a reload.
            driver.get(base + "/jobs?queue=reports")
            fresh = await build.enqueue(name="fresh")
            wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'a[href="/jobs/{fresh}"]'), "auto-refresh")

            # Pause the mail queue: the worker keeps claiming, but nothing from mail.
            driver.get(base + "/")
            click(driver, 'tr[data-queue="mail"] button[data-action="pause"]')
            wait(driver, lambda d: "paused" in d.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"]').text,
                 "the queue to show paused")
            assert worker.producer is not None
            held = await send.enqueue(to="paused@example.com")
            claims = worker.producer.statements
            await eventually(lambda: worker.producer is not None and worker.producer.statements >= claims + 2,
                             timeout=WAIT, what="two claims after the pause")
            assert (await q.get_job(held)).status == "pending"  # type: ignore[union-attr]
            click(driver, 'tr[data-queue="mail"] button[data-action="resume"]')
            await eventually(lambda: _gone(q, held), timeout=WAIT, what="the resumed queue's job to run")
            assert console_errors(driver) == []


def _heading_starts(text: str) -> Callable[[webdriver.Chrome], bool]:
    return lambda d: bool(d.find_element(By.TAG_NAME, "h1").text.startswith(text))


def _page(driver: webdriver.Chrome, url: str) -> str:
    driver.get(url)
    return str(driver.find_element(By.TAG_NAME, "main").text)


async def _no_pending(db: asyncpg.Connection, queue: str) -> bool:
    return not await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE queue = $1 AND status = 'pending'", queue)


async def _gone(q: aioqueue.Queue, job_id: int) -> bool:
    return await q.get_job(job_id) is None


