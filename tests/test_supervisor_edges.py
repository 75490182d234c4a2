"""The command at its edges: a SIGTERM in the first moments of ``aioqueue worker`` (while it
imports, checks the schema, or spawns children that are still importing), whatever the number
of Queues and processes, ends in exit 0 with no orphans; operator commands on jobs that do not
exist say so and exit non-zero."""

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

from .cli_tools import aioqueue_cli, cli_env, cli_process
from .conftest import TEMPLATE, fresh_database
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


HELD_AT_IMPORT = '''
"""Two Queues whose worker processes stop while importing this module until the test lets them go."""
import os
import sys
import time
from pathlib import Path

import aioqueue

app = aioqueue.Queue(os.environ["AIOQUEUE_DSN"])
heavy = aioqueue.Queue(os.environ["HEAVY_DSN"])


@app.task(queue="mail")
async def send_mail() -> None:
    pass


@heavy.task(queue="thumbnails")
async def thumbnail() -> None:
    pass


# A process that will run workers (not a supervisor) says it is here, then waits for the test:
# a signal the test sends meanwhile reaches it at this known point of its start.
if "--supervised-by" in sys.argv or "--processes" not in sys.argv:
    markers = Path(os.environ["MARKERS"])
    (markers / f"importing-{os.getpid()}").touch()
    deadline = time.monotonic() + 30
    while not (markers / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
'''


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("targets", [["held:app"], ["held:app", "held:heavy"]], ids=["one-queue", "two-queues"])
async def test_a_sigterm_before_the_workers_run_stops_every_one_of_them(
    dsn: str, tmp_path: Path, processes: int, targets: list[str]
) -> None:
    """The signal is held while the workers' process imports the app: every worker of the
    process, however many Queues it serves, must stop at once when it starts."""
    (tmp_path / "held.py").write_text(HELD_AT_IMPORT)
    markers = tmp_path / "markers"
    markers.mkdir()
    args = ["worker", *targets, "--grace-period", "1", "--poll-interval", "0.2"]
    if processes > 1:
        args += ["--processes", str(processes)]
    async with fresh_database("h", TEMPLATE) as heavy_dsn, cli_process(
        args, dsn, tmp_path, env={"HEAVY_DSN": heavy_dsn, "MARKERS": str(markers)}
    ) as (process, output):
        await eventually(lambda: len(list(markers.glob("importing-*"))) == processes, timeout=20,
                         what="every worker process to be importing the app")
        process.send_signal(signal.SIGTERM)
        if processes > 1:  # the supervisor has passed it on to its children
            await output.wait_for("SIGTERM: stopping")
        (markers / "go").touch()
        with anyio.fail_after(20):
            status = await process.wait()
        assert status == 0, output.text
        assert _children_of(process.pid) == []
    assert output.text.count(" stopped: WorkerStats(claimed=0") == processes * len(targets), output.text


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
