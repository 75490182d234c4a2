"""The outbox relay: reads each outbox stream's committed events oldest first and publishes them
to a :class:`~aioqueue.streams.Stream`, then deletes them, one batch at a time.

It runs like a worker: in the registry (``workers``, queues ``outbox:NAME``), with health probes,
woken by NOTIFY (``<schema>_outbox``, payload: the stream) and polling as the guarantee, stopping
cleanly on SIGINT/SIGTERM (the batch in hand is published and deleted first). One relay at a
time publishes a stream: the holder of its lease, renewed by every read (``relay_read``); others
wait as standbys and take over once it lapses. Per key the outbox's ids follow commit order
(migration 0013), and a batch goes to the stream in id order, so a key's events arrive in commit
order. Events leave the outbox only after the stream took them: a relay killed anywhere loses
nothing, and what it sent again is dropped by a stream that can (``Stream.exactly_once``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import anyio

from . import _stop_signals as stop_signals
from ._errors import ConfigurationError
from ._health import Health
from ._notifier import Notifier
from ._registry import WorkerRegistry
from ._signal import Flag
from .streams import Event

if TYPE_CHECKING:
    from ._database import Database
    from .streams import Stream

logger = logging.getLogger("aioqueue.relay")


class RelayOptions(TypedDict, total=False):
    """The options of :meth:`Queue.relay <aioqueue.Queue.relay>`."""

    name: str
    batch_size: int
    poll_interval: float
    lease: float
    health_port: int | None
    health_addr: str
    install_signal_handlers: bool


@dataclasses.dataclass(slots=True)
class RelayStats:
    """What a relay did: events the stream took as new, events it already held (sent again after
    a crash or a lost lease), and batches."""

    published: int = 0
    duplicates: int = 0
    batches: int = 0


def _positive(name: str, value: object, kind: type = float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0 or (
        kind is int and not isinstance(value, int)
    ):
        raise ConfigurationError(f"{name} must be a positive {kind.__name__}, got {value!r}")


class Relay:
    """Publishes outbox streams to a stream until stopped; see :meth:`aioqueue.Queue.relay`.

    ``batch_size`` events per read and per publish; ``poll_interval`` seconds between reads of a
    quiet stream (NOTIFY wakes it sooner); ``lease`` seconds a crashed relay keeps a stream from
    its standbys (a relay renews it with every read, at least every ``poll_interval``).
    """

    def __init__(
        self,
        db: Database,
        stream: Stream,
        streams: Sequence[str],
        *,
        name: str | None = None,
        batch_size: int = 500,
        poll_interval: float = 1.0,
        lease: float = 30.0,
        health_port: int | None = None,
        health_addr: str = "0.0.0.0",
        install_signal_handlers: bool = False,
    ) -> None:
        if not streams:
            raise ConfigurationError("a relay needs at least one outbox stream to publish")
        _positive("batch_size", batch_size, int)
        _positive("poll_interval", poll_interval)
        _positive("lease", lease)
        if lease <= poll_interval:
            raise ConfigurationError(f"lease ({lease}s) must be longer than poll_interval ({poll_interval}s)")
        self.db = db
        self.stream = stream
        self.streams = list(dict.fromkeys(streams))
        self.name = name or f"relay-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.lease = lease
        self.health_port = health_port
        self.health_addr = health_addr
        self.install_signal_handlers = install_signal_handlers
        self.stats = RelayStats()
        self.lag: dict[str, float] = {}
        """Per stream this relay leads: how many seconds the oldest waiting event had waited at
        the last read (0.0 when none waited). Written by the stream's loop, read by anyone."""
        self.leading: set[str] = set()
        """The streams whose lease this relay held at its last read of them."""
        self.health: Health | None = None
        self._wakeups = {s: Flag() for s in self.streams}
        self._stopping = False
        self._serving = False
        self._scope: anyio.CancelScope | None = None

    def stop(self) -> None:
        """Stop after the batches in hand are published and deleted."""
        self._stopping = True
        for flag in self._wakeups.values():
            flag.set()

    async def run(self) -> RelayStats:
        """Publish until :meth:`stop` (or SIGINT/SIGTERM, with ``install_signal_handlers``)."""
        return await self._run(until_empty=False)

    async def run_until_empty(self) -> RelayStats:
        """Publish until every stream this relay leads has no event left, then return."""
        return await self._run(until_empty=True)

    def _state(self) -> str | None:
        return None if self._serving else ("stopping" if self._stopping else "not started")

    def _wake(self, stream: str) -> None:
        flag = self._wakeups.get(stream)
        if flag is not None:
            flag.set()

    def _wake_all(self) -> None:
        for flag in self._wakeups.values():
            flag.set()

    async def _run(self, *, until_empty: bool) -> RelayStats:
        await self.db.open()
        await self.db.check_schema()
        db = self.db
        registry = WorkerRegistry(db, self.name, queues=[f"outbox:{s}" for s in self.streams],
                                  concurrency=len(self.streams))
        try:
            async with anyio.create_task_group() as services:
                self._scope = services.cancel_scope
                services.start_soon(registry.run)
                if not until_empty:
                    notifier = Notifier(db, {db.channels.outbox: self._wake}, self._wake_all)
                    await services.start(notifier.run)
                if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
                    services.start_soon(self._watch_signals)
                if self.health_port is not None:
                    self.health = Health(db, self._state, port=self.health_port, host=self.health_addr,
                                         name=self.name)
                    await services.start(self.health.run)
                self._serving = True
                logger.info("relay %s started: streams=%s", self.name, ",".join(self.streams))
                try:
                    async with anyio.create_task_group() as loops:
                        for name in self.streams:
                            loops.start_soon(self._relay, name, until_empty)
                finally:
                    self._serving = False
                    services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5.0):
                await self._release()
        logger.info("relay %s stopped: %d events published", self.name, self.stats.published)
        return self.stats

    async def _relay(self, name: str, until_empty: bool) -> None:
        """Read, publish and delete batches of stream ``name`` until stopped (or empty)."""
        flag = self._wakeups[name]
        failures = 0
        while not self._stopping:
            flag.clear()
            try:
                events = await self._read(name)
                if events:
                    await self._publish(name, events)
                failures = 0
            except Exception as exc:
                failures += 1
                if failures == 1 or failures % 50 == 0:  # once per outage, then now and then
                    logger.warning("relay of stream %r failed (%s: %s); retrying", name, type(exc).__name__, exc)
                await flag.wait(min(self.poll_interval, 0.05 * 2 ** min(failures, 8)))
                continue
            if events is None:  # another relay leads: stand by, ready to take over
                await flag.wait(self.poll_interval)
            elif not events:
                if until_empty:
                    return
                await flag.wait(self.poll_interval)

    async def _read(self, name: str) -> list[Event] | None:
        """Take or renew the lease and read a batch; None when another relay holds the lease."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.relay_read, name, self.name, self.lease, self.batch_size)
        if not rows[0]["leader"]:
            if name in self.leading:
                logger.warning("relay %s lost the lease of stream %r to another relay", self.name, name)
            self.leading.discard(name)
            return None
        self.leading.add(name)
        events = [Event(id=r["id"], stream=name, key=r["key"], payload=r["payload"], created_at=r["created_at"])
                  for r in rows if r["id"] is not None]
        self.lag[name] = float(rows[0]["age"]) if events else 0.0
        return events

    async def _publish(self, name: str, events: list[Event]) -> None:
        """Publish a batch, then delete it from the outbox; a failure leaves it for the next read."""
        new = await self.stream.publish(events)
        async with self.db.connection() as conn:
            await conn.execute(self.db.queries.relay_ack, name, [e.id for e in events])
        self.stats.published += new
        self.stats.duplicates += len(events) - new
        self.stats.batches += 1

    async def _release(self) -> None:
        """End this relay's leases now, so standbys take over without waiting for them to lapse."""
        if not self.leading:
            return
        try:
            async with self.db.connection() as conn:
                for name in sorted(self.leading):
                    await conn.execute(self.db.queries.relay_release, name, self.name)
            self.leading.clear()
        except Exception as exc:
            logger.warning("could not end relay %s's leases (%s: %s); they lapse in %.0fs",
                           self.name, type(exc).__name__, exc, self.lease)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            early = stop_signals.take()
            if early is not None:
                self.stop()
            async for signum in signals:
                if self._stopping and self._scope is not None:
                    logger.warning("%s again: stopping now (the batch in hand goes again)", signal.Signals(signum).name)
                    self._scope.cancel()
                    return
                logger.info("%s: stopping after the batches in hand (send again to stop at once)",
                            signal.Signals(signum).name)
                self.stop()
