"""A level-triggered wake-up flag for one waiter, built on ``anyio.Event``.

``set()`` may be called any number of times from callbacks; ``wait()`` returns at once if it was
set since the last ``clear()``. Unlike a bare ``anyio.Event`` it can be reused, and a ``set()``
that lands between ``clear()`` and ``wait()`` is never lost.
"""

from __future__ import annotations

import anyio


class Flag:
    """A resettable event: the producer's wake-up and capacity signals."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        """Raise the flag and wake the waiter."""
        self._event.set()

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self._event.is_set()

    def clear(self) -> None:
        """Lower the flag, if raised."""
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is raised or ``timeout`` passes; return whether it is raised."""
        if self._event.is_set():
            return True
        with anyio.move_on_after(timeout):
            await self._event.wait()
        return self._event.is_set()
