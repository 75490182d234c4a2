"""The worker: one task group that owns a producer, handler runners, a completer, a notifier,
a heartbeat and maintenance, and shuts them down in order.

``run()`` works until ``stop()`` or SIGINT/SIGTERM (a second signal interrupts running
handlers at once); ``run_until_empty()`` processes every ready job and returns. Shutdown stops
claiming, lets running handlers finish within ``grace_period``, interrupts the rest (they go
back to pending without spending an attempt), writes every outcome, and closes the listener.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .app import Queue
from .completer import Completer
from .errors import ConfigurationError
from .executor import Executor, Interrupt
from .job import Job
from .lease import Heartbeat
from .maintenance import Maintenance
from .notifier import Notifier
from .periodic import Scheduler
from .producer import Producer
from .signal import Flag
from .task import check_name

logger = logging.getLogger("aioqueue.worker")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStats:
    """What a worker did: jobs claimed, and how their attempts ended."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    snoozed: int = 0
    interrupted: int = 0
    cancelled: int = 0


def _slots(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _positive(name: str, value: float, *, minimum: float = 0.0) -> float:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= minimum:
        raise ConfigurationError(f"{name} must be a number greater than {minimum}, got {value!r}")
    return float(value)


class Worker:
    """Runs the jobs of one :class:`~aioqueue.Queue`'s tasks, ``concurrency`` at a time."""

    def __init__(
        self,
        app: Queue,
        *,
        concurrency: int = 10,
        queues: Sequence[str] | Mapping[str, int] | None = None,
        poll_interval: float = 1.0,
        lease: float = 300.0,
        grace_period: float = 30.0,
        heartbeat_interval: float | None = None,
        reap_interval: float | None = None,
        archive_retention: float | None = 7 * 86400.0,
        batch_size: int | None = None,
        prefetch: int = 0,
        completion_batch: int = 1000,
        completion_interval: float = 0.002,
        listen: bool = True,
        ping_interval: float = 5.0,
        name: str | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.app = app
        self.concurrency = concurrency
        self.queues = None if queues is None else [check_name("queue name", q) for q in queues]
        # Per-queue caps on this worker's slots, when queues is a mapping {queue: slots}.
        self.queue_concurrency: dict[str, int] | None = None
        if isinstance(queues, Mapping):
            self.queue_concurrency = {
                name: _slots(f"concurrency of queue {name!r}", slots) for name, slots in queues.items()
            }
        self.poll_interval = _positive("poll_interval", poll_interval)
        self.lease = _positive("lease", lease, minimum=0.1)
        if not isinstance(grace_period, int | float) or grace_period < 0:
            raise ConfigurationError(f"grace_period must be >= 0, got {grace_period!r}")
        self.grace_period = float(grace_period)
        self.heartbeat_interval = _positive(
            "heartbeat_interval", heartbeat_interval or min(self.lease / 3, 30.0)
        )
        if self.heartbeat_interval >= self.lease:
            raise ConfigurationError("heartbeat_interval must be shorter than the lease")
        self.reap_interval = _positive("reap_interval", reap_interval or min(self.lease / 2, 60.0))
        self.archive_retention = archive_retention
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ConfigurationError(f"prefetch must be an int >= 0, got {prefetch!r}")
        # Jobs claimed ahead of free slots, waiting in a local buffer (already running under
        # our lease): handlers never wait for a claim round trip. Unstarted ones go back on stop.
        self.prefetch = prefetch
        self.batch_size = batch_size or concurrency + prefetch
        self.completion_batch = completion_batch
        self.completion_interval = completion_interval
        self.listen = listen
        self.ping_interval = ping_interval
        self.install_signal_handlers = install_signal_handlers
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.ready = anyio.Event()
        self.notifier: Notifier | None = None
        self.producer: Producer | None = None
        self.executor: Executor | None = None
        self.heartbeat: Heartbeat | None = None
        self.maintenance: Maintenance | None = None
        self.scheduler: Scheduler | None = None
        self._counts: dict[str, int] = {}
        self._active = 0
        self._active_by_queue: dict[str, int] = {}
        self._capacity = Flag()
        self._idle = Flag()
        self._stop = False
        self._running = False

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace_period`` to finish. Returns at once."""
        self._stop = True
        self._capacity.set()
        if self.producer is not None:
            self.producer.wake()

    def abort(self) -> None:
        """Stop claiming and interrupt running handlers now (their jobs go back to pending)."""
        self.stop()
        if self.executor is not None:
            self.executor.interrupt_all(Interrupt.SHUTDOWN)

    @property
    def stats(self) -> WorkerStats:
        """Counts so far."""
        return WorkerStats(**self._counts)

    @property
    def active(self) -> int:
        """Jobs claimed and not yet finished by their handler."""
        return self._active

    async def run(self) -> WorkerStats:
        """Work until :meth:`stop`, :meth:`abort` or SIGINT/SIGTERM; return the counts."""
        return await self._run(burst=False)

    async def run_until_empty(self) -> WorkerStats:
        """Process every ready job, including ones that become ready meanwhile; then return."""
        return await self._run(burst=True)

    # -- the body ------------------------------------------------------------------------------

    async def _run(self, *, burst: bool) -> WorkerStats:
        if self._running:
            raise RuntimeError("this worker is already running")
        self._running = True
        self._stop = False
        opened = False
        try:
            if self.app._pool is None:
                await self.app.open()
                opened = True
            await self.app.check_schema()
            await self._serve(burst)
        finally:
            self._running = False
            if opened:
                with anyio.CancelScope(shield=True):
                    await self.app.close()
        return self.stats

    async def _serve(self, burst: bool) -> None:
        queues = self.queues or sorted({t.queue for t in self.app.tasks.values()})
        if not queues:
            raise ConfigurationError("the worker has no queues: register a task or pass queues=[...]")
        holdings: dict[int, int] = {}

        def written(claims: list[tuple[int, int]]) -> None:
            for job_id, attempt in claims:
                # Only that claim: the job may already be held again under a newer attempt.
                if holdings.get(job_id) == attempt:
                    del holdings[job_id]

        self._counts = {}
        completer = Completer(
            self.app,
            batch_size=self.completion_batch,
            interval=self.completion_interval,
            on_written=written,
        )
        executor = self.executor = Executor(self.app, completer, self._counts)
        producer = self.producer = Producer(
            self.app,
            worker_id=self.name,
            queues=queues,
            lease=self.lease,
            poll_interval=self.poll_interval,
        )
        self.heartbeat = Heartbeat(
            self.app,
            holdings,
            lease=self.lease,
            interval=self.heartbeat_interval,
            writing=completer.writing,
            on_lost=functools.partial(executor.interrupt, reason=Interrupt.LEASE_LOST),
        )
        self.maintenance = Maintenance(
            self.app, reap_interval=self.reap_interval, archive_retention=self.archive_retention
        )
        try:
            async with anyio.create_task_group() as services:
                services.start_soon(completer.run)
                services.start_soon(self.heartbeat.run)
                services.start_soon(self.maintenance.run)
                if self.listen and not burst:
                    channels: dict[str, Callable[[str], None]] = {
                        self.app.channel: producer.wake,
                        self.app.cancel_channel: self._on_cancel,
                    }
                    self.notifier = Notifier(self.app, channels, producer.wake, ping_interval=self.ping_interval)
                    await services.start(self.notifier.run)
                services.start_soon(self._watch_cancels, holdings)
                periodics = [p for p in self.app.periodics.values() if p.task.queue in queues]
                if periodics and not burst:
                    self.scheduler = Scheduler(self.app, periodics)
                    services.start_soon(self.scheduler.run)
                if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
                    services.start_soon(self._watch_signals)
                logger.info(
                    "worker %s started: queues=%s concurrency=%d", self.name, ",".join(queues),
                    self.concurrency,
                )
                try:
                    await self._work(producer, executor, completer, holdings, burst)
                finally:
                    services.cancel_scope.cancel()
        finally:
            await self._final_flush(completer)
            logger.info("worker %s stopped: %s", self.name, self.stats)

    async def _work(
        self,
        producer: Producer,
        executor: Executor,
        completer: Completer,
        holdings: dict[int, int],
        burst: bool,
    ) -> None:
        send, receive = anyio.create_memory_object_stream[Job](max_buffer_size=self.concurrency + self.prefetch)
        self._idle.set()
        async with anyio.create_task_group() as runners:
            async with receive:
                for _ in range(self.concurrency):
                    runners.start_soon(self._runner, receive.clone(), executor, completer)
            try:
                async with send:
                    await self._produce(producer, completer, holdings, send, burst)
            finally:
                self.ready.set()
            runners.start_soon(self._enforce_grace, executor, runners.cancel_scope)

    async def _produce(
        self,
        producer: Producer,
        completer: Completer,
        holdings: dict[int, int],
        send: MemoryObjectSendStream[Job],
        burst: bool,
    ) -> None:
        backlog_limit = max(self.completion_batch * 4, self.concurrency * 2)
        # With a prefetch buffer, refill it in large claims rather than one job at a time.
        min_claim = max(1, min(self.batch_size, self.prefetch // 2))
        while not self._stop:
            free = min(self.concurrency + self.prefetch - self._active, self.batch_size)
            per_queue = None
            if self.queue_concurrency is not None:
                per_queue = [
                    max(0, min(free, self.queue_concurrency.get(q, free) - self._active_by_queue.get(q, 0)))
                    for q in producer.queues
                ]
                free = min(free, sum(per_queue))
            # Below min_claim, wait for a bigger refill only while jobs in hand keep us busy.
            if free <= 0 or (free < min_claim and self._active) or len(completer) > backlog_limit:
                self._capacity.clear()
                await self._capacity.wait(self.poll_interval)
                continue
            jobs = await producer.claim_with_retry(free, lambda: self._stop, per_queue)
            self.ready.set()  # listening, and has looked for work once
            if jobs:
                self._counts["claimed"] = self._counts.get("claimed", 0) + len(jobs)
                self._idle.clear()
                for job in jobs:
                    holdings[job.id] = job.attempt
                    self._active += 1
                    self._active_by_queue[job.queue] = self._active_by_queue.get(job.queue, 0) + 1
                    send.send_nowait(job)
            if len(jobs) == free:
                continue  # every slot filled: there may be more ready right now
            if not burst:
                await producer.wait()
            elif jobs:
                continue
            elif self._active:
                self._capacity.clear()
                await self._capacity.wait(self.poll_interval)
            elif len(completer):
                await completer.wait_idle()  # outcomes first: a retry may be ready at once
            else:
                return

    async def _runner(
        self, receive: MemoryObjectReceiveStream[Job], executor: Executor, completer: Completer
    ) -> None:
        taken = 0
        async with receive:
            while True:
                # Take a buffered job without the checkpoint anyio's receive() makes first (a
                # few µs a job), but yield every 32 jobs, before taking one, so that no-op
                # handlers cannot starve the producer and the completer.
                if taken % 32 == 31:
                    await anyio.lowlevel.checkpoint()
                try:
                    job = receive.receive_nowait()
                except anyio.WouldBlock:
                    try:
                        job = await receive.receive()
                    except anyio.EndOfStream:
                        return
                except anyio.EndOfStream:
                    return
                taken += 1
                try:
                    if self._stop:
                        # Claimed but not started when shutdown began: give it back untouched.
                        completer.rescheduled(job, 0.0)
                    else:
                        await executor.execute(job)
                finally:
                    self._active -= 1
                    self._active_by_queue[job.queue] -= 1
                    self._capacity.set()
                    if not self._active:
                        self._idle.set()

    async def _enforce_grace(self, executor: Executor, runners: anyio.CancelScope) -> None:
        if await self._idle.wait(self.grace_period):
            return
        count = executor.interrupt_all(Interrupt.SHUTDOWN)
        logger.warning("grace period of %.1fs over: interrupting %d running job(s)", self.grace_period, count)
        if not await self._idle.wait(10.0):
            logger.error("handlers ignored cancellation; abandoning them to the lease")
            runners.cancel()

    def _on_cancel(self, payload: str) -> None:
        """A cancel request arrived by NOTIFY: interrupt the job if it runs here."""
        if self.executor is not None and payload.isdigit():
            self.executor.interrupt(int(payload), Interrupt.CANCELLED)

    async def _watch_cancels(self, holdings: dict[int, int]) -> None:
        """Poll for cancel requests of held jobs: the backstop for a lost notification."""
        failing = False
        while True:
            await anyio.sleep(self.poll_interval)
            if not holdings or self.executor is None:
                continue
            held = dict(holdings)
            try:
                async with self.app.connection() as conn:
                    rows = await conn.fetch(self.app.queries.cancel_requests, list(held), list(held.values()))
            except Exception as exc:
                if not failing:  # once per outage, not once a tick
                    logger.warning("checking for cancel requests failed (%s: %s)", type(exc).__name__, exc)
                failing = True
                continue
            failing = False
            for row in rows:
                self.executor.interrupt(row["id"], Interrupt.CANCELLED)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if not self._stop:
                    logger.info("%s: stopping gracefully (send again to interrupt running jobs)",
                                signal.Signals(signum).name)
                    self.stop()
                else:
                    logger.warning("%s again: interrupting running jobs", signal.Signals(signum).name)
                    self.abort()

    async def _final_flush(self, completer: Completer) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(15.0):
            while len(completer):
                try:
                    await completer.flush()
                except Exception as exc:
                    logger.warning("final write of job outcomes failed (%s); retrying", exc)
                    await anyio.sleep(0.2)
        if len(completer):
            logger.error(
                "%d job outcome(s) could not be written; their leases will return the jobs",
                len(completer),
            )
