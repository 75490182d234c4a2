"""The command at its edges: a SIGTERM in the first moments of ``aioqueue worker`` (while it
imports, checks the schema, or spawns children that are still importing) ends in exit 0 with
no orphans; operator commands on jobs that do not exist say so and exit non-zero."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import asyncpg
import psutil  # type: ignore[import-untyped]
import pytest

import aioqueue
from aioqueue.stop_signals import is_worker_command

from .cli_tools import aioqueue_cli, cli_env
from .helpers import eventually


def _children_of(pid: int) -> list[psutil.Process]:
    """Worker processes a supervisor ``pid`` started (they run in sessions of their own)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--supervised-by" in cmdline and cmdline[cmdline.index("--supervised-by") + 1] == str(pid):
            found.append(process)
    return found


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (its SigCgt mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


# Seconds after the command's first handler is in place (importing aioqueue begins it): inside
# the imports, the schema check, and the children's start. Before that point only the
# interpreter's own start-up runs, which no code of the command can guard.
MOMENTS = [0.0, 0.1, 0.25, 0.5, 0.9]


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("moment", MOMENTS)
async def test_an_early_sigterm_exits_cleanly_with_no_orphans(
    dsn: str, app_dir: Path, processes: int, moment: float
) -> None:
    command = [sys.executable, "-m", "aioqueue", "worker", "cli_app:queue", "-p", str(processes)]
    async with await anyio.open_process(command, env=cli_env(dsn), cwd=app_dir, stdout=None, stderr=None) as process:
        await eventually(lambda: _catches_sigterm(process.pid), timeout=20, interval=0.001,
                         what="the command to hold SIGTERM")
        await anyio.sleep(moment)  # the fault's timing, not a wait for a condition
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            status = await process.wait()
    assert status == 0, f"SIGTERM at {moment}s: exit status {status}"
    assert _children_of(process.pid) == []


def test_the_worker_command_is_recognised_from_its_argv() -> None:
    assert is_worker_command(["python", "-m", "aioqueue", "worker", "app:q"])
    assert is_worker_command(["python", "/venv/bin/aioqueue", "--dsn", "x", "worker", "app:q"])
    assert not is_worker_command(["python", "-m", "aioqueue", "status"])
    assert not is_worker_command(["python", "-m", "myapp", "worker"])
    assert not is_worker_command(["python", "-c", "import aioqueue"])


async def test_dead_retry_or_purge_of_jobs_that_do_not_exist_fails_saying_so(
    q: aioqueue.Queue, dsn: str, db: asyncpg.Connection
) -> None:
    for action in ("retry", "purge"):
        status, out, err = await aioqueue_cli("dead", action, "999", dsn=dsn)
        assert status == 1, (out, err)
        assert "no dead job with id 999" in err

    @q.task
    async def bad() -> None:
        pass

    real = await bad.enqueue()
    await db.execute("UPDATE aioqueue.jobs SET status = 'dead'")
    status, out, err = await aioqueue_cli("dead", "retry", str(real), "999", dsn=dsn)
    assert status == 1, (out, err)
    assert f"retried 1 dead job(s): {real}" in out and "no dead job with id 999" in err
