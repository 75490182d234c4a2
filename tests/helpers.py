"""Helpers for worker tests: run a worker in the background, wait for conditions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

import aioqueue


@contextlib.asynccontextmanager
async def running(worker: aioqueue.Worker, timeout: float = 30.0) -> AsyncIterator[aioqueue.Worker]:
    """Run ``worker`` in the background for the body; stop it (gracefully) afterwards."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(timeout):
            await worker.ready.wait()
        try:
            yield worker
        finally:
            worker.stop()


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it returns true; fail after ``timeout`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(interval)
