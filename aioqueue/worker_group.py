"""Run the workers of several Queues (in one database or several) in one process, as one unit.

Each :class:`~aioqueue.Queue` names its own database, so queues that should leave the
application's database get a Queue (and tasks) of their own on another server; this runs a
worker for each in one task group. The group owns the process's signals (its workers must be
made with ``install_signal_handlers=False``): the first SIGINT/SIGTERM stops every worker
gracefully, a second interrupts their running jobs. If one worker fails, the others are stopped.
With ``health_port``, one HTTP server answers the probes for the whole group.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence

import anyio

from . import _stop_signals as stop_signals
from ._checks import check_int, check_seconds
from ._errors import ConfigurationError
from ._health import HealthServer
from ._worker import Worker, WorkerStats


async def run_workers(
    workers: Sequence[Worker],
    *,
    handle_signals: bool = True,
    health_port: int | None = None,
    health_addr: str = "0.0.0.0",
    unready_after: float = 10.0,
) -> list[WorkerStats]:
    """Run ``workers`` until each is stopped (by :meth:`Worker.stop` or a signal); return their
    counts, in order. With ``health_port``, serve ``/live`` and ``/ready`` for the group there:
    200 only while every worker would answer 200 (the body has each worker's answer by name)."""
    if not workers:
        raise ConfigurationError("run_workers needs at least one worker")
    for worker in workers:
        if worker.config.install_signal_handlers:
            raise ConfigurationError(
                f"worker {worker.name} watches signals itself: make the workers of a group with "
                "install_signal_handlers=False (the group stops them all on a signal)"
            )
        if health_port is not None and worker.config.health_port is not None:
            raise ConfigurationError(
                f"worker {worker.name} serves health probes itself: with run_workers(health_port=...) the "
                "group serves them, so make its workers without health_port"
            )
    server = None
    if health_port is not None:
        check_int("health_port", health_port, 0, 65535)
        check_seconds("unready_after", unready_after, allow_zero=False)
        server = HealthServer([w.health_check(unready_after) for w in workers], host=health_addr, port=health_port)
    stats: list[WorkerStats | None] = [None] * len(workers)

    async def run(i: int, worker: Worker) -> None:
        stats[i] = await worker.run()

    async with anyio.create_task_group() as tg:
        if handle_signals and threading.current_thread() is threading.main_thread():
            tg.start_soon(_watch_signals, workers)
        if server is not None:
            await tg.start(server.run)
        async with anyio.create_task_group() as running:
            for i, worker in enumerate(workers):
                running.start_soon(run, i, worker)
        tg.cancel_scope.cancel()
    return [s if s is not None else WorkerStats() for s in stats]


async def _watch_signals(workers: Sequence[Worker]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stopping = stop_signals.take() is not None  # one came while the command was starting
        if stopping:
            for worker in workers:
                worker.stop()
        async for _signum in signals:
            for worker in workers:
                if stopping:
                    worker.abort()
                else:
                    worker.stop()
            stopping = True
