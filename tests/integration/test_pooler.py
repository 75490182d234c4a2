"""Through a real PgBouncer in transaction mode: detection, no named prepared statements, LISTEN
past the pooler (``listen_dsn``) or polling, and every path (enqueue, workers, operator calls,
the CLI) under concurrency, where a server connection changes hands between transactions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import asyncpg
import pytest

import aioqueue
from tests.support.cli_tools import aioqueue_cli, cli_process
from tests.support.helpers import eventually, reclaimed, running
from tests.support.pg import server
from tests.support.pooler_tools import pgbouncer, via


@pytest.fixture(scope="module")
async def bouncer() -> AsyncIterator[int]:
    """A PgBouncer (transaction mode, 4 server connections per database) for this module."""
    async with pgbouncer(server().dsn, pool_size=4) as port:
        yield port


@pytest.fixture
def pooled_dsn(dsn: str, bouncer: int) -> str:
    """The test's database, reached through the pooler."""
    return via(dsn, bouncer)


async def test_a_pooler_is_detected_and_a_direct_server_is_not(dsn: str, pooled_dsn: str) -> None:
    async with aioqueue.Queue(pooled_dsn) as through, aioqueue.Queue(dsn) as direct:
        assert through.database.pooler is True
        assert direct.database.pooler is False
        assert await through.database.can_listen() is False
        assert await direct.database.can_listen() is True
    pinned = aioqueue.Queue(pooled_dsn, pooler=False)
    assert pinned.database.pooler is False  # said, not detected


async def test_enqueue_in_transactions_under_concurrency(pooled_dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(pooled_dsn, pool_max_size=8) as q:

        @q.task
        async def job(n: int) -> None:
            pass

        async def caller(i: int) -> None:
            for k in range(10):
                async with q.pool.acquire() as conn, conn.transaction():
                    await job.options(conn=conn).enqueue(i * 100 + k)
                    await job.options(conn=conn).enqueue_many([{"n": -1}, {"n": -2}])
                await job.enqueue(i * 100 + k + 50)
                await job.options(key=f"k{i}-{k}").enqueue(0)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(caller, i)
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 8 * 10 * 5


async def test_the_apps_direct_connection_may_carry_jobs_of_a_queue_behind_the_pooler(
    dsn: str, pooled_dsn: str, db: asyncpg.Connection
) -> None:
    """The same database, reached through PgBouncer by the Queue and directly by the app, is
    one database: its jobs are written, on every path, async and sync."""
    import psycopg

    async with aioqueue.Queue(pooled_dsn, pooler=True) as q:

        @q.task
        async def job(n: int) -> None:
            pass

        async with db.transaction():
            await job.options(conn=db).enqueue(1)
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            await job.options(conn=aconn).enqueue_many([{"n": 2}, {"n": 3}])
            await aconn.commit()
        async with q.pool.acquire() as through, through.transaction():  # and the pooler's, of course
            await job.options(conn=through).enqueue(4)

    def sync_path() -> None:
        fresh = aioqueue.Queue(pooled_dsn, pooler=True)  # never opened: asked through the pooler
        job = fresh.task(name="job")(_job)
        with psycopg.connect(dsn) as conn, conn.transaction():
            job.options(conn=conn).enqueue_sync(5)

    await anyio.to_thread.run_sync(sync_path)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 5


async def _job(n: int) -> None:
    pass


async def test_workers_drain_retry_and_return_results_through_the_pooler(
    pooled_dsn: str, db: asyncpg.Connection
) -> None:
    async with aioqueue.Queue(pooled_dsn) as q:
        attempts: dict[int, int] = {}

        @q.task(archive=True)
        async def square(n: int) -> int:
            return n * n

        @q.task(max_attempts=3, retry=aioqueue.Backoff(base=0.01, jitter=0))
        async def flaky(n: int) -> None:
            attempts[n] = attempts.get(n, 0) + 1
            if attempts[n] < 3:
                raise ValueError("again")

        refs = [await square.enqueue(n) for n in range(200)]
        await flaky.enqueue_many([{"n": n} for n in range(20)])
        async with anyio.create_task_group() as tg:
            workers = [q.worker(concurrency=8, poll_interval=0.05) for _ in range(3)]
            for w in workers:
                tg.start_soon(w.run)
            with anyio.fail_after(30):
                results = [await ref.result(timeout=30) for ref in refs[::20]]
            await eventually(
                lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=30, what="the queue to drain"
            )
            for w in workers:
                w.stop()
        assert results == [n * n for n in range(0, 200, 20)]
        assert attempts == dict.fromkeys(range(20), 3)
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE status = 'succeeded'") == 200


async def test_run_until_empty_through_the_pooler_never_hangs(pooled_dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(pooled_dsn) as q:

        @q.task
        async def noop(n: int) -> None:
            pass

        for _ in range(3):
            await noop.enqueue_many([{"n": n} for n in range(300)])
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for _ in range(4):
                        tg.start_soon(q.worker(concurrency=10).run_until_empty)
            assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_a_bulk_enqueue_of_several_statements_is_one_transaction_through_the_pooler(
    pooled_dsn: str, db: asyncpg.Connection
) -> None:
    from aioqueue._enqueue import CHUNK

    async with aioqueue.Queue(pooled_dsn) as q:

        @q.task
        async def noop(n: int) -> None:
            pass

        ids = await noop.enqueue_many([{"n": n} for n in range(CHUNK + 1)])
        assert ids == sorted(ids) and len(ids) == CHUNK + 1
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == CHUNK + 1
        # The second statement refused (a row only it holds breaks a check): the first is undone.
        await db.execute("DELETE FROM aioqueue.jobs")
        await db.execute(
            "ALTER TABLE aioqueue.jobs ADD CONSTRAINT no_last CHECK ((args->>'n')::int <> -1)"
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await noop.enqueue_many([{"n": n} for n in range(CHUNK)] + [{"n": -1}])
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_completion_stays_fenced_through_the_pooler(pooled_dsn: str, db: asyncpg.Connection) -> None:
    from aioqueue._completer import Completer

    async with aioqueue.Queue(pooled_dsn) as q:

        @q.task
        async def noop() -> None:
            pass

        await noop.enqueue()
        stale, fresh = await reclaimed(q, db)
        late = Completer(q.database)
        late.succeeded(stale, None)
        await late.flush()
        assert await db.fetchval("SELECT locked_by FROM aioqueue.jobs") == "second"
        done = Completer(q.database)
        done.succeeded(fresh, None)
        await done.flush()
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


@pytest.mark.parametrize("listen", ["listen_dsn", "poll"])
async def test_cancel_and_wake_ups_with_listen_dsn_or_polling(
    dsn: str, pooled_dsn: str, db: asyncpg.Connection, listen: str
) -> None:
    listen_dsn = dsn if listen == "listen_dsn" else None
    poll = 30.0 if listen == "listen_dsn" else 0.1  # with LISTEN, a wake-up cannot be the poll
    async with aioqueue.Queue(pooled_dsn, listen_dsn=listen_dsn) as q:
        began = anyio.Event()

        @q.task
        async def forever() -> None:
            began.set()
            await anyio.sleep_forever()

        @q.task(archive=True)
        async def quick() -> str:
            return "done"

        async with running(q.worker(poll_interval=poll)) as worker:
            assert (worker.notifier is not None and worker.notifier.connected) is (listen == "listen_dsn")
            ref = await forever.enqueue()
            with anyio.fail_after(10):
                await began.wait()
            assert await ref.cancel() == "requested"
            info = None

            async def cancelled() -> bool:
                nonlocal info
                info = await ref.info()
                return info is not None and info.status == "cancelled"

            await eventually(cancelled, timeout=10, what="the running job to be cancelled")
            quick_ref = await quick.enqueue()
            assert await quick_ref.result(timeout=10) == "done"
            if listen == "listen_dsn":
                # The listener's backend is a direct one: the pid it saw is a real server pid.
                pids = {r["pid"] for r in await db.fetch("SELECT pid FROM pg_stat_activity")}
                assert worker.notifier is not None and worker.notifier.backend_pid in pids


async def test_periodic_through_the_pooler(pooled_dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(pooled_dsn) as q:

        @q.periodic(every=1, name="tick", archive=True)
        async def tick() -> None:
            pass

        async with running(q.worker(poll_interval=0.05)):
            await eventually(
                lambda: db.fetchval("SELECT count(*) >= 2 FROM aioqueue.jobs_done WHERE task = 'tick'"),
                timeout=15, what="two periodic slots to run",
            )


async def test_operator_calls_under_concurrency(pooled_dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(pooled_dsn, pool_max_size=8) as q:

        @q.task(max_attempts=1)
        async def doomed() -> None:
            raise RuntimeError("no")

        refs = [await doomed.enqueue() for _ in range(10)]
        await q.worker().run_until_empty()

        async def operate(i: int) -> None:
            for _ in range(10):
                await q.status()
                await q.get_job(refs[i])
                await q.list_dead()
                await q.cancel(10_000 + i)
                await q.queue_settings()

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(operate, i)
        assert len(await q.retry_dead(all=True)) == 10
        await q.pause("default")
        await q.set_limits("default", concurrency=3)
        await q.resume("default")


async def test_cli_through_the_pooler(empty_dsn: str, bouncer: int, tmp_path: Path) -> None:
    pooled = via(empty_dsn, bouncer)
    # Two processes in turn: the second must not trip over the first's prepared statements.
    for _ in range(2):
        code, _out, err = await aioqueue_cli("migrate", dsn=pooled)
        assert code == 0, err
    for args in (("status",), ("dead", "list"), ("dead", "retry", "--all")):
        code, _out, err = await aioqueue_cli(*args, dsn=pooled)
        assert code == 0, err
    (tmp_path / "pooled_app.py").write_text(
        "import os\nimport aioqueue\nqueue = aioqueue.Queue(os.environ['AIOQUEUE_DSN'])\n\n"
        "@queue.task(queue='p')\nasync def nothing(n: int) -> None:\n    pass\n"
    )
    async with aioqueue.Queue(pooled) as q:
        job = q.task(queue="p", name="nothing")(_nothing)
        await job.enqueue_many([{"n": n} for n in range(50)])
    # `aioqueue worker` through the pooler, LISTEN straight to the server (--listen-dsn).
    direct = await asyncpg.connect(empty_dsn)
    try:
        worker_args = ["worker", "pooled_app:queue", "--poll-interval", "0.1", "--listen-dsn", empty_dsn]
        async with cli_process(worker_args, pooled, tmp_path) as (process, output):
            await output.wait_for("started: queues=p")
            await eventually(lambda: direct.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"),
                             timeout=25, what="the CLI worker to drain the queue")
            listening = "SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = $1"
            await eventually(lambda: direct.fetchval(listening, empty_dsn.rsplit("/", 1)[1]), timeout=10,
                             what="a LISTEN backend straight on the server")
            process.terminate()
            with anyio.fail_after(30):
                assert await process.wait() == 0
        assert "LISTEN cannot pass a transaction pooler" not in output.text
    finally:
        await direct.close()


async def _nothing(n: int) -> None:
    pass
