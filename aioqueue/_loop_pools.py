"""Pools tied to the event loop that opened them: an asyncpg pool works only on its own loop,
so :class:`~aioqueue._database.Database` keeps one per loop, each closed as its loop ends.
What that takes lives here: which loop a pool belongs to, whether it is gone, and the keeper
that closes it while its loop still runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import anyio
import asyncpg


def gone(pool: asyncpg.Pool) -> bool:
    """Whether ``pool`` can serve no one any more: closed, or its loop is."""
    home = home_loop(pool)
    return pool.is_closing() or (home is not None and home.is_closed())


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop, or None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def home_loop(pool: asyncpg.Pool) -> asyncio.AbstractEventLoop | None:
    """The event loop ``pool`` was made on (asyncpg keeps it, without a public name)."""
    loop = getattr(pool, "_loop", None)
    return loop if isinstance(loop, asyncio.AbstractEventLoop) else None


class LoopPool:
    """The pool a :class:`Database` opened on one event loop. ``keeper`` is an async generator
    started on that loop: the loop's runner finalises async generators before it closes the
    loop (``asyncio.run``, ``asyncio.Runner``, ``anyio.run``, uvloop), which closes the pool
    while the loop still runs."""

    __slots__ = ("keeper", "lock", "pool")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.pool: asyncpg.Pool | None = None
        self.keeper: AsyncGenerator[None, None] | None = None


def dispose(keeper: AsyncGenerator[None, None]) -> None:
    """Finish the keeper of a loop that closed without finalising it: its pool cannot be
    closed any more, and a keeper left to the garbage collector would ask that loop to."""
    closer = keeper.aclose()
    try:
        closer.send(None)  # the keeper awaits nothing once its loop is closed
    except (StopIteration, RuntimeError):
        pass
    finally:
        closer.close()
