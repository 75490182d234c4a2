"""Run the workers of several Queues (in one database or several) in one process, as one unit.

Each :class:`~aioqueue.Queue` names its own database, so queues that should leave the
application's database get a Queue (and tasks) of their own on another server; this runs a
worker for each in one task group. The group owns the process's signals (its workers must be
made with ``install_signal_handlers=False``): the first SIGINT/SIGTERM stops every worker
gracefully, a second interrupts their running jobs. If one worker fails, the others are stopped.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence

import anyio

from . import stop_signals
from .errors import ConfigurationError
from .worker import Worker, WorkerStats


async def run_workers(workers: Sequence[Worker], *, handle_signals: bool = True) -> list[WorkerStats]:
    """Run ``workers`` until each is stopped (by :meth:`Worker.stop` or a signal); return their
    counts, in order."""
    if not workers:
        raise ConfigurationError("run_workers needs at least one worker")
    for worker in workers:
        if worker.config.install_signal_handlers:
            raise ConfigurationError(
                f"worker {worker.name} watches signals itself: make the workers of a group with "
                "install_signal_handlers=False (the group stops them all on a signal)"
            )
    stats: list[WorkerStats | None] = [None] * len(workers)

    async def run(i: int, worker: Worker) -> None:
        stats[i] = await worker.run()

    async with anyio.create_task_group() as tg:
        if handle_signals and threading.current_thread() is threading.main_thread():
            tg.start_soon(_watch_signals, workers)
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
