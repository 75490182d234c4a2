"""When a worker's producer looks for jobs again, short of a free slot: a notification naming one
of its queues, the listener coming back, the earliest delayed job or rate window it knows of, or
the poll tick.

It owns those reasons and the wait for the first of them. It never reads the database: the
producer asks for the next due time when :attr:`Wakeups.check_due` says so and tells it here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ._signal import Flag

logger = logging.getLogger("aioqueue.producer")


class Wakeups:
    """The reasons for one producer to look for jobs of ``queues`` again, and the wait for them."""

    def __init__(self, queues: Sequence[str], poll_interval: float) -> None:
        self._queue_set = frozenset(queues)
        self.poll_interval = poll_interval
        self.flag = Flag()
        """Raised by every reason to look, and by :meth:`stop`."""
        # When to look again without being told (monotonic seconds): the earliest delayed job
        # or rate window we know of. Delayed enqueues, retries and snoozes announce their due
        # time by NOTIFY; the database is asked at start, after a due time passes, and after a
        # claim a rate limit may have cut short.
        self._due: float | None = None
        self.check_due = True
        """Whether the due time we know may be stale: the producer should ask the database."""
        self._woken = False
        self._stopping = False

    def wake(self, queue: str | None = None) -> None:
        """Look for jobs now (``queue``: the queue a notification named, if any)."""
        if queue is None or queue in self._queue_set:
            self._woken = True
            self.flag.set()

    def reconnected(self) -> None:
        """The listener was away: notifications may be lost, so look now and re-learn due times."""
        self.check_due = True
        self.wake()

    def on_due(self, payload: str) -> None:
        """A ``'seconds queue'`` notification: a job of ``queue`` is due in ``seconds``."""
        seconds, _, queue = payload.partition(" ")
        if queue in self._queue_set:
            try:
                self.due_in(float(seconds))
            except ValueError:
                logger.warning("ignored a malformed due-time notification %r", payload)

    def due_in(self, seconds: float) -> None:
        """Look again ``seconds`` from now (or earlier, if something else is due sooner)."""
        at = time.monotonic() + max(0.0, seconds)
        if self._due is None or at < self._due:
            self._due = at
            self.flag.set()  # re-arm the wait with the earlier deadline

    def stop(self) -> None:
        """End the wait now, and every later one at once."""
        self._stopping = True
        self.flag.set()

    def claiming(self) -> None:
        """A claim starts: it answers every wake-up so far."""
        self.flag.clear()
        self._woken = False

    async def wait(self) -> None:
        """Wait for a wake-up, the earliest known due time, or the poll tick, whichever is first."""
        deadline = time.monotonic() + self.poll_interval
        while not self._woken and not self._stopping:
            now = time.monotonic()
            target = deadline if self._due is None else min(deadline, self._due)
            if target <= now:
                break
            self.flag.clear()
            if self._woken:
                break
            await self.flag.wait(target - now)
        self._woken = False
        if self._due is not None and self._due <= time.monotonic():
            self._due = None
            self.check_due = True  # that one is due now: ask what comes after it
