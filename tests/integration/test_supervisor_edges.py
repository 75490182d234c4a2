"""The command at its edges: a SIGTERM in the first moments of ``aioqueue worker`` (while it
imports, checks the schema, or spawns children that are still importing), whatever the number
of Queues and processes, ends in exit 0 with no orphans; operator commands on jobs that do not
exist say so and exit non-zero."""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import asyncpg
import psutil  # type: ignore[import-untyped]
import pytest

import aioqueue
from aioqueue._stop_signals import is_worker_command
from tests.support.cli_tools import TWO_QUEUES, aioqueue_cli, cli_env, cli_process
from tests.support.helpers import eventually


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


HELD_AT_IMPORT = TWO_QUEUES + '''
# A process that will run workers (not a supervisor) says it is here, then waits for the test:
# a signal the test sends meanwhile reaches it at this known point of its start.
import sys
import time
from pathlib import Path

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
    dsn: str, other_dsn: str, tmp_path: Path, processes: int, targets: list[str]
) -> None:
    """The signal is held while the workers' process imports the app: every worker of the
    process, however many Queues it serves, must stop at once when it starts."""
    (tmp_path / "held.py").write_text(HELD_AT_IMPORT)
    markers = tmp_path / "markers"
    markers.mkdir()
    args = ["worker", *targets, "--grace-period", "1", "--poll-interval", "0.2"]
    if processes > 1:
        args += ["--processes", str(processes)]
    async with cli_process(args, dsn, tmp_path, env={"HEAVY_DSN": other_dsn, "MARKERS": str(markers)}) as (
        process, output
    ):
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


@contextlib.contextmanager
def _ports_taken(count: int) -> Iterator[tuple[int, list[int]]]:
    """A port P free on 127.0.0.1 and the ``count`` ports after it held by listening sockets
    (another program's): yield P and the ports held."""
    for _ in range(50):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1] - 1
            first.close()
            try:
                held = []
                for taken in range(port + 1, port + 1 + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", taken))
                    s.listen()
                    held.append(taken)
                with socket.socket() as free:
                    free.bind(("127.0.0.1", port))
            except OSError:
                continue  # a neighbour is busy: try other ports
            yield port, held
            return
    raise RuntimeError("found no free port followed by free ports to hold")


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("aioqueue: error:")]


@pytest.mark.parametrize("targets", [["cli_app:queue"], ["two:app", "two:heavy"]], ids=["one-queue", "two-queues"])
async def test_a_health_port_in_use_is_one_line_naming_it(
    dsn: str, app_dir: Path, other_dsn: str, targets: list[str]
) -> None:
    (app_dir / "two.py").write_text(TWO_QUEUES)
    with _ports_taken(1) as (_free, [taken]):
        async with cli_process(["worker", *targets, "--health-port", str(taken), "--health-addr", "127.0.0.1"],
                               dsn, app_dir, env={"HEAVY_DSN": other_dsn}) as (process, output):
            with anyio.fail_after(20):
                status = await process.wait()
    assert status == 2, output.text
    assert "Traceback" not in output.text
    assert _error_lines(output.text) == [
        f"aioqueue: error: cannot serve health probes on 127.0.0.1:{taken}: the port is already in use"
    ], output.text


CHILD_FAILS = '''
"""A Queue that a worker process of a supervisor (and only one) finds misconfigured."""
import os
import sys

import aioqueue

supervised = "--supervised-by" in sys.argv
if supervised and os.environ["FAULT"] == "import":
    raise RuntimeError("the app's settings are missing")
queue = aioqueue.Queue(
    os.environ["AIOQUEUE_DSN"], schema="not_migrated" if supervised and os.environ["FAULT"] == "schema" else "aioqueue"
)


@queue.task(queue="cli")
async def record(n: int) -> None:
    pass
'''


@pytest.mark.parametrize("fault", ["health-port", "import", "schema"])
async def test_a_child_that_cannot_start_stops_them_all_with_its_message(
    dsn: str, tmp_path: Path, fault: str
) -> None:
    """A configuration error in a worker process (its health port taken, its app failing to
    import, its schema not migrated) is no crash to restart: the supervisor stops every child
    and exits non-zero with the child's message."""
    (tmp_path / "child_fails.py").write_text(CHILD_FAILS)
    with _ports_taken(1) as (free, [taken]):
        args = ["worker", "child_fails:queue", "--processes", "2", "--poll-interval", "0.2"]
        if fault == "health-port":  # process 0 serves on the free port, process 1 finds its own taken
            args += ["--health-port", str(free), "--health-addr", "127.0.0.1"]
        async with cli_process(args, dsn, tmp_path, env={"FAULT": fault}) as (process, output):
            with anyio.fail_after(30):
                status = await process.wait()
            assert _children_of(process.pid) == []
    expected = {
        "health-port": (2, f"cannot serve health probes on 127.0.0.1:{taken}: the port is already in use"),
        "import": (2, "importing 'child_fails' failed: RuntimeError: the app's settings are missing"),
        "schema": (1, "the aioqueue schema 'not_migrated' does not exist"),
    }
    code, message = expected[fault]
    assert status == code, output.text
    assert "restarting" not in output.text
    errors = _error_lines(output.text)
    assert len(errors) == 1 and message in errors[0], output.text
    assert output.text.rstrip().endswith(errors[0])  # the supervisor's last word


async def test_an_app_that_fails_to_import_is_a_configuration_error(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import no_such_dependency_here\n")
    status, _out, err = await aioqueue_cli("worker", "broken:queue", dsn=dsn, cwd=tmp_path)
    assert status == 2, err
    assert 'File "' in err and "broken.py" in err  # the traceback says where
    assert _error_lines(err) == [
        "aioqueue: error: importing 'broken' failed: ModuleNotFoundError: No module named 'no_such_dependency_here'"
    ]
