"""One worker process for the tests that need a worker in a process of its own (to kill it, or to
run several at once): ``python -m tests.support.worker KIND DSN ARG...``, where KIND names the
task it runs, its arguments and its worker's settings:

- ``hang DSN LEASE``: task ``hang`` records that it started (a committed row in ``started``),
  then never returns, so a test can kill the process with the job in flight.
- ``limited DSN SECONDS``: task ``limited`` (queue ``lim``) sleeps ``SECONDS`` and records its
  start and end in ``spans`` (:data:`SPANS_TABLE`), so a test can tell from the database how many
  ran at once across every process, and when.
- ``load DSN CONCURRENCY LEASE``: task ``work`` (:func:`register`) records each start and finish
  of a handler in ``runs`` (:data:`RUNS_TABLE`) with this process's pid, a few milliseconds
  apart, so a test that kills this process can tell which jobs were in flight at the kill.
- ``workflows DSN CONCURRENCY LEASE``: the workflow tasks of :mod:`tests.support.workflow_steps`
  (each step commits its effect row), with ``load``'s worker settings.
- ``steps DSN CONCURRENCY LEASE``: task ``flow`` (:func:`register_flow`) runs five durable steps,
  each writing its side effect (a row of ``effects``, :data:`EFFECTS_TABLE`) on the step's own
  connection, with a 0 s durable sleep after the second, so that kills land before, inside and
  after steps, and between a suspension and its resumption.
- ``nap DSN SECONDS``: a default worker (only ``concurrency=5``) whose task ``nap`` (queue
  ``naps``) sleeps ``SECONDS`` and records its start, end and process in ``naps``
  (:data:`NAPS_TABLE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import asyncpg

import aioqueue
from tests.support import workflow_steps
from tests.support.helpers import eventually

SPANS_TABLE = "CREATE TABLE spans (job_id bigint, started timestamptz, ended timestamptz)"
NAPS_TABLE = "CREATE TABLE naps (job_id bigint, pid int, started timestamptz, ended timestamptz)"
RUNS_TABLE = """
CREATE TABLE runs (
    job_id  bigint NOT NULL,
    n       int    NOT NULL,
    attempt int    NOT NULL,
    pid     int    NOT NULL,
    event   text   NOT NULL CHECK (event IN ('start', 'finish')),
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
EFFECTS_TABLE = "CREATE TABLE effects (job_id bigint, step int, pid int, at timestamptz DEFAULT clock_timestamp())"
_RECORD = "INSERT INTO runs (job_id, n, attempt, pid, event) VALUES ($1, $2, $3, $4, $5)"


def register(queue: aioqueue.Queue) -> aioqueue.Task[[int], None]:
    """Register ``work`` on ``queue``: the task the crash tests enqueue and ``load`` runs."""
    pid = os.getpid()

    @queue.task(name="work", max_attempts=1000)
    async def work(n: int) -> None:
        job = aioqueue.current_job()
        async with queue.connection() as conn:
            await conn.execute(_RECORD, job.id, n, job.attempt, pid, "start")
        await anyio.sleep(random.uniform(0.001, 0.02))
        async with queue.connection() as conn:
            await conn.execute(_RECORD, job.id, n, job.attempt, pid, "finish")

    return work


def register_flow(queue: aioqueue.Queue) -> aioqueue.Task[[int], int]:
    """Register ``flow`` on ``queue``: the task the steps crash test enqueues and ``steps`` runs."""

    @queue.task(name="flow", max_attempts=100)
    async def flow(n: int) -> int:
        job = aioqueue.current_job()
        total = 0
        for step in range(1, 6):
            async with queue.connection() as conn:

                async def effect(step: int = step, conn: Any = conn) -> int:
                    await conn.execute("INSERT INTO effects (job_id, step, pid) VALUES ($1, $2, $3)",
                                       job.id, step, os.getpid())
                    # A kill may land inside the step; long enough that the work outlasts the
                    # first kills on a fast, quiet machine too.
                    await anyio.sleep(random.uniform(0.02, 0.1))
                    return step

                total += int(await aioqueue.step(f"effect {step}", effect, connection=conn))
            if step == 2:
                await aioqueue.sleep(0, name="pause")
        return total

    return flow


async def hang(dsn: str, lease: str) -> None:
    queue = aioqueue.Queue(dsn)

    @queue.task(name="hang")
    async def hang(n: int) -> None:
        job = aioqueue.current_job()
        async with queue.connection() as conn:
            await conn.execute("INSERT INTO started (job_id, pid) VALUES ($1, pg_backend_pid())", job.id)
        await anyio.sleep_forever()

    async with queue:
        await queue.worker(concurrency=4, lease=float(lease), poll_interval=0.1).run()


async def _sleeper(queue: aioqueue.Queue, seconds: float, record: str, *values: object) -> None:
    """A handler's body: sleep ``seconds`` between its start and ``record`` (committed), which
    takes the job's id, then ``values``, then the start time."""
    async with queue.connection() as conn:
        started = await conn.fetchval("SELECT clock_timestamp()")
    await anyio.sleep(seconds)
    async with queue.connection() as conn:
        await conn.execute(record, aioqueue.current_job().id, *values, started)


async def limited(dsn: str, seconds: str) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=4)

    @queue.task(name="limited", queue="lim")
    async def limited() -> None:
        await _sleeper(queue, float(seconds), "INSERT INTO spans VALUES ($1, $2, clock_timestamp())")

    async with queue:
        await queue.worker(concurrency=5, poll_interval=5.0).run()


async def nap(dsn: str, seconds: str) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=4)

    @queue.task(name="nap", queue="naps")
    async def nap() -> None:
        await _sleeper(queue, float(seconds), "INSERT INTO naps VALUES ($1, $2, $3, clock_timestamp())", os.getpid())

    async with queue:
        await queue.worker(concurrency=5).run()


async def load(dsn: str, concurrency: str, lease: str, tasks: Callable[[aioqueue.Queue], object] = register) -> None:
    queue = aioqueue.Queue(dsn, pool_max_size=10)
    tasks(queue)
    async with queue:
        seconds = float(lease)
        worker = queue.worker(
            concurrency=int(concurrency),
            lease=seconds,
            heartbeat_interval=seconds / 6,
            reap_interval=0.25,
            poll_interval=0.2,
            grace_period=5.0,
        )
        await worker.run()


async def workflows(dsn: str, concurrency: str, lease: str) -> None:
    await load(dsn, concurrency, lease, workflow_steps.register)


async def steps(dsn: str, concurrency: str, lease: str) -> None:
    await load(dsn, concurrency, lease, register_flow)


Kind = Callable[..., Coroutine[Any, Any, None]]
KINDS: dict[str, Kind] = {
    "hang": hang, "limited": limited, "load": load, "nap": nap, "steps": steps, "workflows": workflows,
}


def command(kind: str, *args: object) -> list[str]:
    """The command line that runs a worker of ``kind`` with ``args`` (the DSN first)."""
    assert kind in KINDS, kind
    return [sys.executable, "-m", "tests.support.worker", kind, *map(str, args)]


@contextlib.asynccontextmanager
async def worker_processes(
    db: asyncpg.Connection, count: int, kind: str, dsn: str, *args: object
) -> AsyncIterator[None]:
    """Run ``count`` worker processes of ``kind`` on ``db``'s database for the body, from when
    every one listens (so none misses the body's first enqueue); terminate them after it."""
    processes = [await anyio.open_process(command(kind, dsn, *args)) for _ in range(count)]
    try:
        listening = (
            "SELECT count(*) = $1 FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        )
        await eventually(lambda: db.fetchval(listening, count), timeout=20, what=f"{count} listening workers")
        yield
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            await process.wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    asyncio.run(KINDS[sys.argv[1]](*sys.argv[2:]))
