"""A level-triggered wake-up flag, on the asyncio event loop's own futures.

``set()`` may be called any number of times from callbacks; ``wait()`` returns at once if it was
set since the last ``clear()``. Unlike a bare event it can be reused, and a ``set()`` that lands
between ``clear()`` and ``wait()`` is never lost.
"""

from __future__ import annotations

import asyncio


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Flag:
    """A resettable event: the producer's wake-up and capacity signals.

    Built on a future per wait and the loop's timer rather than on ``anyio.Event`` and
    ``anyio.move_on_after``: a worker clears and waits on its flags several times a job (an idle
    worker's wake-up goes through one), and the anyio layers (an event made through the backend
    lookup at every ``clear()``, a cancel scope at every timed wait) cost several times the wait
    itself. Cancelling the waiting task (a cancel scope, ``Task.cancel``) ends the wait as it
    would any await."""

    __slots__ = ("_waiters", "raised")

    def __init__(self) -> None:
        self.raised = False
        """Whether the flag is raised: :meth:`is_set` without a call, for the worker's per-job
        paths, which raise flags that are most often raised already (``if not f.raised:
        f.set()``). Only :meth:`set` raises it (it wakes the waiters); lowering it by hand is
        :meth:`clear` without the call."""
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        """Raise the flag and wake every waiter."""
        if not self.raised:
            self.raised = True
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self.raised

    def clear(self) -> None:
        """Lower the flag, if raised."""
        self.raised = False

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is raised or ``timeout`` passes; return whether it is raised."""
        if self.raised:
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        # No timer for no timeout (None, or NaN, which never passes).
        timer = None if timeout is None or timeout != timeout else loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)
            if timer is not None:
                timer.cancel()
        return self.raised
