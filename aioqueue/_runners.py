"""Hand a worker's claimed jobs to its runner tasks, at most ``concurrency`` handlers at once.

Claimed jobs wait in a plain deque, in claim order. A runner that finishes a job takes the next
one at once; a runner with nothing to do waits on a future of its own, and only as many of those
are woken (or, while fewer than ``concurrency`` exist, started) as there are jobs for them: the
hand-over costs the same at 10 slots as at 10,000, and an idle slot costs nothing per job.
Wake-ups fan out: a runner woken or started for a job wakes or starts up to two more if jobs are
still waiting, so a large claim reaches a thousand slots within a few turns of the event loop,
while jobs that finish at once (no await) are run by the few runners already awake rather than
by one runner each: slots that no-op jobs never needed are never started.

Runners are plain asyncio tasks that :class:`Runners` owns, not children of an anyio task group:
a task group's ``start_soon`` costs about fifteen times as much per task (a wrapper coroutine, a
cancel scope and an event each), which at a thousand slots is a claim's worth of the worker's
time and memory. :meth:`Runners.join` stands in for the group: it waits until every runner has
ended, raises a runner's unexpected error, and when cancelled cancels every runner and waits,
shielded, until they have recorded their outcomes. When claiming stops, the jobs claimed ahead
and not started are given back at once (:meth:`Runners.give_back`), and every waiting runner ends.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from ._signal import Flag

if TYPE_CHECKING:
    from ._claims import Claims
    from ._completer import Completer
    from ._executor import Executor
    from ._job import Job

logger = logging.getLogger("aioqueue.worker")

#: A runner that takes jobs without waiting (no-op handlers, a deep buffer) yields to the event
#: loop after this many, so that it cannot starve the producer and the completer.
YIELD_EVERY = 32

#: How many more runners a woken runner wakes (or starts) while jobs wait: the fan-out.
FAN_OUT = 2


class Runners:
    """The runner tasks of one worker and the jobs waiting for them."""

    def __init__(
        self,
        executor: Executor,
        completer: Completer,
        claims: Claims,
        concurrency: int,
        stopping: Callable[[], bool],
    ) -> None:
        self._executor = executor
        self._completer = completer
        self._claims = claims
        self._concurrency = concurrency
        self._stopping = stopping
        self._jobs: collections.deque[Job] = collections.deque()
        # Futures of runners waiting for a job, oldest first. A cancelled runner's future stays
        # here, done, and is skipped: removing it would cost a scan per cancelled runner.
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        # Runners woken or started for a job that have not taken one yet: jobs promised to them.
        self._woken = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._unstarted: set[asyncio.Task[None]] = set()  # started for a job, not yet running
        self._closed = False
        self._abandoned = False
        self._draining = False  # join() is waiting for cancelled runners to end
        self._error: BaseException | None = None
        self._ended = Flag()  # raised once closed with no runner left, on an error, or abandoned

    def __len__(self) -> int:
        """Jobs claimed and waiting for a runner."""
        return len(self._jobs)

    @property
    def started(self) -> int:
        """Runner tasks alive now: the slots used so far (idle ones included)."""
        return len(self._tasks)

    # -- the producer's side -------------------------------------------------------------------

    def hand_over(self, jobs: Sequence[Job]) -> None:
        """Queue freshly claimed ``jobs`` (their claims are already taken) for the runners."""
        self._jobs.extend(jobs)
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
        if not self._tasks:
            self._ended.set()

    # -- the owner's side ----------------------------------------------------------------------

    async def join(self) -> None:
        """Wait until every runner has ended after :meth:`close`, and raise the error a runner
        ended with, if any. Cancelled (or on that error), cancel every runner and wait, shielded,
        until they have ended (or :meth:`abandon` is called)."""
        try:
            await self._ended.wait()
        finally:
            if self._tasks and not self._abandoned:
                self._draining = True
                for task in self._tasks:
                    task.cancel()
                with anyio.CancelScope(shield=True):
                    while self._tasks and not self._abandoned:
                        self._ended.clear()
                        await self._ended.wait()
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """Stop waiting for runners whose handlers ignore cancellation: cancel them once more
        and let :meth:`join` return (their jobs go back when their leases expire)."""
        self._abandoned = True
        for task in self._tasks:
            task.cancel()
        self._ended.set()

    def _start(self) -> None:
        task = asyncio.get_running_loop().create_task(self._run())
        self._tasks.add(task)
        self._unstarted.add(task)
        task.add_done_callback(self._runner_ended)

    def _runner_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task in self._unstarted:  # cancelled before it ran: it never took its promised job
            self._unstarted.discard(task)
            self._woken -= 1
        if not task.cancelled() and (error := task.exception()) is not None:
            # Only a bug in aioqueue's own bookkeeping gets here: end the worker with it.
            if self._error is None:
                self._error = error
            self._ended.set()
        elif not self._tasks and (self._closed or self._draining):
            self._ended.set()

    # -- the runners' side ---------------------------------------------------------------------

    def _wake(self, most: int) -> None:
        """Wake (or start, while fewer than ``concurrency`` run) up to ``most`` runners, never
        more than the jobs not yet promised to one."""
        most = min(most, len(self._jobs) - self._woken)
        while most > 0 and self._idle:
            future = self._idle.popleft()
            if not future.done():
                future.set_result(None)
                self._woken += 1
                most -= 1
        while most > 0 and len(self._tasks) < self._concurrency and not self._closed:
            self._start()
            self._woken += 1
            most -= 1

    async def _run(self) -> None:
        task = asyncio.current_task()  # the one an interruption of this runner's job cancels
        assert task is not None
        loop = task.get_loop()
        executor = self._executor
        attempt = executor.attempt_of(task)
        jobs = self._jobs
        self._unstarted.discard(task)
        self._woken -= 1
        # Started (or, below, woken) for a job: once it takes one, it passes the start on.
        promised = True
        taken = 0
        while True:
            if not jobs:
                if self._closed:
                    return
                # Wait to be woken for a job, in this frame rather than in a coroutine of its own:
                # while claims come slower than the handlers finish, a runner waits about once a
                # job, and each wait's objects are alive across a claim for the collector to walk.
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
                promised = True
                continue  # another runner may have taken the job first
            job = jobs.popleft()
            if promised:
                promised = False
                self._wake(FAN_OUT)
            taken += 1
            begun = 0.0  # when its handler started (the executor's clock), if it did
            try:
                if self._stopping():
                    # Claimed but not started when shutdown began: give it back untouched.
                    self._completer.rescheduled(job, 0.0)
                elif (call := executor.start(job, attempt)) is not None:
                    begun = attempt.started
                    # The handler is awaited here, in the runner's own frame (see start()).
                    try:
                        result = await call
                    except BaseException as error:
                        executor.ended(attempt, error)
                    else:
                        executor.ended(attempt, None, result)
            except Exception:
                # Only a bug in aioqueue's own bookkeeping gets here (handlers' errors are
                # outcomes): say so loudly and keep the worker's other jobs running. The job's
                # lease returns it if no outcome was recorded.
                logger.exception("internal error while running job %d attempt %d", job.id, job.attempt)
            finally:
                self._claims.finished(job, time.perf_counter() - begun if begun else 0.0, begun)
            if not self._claims.active:
                # No handler runs: no outcome comes until a claim hands over more, so the ones
                # buffered need not wait to gather (the last of a burst, say).
                self._completer.hurry()
            if taken % YIELD_EVERY == 0:
                await asyncio.sleep(0)
