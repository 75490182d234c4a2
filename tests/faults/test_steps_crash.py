"""Durable steps under SIGKILL: worker processes running jobs of five steps (each writing its
side effect on the step's own connection) and a durable sleep are killed every 2 s; every
job finishes and every step's side effect exists exactly once (``tests/support/worker.py``,
kind ``steps``)."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import anyio
import asyncpg
import pytest
from anyio.abc import Process

import aioqueue
from tests.support.fault_tools import stop_processes
from tests.support.helpers import eventually
from tests.support.worker import EFFECTS_TABLE, command, register_flow


async def _spawn_step_worker(dsn: str, log: Path) -> Process:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    with log.open("ab") as out:
        return await anyio.open_process(command("steps", dsn, 10, 2.0), env=env, stdout=out, stderr=out)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_sigkilled_workers_commit_each_steps_side_effect_exactly_once(
    dsn: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    jobs, kills = 500, 15
    rng = random.Random()
    await db.execute(EFFECTS_TABLE)
    async with aioqueue.Queue(dsn) as queue:
        await register_flow(queue).enqueue_many([{"n": n} for n in range(jobs)])
    log = tmp_path / "workers.log"
    procs = [await _spawn_step_worker(dsn, log) for _ in range(3)]
    left: list[int] = []
    try:
        for _ in range(kills):  # a SIGKILL every 2 s, the victim replaced at once
            await anyio.sleep(2.0)
            left.append(await db.fetchval("SELECT count(*) FROM aioqueue.jobs"))
            victim = procs.pop(rng.randrange(len(procs)))
            victim.send_signal(signal.SIGKILL)
            with anyio.fail_after(10):
                assert await victim.wait() == -signal.SIGKILL
            await victim.aclose()
            procs.append(await _spawn_step_worker(dsn, log))
        await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"), timeout=300,
                         interval=0.2, what="every job to finish")
    finally:
        await stop_processes(procs)
    assert left[0] > 0, "the first kill came after the work was done"
    counts = await db.fetch("SELECT job_id, step, count(*) AS n FROM effects GROUP BY job_id, step")
    assert len(counts) == jobs * 5
    assert [tuple(r) for r in counts if r["n"] != 1] == []  # every committed step's effect exactly once
