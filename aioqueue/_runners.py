"""Hand a worker's claimed jobs to its runner tasks, at most ``concurrency`` handlers at once.

Claimed jobs wait in a plain deque, in claim order. A runner that finishes a job takes the next
one at once; a runner with nothing to do waits on a future of its own, and only as many of those
are woken as there are jobs for them: the hand-over costs the same at 10 slots as at 10,000, and
an idle slot costs nothing per job. Wake-ups fan out: a runner woken for a job wakes up to two
more if jobs are still waiting, so a large claim reaches every idle slot within a few turns of
the event loop, while jobs that finish at once (no await) are run by the few runners already
awake rather than by one woken runner each.

Runners start as jobs arrive, one per slot actually needed, and live in the worker's task group,
so the group's cancellation ends them. When claiming stops, the jobs claimed ahead and not
started are given back at once (:meth:`Runners.give_back`), and every waiting runner ends.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._claims import Claims
    from ._completer import Completer
    from ._executor import Executor
    from ._job import Job

logger = logging.getLogger("aioqueue.worker")

#: A runner that takes jobs without waiting (no-op handlers, a deep buffer) yields to the event
#: loop after this many, so that it cannot starve the producer and the completer.
YIELD_EVERY = 32

#: How many more runners a woken runner wakes while jobs wait: the fan-out of wake-ups.
FAN_OUT = 2


class Runners:
    """The runner tasks of one worker and the jobs waiting for them."""

    def __init__(
        self,
        group: TaskGroup,
        executor: Executor,
        completer: Completer,
        claims: Claims,
        concurrency: int,
        stopping: Callable[[], bool],
    ) -> None:
        self._group = group
        self._executor = executor
        self._completer = completer
        self._claims = claims
        self._concurrency = concurrency
        self._stopping = stopping
        self._jobs: collections.deque[Job] = collections.deque()
        # Futures of runners waiting for a job, oldest first. A cancelled runner's future stays
        # here, done, and is skipped: removing it would cost a scan per cancelled runner.
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._woken = 0  # runners woken for a job that have not taken one yet
        self._started = 0
        self._closed = False

    def __len__(self) -> int:
        """Jobs claimed and waiting for a runner."""
        return len(self._jobs)

    # -- the producer's side -------------------------------------------------------------------

    def hand_over(self, jobs: Sequence[Job]) -> None:
        """Queue freshly claimed ``jobs`` (their claims are already taken) for the runners."""
        self._jobs.extend(jobs)
        # Enough runners for the active jobs, up to the concurrency: slots never used cost nothing.
        wanted = min(self._concurrency, self._claims.active)
        while self._started < wanted:
            self._group.start_soon(self._run)
            self._started += 1
        self._wake(1)

    def give_back(self) -> None:
        """Give back at once the jobs claimed and not started, even while every runner is busy
        with a handler that may take its whole grace period."""
        while self._jobs:
            job = self._jobs.popleft()
            self._completer.rescheduled(job, 0.0)
            self._claims.finished(job)

    def close(self) -> None:
        """No more jobs come: runners end once the jobs waiting now are taken."""
        self._closed = True
        while self._idle:
            future = self._idle.popleft()
            if not future.done():
                future.set_result(None)

    # -- the runners' side ---------------------------------------------------------------------

    def _wake(self, most: int) -> None:
        """Wake up to ``most`` idle runners, never more than the jobs not yet promised to one."""
        most = min(most, len(self._jobs) - self._woken)
        while most > 0 and self._idle:
            future = self._idle.popleft()
            if not future.done():
                future.set_result(None)
                self._woken += 1
                most -= 1

    async def _take(self) -> Job | None:
        """The next job, waiting for one if none is queued; None once closed and empty."""
        loop = asyncio.get_running_loop()
        while not self._jobs:
            if self._closed:
                return None
            future: asyncio.Future[None] = loop.create_future()
            self._idle.append(future)
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():
                    # Woken, then cancelled before taking the job: pass the wake-up on.
                    self._woken -= 1
                    self._wake(1)
                raise
            self._woken -= 1
            if self._jobs:
                job = self._jobs.popleft()
                self._wake(FAN_OUT)
                return job
        return self._jobs.popleft()

    async def _run(self) -> None:
        task = asyncio.current_task()  # the one an interruption of this runner's job cancels
        assert task is not None
        taken = 0
        while True:
            if taken % YIELD_EVERY == YIELD_EVERY - 1:
                await anyio.lowlevel.checkpoint()
            job = self._jobs.popleft() if self._jobs else await self._take()
            if job is None:
                return
            taken += 1
            try:
                if self._stopping():
                    # Claimed but not started when shutdown began: give it back untouched.
                    self._completer.rescheduled(job, 0.0)
                else:
                    await self._executor.execute(job, task)
            except Exception:
                # Only a bug in aioqueue's own bookkeeping gets here (handlers' errors are
                # outcomes): say so loudly and keep the worker's other jobs running. The job's
                # lease returns it if no outcome was recorded.
                logger.exception("internal error while running job %d attempt %d", job.id, job.attempt)
            finally:
                self._claims.finished(job)
