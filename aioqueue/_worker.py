"""The worker: one task group that owns a producer, handler runners, a completer, a notifier,
a heartbeat, a cancel watch and maintenance, and shuts them down in order.

``run()`` works until ``stop()`` or SIGINT/SIGTERM (a second signal interrupts running
handlers at once); ``run_until_empty()`` processes every ready job and returns. Shutdown stops
claiming, lets running handlers finish within ``grace_period``, interrupts the rest (they go
back to pending without spending an attempt), writes every outcome, and closes the listener.
The worker wires the services together; each owns its own state (claiming in the producer,
held claims in :class:`~aioqueue._claims.Claims`, outcomes in the executor, writes in the
completer, cancel requests in :class:`~aioqueue._cancel_watch.CancelWatch`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Unpack

import anyio
from anyio.abc import TaskGroup

from . import _progress as progress
from . import _steps as steps
from . import _stop_signals as stop_signals
from ._cancel_watch import CancelWatch
from ._claims import ClaimKey, Claims
from ._completer import Completer, SharedConnection
from ._config import WorkerConfig, WorkerOptions
from ._errors import ConfigurationError
from ._executor import Executor
from ._health import Health
from ._lease import Heartbeat
from ._maintenance import VACUUM_INTERVAL, Maintenance
from ._notifier import Notifier
from ._outcome import Interrupt
from ._periodic import Scheduler
from ._producer import Producer
from ._registry import WorkerRegistry
from ._runners import Runners

if TYPE_CHECKING:
    from ._app import Queue

logger = logging.getLogger("aioqueue.worker")


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerStats:
    """What a worker did: jobs claimed, and how their attempts ended; of the snoozed ones, those
    that stopped at a durable sleep or event wait (``suspended``); and what its handlers stored
    (:func:`aioqueue.step`, :func:`aioqueue.sleep`, :func:`aioqueue.wait_for_event`)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    snoozed: int = 0
    interrupted: int = 0
    cancelled: int = 0
    suspended: int = 0
    steps: int = 0
    sleeps: int = 0
    event_waits: int = 0


class Worker:
    """Runs the jobs of one :class:`~aioqueue.Queue`'s tasks, ``concurrency`` at a time.

    Options are those of :class:`~aioqueue.WorkerConfig`; pass ``config=`` to start from a
    config object (keyword options then override its fields).
    """

    def __init__(self, app: Queue, config: WorkerConfig | None = None, **options: Unpack[WorkerOptions]) -> None:
        if config is not None and not isinstance(config, WorkerConfig):
            raise ConfigurationError(f"config must be an aioqueue.WorkerConfig, got {config!r}")
        self.app = app
        self.config = WorkerConfig.from_options(options, base=config) if options or config is None else config
        self.name: str = self.config.name or ""
        self.ready = anyio.Event()
        """Set once the worker has started: it is listening, has looked for work once, its
        registry row is written and the reaper has run. (If the listener's first attempt to
        connect failed, it listens later and the worker then looks for work again at once.)"""
        self.notifier: Notifier | None = None
        self.producer: Producer | None = None
        self.executor: Executor | None = None
        self.heartbeat: Heartbeat | None = None
        self.maintenance: Maintenance | None = None
        self.scheduler: Scheduler | None = None
        self.registry: WorkerRegistry | None = None
        self.health: Health | None = None
        self.claims = Claims()
        self._serving = False
        self._stop = False
        self._running = False

    @property
    def concurrency(self) -> int:
        """How many handlers run at once."""
        return self.config.concurrency

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running handlers get ``grace_period`` to finish. Returns at once: await
        ``run()`` (or its task) to know when the worker is done. Called before ``run()`` (say, by
        a signal that came while the process was starting), the run stops as soon as it starts."""
        self._stop = True
        if self.producer is not None:
            self.producer.stop()

    def abort(self) -> None:
        """Stop claiming and interrupt running handlers now (their jobs go back to pending)."""
        self.stop()
        if self.executor is not None:
            self.executor.interrupt_all(Interrupt.SHUTDOWN)

    @property
    def stats(self) -> WorkerStats:
        """Counts so far."""
        counts: dict[str, int] = {} if self.executor is None else dict(self.executor.counts)
        if self.producer is not None:
            counts["claimed"] = self.producer.claimed + self.producer.buried
            counts["dead"] = counts.get("dead", 0) + self.producer.buried
        return WorkerStats(**counts)

    @property
    def active(self) -> int:
        """Jobs claimed and not yet finished by their handler."""
        return self.claims.active

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
        db = self.app.database
        opened = False
        try:
            if not db.is_open:
                await db.open()
                opened = True
            await self._serve(burst)
        finally:
            # A stop asked for before the run began holds for it (a group of workers is told to
            # stop before each starts); once the run is over, the next one starts afresh.
            self._running = False
            self._stop = False
            if opened:
                with anyio.CancelScope(shield=True):
                    await db.close()
        return self.stats

    async def _serve(self, burst: bool) -> None:
        cfg, db = self.config, self.app.database
        if cfg.listen and not burst and not await db.can_listen():
            logger.warning("LISTEN cannot pass a transaction pooler: polling every %.1fs (set listen_dsn "
                           "to a DSN straight to the server to be woken at once)", cfg.poll_interval)
            cfg = dataclasses.replace(cfg, listen=False)
        queues = list(cfg.queues or sorted({t.queue for t in self.app.tasks.values()}))
        if not queues:
            raise ConfigurationError("the worker has no queues: register a task or pass queues=[...]")
        claims = self.claims = Claims()
        completer = Completer(
            db,
            batch_size=cfg.completion_batch,
            interval=cfg.completion_interval,
            max_backlog=max(cfg.completion_batch * 4, cfg.concurrency * 2),
            on_written=claims.release_written,
            commit_mode=cfg.commit_mode,
        )
        executor = self.executor = Executor(self.app.tasks, self.app.middleware, completer)
        producer = self.producer = Producer(
            db, cfg, queues=queues, claims=claims, completer=completer, on_lost=self._lost
        )
        producer.take_limits(await db.check_schema(queues))  # and its queues' limits, one round trip
        if self._stop:
            producer.stop()
        self.heartbeat = Heartbeat(
            db, claims, lease=cfg.lease, interval=cfg.heartbeat_interval or 1.0,
            writing=completer.writing, on_lost=self._lost,
        )
        self.maintenance = maintenance = Maintenance(
            db, reap_interval=cfg.reap_interval or 1.0, archive_retention=cfg.archive_retention,
            vacuum_threshold=cfg.vacuum_threshold, vacuum_interval=min(VACUUM_INTERVAL, cfg.reap_interval or 1.0),
        )
        cancels = CancelWatch(db, claims, interval=cfg.poll_interval, interrupt=executor.interrupt,
                              interrupt_job=executor.interrupt_job)
        try:
            async with anyio.create_task_group() as services:
                served = {t.name: t.queue for t in self.app.tasks.values() if t.queue in queues}
                self.registry = WorkerRegistry(
                    db, self.name, queues=queues, concurrency=cfg.concurrency, tasks=served,
                    counts=lambda: dataclasses.asdict(self.stats),
                )
                started = anyio.Event()
                services.start_soon(self._start_beside_claims, services, producer, completer, self.registry,
                                    self.maintenance, started)
                services.start_soon(self._ready_once, producer.ready, started)
                services.start_soon(self.heartbeat.run)
                services.start_soon(self._upkeep_once_settled, producer, completer, burst)
                channels: dict[str, Callable[[str], None]] = {
                    db.channels.jobs: producer.wakeups.wake,
                    db.channels.due: producer.wakeups.on_due,
                    db.channels.cancel: cancels.notified,
                }
                notifier = self.notifier = Notifier(db, channels, producer.wakeups.reconnected,
                                                    ping_interval=cfg.ping_interval)
                if cfg.listen and not burst:
                    await services.start(notifier.run)
                services.start_soon(cancels.run)
                periodics = [p for p in self.app.periodics.values() if p.task.queue in queues]
                if periodics and not burst:
                    self.scheduler = Scheduler(db, periodics)
                    services.start_soon(self.scheduler.run)
                if cfg.install_signal_handlers and threading.current_thread() is threading.main_thread():
                    services.start_soon(self._watch_signals)
                if cfg.health_port is not None:
                    self.health = Health(db, self._services_state, port=cfg.health_port, host=cfg.health_addr,
                                         unready_after=cfg.unready_after, name=self.name)
                    await services.start(self.health.run)
                self._serving = True
                logger.info("worker %s started: queues=%s concurrency=%d", self.name, ",".join(queues),
                            cfg.concurrency)

                async def reaped_at_start() -> bool:
                    await started.wait()
                    return maintenance.reaped > 0

                try:
                    # A burst listens only once a limit holds its jobs back (see Producer.run).
                    listen = functools.partial(services.start, notifier.run) if cfg.listen and burst else None
                    await self._work(producer, executor, completer, burst, reaped_at_start, listen)
                finally:
                    self._serving = False
                    services.cancel_scope.cancel()
        finally:
            await self._final_flush(completer)
            logger.info("worker %s stopped: %s", self.name, self.stats)

    async def _start_beside_claims(
        self, services: TaskGroup, producer: Producer, completer: Completer, registry: WorkerRegistry,
        maintenance: Maintenance, started: anyio.Event,
    ) -> None:
        """The worker's first statements other than claims, on the pool's next connection: the
        completer's warm-up, then, taking turns with the outcomes' writes, the registry's row
        and the reaper (a burst does not end before it has claimed what crashed workers left).
        So the first claim waits for none of them, and the pool opens one connection more."""
        await producer.connected.wait()
        registering = writing = False
        shared: SharedConnection | None = None
        try:
            async with self.app.database.connection() as conn:
                shared = completer.shared = SharedConnection(conn)
                try:
                    async with shared.turn():
                        await completer.warm_up(conn)
                    services.start_soon(completer.run)
                    writing = True
                    async with shared.turn():
                        services.start_soon(registry.run, conn)
                        registering = True
                        await registry.tried.wait()
                    async with shared.turn():
                        await maintenance.step(functools.partial(maintenance.reap, conn))
                finally:
                    # Not given back to the pool while a write is under way on it (see take_back).
                    with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                        await shared.take_back()
        except Exception as exc:  # no connection: each service gets its own later, or retries
            logger.warning("starting the worker's services failed (%s: %s)", type(exc).__name__, exc)
            if not registering:
                services.start_soon(registry.run)
        finally:
            if shared is not None:
                completer.shared = None
                shared.handed_back()
        started.set()
        if not writing:
            services.start_soon(completer.run)

    async def _ready_once(self, *events: anyio.Event) -> None:
        """Set :attr:`ready` once every one of ``events`` is set."""
        for event in events:
            await event.wait()
        self.ready.set()

    async def _upkeep_once_settled(self, producer: Producer, completer: Completer, burst: bool) -> None:
        """Run maintenance once the producer has caught up with the ready jobs: upkeep
        (retention and pruning; the reaper ran before the first claim), or ``reap_interval``
        after the first claim if it has not by then, and the vacuum checks, or
        ``vacuum_interval`` after it. At start either would take a connection of its own
        (the pool opening one more, a cold backend) and compete with the first burst of jobs
        for the server, and neither is urgent; an idle worker catches up at its first claim.
        A burst (``run_until_empty()``) catches up only as it ends: it runs them once it has
        lasted their interval, never while it returns, and never prunes the steps of the jobs
        it has just finished."""
        await self.ready.wait()
        await completer.warmed.wait()  # until then the completer's connection is not free for it

        async def settled(seconds: float) -> bool:
            with anyio.move_on_after(seconds):
                await (anyio.sleep_forever() if burst else producer.caught_up.wait())
                return True
            return False

        assert self.maintenance is not None
        await self.maintenance.run(reaped=True, settled=settled)

    async def _work(
        self,
        producer: Producer,
        executor: Executor,
        completer: Completer,
        burst: bool,
        started: Callable[[], Awaitable[bool]],
        listen: Callable[[], Awaitable[object]] | None,
    ) -> None:
        # Where the handlers' durable steps are stored: the runners, started from here, inherit it.
        steps.bind(completer.db)
        progress.bind(completer)  # and where they report progress
        runners = Runners(executor, completer, self.claims, self.config.concurrency, lambda: self._stop)
        async with anyio.create_task_group() as group:
            group.start_soon(runners.join)  # the group waits for the runners, or cancels them
            try:
                await producer.run(runners.hand_over, burst=burst, started=started, listen=listen)
            finally:
                runners.give_back()
                runners.close()
                self.ready.set()
            group.start_soon(self._enforce_grace, executor, runners)

    async def _enforce_grace(self, executor: Executor, runners: Runners) -> None:
        if await self.claims.idle.wait(self.config.grace_period):
            return
        count = executor.interrupt_all(Interrupt.SHUTDOWN)
        logger.warning("grace period of %.1fs over: interrupting %d running job(s)", self.config.grace_period, count)
        if not await self.claims.idle.wait(10.0):
            logger.error("handlers ignored cancellation; abandoning them to the lease")
            runners.abandon()

    def health_check(self, unready_after: float = 10.0) -> Health:
        """This worker's liveness and readiness, for a server that reports on a group of workers
        (:func:`~aioqueue.run_workers` with ``health_port``)."""
        return Health(self.app.database, self._services_state, unready_after=unready_after, name=self.name)

    def _services_state(self) -> str | None:
        """None while the worker's services run and it claims; else what it is doing instead."""
        if not self._serving:
            return "stopped"
        if self._stop:
            return "stopping"
        return None

    def _lost(self, claim: ClaimKey) -> None:
        """The lease of ``claim`` is lost (reaped, or the job claimed again): stop its handler."""
        if self.executor is not None:
            self.executor.interrupt(claim, Interrupt.LEASE_LOST)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            early = stop_signals.take()  # one that came while the command was starting
            if early is not None:
                logger.info("%s came while starting: stopping", signal.Signals(early).name)
                self.stop()
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
