"""A level-triggered wake-up flag for one waiter, built on ``anyio.Event``.

``set()`` may be called any number of times from callbacks; ``wait()`` returns at once if it was
set since the last ``clear()``. Unlike a bare ``anyio.Event`` it can be reused, and a ``set()``
that lands between ``clear()`` and ``wait()`` is never lost.
"""

from __future__ import annotations

import anyio


class Flag:
    """A resettable event: the producer's wake-up and capacity signals."""

    __slots__ = ("_event", "_raised")

    def __init__(self) -> None:
        self._event = anyio.Event()
        # Mirrors the event, read without its two layers of calls: every finished job raises
        # a flag that is most often raised already.
        self._raised = False

    def set(self) -> None:
        """Raise the flag and wake the waiter."""
        if not self._raised:
            self._raised = True
            self._event.set()

    def is_set(self) -> bool:
        """Whether the flag is raised."""
        return self._raised

    def clear(self) -> None:
        """Lower the flag, if raised."""
        if self._raised:
            self._raised = False
            self._event = anyio.Event()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is raised or ``timeout`` passes; return whether it is raised."""
        if self._raised:
            return True
        with anyio.move_on_after(timeout):
            await self._event.wait()
        return self._raised
