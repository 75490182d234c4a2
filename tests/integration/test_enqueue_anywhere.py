"""Enqueue from anywhere: SQLAlchemy, psycopg (async and sync), Django, by name, and SQL, each in
the caller's transaction, each writing the row the asyncpg path writes."""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import aioqueue
from tests.support.django_db import django_connection
from tests.support.pg import fetchval_once

RUN_AT = datetime.datetime(2031, 5, 1, 12, tzinfo=datetime.UTC)
COLUMNS = "queue, task, args::text, status, priority, run_at, attempts, max_attempts, dedup_key, archive, last_error"


def _sa_url(dsn: str, driver: str = "asyncpg") -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


@pytest.fixture
async def engine(dsn: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(_sa_url(dsn))
    try:
        yield eng
    finally:
        await eng.dispose()


class Listener:
    """Collects the payloads of a queue's wake-up channels: ``<schema>_jobs`` (a queue name, for
    jobs ready now) and ``<schema>_due`` (``'seconds queue'``, for jobs due later).
    ``settled()`` sends a marker and waits for it, so every notification committed before is in
    ``received``."""

    def __init__(self, conn: asyncpg.Connection, channel: str) -> None:
        self.conn, self.channel = conn, channel
        self.received: list[str] = []
        self._marker = anyio.Event()

    def on(self, _c: object, _pid: int, _ch: str, payload: object) -> None:
        assert isinstance(payload, str)
        if payload == "marker":
            self._marker.set()
        else:
            self.received.append(payload)

    async def settled(self) -> list[str]:
        self._marker = anyio.Event()
        await self.conn.execute("SELECT pg_notify($1, 'marker')", self.channel)
        with anyio.fail_after(5):
            await self._marker.wait()
        return self.received


@pytest.fixture
async def listener(dsn: str, q: aioqueue.Queue) -> AsyncIterator[Listener]:
    conn = await asyncpg.connect(dsn)
    found = Listener(conn, q.channel)
    await conn.add_listener(q.channel, found.on)
    await conn.add_listener(q.database.channels.due, found.on)
    try:
        yield found
    finally:
        await conn.close()


def _register(q: aioqueue.Queue) -> aioqueue.Task[..., None]:
    @q.task(queue="mail", name="billing.charge")
    async def charge(amount: int, note: str = "") -> None:
        pass

    return charge


async def _jobs(db: asyncpg.Connection) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await db.fetch(f"SELECT {COLUMNS} FROM aioqueue.jobs ORDER BY id")]


async def _recorded(db: asyncpg.Connection, queues: dict[str, str]) -> None:
    """Record each task's queue, as the workers that serve it do when they start: where SQL
    sends a job given no queue."""
    await db.execute("INSERT INTO aioqueue.tasks (name, queue) SELECT * FROM unnest($1::text[], $2::text[])",
                     list(queues), list(queues.values()))


# -- Django: configured once per process, pointed at the test's database per test ------------




# -- 1. SQLAlchemy ----------------------------------------------------------------------------


async def test_sqlalchemy_session_commit_and_rollback(
    q: aioqueue.Queue, db: asyncpg.Connection, engine: AsyncEngine, listener: Listener
) -> None:
    charge = _register(q)
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(text("INSERT INTO orders VALUES (1)"))
        job = await charge.options(conn=session).enqueue(amount=1)
        bulk = await charge.options(conn=session).enqueue_many([{"amount": 2}, {"amount": 3}])
    assert await listener.settled() == ["mail"]  # one wake-up per transaction: PostgreSQL folds repeats
    assert sorted([job, *bulk]) == [r["id"] for r in await db.fetch("SELECT id FROM aioqueue.jobs ORDER BY id")]

    async def order_then_fail() -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(text("INSERT INTO orders VALUES (2)"))
            await charge.options(conn=session).enqueue(amount=4)
            await charge.options(conn=session).enqueue_many([{"amount": 5}])
            raise RuntimeError("declined")

    with pytest.raises(RuntimeError, match="declined"):
        await order_then_fail()
    # An AsyncConnection, before its first statement: the job still joins its transaction.
    async with engine.connect() as conn:
        await conn.begin()
        await charge.options(conn=conn).enqueue(amount=6)
        await conn.rollback()
    assert await listener.settled() == ["mail"]  # nothing more was sent
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 3
    assert await db.fetchval("SELECT count(*) FROM orders") == 1


async def test_sqlalchemy_first_statement_is_the_job(
    q: aioqueue.Queue, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    """The session's transaction has begun but nothing was sent yet: the bare driver connection
    would commit the job on its own. Written through the session, it rolls back with it."""
    charge = _register(q)
    async with AsyncSession(engine) as session, session.begin():
        await charge.options(conn=session).enqueue(amount=1)
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0  # not committed yet
        await session.rollback()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_sqlalchemy_other_driver_and_no_transaction_are_refused(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    charge = _register(q)
    other = create_async_engine(_sa_url(dsn, "psycopg"))
    try:
        async with AsyncSession(other) as session:
            with pytest.raises(aioqueue.ConfigurationError, match=r"'psycopg' driver.*only on the asyncpg driver"):
                charge.options(conn=session)
    finally:
        await other.dispose()
    async with AsyncSession(engine) as session:
        with pytest.raises(aioqueue.NotInTransactionError, match=r"session.begin\(\)"):
            await charge.options(conn=session).enqueue(amount=1)
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with auto.connect() as conn:
        await conn.execute(text("SELECT 1"))
        with pytest.raises(aioqueue.NotInTransactionError, match="AUTOCOMMIT"):
            await charge.options(conn=conn).enqueue(amount=1)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


# -- 2. psycopg -------------------------------------------------------------------------------


async def test_psycopg_async_commit_and_rollback(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, listener: Listener
) -> None:
    charge = _register(q)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        job = await charge.options(conn=conn).enqueue(amount=1)  # psycopg begins the transaction
        await charge.options(conn=conn).enqueue_many([{"amount": 2}])
        assert await listener.settled() == []  # NOTIFY waits for the commit
        await conn.commit()
        assert await listener.settled() == ["mail"]
        await charge.options(conn=conn).enqueue(amount=3)
        await conn.rollback()
    assert await listener.settled() == ["mail"]
    assert await db.fetchval("SELECT min(id) FROM aioqueue.jobs") == job
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 2


def test_psycopg_sync_commit_and_rollback(q: aioqueue.Queue, dsn: str) -> None:
    charge = _register(q)
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE orders (id int)")
            conn.execute("INSERT INTO orders VALUES (1)")
            job = charge.options(conn=conn).enqueue_sync(amount=1)
            ids = charge.options(conn=conn, delay=5).enqueue_many_sync([{"amount": 2}, {"amount": 3, "note": "x"}])
        def order_then_fail() -> None:
            with conn.transaction():
                charge.options(conn=conn).enqueue_sync(amount=4)
                raise RuntimeError("declined")

        with pytest.raises(RuntimeError):
            order_then_fail()
        rows = conn.execute("SELECT id, args->>'amount' FROM aioqueue.jobs ORDER BY id").fetchall()
        assert rows == [(job, "1"), (ids[0], "2"), (ids[1], "3")]
        with pytest.raises(aioqueue.JobArgumentsError, match=r"'billing.charge'.*'amount'"):
            charge.options(conn=conn).enqueue_sync(amonut=1)
    auto = psycopg.connect(dsn, autocommit=True)
    try:
        with pytest.raises(aioqueue.NotInTransactionError, match=r"with conn.transaction\(\)"):
            charge.options(conn=auto).enqueue_sync(amount=1)
        assert auto.execute("SELECT count(*) FROM aioqueue.jobs").fetchone() == (3,)
    finally:
        auto.close()


# -- 3. Django --------------------------------------------------------------------------------


def test_django_atomic_commit_and_rollback(q: aioqueue.Queue, django_db: str) -> None:
    from django.db import models, transaction

    connection = django_connection(django_db)
    charge = _register(q)

    class Order(models.Model):
        item: models.CharField[str, str] = models.CharField(max_length=50)

        class Meta:
            app_label = "aioqueue_tests"

    with connection.schema_editor() as editor:
        editor.create_model(Order)
    with transaction.atomic():
        order = Order.objects.create(item="widget")
        job = charge.options(conn=connection).enqueue_sync(amount=order.pk)
        charge.options(conn=connection).enqueue_many_sync([{"amount": 2}])
    def order_then_fail() -> None:
        with transaction.atomic():
            Order.objects.create(item="gadget")
            charge.options(conn=connection).enqueue_sync(amount=3)
            raise RuntimeError("declined")

    with pytest.raises(RuntimeError):
        order_then_fail()
    with pytest.raises(aioqueue.NotInTransactionError, match=r"transaction.atomic\(\)"):
        charge.options(conn=connection).enqueue_sync(amount=4)
    assert Order.objects.count() == 1
    with connection.cursor() as cur:
        cur.execute("SELECT id, args->>'amount' FROM aioqueue.jobs ORDER BY id")
        rows = cur.fetchall()
    assert rows[0] == (job, str(order.pk)) and len(rows) == 2


# -- 4. By name -------------------------------------------------------------------------------


async def test_by_name_runs_where_the_handler_lives_and_bad_arguments_go_dead(
    dsn: str, db: asyncpg.Connection
) -> None:
    charged: list[int] = []
    async with aioqueue.Queue(dsn) as producer, aioqueue.Queue(dsn) as service:

        @service.task(name="billing.charge", queue="billing")
        async def charge(amount: int) -> None:
            charged.append(amount)

        assert producer.tasks == {}  # the producer has none of the handler's code
        good = await producer.enqueue_by_name("billing.charge", {"amount": 5}, queue="billing", priority=3)
        bad = await producer.enqueue_by_name("billing.charge", {"amonut": 6}, queue="billing", max_attempts=5)
        many = await producer.enqueue_many_by_name("billing.charge", [{"amount": 7}, {"amount": 8}], queue="billing")
        keyed = await producer.enqueue_by_name("billing.charge", {"amount": 9}, queue="billing", key="inv-9", delay=0)
        assert await producer.enqueue_by_name("billing.charge", {"amount": 10}, queue="billing", key="inv-9") == keyed
        async with db.transaction():
            await producer.by_name("billing.charge").options(conn=db, queue="billing").enqueue(amount=11)
        stats = await service.worker().run_until_empty()
        assert sorted(charged) == [5, 7, 8, 9, 11] and stats.dead == 1 and stats.retried == 0
        info = await service.get_job(bad)
        assert info is not None and info.status == "dead" and info.attempts == 1
        assert info.last_error == "TypeError: task 'billing.charge': got an unexpected keyword argument 'amonut'"
        assert await service.get_job(good) is None and len(many) == 2

        with pytest.raises(aioqueue.JobArgumentsError, match="must be a JSON object"):
            await producer.enqueue_by_name("billing.charge", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(aioqueue.JobArgumentsError, match=r"argument 'when' is of type datetime"):
            await producer.enqueue_by_name("billing.charge", {"when": datetime.datetime.now()})
        with pytest.raises(aioqueue.PayloadTooLargeError, match=r"'billing\.charge'"):
            await producer.enqueue_by_name("billing.charge", {"blob": "x" * (1024 * 1024)})
        with pytest.raises(aioqueue.ConfigurationError, match="task name"):
            await producer.enqueue_by_name("", {})
        with pytest.raises(aioqueue.ConfigurationError, match="priority"):
            await producer.enqueue_by_name("billing.charge", {}, priority=2**40)
        # Where the task is registered, by-name checks the signature at once.
        with pytest.raises(aioqueue.JobArgumentsError, match=r"'billing\.charge': missing a required argument"):
            await service.enqueue_by_name("billing.charge", {"amonut": 1})


NO_QUEUE = r"task 'billing\.charge' has no known queue.*pass queue=.*or start a worker that serves it"
NO_QUEUE_SQL = r"task 'billing\.charge' has no known queue.*pass its queue.*or start a worker that serves it"


async def test_by_name_without_a_queue_reaches_a_worker_of_the_task_from_every_way_in(
    dsn: str, db: asyncpg.Connection, engine: AsyncEngine, django_db: str, listener: Listener
) -> None:
    """A job enqueued by name without a queue goes to the queue of the workers that serve its
    task, whichever way it comes in; before any such worker has started, each way in refuses
    it, naming the task and the missing queue, writes nothing and wakes nobody, and (in Python)
    leaves the caller's transaction usable."""
    charged: list[int] = []
    async with aioqueue.Queue(dsn) as producer, aioqueue.Queue(dsn) as service:

        @service.task(name="billing.charge", queue="billing")
        async def charge(amount: int) -> None:
            charged.append(amount)

        def named() -> aioqueue.NamedTask:
            return producer.by_name("billing.charge")

        async def pooled(n: int) -> None:
            await producer.enqueue_by_name("billing.charge", {"amount": n})

        async def pooled_bulk(n: int) -> None:
            await producer.enqueue_many_by_name("billing.charge", [{"amount": n}])

        async def pooled_bulk_keyed(n: int) -> None:
            await producer.enqueue_many_by_name("billing.charge", [{"amount": n}], keys=[f"k{n}"])

        async def in_asyncpg(n: int) -> None:
            async with db.transaction():
                try:
                    await named().options(conn=db).enqueue(amount=n)
                finally:
                    assert await db.fetchval("SELECT 1") == 1  # the caller's transaction goes on

        async def in_sqlalchemy(n: int) -> None:
            async with AsyncSession(engine) as session, session.begin():
                try:
                    await named().options(conn=session).enqueue_many([{"amount": n}])
                finally:
                    assert (await session.execute(text("SELECT 1"))).scalar() == 1

        async def in_psycopg_async(n: int) -> None:
            async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
                try:
                    await named().options(conn=conn).enqueue(amount=n)
                finally:
                    assert await (await conn.execute("SELECT 1")).fetchone() == (1,)

        def psycopg_sync(n: int) -> None:
            with psycopg.connect(dsn) as conn, conn.transaction():
                try:
                    named().options(conn=conn).enqueue_many_sync([{"amount": n}])
                finally:
                    assert conn.execute("SELECT 1").fetchone() == (1,)

        def django(n: int) -> None:
            from django.db import transaction

            connection = django_connection(django_db)
            try:
                with transaction.atomic():
                    try:
                        named().options(conn=connection).enqueue_sync(amount=n)
                    finally:
                        with connection.cursor() as cur:
                            cur.execute("SELECT 1")
            finally:
                connection.close()

        async def in_psycopg_sync(n: int) -> None:
            await anyio.to_thread.run_sync(psycopg_sync, n)

        async def in_django(n: int) -> None:
            await anyio.to_thread.run_sync(django, n)

        async def sql_one(n: int) -> None:
            await db.execute("SELECT aioqueue.add_job('billing.charge', $1::jsonb)", json.dumps({"amount": n}))

        async def sql_bulk(n: int) -> None:
            jobs = [{"task": "billing.charge", "args": {"amount": -n}, "queue": "billing"},
                    {"task": "billing.charge", "args": {"amount": n}}]
            await db.execute("SELECT aioqueue.add_jobs($1::jsonb)", json.dumps(jobs))

        python_ways = [pooled, pooled_bulk, pooled_bulk_keyed, in_asyncpg, in_sqlalchemy, in_psycopg_async,
                       in_psycopg_sync, in_django]
        # No worker has served the task yet: refused everywhere, nothing written.
        for way in python_ways:
            with pytest.raises(aioqueue.NotRegisteredError, match=NO_QUEUE):
                await way(0)
        with pytest.raises(asyncpg.InvalidParameterValueError, match=r"aioqueue\.add_job: " + NO_QUEUE_SQL):
            await sql_one(0)
        in_bulk = r"aioqueue\.add_jobs: job 2 of 2: " + NO_QUEUE_SQL
        with pytest.raises(asyncpg.InvalidParameterValueError, match=in_bulk):
            await sql_bulk(0)
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
        assert await listener.settled() == []

        # A worker that serves the task has started: every way in finds its queue.
        await service.worker().run_until_empty()
        for n, way in enumerate([*python_ways, sql_one, sql_bulk], start=1):
            await way(n)
        await producer.enqueue_by_name("billing.charge", {"amount": 99}, queue="elsewhere")  # as given
        queues = [r["queue"] for r in await db.fetch("SELECT queue FROM aioqueue.jobs ORDER BY id")]
        assert queues == ["billing"] * 11 + ["elsewhere"]
        assert set(await listener.settled()) == {"billing", "elsewhere"}
        await service.worker().run_until_empty()
        assert sorted(charged) == [-10, *range(1, 11)]


async def test_a_worker_records_the_queues_of_the_tasks_it_serves_as_it_starts(
    dsn: str, db: asyncpg.Connection
) -> None:
    async def noop() -> None:
        pass

    async with aioqueue.Queue(dsn) as first, aioqueue.Queue(dsn) as moved:
        first.task(name="a", queue="x")(noop)
        first.task(name="b", queue="y")(noop)
        worker = first.worker(queues=["x"])
        await worker.run_until_empty()
        assert worker.registry is not None and worker.registry.tasks == {"a": "x"}
        rows = await db.fetch("SELECT name, queue FROM aioqueue.tasks ORDER BY name")
        assert [tuple(r) for r in rows] == [("a", "x")]  # b's queue is not this worker's
        moved.task(name="a", queue="z")(noop)
        await moved.worker().run_until_empty()  # the task moved: the last worker to start wins
        rows = await db.fetch("SELECT name, queue FROM aioqueue.tasks ORDER BY name")
        assert [tuple(r) for r in rows] == [("a", "z")]
        assert await first.enqueue_by_name("a") and await moved.by_name("a").options().enqueue()
        # A Queue that registers the task uses its own queue; one that does not, the record.
        async with aioqueue.Queue(dsn) as producer:
            await producer.enqueue_by_name("a")
        queues = [r["queue"] for r in await db.fetch("SELECT queue FROM aioqueue.jobs ORDER BY id")]
        assert queues == ["x", "z", "z"]


async def test_argument_names_that_are_not_str_are_refused_naming_task_and_name(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    charge = _register(q)
    message = r"task 'billing\.charge': argument names must be str, got 1; the arguments are a JSON object"
    async with aioqueue.Queue(q.dsn) as producer:  # without the handler, and (q) with it
        for queue in (producer, q):
            with pytest.raises(aioqueue.JobArgumentsError, match=message):
                await queue.enqueue_by_name("billing.charge", {1: 2}, queue="mail")  # type: ignore[dict-item]
            with pytest.raises(aioqueue.JobArgumentsError, match=r"enqueue_many: item 2 of 2: " + message):
                await queue.enqueue_many_by_name(
                    "billing.charge", [{"amount": 1}, {1: 2}], queue="mail"  # type: ignore[dict-item]
                )
    with pytest.raises(aioqueue.JobArgumentsError, match=r"enqueue_many: item 1 of 1: " + message):
        await charge.enqueue_many([{1: 2}])  # type: ignore[dict-item]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


# -- 5. SQL -----------------------------------------------------------------------------------


async def test_trigger_on_orders_enqueues_a_job_a_worker_runs(
    q: aioqueue.Queue, db: asyncpg.Connection, listener: Listener
) -> None:
    shipped: list[int] = []

    @q.task(queue="shipping")
    async def ship_order(order_id: int) -> None:
        shipped.append(order_id)

    await db.execute(
        """
        CREATE TABLE orders (id int PRIMARY KEY, item text NOT NULL);
        CREATE FUNCTION orders_enqueue_shipping() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM aioqueue.add_job('ship_order', jsonb_build_object('order_id', NEW.id), queue => 'shipping');
            RETURN NEW;
        END $$;
        CREATE TRIGGER orders_shipping AFTER INSERT ON orders
            FOR EACH ROW EXECUTE FUNCTION orders_enqueue_shipping();
        """
    )
    await db.execute("INSERT INTO orders VALUES (1, 'widget'), (2, 'gadget')")
    async def failing_order() -> None:
        async with db.transaction():
            await db.execute("INSERT INTO orders VALUES (3, 'x')")
            await db.execute("INSERT INTO orders VALUES (3, 'x')")  # the order fails: so does its job

    with pytest.raises(asyncpg.UniqueViolationError):
        await failing_order()
    assert await listener.settled() == ["shipping"]  # one statement, one transaction, one wake-up
    stats = await q.worker().run_until_empty()
    assert sorted(shipped) == [1, 2] and stats.succeeded == 2


async def test_sql_functions_check_their_inputs(db: asyncpg.Connection) -> None:
    await _recorded(db, {"t": "default", "a": "default", "b": "default"})
    bad = {
        "SELECT aioqueue.add_job('')": "task must be a name of 1 to 255 characters, got ''",
        "SELECT aioqueue.add_job(NULL)": "task must be a name of 1 to 255 characters, got NULL",
        "SELECT aioqueue.add_job(repeat('t', 256))": r"task must be .* \(256 characters\)",
        "SELECT aioqueue.add_job('t', queue => '')": "queue must be a name of 1 to 255 characters",
        "SELECT aioqueue.add_job('t', '[1]')": "args of task 't' must be a JSON object of keyword arguments, got array",
        "SELECT aioqueue.add_job('t', 'null')": "must be a JSON object of keyword arguments, got null",
        "SELECT aioqueue.add_job('t', jsonb_build_object('x', repeat('a', 1048576)))":
            "args of task 't' are 1048585 bytes as JSON, over the limit of 1048576",
        "SELECT aioqueue.add_job('t', delay_seconds => -1)": "delay_seconds must be 0 to ten years",
        "SELECT aioqueue.add_job('t', delay_seconds => 'NaN')": "delay_seconds must be 0 to ten years",
        "SELECT aioqueue.add_job('t', max_attempts => 0)": "max_attempts must be an int from 1 to 10000",
        "SELECT aioqueue.add_job('t', run_at => 'infinity')": "run_at must be a finite time",
        "SELECT aioqueue.add_job('t', dedup_key => '')": "dedup_key must be 1 to 1000 characters",
        "SELECT aioqueue.add_jobs('{}')": "jobs must be a JSON array of job objects, got object",
        "SELECT aioqueue.add_jobs('[1]')": "each job must be a JSON object, got number",
        """SELECT aioqueue.add_jobs('[{"task": "t", "quee": "x"}]')""": "unknown key 'quee'",
        """SELECT aioqueue.add_jobs('[{"queue": "x"}]')""": "task must be a name",
    }
    for sql, message in bad.items():
        with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
            await db.fetch(sql)
    with pytest.raises(asyncpg.UntranslatableCharacterError):  # NUL never reaches the function
        await db.fetch("SELECT aioqueue.add_job('t', '{\"a\": \"\\u0000\"}')")
    # A caller's text is a value, never SQL.
    hostile = "x'); DROP TABLE aioqueue.jobs; --"
    job_id = await db.fetchval("SELECT aioqueue.add_job($1, jsonb_build_object('s', $1::text), $1)", hostile)
    assert await db.fetchval("SELECT task FROM aioqueue.jobs WHERE id = $1", job_id) == hostile
    ids = await db.fetchval(
        """SELECT array_agg(i) FROM aioqueue.add_jobs('[{"task": "a", "dedup_key": "k"}, {"task": "b"},
           {"task": "a", "dedup_key": "k"}]') AS i"""
    )
    assert ids[0] == ids[2] != ids[1]
    # A run_at no client could read back is refused by the table itself, whoever writes it.
    for sql in ("SELECT aioqueue.add_job('t', run_at => '20000-01-01 00:00+00')",
                "SELECT aioqueue.add_job('t', run_at => '9999-12-31 00:00+00', delay_seconds => 86400)",
                "INSERT INTO aioqueue.jobs (queue, task, run_at) "
                "VALUES ('q', 't', '0001-01-01 00:00+00'::timestamptz - interval '1 day')"):
        with pytest.raises(asyncpg.CheckViolationError, match="jobs_run_at_within_year_1_to_9999"):
            await db.execute(sql)


async def test_add_jobs_writes_a_batch_in_input_order_with_one_notify_per_queue_and_due_time(
    q: aioqueue.Queue, db: asyncpg.Connection, listener: Listener
) -> None:
    batch: list[dict[str, Any]] = [
        {"task": "a", "args": {"i": i}, "queue": "q1" if i % 2 else "q2"} for i in range(200)
    ]
    batch += [{"task": "b", "delay_seconds": 60, "queue": "q1"}, {"task": "b", "delay_seconds": 60, "queue": "q1"},
              {"task": "c", "priority": 7, "max_attempts": 2, "run_at": "2001-02-03T04:05:06Z"}]  # no queue
    await _recorded(db, {"c": "q3"})
    ids = [r[0] for r in await db.fetch("SELECT * FROM aioqueue.add_jobs($1::jsonb)", json.dumps(batch))]
    assert len(ids) == len(batch) and ids == sorted(ids)  # one id per job, in the order given
    rows = {r["id"]: r for r in await db.fetch("SELECT * FROM aioqueue.jobs")}
    assert [rows[i]["args"] for i in ids[:200]] == [json.dumps({"i": i}) for i in range(200)]
    assert [rows[i]["queue"] for i in ids[:4]] == ["q2", "q1", "q2", "q1"]
    later, last = rows[ids[200]], rows[ids[202]]
    assert later["run_at"] == rows[ids[201]]["run_at"] > rows[ids[0]]["run_at"]
    assert (last["task"], last["queue"], last["priority"], last["max_attempts"], last["archive"]) == (
        "c", "q3", 7, 2, False)
    assert last["run_at"] == datetime.datetime(2001, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)
    got = await listener.settled()
    ready, due = sorted(p for p in got if " " not in p), [p for p in got if " " in p]
    assert ready == ["q1", "q2", "q3"]  # one wake-up per queue with ready jobs
    [delayed] = due  # and one due time for the two delayed jobs, which share it
    seconds, queue = delayed.split(" ")
    assert queue == "q1" and 55 < float(seconds) <= 60


async def test_add_jobs_with_dedup_keys_writes_one_job_per_key_and_returns_ids_in_order(
    q: aioqueue.Queue, db: asyncpg.Connection, listener: Listener
) -> None:
    await _recorded(db, {"a": "default", "b": "default"})
    live = await db.fetchval("SELECT aioqueue.add_job('a', dedup_key => 'live')")
    batch: list[dict[str, Any]] = []
    for i in range(300):
        job: dict[str, Any] = {"task": "a", "args": {"i": i}, "queue": f"q{i % 3}"}
        if i % 5 == 0:
            job["dedup_key"] = f"k{i % 20}"  # k0, k5, k10, k15: each four times over the batch
        batch.append(job)
    batch.append({"task": "b", "dedup_key": "live"})
    ids = [r[0] for r in await db.fetch("SELECT * FROM aioqueue.add_jobs($1::jsonb)", json.dumps(batch))]
    assert len(ids) == len(batch) and ids[-1] == live
    first_of = {job["dedup_key"]: i for i, job in reversed(list(enumerate(batch))) if "dedup_key" in job}
    assert all(ids[i] == ids[first_of[job["dedup_key"]]] for i, job in enumerate(batch) if "dedup_key" in job)
    plain = [ids[i] for i, job in enumerate(batch) if "dedup_key" not in job]
    assert plain == sorted(plain) and len(set(plain)) == 240  # new jobs, in the order given
    rows = {r["id"]: r for r in await db.fetch("SELECT id, args, dedup_key FROM aioqueue.jobs")}
    assert len(rows) == 1 + 240 + 4  # the live job, the jobs without a key, one job per new key
    assert [json.loads(rows[ids[i]]["args"])["i"] for i in (0, 1, 5, 25, 299)] == [0, 1, 5, 5, 299]
    got = await listener.settled()
    assert got[0] == "default"  # add_job()'s, before the batch
    assert sorted(p for p in got[1:] if p != "default") == ["q0", "q1", "q2"]  # one wake-up per queue


async def test_add_jobs_names_the_first_refused_job_and_writes_none(db: asyncpg.Connection) -> None:
    await _recorded(db, {"a": "default", "t": "default"})
    cases = {
        # The first refused job in the order given is the one named, whatever comes after it.
        '[{"task": "a"}, {"task": "t", "quee": 1}, {"task": "a", "priority": "high"}]':
            (asyncpg.InvalidParameterValueError, r"^aioqueue\.add_jobs: job 2 of 3: unknown key 'quee'"),
        '[{"task": "a"}, {"task": "a", "priority": "high"}, {"task": "t", "quee": 1}]':
            (asyncpg.InvalidTextRepresentationError,
             r'^aioqueue\.add_jobs: job 2 of 3: invalid input syntax for type integer: "high"$'),
        '[{"task": "a"}, {"task": "a", "max_attempts": 99999999999}]':
            (asyncpg.NumericValueOutOfRangeError, r"^aioqueue\.add_jobs: job 2 of 2: value \"99999999999\" is out"),
        '[{"task": "a", "run_at": "soon"}]':
            (asyncpg.InvalidDatetimeFormatError, r"^aioqueue\.add_jobs: job 1 of 1: invalid input syntax for type"),
        '[{"task": "a"}, {"task": "a", "delay_seconds": -1}]':
            (asyncpg.InvalidParameterValueError, r"^aioqueue\.add_jobs: job 2 of 2: delay_seconds must be 0 to ten"),
        '[{"task": "a"}, {"task": "a", "dedup_key": ""}, {"task": "a", "dedup_key": "k"}]':
            (asyncpg.InvalidParameterValueError, r"^aioqueue\.add_jobs: job 2 of 3: dedup_key must be 1 to 1000"),
        '[{"task": "a"}, "b"]':
            (asyncpg.InvalidParameterValueError, r"^aioqueue\.add_jobs: job 2 of 2: each job must be a JSON object, "
                                                 r"got string$"),
    }
    for batch, (error, message) in cases.items():
        with pytest.raises(error, match=message):
            await db.fetch("SELECT * FROM aioqueue.add_jobs($1::jsonb)", batch)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    assert await db.fetch("SELECT * FROM aioqueue.add_jobs('[]')") == []


# -- 6. conn= means "in my transaction" -------------------------------------------------------


async def test_conn_outside_a_transaction_or_of_an_unknown_kind_is_refused(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    charge = _register(q)
    with pytest.raises(aioqueue.NotInTransactionError, match=r"async with conn.transaction\(\)"):
        await charge.options(conn=db).enqueue(amount=1)
    with pytest.raises(aioqueue.NotInTransactionError):
        await charge.enqueue_many([{"amount": 1}], conn=db)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as auto:
        with pytest.raises(aioqueue.NotInTransactionError, match="autocommit"):
            await charge.options(conn=auto).enqueue(amount=1)
        async with auto.transaction():  # an explicit transaction is fine
            await charge.options(conn=auto).enqueue(amount=1)
    for wrong in ("postgresql://x", 5, q, object(), q.database):
        with pytest.raises(aioqueue.ConfigurationError, match=r"conn must be an asyncpg\.Connection") as caught:
            charge.options(conn=wrong)  # type: ignore[arg-type]
        for kind in ("SQLAlchemy AsyncSession or AsyncConnection", "psycopg 3", "Django"):
            assert kind in str(caught.value)
    # Sync calls need a sync connection, async calls an async one.
    async with db.transaction():
        with pytest.raises(aioqueue.ConfigurationError, match="use `await enqueue\\(\\)` instead"):
            charge.options(conn=db).enqueue_sync(amount=1)
        with pytest.raises(aioqueue.ConfigurationError, match="got no conn"):
            charge.options().enqueue_many_sync([{"amount": 1}])
    with psycopg.connect(dsn) as sync_conn, pytest.raises(aioqueue.ConfigurationError, match=r"use enqueue_sync\(\)"):
        await charge.options(conn=sync_conn).enqueue(amount=1)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1


# -- 7. One definition of a job ---------------------------------------------------------------


async def test_every_path_writes_the_same_row_and_notification(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, engine: AsyncEngine, listener: Listener, django_db: str
) -> None:
    charge = _register(q)
    args = {"amount": 5, "note": "é ☃"}
    opts: dict[str, Any] = {"queue": "mail", "priority": 7, "delay": 30.5, "run_at": RUN_AT, "max_attempts": 3}
    paths: list[str] = []

    async def via(name: str) -> None:
        paths.append(name)
        assert len(await listener.settled()) == len(paths), f"{name}: one NOTIFY at commit"
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == len(paths), name

    await charge.options(**opts).enqueue(**args)
    await via("pool")
    async with db.transaction():
        await charge.options(conn=db, **opts).enqueue(**args)
    await via("asyncpg")
    async with AsyncSession(engine) as session, session.begin():
        await charge.options(conn=session, **opts).enqueue(**args)
    await via("sqlalchemy")
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        await charge.options(conn=aconn, **opts).enqueue(**args)
        await aconn.commit()
    await via("psycopg async")

    def sync_paths() -> None:
        with psycopg.connect(dsn) as conn:
            charge.options(conn=conn, **opts).enqueue_sync(**args)
        from django.db import transaction

        connection = django_connection(django_db)
        with transaction.atomic():
            q.by_name("billing.charge").options(conn=connection, **opts).enqueue_sync(**args)
        connection.close()

    await anyio.to_thread.run_sync(sync_paths)
    paths.append("psycopg sync")
    await via("django")
    async with aioqueue.Queue(dsn) as producer:  # by name, without the handler
        await producer.enqueue_by_name("billing.charge", args, **opts)
        assert producer.by_name("billing.charge").defaults == q.by_name("nothing").defaults
    await via("by name")
    await db.execute(
        "SELECT aioqueue.add_job('billing.charge', $1::jsonb, 'mail', 7, $2, 30.5, 3)", json.dumps(args), RUN_AT
    )
    await via("sql")
    rows = await _jobs(db)
    assert len(rows) == len(paths) == 8
    assert all(row == rows[0] for row in rows), dict(zip(paths, rows, strict=True))
    assert rows[0][5] == RUN_AT + datetime.timedelta(seconds=30.5)


async def test_every_path_shares_the_dedup_key_and_the_defaults(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, engine: AsyncEngine
) -> None:
    charge = _register(q)

    @q.task
    async def plain(n: int = 0) -> None:
        pass

    await q.worker().run_until_empty()  # records the tasks' queues, where SQL and by-name look
    first = await charge.options(key="inv-1").enqueue(amount=1)
    async with AsyncSession(engine) as session, session.begin():
        assert await charge.options(conn=session, key="inv-1").enqueue(amount=2) == first
    async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
        assert await charge.options(conn=aconn, key="inv-1").enqueue(amount=3) == first
    with psycopg.connect(dsn) as conn:
        assert charge.options(conn=conn, key="inv-1").enqueue_sync(amount=4) == first
    assert await q.enqueue_by_name("billing.charge", {"amount": 5}, key="inv-1") == first
    assert await db.fetchval("SELECT aioqueue.add_job('billing.charge', dedup_key => 'inv-1')") == first
    # In bulk, a key per item, on every path.
    assert await charge.enqueue_many([{"amount": 6}, {"amount": 7}], keys=["inv-1", "inv-1"]) == [first] * 2
    async with AsyncSession(engine) as session, session.begin():
        assert await charge.enqueue_many([{"amount": 8}], keys=["inv-1"], conn=session) == [first]
    async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
        assert await charge.enqueue_many([{"amount": 9}], keys=["inv-1"], conn=aconn) == [first]
    with psycopg.connect(dsn) as conn:
        assert charge.options(conn=conn).enqueue_many_sync([{"amount": 10}], keys=["inv-1"]) == [first]
    assert await q.enqueue_many_by_name("billing.charge", [{"amount": 11}], keys=["inv-1"]) == [first]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1
    # Defaults: an unregistered name, the SQL function and a bare @q.task agree.
    async with aioqueue.Queue(dsn) as producer:
        await producer.enqueue_by_name("plain")
        await plain.enqueue()
        await db.execute("SELECT aioqueue.add_job('plain')")
    rows = [r[:-2] for r in await _jobs(db)][1:]
    stripped = [(r[0], r[1], r[2], r[3], r[4], r[6], r[7], r[8]) for r in rows]
    assert stripped == [("default", "plain", "{}", "pending", 0, 0, 5, None)] * 3



# -- 8. Another database ---------------------------------------------------------------------


async def _count_jobs(dsn: str) -> int:
    return int(await fetchval_once(dsn, "SELECT count(*) FROM aioqueue.jobs"))


def _database_of(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


async def test_a_job_for_a_queue_of_another_database_is_refused_on_every_kind_of_connection(
    dsn: str, other_dsn: str, engine: AsyncEngine, django_db: str
) -> None:
    """The application's connection (to ``dsn``) cannot carry a job of a Queue whose database
    is another (``other_dsn``): no worker of that Queue would ever look where it is written."""
    heavy = aioqueue.Queue(other_dsn)  # not opened: the check opens what it needs
    charge = _register(heavy)
    app_db, heavy_db = _database_of(dsn), _database_of(other_dsn)
    refused = rf"task 'billing.charge'.* database '{heavy_db}'.*conn reaches database '{app_db}'"
    calls = 0

    def expect_refusal() -> Any:
        nonlocal calls
        calls += 1
        return pytest.raises(aioqueue.WrongDatabaseError, match=refused)

    plain = await asyncpg.connect(dsn)
    try:
        async with plain.transaction():
            with expect_refusal():
                await charge.options(conn=plain).enqueue(amount=1)
            with expect_refusal():
                await charge.enqueue_many([{"amount": 1}], conn=plain)
            with expect_refusal():
                await heavy.enqueue_by_name("billing.charge", {"amount": 1}, conn=plain)
    finally:
        await plain.close()
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool, pool.acquire() as pooled, \
            pooled.transaction():
        with expect_refusal():
            await charge.options(conn=pooled).enqueue(amount=1)
    async with AsyncSession(engine) as session, session.begin():
        with expect_refusal():
            await charge.options(conn=session).enqueue(amount=1)
    async with engine.begin() as sa_conn:
        with expect_refusal():
            await charge.options(conn=sa_conn).enqueue_many([{"amount": 1}])
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        with expect_refusal():
            await charge.options(conn=aconn).enqueue(amount=1)

    def sync_paths() -> None:
        # No event loop here, and this Queue has never connected from this thread's point of
        # view: the check learns which database the Queue names through a short connection.
        sync_heavy = aioqueue.Queue(other_dsn)
        sync_charge = _register(sync_heavy)
        with psycopg.connect(dsn) as conn, conn.transaction():
            with expect_refusal():
                sync_charge.options(conn=conn).enqueue_sync(amount=1)
            with expect_refusal():
                sync_charge.options(conn=conn).enqueue_many_sync([{"amount": 1}])
        from django.db import transaction

        connection = django_connection(django_db)
        with transaction.atomic(), expect_refusal():
            sync_heavy.by_name("billing.charge").options(conn=connection).enqueue_sync(amount=1)
        connection.close()

    await anyio.to_thread.run_sync(sync_paths)
    assert calls == 10
    assert await _count_jobs(dsn) == 0 and await _count_jobs(other_dsn) == 0
    await heavy.close()


def _questions_and_jobs(sent: list[str]) -> list[str]:
    """Of the statements sent, the questions about the database and the jobs, in order."""
    return ["question" if "pg_postmaster_start_time" in query else "job" for query in sent
            if "pg_postmaster_start_time" in query or query.startswith("WITH")]


async def test_the_queues_own_database_is_accepted_and_asked_about_once(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, engine: AsyncEngine, django_db: str
) -> None:
    """The common path: the same connection enqueuing again sends nothing but the job. Another
    schema of the same database is the same database."""
    charge = _register(q)

    def sent_by(conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> list[str]:
        queries: list[str] = []
        conn.add_query_logger(lambda record: queries.append(record.query))
        return queries

    sent = sent_by(db)
    for n in range(3):
        async with db.transaction():
            await charge.options(conn=db).enqueue(amount=n)
    assert _questions_and_jobs(sent) == ["question", "job", "job", "job"]  # asked once, then the job alone
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        async with pool.acquire() as first:
            sent = sent_by(first)
        for n in range(3):  # a new proxy each time, one connection under them
            async with pool.acquire() as pooled, pooled.transaction():
                await charge.options(conn=pooled).enqueue(amount=n)
        assert _questions_and_jobs(sent) == ["question", "job", "job", "job"]

    other_schema = aioqueue.Queue(dsn, schema="elsewhere")
    await other_schema.migrate()
    elsewhere = _register(other_schema)
    async with AsyncSession(engine) as session, session.begin():
        await elsewhere.options(conn=session).enqueue(amount=1)
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        await charge.options(conn=aconn).enqueue(amount=1)
        await aconn.commit()

    def sync_paths() -> None:
        with psycopg.connect(dsn) as conn, conn.transaction():
            charge.options(conn=conn).enqueue_sync(amount=1)
        from django.db import transaction

        connection = django_connection(django_db)
        with transaction.atomic():
            charge.options(conn=connection).enqueue_many_sync([{"amount": 1}])
        connection.close()

    await anyio.to_thread.run_sync(sync_paths)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 3 + 3 + 3
    assert await db.fetchval("SELECT count(*) FROM elsewhere.jobs") == 1
    await other_schema.close()


async def test_connections_of_the_queues_own_pool_are_not_asked_even_when_it_is_exhausted(dsn: str) -> None:
    """Callers holding every connection of the pool the Queue borrows must not wait for one
    more to ask which database it is: what the Queue's own pool hands out is its database."""
    async with asyncpg.create_pool(dsn, min_size=2, max_size=2) as pool:
        q = aioqueue.Queue(pool=pool)
        charge = _register(q)
        both = anyio.Event()
        holding = 0

        async def caller(n: int) -> None:
            nonlocal holding
            async with pool.acquire() as conn, conn.transaction():
                holding += 1
                if holding == 2:
                    both.set()
                await both.wait()  # both connections are taken now
                await charge.options(conn=conn).enqueue(amount=n)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for n in range(2):
                    tg.start_soon(caller, n)
        assert q.database.identity is None  # never needed
        assert await pool.fetchval("SELECT count(*) FROM aioqueue.jobs") == 2


async def test_a_server_restart_between_two_enqueues_is_no_reason_to_refuse() -> None:
    """The server's start time is part of what names a database: after a restart the Queue's
    answer is stale, so both sides are asked again before a refusal."""
    from tests.support.fault_tools import owned_server

    async with owned_server() as server:
        q = aioqueue.Queue(server.dsn)
        charge = _register(q)
        for n in range(2):
            conn = await asyncpg.connect(server.dsn)
            try:
                async with conn.transaction():
                    await charge.options(conn=conn).enqueue(amount=n)
                assert await conn.fetchval("SELECT count(*) FROM aioqueue.jobs") == n + 1
            finally:
                await conn.close()
            if n == 0:
                before = q.database.identity
                await server.stop()
                await server.start()
        assert before is not None and q.database.identity is not None
        assert before.name == q.database.identity.name and before.started < q.database.identity.started
        assert str(before).startswith(f"database {before.name!r} ")  # and where: an address, or a local socket


# -- 9. The examples ----------------------------------------------------------------------------
# (the FastAPI + SQLAlchemy example runs beside the plain FastAPI one in test_integrations.py)


async def test_django_example_runs(dsn: str) -> None:
    import os
    import subprocess
    import sys

    from tests.support.examples import EXAMPLES

    script = EXAMPLES / "django_app.py"
    done = await anyio.run_process(
        [sys.executable, str(script), "demo"], env={**os.environ, "AIOQUEUE_DSN": dsn},
        stderr=subprocess.STDOUT, check=False,
    )
    output = done.stdout.decode()
    assert done.returncode == 0, output
    assert "jobs run: 1" in output and "confirmed: True" in output, output


async def test_missing_schema_through_psycopg_says_run_migrate(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn) as q:
        charge = _register(q)
        async with await psycopg.AsyncConnection.connect(empty_dsn) as conn:
            with pytest.raises(aioqueue.SchemaNotReadyError, match="run `aioqueue migrate`"):
                await charge.options(conn=conn).enqueue(amount=1)


async def test_a_partition_key_is_written_from_every_connection_type(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection, engine: AsyncEngine, django_db: str
) -> None:
    """The partition key (see tests/test_partition_keys.py) goes into the row whichever
    connection the caller's transaction is on, one job or many."""
    charge = _register(q)

    def psycopg_sync() -> None:
        with psycopg.connect(dsn) as conn, conn.transaction():
            charge.options(conn=conn, partition_key="psycopg-sync").enqueue_sync(amount=4)
            charge.options(conn=conn, partition_key="psycopg-sync").enqueue_many_sync([{"amount": 5}])

    def django() -> None:
        from django.db import transaction

        connection = django_connection(django_db)
        try:
            with transaction.atomic():
                charge.options(conn=connection, partition_key="django").enqueue_sync(amount=6)
                charge.options(conn=connection, partition_key="django").enqueue_many_sync([{"amount": 7}])
        finally:
            connection.close()

    async with db.transaction():
        await charge.options(conn=db, partition_key="asyncpg").enqueue_many([{"amount": 1}])
    async with AsyncSession(engine) as session, session.begin():
        await charge.options(conn=session, partition_key="sqlalchemy").enqueue(amount=2)
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await charge.options(conn=conn, partition_key="psycopg-async").enqueue_many([{"amount": 3}])
    await anyio.to_thread.run_sync(psycopg_sync)
    await anyio.to_thread.run_sync(django)
    rows = await db.fetch("SELECT partition_key, (args->>'amount')::int AS n FROM aioqueue.jobs ORDER BY id")
    assert [(r["partition_key"], r["n"]) for r in rows] == [
        ("asyncpg", 1), ("sqlalchemy", 2), ("psycopg-async", 3), ("psycopg-sync", 4), ("psycopg-sync", 5),
        ("django", 6), ("django", 7)]
