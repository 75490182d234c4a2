"""Durable steps, sleeps and event waits: stored once, returned on every later run, fenced by the
claim; sleeps and waits give the slot back and resume on the queue's clock or an event."""

from __future__ import annotations

import datetime
import json
from typing import Any

import anyio
import asyncpg
import pytest
from prometheus_client import CollectorRegistry

import aioqueue
from aioqueue._maintenance import Maintenance
from aioqueue._steps import Suspended
from aioqueue.dashboard import create_app
from aioqueue.metrics import PrometheusMetrics
from aioqueue.testing import Clock, drain
from tests.support.cli_tools import aioqueue_cli
from tests.support.dashboard_tools import SERVED, client_for
from tests.support.helpers import running

HOSTILE = '<script>alert("x")</script>'


async def _steps(db: asyncpg.Connection) -> list[tuple[str, int, str, str]]:
    rows = await db.fetch("SELECT name, occurrence, kind, state FROM aioqueue.job_steps ORDER BY created_at, name")
    return [tuple(r) for r in rows]


async def test_a_completed_step_is_not_run_again_on_retry(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    calls: list[str] = []

    async def charge(amount: int) -> dict[str, Any]:
        calls.append("charge")
        return {"charged": amount, "receipt": (1, 2)}

    async def ship() -> str:
        calls.append("ship")
        if calls.count("ship") == 1:
            raise RuntimeError("carrier down")
        return "shipped"

    @q.task(max_attempts=3)
    async def order(amount: int) -> list[Any]:
        receipt = await aioqueue.step("charge", charge, amount)
        shipped = await aioqueue.step("ship", ship)
        return [receipt, shipped]

    await order.enqueue(amount=5)
    outcomes = [a.outcome for a in await drain(q)]
    assert outcomes[0] == "retried"
    await db.execute("UPDATE aioqueue.jobs SET run_at = now()")  # past the backoff
    attempts = await drain(q)
    assert [a.outcome for a in attempts] == ["succeeded"]
    # The stored result comes back as JSON gives it: the tuple as a list, on both runs.
    assert attempts[0].result == [{"charged": 5, "receipt": [1, 2]}, "shipped"]
    assert calls == ["charge", "ship", "ship"]


async def test_a_name_reached_again_is_a_new_occurrence(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    fetched: list[int] = []

    async def fetch(page: int) -> int:
        fetched.append(page)
        if len(fetched) == 2:
            raise RuntimeError("transient")
        return page * 10

    @q.task(max_attempts=2)
    async def crawl() -> list[int]:
        return [await aioqueue.step("fetch", fetch, page) for page in (1, 2, 3)]

    await crawl.enqueue()
    await drain(q)
    await db.execute("UPDATE aioqueue.jobs SET run_at = now()")
    attempts = await drain(q)
    assert attempts[0].result == [10, 20, 30]
    assert fetched == [1, 2, 2, 3]
    assert await _steps(db) == [("fetch", 1, "step", "done"), ("fetch", 2, "step", "done"),
                                ("fetch", 3, "step", "done")]


async def test_steps_survive_an_interrupted_attempt(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    calls: list[str] = []
    stuck = anyio.Event()

    async def first() -> str:
        calls.append("first")
        return "one"

    @q.task
    async def job() -> str:
        value = await aioqueue.step("first", first)
        if not stuck.is_set():
            stuck.set()
            await anyio.sleep_forever()
        return str(value)

    await job.enqueue()
    worker = q.worker(grace_period=0.1)
    async with running(worker):
        with anyio.fail_after(10):
            await stuck.wait()
    assert await db.fetchval("SELECT status FROM aioqueue.jobs") == "pending"
    attempts = await drain(q)
    assert [(a.outcome, a.result) for a in attempts] == [("succeeded", "one")]
    assert calls == ["first"]


async def test_a_step_commits_with_its_own_writes_on_the_given_connection(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    await db.execute("CREATE TABLE ledger (order_id int PRIMARY KEY, amount int)")
    failures = [True]

    @q.task(max_attempts=3)
    async def book(order_id: int) -> int:
        async with q.connection() as conn:

            async def write() -> int:
                await conn.execute("INSERT INTO ledger VALUES ($1, 5)", order_id)
                if failures and failures.pop():
                    raise RuntimeError("after the write, before the commit")
                return 5

            return int(await aioqueue.step("book", write, connection=conn))

    await book.enqueue(order_id=1)
    assert [a.outcome for a in await drain(q)] == ["retried"]
    # The step's writes rolled back with it: no row, no stored step.
    assert await db.fetchval("SELECT count(*) FROM ledger") == 0
    assert await _steps(db) == []
    await db.execute("UPDATE aioqueue.jobs SET run_at = now()")
    assert [a.outcome for a in await drain(q)] == ["succeeded"]
    assert [tuple(r) for r in await db.fetch("SELECT * FROM ledger")] == [(1, 5)]
    assert await _steps(db) == [("book", 1, "step", "done")]


async def test_a_step_of_an_attempt_that_lost_its_job_is_refused_and_rolled_back(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    await db.execute("CREATE TABLE ledger (order_id int)")
    errors: list[BaseException] = []

    @q.task(max_attempts=1)
    async def book() -> None:
        job = aioqueue.current_job()
        async with q.connection() as conn:

            async def write() -> None:
                await conn.execute("INSERT INTO ledger VALUES (1)")
                # What the reaper does to an attempt whose lease expired (due later here, so that
                # this drain does not run the job again).
                await db.execute(
                    "UPDATE aioqueue.jobs SET status = 'pending', lease_expires_at = NULL,"
                    " run_at = now() + interval '1 day' WHERE id = $1",
                    job.id,
                )

            try:
                await aioqueue.step("book", write, connection=conn)
            except aioqueue.StepNotRecorded as exc:
                errors.append(exc)
                raise

    await book.enqueue()
    await drain(q)
    assert len(errors) == 1 and "no longer holds its job" in str(errors[0])
    assert await db.fetchval("SELECT count(*) FROM ledger") == 0
    assert await _steps(db) == []


async def test_bad_steps_are_refused_at_the_call(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    errors: list[str] = []

    async def unstorable() -> object:
        return object()

    async def fine() -> int:
        return 1

    @q.task(max_attempts=1)
    async def job() -> None:
        for call in (
            lambda: aioqueue.step("", fine),
            lambda: aioqueue.step("x", unstorable),
            lambda: aioqueue.sleep(-1),
            lambda: aioqueue.sleep_until(datetime.datetime(2030, 1, 1)),  # naive on purpose
            lambda: aioqueue.wait_for_event("paid", timeout=float("nan")),
            lambda: aioqueue.wait_for_event("paid", key=5, timeout=1),  # type: ignore[arg-type]
        ):
            with pytest.raises(aioqueue.ConfigurationError) as info:
                await call()
            errors.append(str(info.value))

    await job.enqueue()
    assert [a.outcome for a in await drain(q)] == ["succeeded"]
    assert "non-empty string" in errors[0]
    assert "the result of step 'x'" in errors[1]
    assert "seconds must be 0..10 years" in errors[2]
    assert "aware datetime" in errors[3]
    assert "timeout must be 0..10 years" in errors[4]
    assert "key must be a string" in errors[5]
    assert await _steps(db) == []
    with pytest.raises(aioqueue.AioqueueError, match="inside a running handler"):
        await aioqueue.step("outside", fine)


async def test_a_name_stored_as_a_step_reached_as_a_sleep_is_refused_and_ten_years_is_the_limit(
    q: aioqueue.Queue,
) -> None:
    seen: list[str] = []

    async def fine() -> int:
        return 1

    @q.task(max_attempts=2)
    async def job() -> None:
        if not seen:
            seen.append(str(await aioqueue.step("x", fine)))
            raise RuntimeError("first attempt fails after its step")
        with pytest.raises(aioqueue.AioqueueError) as info:
            await aioqueue.sleep(1, name="x")  # where the first run stored a step
        seen.append(str(info.value))
        with pytest.raises(aioqueue.ConfigurationError, match=r"0\.\.10 years"):
            await aioqueue.sleep(10 * 365 * 86400 + 1)

    await job.enqueue()
    await drain(q)
    async with q.connection() as conn:
        await conn.execute("UPDATE aioqueue.jobs SET run_at = now()")  # the retry, due now
    assert [a.outcome for a in await drain(q)] == ["succeeded"]
    assert seen[0] == "1" and "x" in seen[1]


async def test_a_sleep_gives_the_slot_back_and_resumes_on_the_queue_clock(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    clock = Clock(q, any_schema=True)
    await clock.freeze()
    ran: list[str] = []

    async def mark(what: str) -> str:
        ran.append(what)
        return what

    @q.task(max_attempts=1)  # a sleep spends no attempt: one is enough
    async def remind() -> str:
        await aioqueue.step("before", mark, "before")
        await aioqueue.sleep(3600)
        return str(await aioqueue.step("after", mark, "after"))

    await remind.enqueue()
    assert [a.outcome for a in await drain(q)] == ["snoozed"]
    row = await db.fetchrow("SELECT status, run_at - aioqueue.now() AS left FROM aioqueue.jobs")
    assert row is not None and row["status"] == "pending" and row["left"] == datetime.timedelta(hours=1)
    waits = await q.list_waits()
    assert [(w["kind"], w["name"], w["state"]) for w in waits] == [("sleep", "sleep", "waiting")]
    await clock.advance(minutes=59)
    assert await drain(q) == []
    await clock.advance(minutes=1)
    attempts = await drain(q)
    assert [(a.outcome, a.result) for a in attempts] == [("succeeded", "after")]
    assert ran == ["before", "after"]
    assert await q.list_waits() == []


async def test_a_30_day_sleep_resumes_after_every_worker_restarted(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    clock = Clock(q, any_schema=True)
    start = await clock.freeze()
    done = anyio.Event()

    @q.task
    async def renew() -> None:
        await aioqueue.sleep_until(start + datetime.timedelta(days=30))
        done.set()

    await renew.enqueue()
    assert [a.outcome for a in await drain(q)] == ["snoozed"]
    for _ in range(3):  # workers come and go; each finds nothing due
        await clock.advance(days=9)
        assert await drain(q) == []
    worker = q.worker(poll_interval=1.0)
    async with running(worker):
        await clock.advance(days=3)  # the due time, exactly
        with anyio.fail_after(1.0 + 2.0):  # one poll, and the machine's noise
            await done.wait()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_an_event_wakes_its_waiter_with_its_payload(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def checkout(order: str) -> Any:
        return await aioqueue.wait_for_event("paid", key=order, timeout=86400)

    await checkout.enqueue(order="o-1")
    await checkout.enqueue(order="o-2")
    assert [a.outcome for a in await drain(q)] == ["snoozed", "snoozed"]
    assert [w["event_key"] for w in await q.list_waits(event="paid")] == ["o-1", "o-2"]
    assert await q.send_event("paid", {"amount": 5}, key="o-2") == 1
    assert await q.send_event("paid", key="o-3") == 0  # nobody waits for it: not kept
    attempts = await drain(q)
    assert [(a.args, a.result) for a in attempts] == [({"order": "o-2"}, {"amount": 5})]
    # The other one still waits, out of the way (due at its timeout).
    assert [w["event_key"] for w in await q.list_waits()] == ["o-1"]


async def test_an_event_sent_from_sql_and_in_a_transaction(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    done = anyio.Event()
    results: list[Any] = []

    @q.task
    async def checkout() -> None:
        results.append(await aioqueue.wait_for_event("paid", timeout=86400))
        done.set()

    await checkout.enqueue()
    await drain(q)
    # Sent in a transaction that rolls back: nobody wakes.
    async with q.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        assert await q.send_event("paid", "never", conn=conn) == 1
        await tx.rollback()
    assert await drain(q) == []
    assert [w["state"] for w in await q.list_waits()] == ["waiting"]
    # From SQL, in the sender's transaction: the running worker is woken by its commit.
    async with running(q.worker(poll_interval=60)):
        async with db.transaction():
            assert await db.fetchval("SELECT aioqueue.send_event('paid', NULL, '{\"ok\": true}')") == 1
        with anyio.fail_after(10):  # by NOTIFY: long before the 60 s poll
            await done.wait()
    assert results == [{"ok": True}]


async def test_a_wait_times_out_as_its_handler_chooses(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    clock = Clock(q, any_schema=True)
    await clock.freeze()

    @q.task
    async def checkout() -> str:
        try:
            await aioqueue.wait_for_event("paid", timeout=600)
        except aioqueue.EventTimeout as exc:
            return f"gave up: {exc.event}"
        return "paid"

    await checkout.enqueue()
    await drain(q)
    await clock.advance(seconds=599)
    assert await drain(q) == []
    await clock.advance(seconds=1)
    assert await q.send_event("paid") == 0  # too late: the wait is over by the time it is due
    attempts = await drain(q)
    assert [a.result for a in attempts] == ["gave up: paid"]
    assert await _steps(db) == [("paid", 1, "event", "timed_out")]


async def test_an_event_sent_while_its_waiter_runs_is_not_lost(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    sent: list[int] = []

    @q.task
    async def checkout() -> Any:
        try:
            return await aioqueue.wait_for_event("paid", timeout=86400)
        except Suspended:
            # The event comes after the wait is stored, before the worker puts the job back.
            if not sent:
                sent.append(await q.send_event("paid", 7))
            raise

    await checkout.enqueue()
    attempts = await drain(q)
    assert sent == [1]
    assert [(a.outcome, a.result) for a in attempts] == [("snoozed", None), ("succeeded", 7)]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_operator_views_of_a_jobs_steps(q: aioqueue.Queue) -> None:
    async def one() -> int:
        return 1

    @q.task
    async def job() -> None:
        await aioqueue.step("one", one)
        await aioqueue.wait_for_event("go", key="k", timeout=60)

    ref = await job.enqueue()
    await drain(q)
    steps = await q.job_steps(ref)
    assert [(s.name, s.kind, s.state, s.result, s.event, s.event_key) for s in steps] == [
        ("one", "step", "done", 1, None, None),
        ("go", "event", "waiting", None, "go", "k"),
    ]
    assert steps[1].to_dict()["wake_at"] == steps[1].wake_at.isoformat()  # type: ignore[union-attr]
    with pytest.raises(aioqueue.ConfigurationError, match="non-empty string"):
        await q.send_event("")
    with pytest.raises(aioqueue.ConfigurationError, match="payload"):
        await q.send_event("go", object())
    with pytest.raises(aioqueue.ConfigurationError, match="positive integer"):
        await q.job_steps(0)


async def test_the_command_line_shows_steps_and_waits_and_sends_events(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    async def one() -> dict[str, int]:
        return {"n": 1}

    @q.task(archive=True)
    async def job() -> Any:
        await aioqueue.step("one", one)
        return await aioqueue.wait_for_event("go", key="k", timeout=3600)

    ref = await job.enqueue()
    await drain(q)
    status, out, err = await aioqueue_cli("steps", str(ref), dsn=dsn)
    assert status == 0, err
    assert out.splitlines()[0].split() == ["STEP", "#", "KIND", "STATE", "WAKES", "(UTC)", "RESULT"]
    assert "one" in out and '{"n": 1}' in out and "waiting" in out
    status, out, err = await aioqueue_cli("waits", "--json", dsn=dsn)
    assert status == 0, err
    assert [(w["job_id"], w["event"], w["event_key"]) for w in json.loads(out)] == [(ref, "go", "k")]
    status, out, err = await aioqueue_cli("send-event", "go", "--key", "k", "--payload", '{"x": 2}', dsn=dsn)
    assert status == 0 and "reached 1 waiting job(s)" in out, (out, err)
    status, out, err = await aioqueue_cli("send-event", "go", "--payload", "{oops", dsn=dsn)
    assert status == 2 and "not JSON" in err
    await drain(q)
    assert await ref.result(timeout=10) == {"x": 2}
    status, out, err = await aioqueue_cli("waits", dsn=dsn)
    assert status == 0 and "no job sleeps" in out, (out, err)


async def test_the_dashboard_job_page_shows_steps_and_waits(q: aioqueue.Queue) -> None:
    async def hostile() -> str:
        return HOSTILE

    @q.task
    async def job() -> None:
        await aioqueue.step("greet", hostile)
        await aioqueue.wait_for_event("go", key=HOSTILE, timeout=3600)

    @q.task
    async def plain() -> None:
        pass

    ref = await job.enqueue()
    other = await plain.options(delay=3600).enqueue()
    await drain(q)
    async with client_for(create_app(q), SERVED, origin=SERVED) as client:
        text = (await client.get(f"/jobs/{ref}")).text
        assert 'id="job-steps"' not in (await client.get(f"/jobs/{other}")).text
    assert 'id="job-steps"' in text
    assert "<td>greet</td>" in text and "<td>event</td>" in text and "<td>waiting</td>" in text
    assert "<script>alert" not in text and "&lt;script&gt;" in text


async def test_metrics_count_runs_that_stopped_at_a_sleep(q: aioqueue.Queue) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    q.use(metrics)

    @q.task
    async def nap() -> None:
        await aioqueue.sleep(3600)

    await nap.enqueue()
    await drain(q)
    labels = {"queue": "default", "task": "nap"}
    assert registry.get_sample_value("aioqueue_jobs_suspended_total", labels) == 1
    assert registry.get_sample_value("aioqueue_jobs_failed_total", labels) in (None, 0)


async def test_a_dead_job_retried_resumes_after_its_stored_steps(q: aioqueue.Queue) -> None:
    charged: list[int] = []
    broken = [True]

    async def charge() -> int:
        charged.append(1)
        return 5

    @q.task(max_attempts=1)
    async def order() -> int:
        amount = int(await aioqueue.step("charge", charge))
        if broken:
            raise RuntimeError("the warehouse is down")
        return amount

    ref = await order.enqueue()
    assert [a.outcome for a in await drain(q)] == ["dead"]
    broken.clear()
    assert await q.retry_dead([ref]) == [ref]
    assert [(a.outcome, a.result) for a in await drain(q)] == [("succeeded", 5)]
    assert charged == [1]


async def test_maintenance_prunes_the_steps_of_jobs_that_are_gone(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    async def one() -> int:
        return 1

    @q.task
    async def gone() -> None:
        await aioqueue.step("one", one)

    @q.task(archive=True)
    async def kept() -> None:
        await aioqueue.step("one", one)

    @q.task
    async def asleep() -> None:
        await aioqueue.step("one", one)
        await aioqueue.sleep(3600)

    refs = [await gone.enqueue(), await kept.enqueue(), await asleep.enqueue()]
    await drain(q)
    maintenance = Maintenance(q.database, reap_interval=60, archive_retention=None, prune_batch=1)
    await maintenance.prune_steps()
    stored = await db.fetch("SELECT DISTINCT job_id FROM aioqueue.job_steps ORDER BY job_id")
    assert [r["job_id"] for r in stored] == refs[1:]
    # Far less often than the reaper: a second pass right after reads nothing.
    await db.execute("DELETE FROM aioqueue.jobs_done")
    assert await maintenance.prune_steps() == 0
    assert await db.fetchval("SELECT count(DISTINCT job_id) FROM aioqueue.job_steps") == 2
