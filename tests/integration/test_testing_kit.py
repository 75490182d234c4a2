"""The test kit users test their own code with (aioqueue.testing), and the queue's clock it moves.

Every time aioqueue acts on is read from the schema's ``now()`` (migration 0012): the guards
below hold every statement, function and column default to it (the worker registry excepted),
and check that the planner inlines it, so production plans are unchanged. The clock tests move
it and watch what aioqueue does on its own: a delayed job, a retry's backoff, a periodic slot,
a lease, a rate window and retention come due, through the real statements, in a drain or in a
running worker, without waiting.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue import _queries as queries
from aioqueue.testing import Clock, assert_enqueued, drain, inline, isolated, refute_enqueued
from tests.support.helpers import eventually, prune_archive, running
from tests.support.plans import explain_generic, function_query, nodes, scans

UTC = datetime.UTC
DAY = datetime.timedelta(days=1)
FIXED = datetime.datetime(2030, 1, 1, 10, 30, tzinfo=UTC)

# A reading of a clock in SQL: a function of the current time (qualified or not), or one of the
# SQL keywords that read it.
_TIME = re.compile(
    r"(?:([\w{}]+)\.)?\b(now|clock_timestamp|statement_timestamp|transaction_timestamp|timeofday)\s*\("
    r"|\b(current_timestamp|current_time|current_date|localtimestamp|localtime)\b",
    re.IGNORECASE,
)
#: The statements that read the wall clock (as pg_catalog.now()), and why: the worker registry
#: tells live processes from dead ones by real seconds; the migrations table exists before the
#: queue's clock; the test kit's clock statements compare with it and write it into the clock;
#: the outbox relay's leases and lag are about live processes and real delays too.
WALL_CLOCK = {"create_migrations_table", "register_worker", "list_workers", "clock_state", "redefine_clock",
              "relay_read", "relay_release", "outbox_status"}
#: The columns whose default is the wall clock: the registry's, and when a migration ran.
WALL_CLOCK_COLUMNS = {("workers", "started_at"), ("workers", "last_seen"), ("tasks", "seen_at"),
                      ("migrations", "applied_at"), ("outbox", "created_at")}


def clock_readings(sql: str, schema: str) -> list[str]:
    """Every reading of a clock in ``sql`` other than the queue's clock of ``schema``."""
    out = []
    for found in _TIME.finditer(sql):
        qualifier, function, _ = found.groups()
        if function and function.lower() == "now" and qualifier == schema:
            continue
        out.append(found[0])
    return out


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[aioqueue.Queue]:
    """An application's queue on the test's database (not opened: isolated() opens it)."""
    queue = aioqueue.Queue(dsn)
    try:
        yield queue
    finally:
        await queue.close()


# -- the queue's clock: one function, read by every statement, inlined -----------------------


def test_every_statement_reads_the_queue_clock_but_the_registry() -> None:
    text = resources.files("aioqueue").joinpath("queries.sql").read_text("utf-8")
    wrong = {}
    for name, sql in queries.parse(text).items():
        readings = clock_readings(sql, "{schema}")
        if name in WALL_CLOCK:
            readings = [r for r in readings if r.lower().replace(" ", "") != "pg_catalog.now("]
        if readings:
            wrong[name] = readings
    assert not wrong, f"statements reading another clock than {{schema}}.now(): {wrong}"
    used = {name for name, sql in queries.parse(text).items() if "{schema}.now()" in sql}
    assert {"claim", "fail", "reschedule", "extend_leases", "reap_expired", "enqueue",
            "next_wakeup", "database_now"} <= used


async def test_every_function_and_default_reads_the_queue_clock_but_the_registry(db: asyncpg.Connection) -> None:
    functions = await db.fetch(
        "SELECT p.proname, p.prosrc FROM pg_proc AS p WHERE p.pronamespace = 'aioqueue'::regnamespace"
    )
    bodies = {r["proname"]: r["prosrc"] for r in functions}
    assert bodies.pop("now") == "SELECT pg_catalog.now()"  # the clock itself: the transaction's now()
    wrong = {name: clock_readings(src, "aioqueue") for name, src in bodies.items()}
    # But one: a fair claim's note of the queue's tail lasts a bound of real time (under a frozen
    # queue clock it would last until a job is added, passing over a job retried meanwhile).
    assert wrong.pop("claim_keyed") == ["clock_timestamp("]
    assert not {k: v for k, v in wrong.items() if v}, wrong
    clocked = {name for name, src in bodies.items() if "aioqueue.now()" in src}
    assert {"claim_jobs", "add_job", "add_jobs", "archive_partitions", "archive_retire"} <= clocked
    defaults = await db.fetch(
        "SELECT c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid) AS expr FROM pg_attrdef AS d "
        "JOIN pg_class AS c ON c.oid = d.adrelid "
        "JOIN pg_attribute AS a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
        "WHERE c.relnamespace = 'aioqueue'::regnamespace AND NOT c.relispartition"  # rows go in by the parent
    )
    timed = {(r["relname"], r["attname"]): r["expr"] for r in defaults if _TIME.search(r["expr"])}
    assert {k for k, expr in timed.items() if expr == "aioqueue.now()"} == {
        ("jobs", "run_at"), ("jobs", "created_at"), ("jobs_done", "finished_at"), ("queues", "updated_at"),
        ("periodic", "updated_at"), ("job_groups", "created_at"), ("job_steps", "created_at"),
        ("job_steps", "updated_at"),
    }
    assert {k for k, expr in timed.items() if expr == "now()"} == WALL_CLOCK_COLUMNS


def _index_conditions(plan: dict[str, Any]) -> list[str]:
    return [node["Index Cond"] for node in nodes(plan) if "Index Cond" in node]


async def test_the_planner_inlines_the_clock_so_the_claim_plans_as_before(app: aioqueue.Queue) -> None:
    """The claim's kept (generic) plan reads the ready index up to now(), the function's body
    in place of the call: the plan production ran before the clock existed. Moved, the clock is
    a constant offset the index condition still takes."""
    async with isolated(app), app.connection() as conn:
        sql = await function_query(conn, f"{app.schema}.claim_jobs")
        assert f"{app.schema}.now()" in sql
        types, values = "text[], int[], text, float8, int", "'{default}', '{10}', 'w', 300, 10"
        plan = await explain_generic(conn, sql, types, values)
        assert ("Index Scan", "jobs_ready_idx", "jobs") in scans(plan)
        assert "(run_at <= now())" in " ".join(_index_conditions(plan)), _index_conditions(plan)
        assert ".now()" not in str(plan)  # no call left to the function
        await Clock(app).advance(days=1)
        moved = await explain_generic(conn, sql, types, values)
        assert ("Index Scan", "jobs_ready_idx", "jobs") in scans(moved)
        conditions = " ".join(_index_conditions(moved))
        assert "(run_at <= (now() + '24:00:00'::interval))" in conditions, conditions


# -- isolated: a fresh schema per test ---------------------------------------------------------


async def test_isolated_gives_the_queue_a_fresh_migrated_schema_and_drops_it(
    app: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    other = aioqueue.Queue(dsn)

    @app.task
    async def noop() -> None:
        pass

    @other.task
    async def other_noop() -> None:
        pass

    async with isolated(app) as queue, isolated(other):
        assert queue is app
        schema = app.schema
        assert schema.startswith("aioqueue_test_") and other.schema.startswith("aioqueue_test_")
        assert schema != other.schema
        assert await db.fetchval(f"SELECT max(version) FROM {schema}.migrations") == migrate.latest_version()
        await app.check_schema()
        await noop.enqueue()
        await other_noop.enqueue()
        assert await db.fetchval(f"SELECT count(*) FROM {schema}.jobs") == 1  # the task follows its queue
        assert await db.fetchval(f"SELECT count(*) FROM {other.schema}.jobs") == 1
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
        assert [(a.task, a.outcome) for a in await drain(app)] == [("noop", "succeeded")]
        other_schema = other.schema
        with pytest.raises(aioqueue.AioqueueError, match="already isolated"):
            async with isolated(app):
                pass
    assert app.schema == "aioqueue" and other.schema == "aioqueue"
    assert app.channel == "aioqueue_jobs"
    for gone in (schema, other_schema):
        assert not await db.fetchval("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", gone)
    assert not app.database.is_open  # it was not open before


# -- assert_enqueued / refute_enqueued ---------------------------------------------------------


async def test_assert_enqueued_matches_task_args_queue_priority_and_key(app: aioqueue.Queue) -> None:
    @app.task(queue="mail")
    async def send(to: str, opts: dict[str, Any] | None = None, tags: list[str] | None = None) -> None:
        pass

    async with isolated(app):
        first = await send.enqueue(to="a@x", opts={"lang": "fr", "cc": None}, tags=["x", "y"])
        second = await send.options(priority=5, key="k1", delay=3600).enqueue(to="b@x")
        assert [j.id for j in await assert_enqueued(app, send, args={"to": "a@x"})] == [first]
        assert [j.id for j in await assert_enqueued(app, "send", args={"opts": {"lang": "fr"}})] == [first]
        assert [j.id for j in await assert_enqueued(app, args={"tags": ("x", "y")})] == [first]  # as JSON stores it
        found = await assert_enqueued(app, app.by_name("send"), queue="mail", priority=5, key="k1")
        assert [j.id for j in found] == [second] and found[0].args == {"to": "b@x"}
        assert len(await assert_enqueued(app, send, count=2)) == 2
        await refute_enqueued(app, send, args={"to": "c@x"})
        await refute_enqueued(app, send, queue="default")
        await refute_enqueued(app, args={"tags": ["x"]})  # a list must be equal, not a part
        await refute_enqueued(app, args={"opts": {"lang": "de"}})

        with pytest.raises(AssertionError) as failed:
            await assert_enqueued(app, send, args={"to": "c@x"})
        message = str(failed.value)
        assert "expected a pending job of task 'send' with args containing {'to': 'c@x'}; found 0" in message
        assert f"job {first}: task 'send' queue 'mail' args" in message and f"job {second}:" in message
        with pytest.raises(AssertionError, match="expected 1 pending job"):
            await assert_enqueued(app, send, count=1)
        with pytest.raises(AssertionError, match=rf"(?s)expected no pending job of task 'send'.*job {first}:"):
            await refute_enqueued(app, send, args={"to": "a@x"})
        with pytest.raises(aioqueue.ConfigurationError, match="args must be values JSON can hold"):
            await assert_enqueued(app, args={"to": object()})
        with pytest.raises(aioqueue.ConfigurationError, match="task must be a task"):
            await assert_enqueued(app, 3)  # type: ignore[arg-type]

        await drain(app)  # the first runs and is gone; the second is due in an hour
        await refute_enqueued(app, send, args={"to": "a@x"})
        await assert_enqueued(app, send, args={"to": "b@x"})


# -- drain -------------------------------------------------------------------------------------


async def test_drain_reports_every_attempt_and_how_it_ended(app: aioqueue.Queue) -> None:
    @app.task
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(retry=aioqueue.Backoff(base=600))
    async def flaky() -> None:
        raise ValueError("boom")

    @app.task
    async def give_up() -> None:
        raise aioqueue.Abort("not worth it")

    @app.task
    async def not_yet() -> None:
        raise aioqueue.Snooze(60)

    @app.task
    async def fan_out(n: int) -> None:
        await add.enqueue(a=n, b=n)

    async with isolated(app):
        ids = [await add.enqueue(a=1, b=2), await flaky.enqueue(), await give_up.enqueue(), await not_yet.enqueue(),
               await fan_out.enqueue(n=5), await app.enqueue_by_name("nobody_serves_it", {}, queue="default")]
        ran = await drain(app)
        assert [(a.task, a.outcome, a.attempt) for a in ran] == [
            ("add", "succeeded", 1), ("flaky", "retried", 1), ("give_up", "dead", 1), ("not_yet", "snoozed", 1),
            ("fan_out", "succeeded", 1), ("add", "succeeded", 1), ("nobody_serves_it", "dead", 1),
        ]
        assert [a.id for a in ran[:5]] == ids[:5] and ran[6].id == ids[5]
        assert ran[0].result == 3 and ran[0].args == {"a": 1, "b": 2} and ran[5].result == 10
        assert isinstance(ran[1].error, ValueError) and str(ran[1].error) == "boom"
        assert isinstance(ran[2].error, aioqueue.Abort) and isinstance(ran[3].error, aioqueue.Snooze)
        assert isinstance(ran[6].error, aioqueue.JobFailed)
        assert ran[6].error.last_error is not None and ran[6].error.last_error.startswith("UnknownTask")
        assert await drain(app) == []  # the retry and the snooze are due later

        await flaky.enqueue()
        with pytest.raises(ValueError, match="boom"):
            await drain(app, raise_errors=True)


# -- the clock: what comes due when it moves ----------------------------------------------------


async def test_a_job_delayed_by_a_day_runs_once_the_clock_moves_a_day(app: aioqueue.Queue) -> None:
    @app.task
    async def report() -> str:
        return "sent"

    async with isolated(app):
        clock = Clock(app)
        job = await report.options(delay=86400).enqueue()
        assert await drain(app) == []
        await clock.advance(hours=23, minutes=59)
        assert await drain(app) == []
        await clock.advance(minutes=1)
        assert [(a.id, a.outcome, a.result) for a in await drain(app)] == [(job, "succeeded", "sent")]


async def test_a_retry_runs_when_the_clock_passes_its_backoff(app: aioqueue.Queue) -> None:
    calls = []

    @app.task(max_attempts=3, retry=aioqueue.Backoff(base=600, factor=2, jitter=0))
    async def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")

    async with isolated(app):
        clock = Clock(app)
        start = await clock.freeze(FIXED)
        job = await flaky.enqueue()
        assert [a.outcome for a in await drain(app)] == ["retried"]
        info = await job.info()
        assert info is not None and info.run_at == start + datetime.timedelta(seconds=600)  # backoff, exactly
        await clock.advance(599.999999)
        assert await drain(app) == []  # frozen: the backoff never runs out by itself
        await clock.advance(datetime.timedelta(microseconds=1))
        assert [(a.attempt, a.outcome) for a in await drain(app)] == [(2, "retried")]
        await clock.advance(1200)  # the second backoff: base * factor
        assert [(a.attempt, a.outcome) for a in await drain(app)] == [(3, "succeeded")]


async def test_a_periodic_slot_runs_when_the_clock_reaches_it(app: aioqueue.Queue, db: asyncpg.Connection) -> None:
    ran = []

    @app.periodic(every=3600)
    async def hourly() -> None:
        ran.append(aioqueue.current_job().id)

    async with isolated(app):  # starts the schedule at the queue's time, as a worker would
        clock = Clock(app)
        await clock.freeze(FIXED)  # later than the start: the 10:00 slot is missed, and runs once
        assert [a.task for a in await drain(app)] == ["hourly"]
        assert await drain(app) == []
        await clock.advance(minutes=29)
        assert await drain(app) == []
        await clock.advance(minutes=1)  # 11:00
        assert [a.task for a in await drain(app)] == ["hourly"]
        await clock.advance(hours=3)  # three slots: the newest runs once (missed="once")
        assert [a.task for a in await drain(app)] == ["hourly"]
        last = await db.fetchval(f"SELECT last_slot FROM {app.schema}.periodic WHERE name = 'hourly'")
        assert last == datetime.datetime(2030, 1, 1, 14, tzinfo=UTC)
        assert len(ran) == 3


async def test_an_expired_lease_is_reaped_when_the_clock_passes_it(app: aioqueue.Queue) -> None:
    @app.task
    async def work() -> None:
        pass

    async with isolated(app):
        clock = Clock(app)
        job = await work.enqueue()
        # A worker claims it with a 60-second lease, as workers do, and dies: nobody renews it.
        async with app.connection() as conn:
            claimed = await conn.fetch(app.queries.claim_unlimited, ["default"], [1], "crashed", 60.0, 1, None)
        assert [r["id"] for r in claimed] == [job]
        assert await drain(app) == []  # its lease holds: not ours to run
        await clock.advance(seconds=61)
        assert [(a.id, a.attempt, a.outcome) for a in await drain(app)] == [(job, 2, "succeeded")]


async def running_jobs(app: aioqueue.Queue, n: int) -> bool:
    async with app.connection() as conn:
        return bool(await conn.fetchval(f"SELECT count(*) = $1 FROM {app.schema}.jobs WHERE status = 'running'", n))


async def test_a_rate_window_passes_when_the_clock_moves(app: aioqueue.Queue) -> None:
    first = anyio.Event()

    @app.task
    async def call_api(n: int) -> None:
        first.set()

    async with isolated(app):
        clock = Clock(app)
        await app.set_limits("default", rate=(1, 3600))
        await call_api.enqueue_many([{"n": 1}, {"n": 2}])
        ran: list[Any] = []

        async def drained() -> None:
            ran.extend(await drain(app))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(drained)
                # The limit holds the second back for an hour of the queue's time, and the drain
                # waits for it (as run_until_empty does) until the clock moves. The clock moves
                # once the first job's outcome is written: an hour on, a lease still held would
                # have expired, and the worker's reaper (its start-up pass may still be to come)
                # would rightly take the first job back.
                await first.wait()
                await eventually(lambda: running_jobs(app, 0), what="the first job's outcome written")
                await clock.advance(hours=1)
        assert [(a.args, a.outcome) for a in ran] == [({"n": 1}, "succeeded"), ({"n": 2}, "succeeded")]


async def test_retention_prunes_the_archive_by_the_queue_clock(app: aioqueue.Queue) -> None:
    """The archive's days are made, and dropped, by the queue's clock: moved two days on, the
    partition of the job's day is past an hour's retention, and goes with the job."""

    @app.task(archive=True)
    async def keep() -> int:
        return 1

    async with isolated(app):
        clock = Clock(app)
        await clock.advance(days=2)  # past the upgrade's partition (to the next midnight)
        async with app.connection() as conn:
            assert await conn.fetchval(app.queries.archive_partitions, 2) >= 1
        await keep.enqueue()
        await drain(app)
        async with app.connection() as conn:
            job_day = await conn.fetchval(f"SELECT tableoid::regclass::text FROM {app.schema}.jobs_done")
            assert job_day.startswith(f"{app.schema}.jobs_done_2")  # a day's own partition
            # Retention runs one caller at a time (the drain's worker may still be finishing a
            # pass: then this one does nothing and the next does it).
            await eventually(lambda: _retired(conn, app, f"{app.schema}.jobs_done_legacy"), timeout=20,
                             what="the partitions before the job's day to be dropped")
            assert await conn.fetchval(f"SELECT count(*) FROM {app.schema}.jobs_done") == 1
            await clock.advance(days=2)
            await conn.fetchval(app.queries.archive_partitions, 2)
            await eventually(lambda: _retired(conn, app, job_day), timeout=20, what="the job's day to be dropped")
            assert await conn.fetchval(f"SELECT count(*) FROM {app.schema}.jobs_done") == 0


async def _retired(conn: Any, app: aioqueue.Queue, partition: str) -> bool:
    """Run retention (an hour) once; whether ``partition`` is gone. It never deletes a row."""
    _, deleted = await prune_archive(conn, app.queries.prune_archive, 3600.0, 100)
    assert deleted == 0
    return await conn.fetchval(f"SELECT to_regclass('{partition}')") is None


async def test_a_kept_claim_plan_sees_the_clock_move(app: aioqueue.Queue) -> None:
    """claim_jobs keeps its generic plan for the life of the connection; redefining the clock
    invalidates it (the plan depends on the function it inlined), so the same connection's next
    claim reads the new time."""

    @app.task
    async def later() -> None:
        pass

    async with isolated(app):
        job = await later.options(delay=86400).enqueue()
        args = (["default"], [1], "w", 60.0, 1, None)
        async with app.connection() as conn:
            for _ in range(8):  # past the executions after which a plan is kept
                assert await conn.fetch(app.queries.claim_unlimited, *args) == []
            await Clock(app).advance(days=1)  # on another of the pool's connections
            assert [r["id"] for r in await conn.fetch(app.queries.claim_unlimited, *args)] == [job]


async def test_a_running_worker_wakes_when_the_clock_moves(app: aioqueue.Queue) -> None:
    done = anyio.Event()

    @app.task
    async def report() -> None:
        done.set()

    async with isolated(app):
        clock = Clock(app)
        await report.options(delay=86400).enqueue()
        # A poll far past the wait below: only the clock's notification can wake it in time.
        async with running(app.worker(poll_interval=60, install_signal_handlers=False)):
            await clock.advance(days=1)
            with anyio.fail_after(10):
                await done.wait()


async def test_freeze_travel_and_reset(app: aioqueue.Queue, db: asyncpg.Connection) -> None:
    async with isolated(app):
        clock = Clock(app)
        assert abs(await clock.now() - await db.fetchval("SELECT now()")) < datetime.timedelta(seconds=5)
        assert await clock.freeze(FIXED) == FIXED
        assert await clock.now() == FIXED and await clock.now() == FIXED  # it stands still
        assert await clock.advance(days=1) == FIXED + DAY
        assert await clock.travel_to(FIXED) == FIXED  # frozen, it stays where it travels
        assert await clock.now() == FIXED
        body = await db.fetchval(f"SELECT prosrc FROM pg_proc WHERE oid = '{app.schema}.now()'::regprocedure")
        assert body == "SELECT '2030-01-01T10:30:00.000000Z'::timestamptz"

        await clock.reset()
        body = await db.fetchval(f"SELECT prosrc FROM pg_proc WHERE oid = '{app.schema}.now()'::regprocedure")
        assert body == "SELECT pg_catalog.now()"  # as migration 0012 made it
        assert abs(await clock.now() - await db.fetchval("SELECT now()")) < datetime.timedelta(seconds=5)

        arrived = await clock.travel_to(FIXED)  # running: from there on
        assert abs(arrived - FIXED) < datetime.timedelta(seconds=1)
        later = await clock.advance(days=1)
        assert FIXED + DAY <= later < FIXED + DAY + datetime.timedelta(seconds=5)
        assert await clock.now() >= later


async def test_the_clock_refuses_bad_input_and_real_schemas(app: aioqueue.Queue, db: asyncpg.Connection) -> None:
    async with isolated(app):
        clock = Clock(app)
        with pytest.raises(aioqueue.ConfigurationError, match="delta must not be negative"):
            await clock.advance(-1)
        with pytest.raises(aioqueue.ConfigurationError, match="delta must be a number of seconds"):
            await clock.advance(True)
        with pytest.raises(aioqueue.ConfigurationError, match="delta must be a number of seconds"):
            await clock.advance(float("nan"))
        with pytest.raises(aioqueue.ConfigurationError, match="days must be a number of days"):
            await clock.advance(days="1")  # type: ignore[arg-type]
        with pytest.raises(aioqueue.ConfigurationError, match="hours must not be negative"):
            await clock.advance(hours=-2)
        with pytest.raises(aioqueue.ConfigurationError, match="past the years 1 to 9999"):
            await clock.advance(days=10**7)
        with pytest.raises(aioqueue.ConfigurationError, match="when must be an aware datetime"):
            await clock.travel_to(datetime.datetime(2030, 1, 1))
        with pytest.raises(aioqueue.ConfigurationError, match="at must be an aware datetime"):
            await clock.freeze("2030-01-01")  # type: ignore[arg-type]
        assert abs(await clock.now() - await db.fetchval("SELECT now()")) < datetime.timedelta(seconds=5)

    # The queue's own schema, not one isolated() made: moving it would run every delayed job.
    with pytest.raises(aioqueue.AioqueueError, match=r"only a schema made by aioqueue\.testing\.isolated"):
        await Clock(app).advance(days=1)
    assert await db.fetchval("SELECT prosrc FROM pg_proc WHERE oid = 'aioqueue.now()'::regprocedure") == (
        "SELECT pg_catalog.now()"
    )
    mine = Clock(app, any_schema=True)  # a test database of one's own
    assert await mine.advance(days=1) - await db.fetchval("SELECT now()") > DAY - datetime.timedelta(seconds=5)
    await mine.reset()


# -- inline mode -------------------------------------------------------------------------------


async def test_inline_runs_what_an_enqueue_commits_before_it_returns(app: aioqueue.Queue) -> None:
    seen: list[int] = []

    @app.task
    async def welcome(user: int) -> str:
        seen.append(user)
        await follow_up.enqueue(user=user)
        return "hi"

    @app.task
    async def follow_up(user: int) -> None:
        seen.append(-user)

    async with isolated(app), inline(app) as ran:
        await welcome.enqueue(user=1)
        assert seen == [1, -1]  # the job, and the one its handler enqueued, before the call returned
        assert [(a.task, a.outcome, a.result) for a in ran] == [("welcome", "succeeded", "hi"),
                                                                ("follow_up", "succeeded", None)]
        await refute_enqueued(app)

        # In the caller's transaction, the job cannot run before the commit, nor does it at the commit.
        async with app.connection() as conn, conn.transaction():
            await welcome.options(conn=conn).enqueue(user=2)
            assert seen == [1, -1]
        assert seen == [1, -1]
        await assert_enqueued(app, welcome, args={"user": 2})

        # Due later: not run now; the next enqueue that commits runs what is ready, user 2 too.
        await welcome.options(delay=60).enqueue(user=3)
        assert seen == [1, -1, 2, -2]
        await assert_enqueued(app, welcome, args={"user": 3})
        await Clock(app).advance(minutes=1)
        await welcome.enqueue_many([{"user": 4}])
        assert sorted(seen[4:]) == [-4, -3, 3, 4]  # in claim order: 3 and 4 were due first
        await refute_enqueued(app)
    assert app._after_enqueue is None  # production's enqueue again


async def test_inline_can_raise_a_handlers_error_from_the_enqueue(app: aioqueue.Queue) -> None:
    @app.task(retry=aioqueue.Backoff(base=600))
    async def fragile() -> None:
        raise ValueError("broken")

    async with isolated(app):
        async with inline(app) as ran:
            await fragile.enqueue()  # the error is the job's, as in production: the call returns
            assert [(a.outcome, type(a.error)) for a in ran] == [("retried", ValueError)]
        async with inline(app, raise_errors=True):
            with pytest.raises(ValueError, match="broken"):
                await fragile.enqueue()
            with pytest.raises(RuntimeError, match="already on"):
                async with inline(app):
                    pass
        assert len(await assert_enqueued(app, fragile)) == 2  # both retry later, as in production
