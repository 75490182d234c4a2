"""Workflows under faults: worker processes SIGKILLed every 2 s and the server restarted once,
while 1,000 workflows with fan-out and fan-in run (migration 0014)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import anyio
import asyncpg
import pytest
from anyio.abc import Process

import aioqueue
from tests.support import workflow_steps
from tests.support.fault_tools import owned_server
from tests.support.pg import fetchval_once
from tests.support.worker import command


async def _spawn_workflow_worker(dsn: str, log: Path) -> Process:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with log.open("ab") as out:
        return await anyio.open_process(
            command("workflows", dsn, 10, 3.0), env=env, stdout=out, stderr=out)


@pytest.mark.slow
@pytest.mark.timeout(900)  # its own bound is the 600 s below; it takes 80 s, over 120 s on a loaded machine
async def test_workflows_survive_sigkill_every_two_seconds_and_a_server_restart(tmp_path: Path) -> None:
    """1,000 workflows of 5 steps (a step, a fan-out of 3 in a group after it, the group's callback),
    3 worker processes, one SIGKILLed every 2 s and replaced, the server stopped (immediate) and
    started once: every workflow finishes, every step's effect row exists once, every group's
    callback was enqueued once, and a step started again only after a kill of the process that
    ran it. Killing stops once every workflow finished and no job is left."""
    workflows = 1000
    async with owned_server() as server:
        db = await asyncpg.connect(server.dsn)
        try:
            for table in workflow_steps.TABLES:
                await db.execute(table)
            async with aioqueue.Queue(server.dsn) as queue:
                await workflow_steps.enqueue_workflows(queue, workflows)
        finally:
            await db.close()
        log = tmp_path / "workers.log"
        procs = [await _spawn_workflow_worker(server.dsn, log) for _ in range(3)]
        killed: set[int] = set()
        restarted = False

        async def finished() -> int:
            return int(await fetchval_once(
                server.dsn,
                "SELECT count(*) FROM effects WHERE step = 'finish' AND NOT EXISTS (SELECT FROM aioqueue.jobs)"))

        try:
            with anyio.fail_after(600):
                while True:
                    await anyio.sleep(2)
                    with contextlib.suppress(OSError, asyncpg.PostgresError):
                        if await finished() == workflows:
                            break
                    victim = procs.pop(0)
                    with contextlib.suppress(ProcessLookupError):  # one started during the outage may have quit
                        victim.send_signal(signal.SIGKILL)
                    await victim.wait()
                    killed.add(victim.pid)
                    procs.append(await _spawn_workflow_worker(server.dsn, log))
                    if not restarted and len(killed) == 3:
                        await server.stop("immediate")
                        await anyio.sleep(1)
                        await server.start()
                        restarted = True
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                await proc.aclose()
        assert restarted
        db = await asyncpg.connect(server.dsn)
        try:
            assert await db.fetchval("SELECT count(*) FROM effects") == workflows * 5
            per_wf = await db.fetch("SELECT wf, count(*) AS n FROM effects GROUP BY wf HAVING count(*) <> 5")
            assert per_wf == []
            assert await db.fetchval("SELECT count(*) FROM aioqueue.group_callbacks") == workflows
            assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0  # nothing stuck or dead
            assert await db.fetchval(
                "SELECT count(*) FROM aioqueue.job_groups WHERE done_at IS NULL OR succeeded <> 3") == 0
            # A step started again only after the process that ran it was killed.
            again = await db.fetch(
                "SELECT s.job_id, s.pid FROM starts AS s WHERE EXISTS (SELECT FROM starts AS t "
                "WHERE t.job_id = s.job_id AND t.attempt > s.attempt)")
            assert {r["pid"] for r in again} <= killed, again
        finally:
            await db.close()
