"""Hold the worker's one LISTEN connection and turn notifications into wake-ups.

The connection is dedicated (outside the pool). It is pinged every ``ping_interval`` and watched
for termination; when it drops, or its first attempt at start fails, the notifier reconnects with
backoff and, once listening, wakes the producer at once, because notifications sent while it was
away are lost. NOTIFY is only a hint: the producer's poll is what guarantees no job is missed.
``wait_result`` runs one too, on the channel of finished jobs: there is one listener, wherever
aioqueue listens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from ._job import Connection

if TYPE_CHECKING:
    from ._database import Database

logger = logging.getLogger("aioqueue.notifier")


class Notifier:
    """Listens on ``channels`` and calls each one's callback with every payload it receives."""

    #: First wait before reconnecting; it doubles with each failure, up to ``max_backoff``.
    reconnect_delay = 0.05

    def __init__(
        self,
        db: Database,
        channels: Mapping[str, Callable[[str], None]],
        on_reconnect: Callable[[], None],
        *,
        ping_interval: float = 5.0,
        max_backoff: float = 5.0,
    ) -> None:
        self.db = db
        self.channels = dict(channels)
        self.on_reconnect = on_reconnect
        self.ping_interval = ping_interval
        self.max_backoff = max_backoff
        self.connects = 0
        self.connected = False
        self.backend_pid: int | None = None

    def _listener(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        self.channels[channel](str(payload))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; report started after the first attempt to connect. Where LISTEN
        cannot work (through a transaction pooler, with no ``listen_dsn``) report started and
        wait: the callers' polls carry on alone. Every LISTEN in place after started was
        reported (a reconnect, or the first connect after a failed attempt) calls
        ``on_reconnect``."""
        if not await self.db.can_listen():
            task_status.started()
            await anyio.sleep_forever()
        failures = 0
        started = False
        while True:
            try:
                conn = await self.db.connect()
            except Exception as exc:
                failures += 1
                delay = min(self.max_backoff, self.reconnect_delay * 2 ** min(failures, 10))
                logger.warning("LISTEN connection failed (%s: %s); retrying in %.1fs",
                               type(exc).__name__, exc, delay)
                if not started:
                    started = True
                    task_status.started()
                await anyio.sleep(delay)
                continue
            lost = anyio.Event()
            try:
                conn.add_termination_listener(_setter(lost))
                for channel in self.channels:
                    await conn.add_listener(channel, self._listener)
                failures = 0
                self.connects += 1
                self.connected = True
                self.backend_pid = conn.get_server_pid()
                if started:
                    # Back after a drop, or in place only after a failed first attempt let the
                    # callers start without it: what was sent meanwhile reached no one.
                    logger.info("LISTEN connection in place again; catching up")
                    self.on_reconnect()
                if not started:
                    started = True
                    task_status.started()
                await self._watch(conn, lost)
            except Exception as exc:
                logger.warning("LISTEN connection lost (%s: %s)", type(exc).__name__, exc)
            finally:
                self.connected = False
                with anyio.CancelScope(shield=True):
                    await self.db.disconnect(conn)
            await anyio.sleep(min(self.max_backoff, self.reconnect_delay * 2 ** min(failures, 10)))
            failures += 1

    async def _watch(self, conn: Connection, lost: anyio.Event) -> None:
        """Return when the connection is terminated or stops answering pings."""
        while not conn.is_closed():
            with anyio.move_on_after(self.ping_interval):
                await lost.wait()
            if lost.is_set() or conn.is_closed():
                return
            with anyio.fail_after(max(1.0, self.ping_interval)):
                await conn.execute(self.db.queries.ping)


def _setter(event: anyio.Event) -> Callable[[object], None]:
    """A termination listener that sets ``event``."""
    return lambda _conn: event.set()
