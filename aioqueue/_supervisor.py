"""Run N worker processes and keep them running: the parent of ``aioqueue worker --processes N``.

Each child is a fresh interpreter running a one-process ``aioqueue worker`` (its own pool and
LISTEN connection); they share the load through the database, as separate machines would. A
child that dies is logged and restarted, after a growing delay when it keeps dying young; one
that cannot go on for a reason no restart would fix (its configuration, its app's import, the
schema) says so on a pipe of its own, and the supervisor stops them all and exits with that
message and status (as it does when a child exits with status 2). On SIGINT/SIGTERM it
sends SIGTERM to every child, which stop claiming and drain within their grace period; a second
signal is passed on too, and makes the children interrupt their running jobs. Children run in a
session of their own, so a terminal's Ctrl-C reaches them once, through the supervisor; they
watch their parent and stop if it disappears. The supervisor never touches the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

import anyio
from anyio.abc import Process, TaskGroup

from . import _stop_signals as stop_signals

logger = logging.getLogger("aioqueue.supervisor")

EXIT_USAGE = 2

#: The environment variable naming the pipe a worker process reports a fatal error on.
REPORT_FD = "AIOQUEUE_REPORT_FD"
#: At most this much of a report is kept (a pipe takes it whole, without blocking the child).
_REPORT_LIMIT = 4096


def report_fd_from_env() -> int | None:
    """In a worker process of a supervisor: take the pipe to report to (out of the environment,
    so that no process this one starts writes to a file descriptor it does not have)."""
    value = os.environ.pop(REPORT_FD, None)
    try:
        fd = int(value) if value is not None else None
        return fd if fd is not None and stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except (ValueError, OSError):
        return None


def report(fd: int, message: str) -> bool:
    """Tell the supervisor why this worker process cannot go on: a reason no restart would fix,
    so it stops every child and exits with ``message``. False if the supervisor is gone."""
    try:
        os.write(fd, message.encode()[:_REPORT_LIMIT])
    except OSError:
        return False
    return True


def _read_report(fd: int) -> str | None:
    """What a child that has exited reported, if anything."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, _REPORT_LIMIT)
    except BlockingIOError:  # nothing written, and the write end still open somewhere
        return None
    return data.decode(errors="replace") or None


def describe_exit(returncode: int) -> str:
    """``exited with status 3`` or ``was killed by SIGKILL``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


@dataclasses.dataclass(eq=False)
class Supervisor:
    """Keeps ``processes`` children running ``command(slot)``, until a signal or :meth:`stop`."""

    command: Callable[[int], Sequence[str]]
    processes: int
    _: dataclasses.KW_ONLY
    shutdown_timeout: float = 60.0
    restart_delay: float = 0.5
    max_restart_delay: float = 30.0
    min_uptime: float = 10.0
    env: Mapping[str, str] | None = None
    handle_signals: bool = True
    children: dict[int, Process] = dataclasses.field(default_factory=dict, init=False)
    restarts: int = dataclasses.field(default=0, init=False)
    exit_code: int = dataclasses.field(default=0, init=False)
    error: str | None = dataclasses.field(default=None, init=False)
    """What the child that stopped them all reported (None: none did)."""
    _stopping: anyio.Event = dataclasses.field(default_factory=anyio.Event, init=False)

    async def run(self) -> int:
        """Start the children, restart those that die, return once all have stopped."""
        async with anyio.create_task_group() as tg:
            if self.handle_signals:
                tg.start_soon(self._watch_signals)
            async with anyio.create_task_group() as slots:
                for slot in range(self.processes):
                    slots.start_soon(self._keep_running, slot)
            tg.cancel_scope.cancel()
        logger.info("all %d worker processes stopped", self.processes)
        return self.exit_code

    def stop(self) -> None:
        """Ask every child to stop gracefully (SIGTERM); a second call asks them to hurry."""
        self._stopping.set()
        self._signal_children(signal.SIGTERM)

    async def _keep_running(self, slot: int) -> None:
        delay = self.restart_delay
        while not self._stopping.is_set():
            started = time.monotonic()
            read_end, write_end = os.pipe()  # the child reports on it why it cannot go on
            try:
                try:
                    process = await anyio.open_process(
                        list(self.command(slot)),
                        stdin=subprocess.DEVNULL,
                        stdout=None,
                        stderr=None,
                        env={**(os.environ if self.env is None else self.env), REPORT_FD: str(write_end)},
                        start_new_session=True,
                        pass_fds=(write_end,),
                    )
                finally:
                    os.close(write_end)  # the child's alone: the pipe ends when the child does
                async with process:
                    self.children[slot] = process
                    logger.info("worker process %d started (pid %d)", slot, process.pid)
                    if self._stopping.is_set():  # a signal came while it was being spawned
                        process.terminate()
                    try:
                        returncode = await process.wait()
                    finally:
                        del self.children[slot]
                reported = _read_report(read_end)
            finally:
                os.close(read_end)
            what = describe_exit(returncode)
            if self._stopping.is_set():
                logger.info("worker process %d (pid %d) %s", slot, process.pid, what)
                return
            if reported is not None and returncode != 0:
                logger.error("worker process %d (pid %d) %s: %s; stopping all", slot, process.pid, what, reported)
                self.error, self.exit_code = reported, returncode
                self.stop()
                return
            if returncode == EXIT_USAGE:
                logger.error("worker process %d (pid %d) %s: bad configuration; stopping all",
                             slot, process.pid, what)
                self.exit_code = EXIT_USAGE
                self.stop()
                return
            young = time.monotonic() - started < self.min_uptime
            delay = min(delay * 2, self.max_restart_delay) if young else self.restart_delay
            self.restarts += 1
            logger.error("worker process %d (pid %d) %s; restarting in %.1fs", slot, process.pid, what, delay)
            with anyio.move_on_after(delay):
                await self._stopping.wait()

    def _signal_children(self, signum: signal.Signals) -> None:
        for process in list(self.children.values()):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                early = stop_signals.take()  # one that came while the command was starting
                if early is not None:
                    self._on_signal(early, tg)
                async for signum in signals:
                    self._on_signal(signum, tg)

    def _on_signal(self, signum: int, tg: TaskGroup) -> None:
        name = signal.Signals(signum).name
        if not self._stopping.is_set():
            logger.info("%s: stopping %d worker processes gracefully (send again to "
                        "interrupt running jobs)", name, len(self.children))
            tg.start_soon(self._kill_after_timeout)
        else:
            logger.warning("%s again: asking worker processes to interrupt running jobs", name)
        self.stop()

    async def _kill_after_timeout(self) -> None:
        await anyio.sleep(self.shutdown_timeout)
        if self.children:
            logger.error("worker processes still running after %.0fs: killing them", self.shutdown_timeout)
            self._signal_children(signal.SIGKILL)
