"""The interface every competitor adapter implements, plus small shared helpers.

An adapter drives one third-party PostgreSQL job queue through its public API so that
aioqueue's benchmark can put the same workload through each library. All timings are
wall-clock seconds measured with :func:`time.perf_counter` in the calling process.

Conventions shared by every adapter:

* Jobs are no-ops: the handler only calls :meth:`JobTracker.hit`, which counts it and
  stores the :func:`time.perf_counter` value at which the handler started.
* Completion is detected by counting in the handler and awaiting an
  :class:`asyncio.Event`, never by sleeping; every wait has a timeout and raises
  :class:`CompetitorTimeout` (or :class:`WorkerDied` if the worker crashed) with a
  message that says what was being waited for.
* Every method leaves the queue with nothing pending: the enqueue benchmarks delete
  the jobs they created (outside the timed section) so later methods start clean.
* ``drain`` pre-loads its jobs with the bulk API and then runs ``ANALYZE`` (adapters
  take ``analyze=False`` to skip it), so that the dequeue query is planned with
  statistics, as it would be in a long-running database. Without it, a library
  whose plan depends on statistics is measured against a table autovacuum has not
  analyzed yet. Whatever drives aioqueue in the same benchmark should do the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "IDLE_GAP",
    "AdapterBase",
    "Competitor",
    "CompetitorError",
    "CompetitorTimeout",
    "JobTracker",
    "WorkerDied",
    "concurrent_callers",
    "idle_wakeups",
    "split_evenly",
    "stop_task",
    "timed",
    "wait_until",
]


@runtime_checkable
class Competitor(Protocol):
    """A third-party job queue driven through its public API."""

    #: Short identifier, e.g. ``"pgqueuer"`` or ``"procrastinate"``.
    name: str

    async def setup(self, dsn: str) -> None:
        """Install the library's schema into the (fresh, empty) database at *dsn*.

        Idempotent: calling it again on an installed database is harmless.
        """
        ...

    async def teardown(self) -> None:
        """Release every connection, pool and worker the adapter still holds."""
        ...

    async def enqueue_bulk(self, n: int) -> float:
        """Enqueue *n* no-op jobs with the library's bulk API; return seconds taken."""
        ...

    async def enqueue_one_by_one(self, n: int, callers: int) -> float:
        """Enqueue *n* jobs one per call from *callers* concurrent coroutines; seconds."""
        ...

    async def drain(self, n: int, concurrency: int) -> float:
        """Enqueue *n* jobs (untimed), then time one in-process worker processing them.

        The clock runs from the moment the worker is started (so it includes the
        worker's own start-up queries) until the handler of the last job has started;
        the worker is then stopped cleanly, untimed, which is also when libraries that
        buffer completions write the last ones.
        """
        ...

    async def wakeup_latency(self, samples: int) -> list[float]:
        """Per-job latency in seconds from enqueue to handler start, against an idle worker.

        Each sample is ``handler_start - t0`` where ``t0`` is taken immediately before
        the enqueue call (so it includes the enqueue's own round trip and commit). The
        next job is enqueued only after the previous one has started and a short idle
        gap (20 ms) has passed, so that each sample meets an idle worker.
        """
        ...


class CompetitorError(RuntimeError):
    """Base class for errors raised by the adapters."""


class CompetitorTimeout(CompetitorError, TimeoutError):
    """A wait inside an adapter ran past its deadline."""


class WorkerDied(CompetitorError):
    """The library's worker task ended while the adapter was waiting on it."""


class AdapterBase:
    """What every adapter holds: its deadlines, whether :meth:`drain` analyzes after the
    pre-load, the DSN :meth:`setup` gives it, the jobs its handler counts, and its worker task.

    Args:
        timeout: deadline in seconds for a whole drain.
        sample_timeout: deadline for one latency sample, kept above the library's fallback
            poll so that a missed NOTIFY shows as an outlier rather than an error.
        stop_timeout: deadline for the worker to shut down.
        analyze: run ``ANALYZE`` after the untimed pre-load in :meth:`drain` (see the
            conventions above).
    """

    name: str

    def __init__(
        self,
        *,
        timeout: float = 600.0,
        sample_timeout: float = 60.0,
        stop_timeout: float = 60.0,
        analyze: bool = True,
    ) -> None:
        self.timeout = timeout
        self.sample_timeout = sample_timeout
        self.stop_timeout = stop_timeout
        self.analyze = analyze
        self._dsn: str | None = None
        self._tracker = JobTracker()
        self._worker: asyncio.Task[None] | None = None

    async def setup(self, dsn: str) -> None:
        """Keep ``dsn`` and install the library's schema there (if it is not yet)."""
        self._dsn = dsn
        await self._install()

    async def teardown(self) -> None:
        await self._stop_worker()
        self._dsn = None

    async def _timed_drain(self, n: int, start_worker: Callable[[], asyncio.Task[None]]) -> float:
        """Seconds from ``start_worker()`` until the handler has run ``n`` jobs; the worker
        is stopped after, in any case."""
        self._tracker.reset(n)
        start = time.perf_counter()
        worker = start_worker()
        try:
            await self._tracker.wait(self.timeout, f"{self.name} to drain {n} jobs", worker)
            return time.perf_counter() - start
        finally:
            await self._stop_worker()

    def _require_dsn(self) -> str:
        if self._dsn is None:
            raise CompetitorError("call setup(dsn) first")
        return self._dsn

    async def _install(self) -> None:
        raise NotImplementedError

    async def _stop_worker(self) -> None:
        raise NotImplementedError


class JobTracker:
    """Counts handler invocations and fires an event once an expected count is reached."""

    def __init__(self) -> None:
        self._expected = 0
        self._count = 0
        self._done = asyncio.Event()
        #: :func:`time.perf_counter` at the start of the most recent handler call.
        self.last_start = 0.0

    @property
    def count(self) -> int:
        return self._count

    def reset(self, expected: int) -> None:
        """Start a new round that completes after *expected* more handler calls."""
        if expected < 1:
            raise ValueError("expected must be at least 1")
        self._expected = expected
        self._count = 0
        self._done.clear()

    def hit(self) -> None:
        """Record one handler call; call this first thing in the handler."""
        self.last_start = time.perf_counter()
        self._count += 1
        if self._count >= self._expected:
            self._done.set()

    async def wait(
        self,
        seconds: float,
        what: str,
        worker: asyncio.Task[Any] | None = None,
    ) -> None:
        """Wait up to *seconds* for the round to complete; *what* names it in errors."""
        await wait_until(
            self._done,
            seconds,
            lambda: f"{what} ({self._count}/{self._expected} handled so far)",
            worker,
        )


async def wait_until(
    event: asyncio.Event,
    seconds: float,
    what: str | Callable[[], str],
    worker: asyncio.Task[Any] | None = None,
) -> None:
    """Wait for *event* for at most *seconds*.

    If *worker* is given and finishes first, raise :class:`WorkerDied` carrying its
    exception instead of waiting out the timeout. *what* names the wait in error
    messages; a callable is evaluated only when an error is raised.
    """
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    watched: set[asyncio.Future[Any]] = {waiter}
    if worker is not None:
        watched.add(worker)
    try:
        await asyncio.wait(watched, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiter.done():
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
    if event.is_set():
        return
    if callable(what):
        what = what()
    if worker is not None and worker.done():
        cause = None if worker.cancelled() else worker.exception()
        raise WorkerDied(f"worker stopped while waiting for {what}: {cause!r}") from cause
    raise CompetitorTimeout(f"timed out after {seconds:g}s waiting for {what}")


async def stop_task(task: asyncio.Task[Any], seconds: float, what: str) -> None:
    """Wait up to *seconds* for an already-signalled *task* to finish.

    A task that ends by cancellation counts as a clean stop (that is how some
    libraries' workers are stopped). If the deadline passes, the task is cancelled and
    :class:`CompetitorTimeout` is raised; if it failed, its exception is re-raised.
    """
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=seconds)
        raise CompetitorTimeout(f"{what} did not stop within {seconds:g}s; it was cancelled")
    if not task.cancelled() and (exc := task.exception()) is not None:
        raise WorkerDied(f"{what} failed: {exc!r}") from exc


def split_evenly(n: int, parts: int) -> list[int]:
    """Split *n* items into *parts* near-equal shares (the first ones get the remainder)."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


async def timed(coro: Coroutine[Any, Any, object]) -> float:
    """Await *coro* and return the seconds it took."""
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def concurrent_callers(
    n: int, callers: int, caller: Callable[[int], Awaitable[int]]
) -> tuple[float, int]:
    """Split *n* calls over *callers* concurrent ``caller(count)`` coroutines, each returning how
    many it did; return (seconds taken, total done)."""
    start = time.perf_counter()
    counts = await asyncio.gather(*(caller(k) for k in split_evenly(n, callers)))
    return time.perf_counter() - start, sum(counts)


#: The pause before each wake-up sample, so every sample meets an idle worker with the last
#: job's writes done (aioqueue's own latency scenario waits as long).
IDLE_GAP = 0.02


async def idle_wakeups(
    tracker: JobTracker,
    worker: asyncio.Task[Any],
    enqueue_one: Callable[[], Awaitable[object]],
    samples: int,
    seconds: float,
    name: str,
) -> list[float]:
    """Enqueue one job at a time against the idle *worker*, whose handler calls
    ``tracker.hit()``; return, per job, the seconds from just before the enqueue call to the
    handler's start. A first job, not recorded, returns once the worker is fetching; each wait
    is at most *seconds*; *name* names the library in errors."""
    latencies: list[float] = []
    for i in range(-1, samples):
        await asyncio.sleep(IDLE_GAP)
        tracker.reset(1)
        t0 = time.perf_counter()
        await enqueue_one()
        await tracker.wait(seconds, f"{name} latency sample {i}" if i >= 0 else f"the {name} warm-up job", worker)
        if i >= 0:
            latencies.append(tracker.last_start - t0)
    return latencies
