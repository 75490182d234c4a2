"""The workflow crash test's tasks and workflows (run by ``python -m tests.support.worker
workflows DSN CONCURRENCY LEASE``).

Each step of a workflow commits one row in ``effects`` (its job id, workflow, step) in a
transaction of its own, keyed by job id, and records every start in ``starts`` with this
process's pid, so the test can tell a step run again after a kill from one run twice by a live
process.
"""

from __future__ import annotations

import os
import random

import anyio

import aioqueue

TABLES = (
    "CREATE TABLE effects (job_id bigint PRIMARY KEY, wf int NOT NULL, step text NOT NULL)",
    "CREATE TABLE starts (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL, step text NOT NULL)",
)


def register(queue: aioqueue.Queue) -> dict[str, aioqueue.Task[..., None]]:
    """The workflow's tasks: ``begin``, ``member`` (fanned out) and ``finish`` (the callback)."""
    pid = os.getpid()

    async def effect(wf: int, step: str) -> None:
        job = aioqueue.current_job()
        async with queue.connection() as conn:
            await conn.execute("INSERT INTO starts VALUES ($1, $2, $3, $4)", job.id, job.attempt, pid, step)
        # Long enough that 5,000 jobs outlast the crash test's kills and restart on any machine.
        await anyio.sleep(random.uniform(0.02, 0.1))
        async with queue.connection() as conn:
            await conn.execute("INSERT INTO effects VALUES ($1, $2, $3) ON CONFLICT (job_id) DO NOTHING",
                               job.id, wf, step)

    @queue.task(name="begin", max_attempts=1000)
    async def begin(wf: int) -> None:
        await effect(wf, "begin")

    @queue.task(name="member", max_attempts=1000)
    async def member(wf: int, i: int) -> None:
        await effect(wf, f"member{i}")

    @queue.task(name="finish", max_attempts=1000)
    async def finish(wf: int) -> None:
        await effect(wf, "finish")

    return {"begin": begin, "member": member, "finish": finish}


async def enqueue_workflows(queue: aioqueue.Queue, n: int, members: int = 3) -> None:
    """``n`` workflows: ``begin``, then ``members`` members of a group after it, then ``finish``
    on the group's success; each workflow in one transaction."""
    tasks = register(queue)
    for wf in range(n):
        async with queue.connection() as conn, conn.transaction():
            first = await tasks["begin"].options(conn=conn).enqueue(wf=wf)
            g = await queue.open_group(on_success=tasks["finish"].s(wf=wf), conn=conn)
            await tasks["member"].options(conn=conn, after=[first], group=g).enqueue_many(
                [{"wf": wf, "i": i} for i in range(members)])
            await g.close(conn=conn)
