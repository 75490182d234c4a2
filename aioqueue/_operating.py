"""The operator calls of a :class:`~aioqueue.Queue`: read jobs and queues, retry or purge dead
jobs, cancel, pause and limit queues, wait for results, reap. Each is a thin call of the
queue's :class:`~aioqueue._admin.Admin` (and, for durable steps and events,
:class:`~aioqueue._step_admin.StepAdmin`), which the command line and the dashboard use too."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import _keys as keys
from ._admin import Admin
from ._job import Connection, JobInfo
from ._step_admin import StepAdmin, StepInfo


class Operations:
    """The operator calls :class:`~aioqueue.Queue` offers, through its ``admin``."""

    admin: Admin

    async def get_job(self, job_id: int) -> JobInfo | None:
        """Return a job by id, live or archived; None when it is gone (or was never there)."""
        return await self.admin.get_job(job_id)

    async def list_dead(self, *, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """Return dead jobs, newest first (at most ``limit``, 1 to 10,000)."""
        return await self.admin.list_dead(queue=queue, limit=limit)

    async def retry_dead(
        self, ids: Iterable[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Send dead jobs back to pending now; return their ids. Name ids, or pass ``all=True``
        (optionally with ``queue``)."""
        return await self.admin.retry_dead(ids, queue=queue, all=all)

    async def purge_dead(
        self, ids: Iterable[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Delete dead jobs; return their ids. Name ids, or pass ``all=True``."""
        return await self.admin.purge_dead(ids, queue=queue, all=all)

    async def pause(self, queue: str) -> None:
        """Stop every worker from claiming jobs of ``queue`` (running jobs finish)."""
        await self.admin.set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        """Let workers claim jobs of ``queue`` again, and wake them."""
        await self.admin.set_paused(queue, False)

    async def set_limits(
        self, queue: str, *, concurrency: int | None = None, rate: tuple[int, float] | None = None
    ) -> None:
        """Limit ``queue`` across every worker: at most ``concurrency`` jobs running, and at
        most ``rate[0]`` jobs started per ``rate[1]`` seconds. None clears a limit. Workers
        pick up a change within a second or their poll interval."""
        await self.admin.set_limits(queue, concurrency=concurrency, rate=rate)

    async def set_key_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        fair: bool = False,
    ) -> None:
        """Hold each partition key of ``queue`` to at most ``concurrency`` running jobs and at
        most ``rate[0]`` jobs started per ``rate[1]`` seconds, across every worker (None: no
        such limit), and claim its keys in turn (round robin) rather than first in, first out;
        a per-key limit implies ``fair``. Every call sets all three: ``set_key_limits(queue)``
        clears them. Workers pick up a change within a second or their poll interval."""
        await keys.set_key_limits(self.admin.db, queue, concurrency=concurrency, rate=rate, fair=fair)

    async def busiest_keys(self, queue: str, *, limit: int = 10, bound: int = 1000) -> list[dict[str, Any]]:
        """The busiest partition keys of ``queue``, most running and pending jobs first, at most
        ``limit`` (1 to 100): dicts of ``key``, ``running`` (exact), ``pending`` and ``ready``
        (each counted up to ``bound``, 1 to 100,000: a count equal to ``bound`` means at least
        that many). Bounded however many keys wait: the keys counted are those with running
        jobs, those of the newest pending jobs and the most common ones in the table's
        statistics (see the how-to on per-key limits)."""
        return await keys.busiest_keys(self.admin.db, queue, limit=limit, bound=bound)

    async def queue_settings(self) -> list[dict[str, Any]]:
        """Every queue with settings: name, paused, concurrency_limit, rate_limit, rate_period,
        fair, key_concurrency_limit, key_rate_limit, key_rate_period."""
        return await self.admin.queue_settings()

    async def cancel(self, job_id: int) -> str:
        """Cancel a job. Return ``"cancelled"`` for a pending job (it will never run),
        ``"requested"`` for a running one (its handler is cancelled at its next await, through
        NOTIFY or within the worker's poll interval), ``"not_found"`` otherwise. Cancelled jobs
        are kept in the archive with status ``cancelled``."""
        return await self.admin.cancel(job_id)

    async def wait_result(self, job_id: int, *, timeout: float | None = None, poll_interval: float = 1.0) -> Any:
        """Wait for a job of an archiving task to succeed and return its result.

        Raises :class:`JobFailed` if it died, :class:`JobCancelled` if it was cancelled,
        :class:`ResultUnavailable` if it is gone without an archived result, and
        ``TimeoutError`` after ``timeout`` seconds. Woken by NOTIFY; polls as a backstop.
        """
        return await self.admin.wait_result(job_id, timeout=timeout, poll_interval=poll_interval)

    async def status(self) -> list[dict[str, Any]]:
        """Per queue: pending, ready, scheduled, running, dead, oldest ready age in seconds, and
        jobs that succeeded in the last minute (``completed_last_minute``)."""
        return await self.admin.status()

    async def reap(self, limit: int = 1000) -> int:
        """Return jobs with expired leases to pending (or dead); return how many were reaped.
        ``limit`` is how many one statement takes; the call reaps them all."""
        return await self.admin.reap(limit)

    async def send_event(
        self, event: str, payload: Any = None, *, key: str | None = None, conn: Connection | None = None
    ) -> int:
        """Send ``event`` (with ``key``, if given) and its JSON ``payload`` to the jobs waiting for
        it in :func:`~aioqueue.wait_for_event`; return how many waits it reached (an event no
        job waits for is not kept). With ``conn``, it is sent in that connection's transaction:
        the waiters wake when it commits, and not at all if it rolls back."""
        return await StepAdmin(self.admin.db).send_event(event, payload, key=key, conn=conn)

    async def workflow_status(self) -> dict[str, int]:
        """Workflow work in flight, each an index-only count: ``groups_open`` (groups taking
        members), ``groups_closed`` (closed, waiting for members to finish), ``waiting`` (jobs
        waiting for other jobs), ``sleeping`` and ``awaiting_event`` (jobs stopped at a durable
        sleep or event wait)."""
        db = self.admin.db
        async with db.connection() as conn:
            row = await conn.fetchrow(db.queries.workflow_status)
        assert row is not None
        return {k: int(v) for k, v in row.items()}

    async def job_steps(self, job_id: int) -> list[StepInfo]:
        """The durable steps, sleeps and event waits job ``job_id`` stored, first reached first."""
        return await StepAdmin(self.admin.db).job_steps(job_id)

    async def list_waits(self, *, event: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Jobs sleeping or waiting for an event (only ``event``'s, if given), soonest to wake
        first, at most ``limit``: job_id, queue, task, name, occurrence, kind, state, event,
        event_key, wake_at, created_at."""
        return await StepAdmin(self.admin.db).list_waits(event=event, limit=limit)
