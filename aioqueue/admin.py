"""The operator's calls: look at jobs and queues, and steer them.

``Admin`` answers status, job lookups and dead-job listings, retries and purges dead jobs,
cancels jobs, pauses and resumes queues, sets their limits, reaps expired leases, and waits for
results. The ``Queue`` methods of the same names, the ``aioqueue`` command and any other front
end go through it, so every way in shares one code path. Each call is one short statement (or
one short transaction); none runs a handler.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import anyio

from . import maintenance
from .checks import check_int, check_job_id, check_job_ids, check_limit, check_name, check_rate
from .errors import ConfigurationError, JobCancelled, JobFailed, ResultUnavailable
from .job import JobInfo
from .notifier import Notifier
from .signal import Flag

if TYPE_CHECKING:
    from .database import Database


class Admin:
    """Operator calls on the jobs and queues of one :class:`~aioqueue.database.Database`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- looking -------------------------------------------------------------------------------

    async def get_job(self, job_id: int) -> JobInfo | None:
        """Return a job by id, live or archived; None when it is gone (or was never there)."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(self.db.queries.get_job, check_job_id(job_id))
        return None if row is None else JobInfo.from_record(row)

    async def list_dead(self, *, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """Return dead jobs, newest first (at most ``limit``, 1 to 10,000)."""
        if queue is not None:
            check_name("queue name", queue)
        check_limit("limit", limit, 1, 10_000)
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.list_dead, queue, limit)
        return [JobInfo.from_record(r) for r in rows]

    async def status(self) -> list[dict[str, Any]]:
        """Per queue: pending, ready, scheduled, running, dead, oldest ready age in seconds, and
        jobs that succeeded in the last minute (``completed_last_minute``)."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.queue_status)
        return [dict(r) for r in rows]

    async def queue_settings(self) -> list[dict[str, Any]]:
        """Every queue with settings: name, paused, concurrency_limit, rate_limit, rate_period."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.queue_settings)
        return [dict(r) for r in rows]

    # -- dead jobs -----------------------------------------------------------------------------

    async def retry_dead(
        self, ids: Iterable[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Send dead jobs back to pending now and wake their workers; return their ids."""
        selected = _select_dead(ids, queue, all)
        async with self.db.connection() as conn, conn.transaction():
            rows = await conn.fetch(self.db.queries.retry_dead, selected, queue)
            for queue_name in sorted({r["queue"] for r in rows}):
                await conn.execute(self.db.queries.notify, self.db.channels.jobs, queue_name)
        return sorted(int(r["id"]) for r in rows)

    async def purge_dead(
        self, ids: Iterable[int] | None = None, *, queue: str | None = None, all: bool = False
    ) -> list[int]:
        """Delete dead jobs; return their ids."""
        selected = _select_dead(ids, queue, all)
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.purge_dead, selected, queue)
        return sorted(int(r["id"]) for r in rows)

    # -- steering ------------------------------------------------------------------------------

    async def cancel(self, job_id: int) -> str:
        """Cancel a job: ``"cancelled"`` (it was pending), ``"requested"`` (it is running), or
        ``"not_found"``."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(
                self.db.queries.cancel, check_job_id(job_id), self.db.channels.cancel, self.db.channels.done
            )
        assert row is not None
        if row["cancelled"]:
            return "cancelled"
        return "requested" if row["requested"] else "not_found"

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume ``queue`` across every worker; resuming wakes them."""
        async with self.db.connection() as conn:
            await conn.execute(
                self.db.queries.set_paused, check_name("queue name", queue), paused, self.db.channels.jobs
            )

    async def set_limits(
        self, queue: str, *, concurrency: int | None = None, rate: tuple[int, float] | None = None
    ) -> None:
        """Limit ``queue`` across every worker (None clears a limit)."""
        check_name("queue name", queue)
        if concurrency is not None:
            check_int("concurrency", concurrency, 0, 1_000_000)
        rate_limit, rate_period = (None, None) if rate is None else check_rate(rate)
        async with self.db.connection() as conn:
            await conn.execute(self.db.queries.set_limits, queue, concurrency, rate_limit, rate_period)

    async def reap(self, batch: int = 1000) -> int:
        """Return jobs with expired leases to pending (or dead); return how many were reaped."""
        return await maintenance.reap(self.db, check_int("batch", batch, 1, 100_000))

    # -- results -------------------------------------------------------------------------------

    async def wait_result(self, job_id: int, *, timeout: float | None = None, poll_interval: float = 1.0) -> Any:
        """Wait for a job of an archiving task to succeed and return its result.

        Raises :class:`JobFailed` if it died, :class:`JobCancelled` if it was cancelled,
        :class:`ResultUnavailable` if it is gone without an archived result, and
        ``TimeoutError`` after ``timeout`` seconds. Woken by NOTIFY; polls as a backstop.
        """
        job_id = check_job_id(job_id)
        wake = Flag()
        listener = Notifier(self.db, {self.db.channels.done: lambda _payload: wake.set()}, wake.set)
        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tg:
                await tg.start(listener.run)
                info = await self._final_state(job_id, wake, poll_interval)
                tg.cancel_scope.cancel()
        # Raised here, outside the task group, so callers get the error itself, not a group.
        if info is None:
            raise ResultUnavailable(
                f"job {job_id} is gone without a kept result: its task does not archive "
                "(archive=True), it was pruned or purged, or it never existed"
            )
        if info.status == "dead":
            raise JobFailed(job_id, info.last_error)
        if info.status == "cancelled":
            raise JobCancelled(f"job {job_id} was cancelled")
        return info.result

    async def _final_state(self, job_id: int, wake: Flag, poll_interval: float) -> JobInfo | None:
        """Wait until job ``job_id`` is succeeded, dead, cancelled or gone; return it (None: gone)."""
        while True:
            wake.clear()
            info = await self.get_job(job_id)
            if info is None or info.status in ("succeeded", "dead", "cancelled"):
                return info
            await wake.wait(poll_interval)


def _select_dead(ids: Iterable[int] | None, queue: str | None, all: bool) -> list[int] | None:
    if ids is not None and all:
        raise ConfigurationError("pass either ids or all=True, not both")
    if ids is None and not all and queue is None:
        raise ConfigurationError("name the dead jobs: ids, queue=..., or all=True")
    if queue is not None:
        check_name("queue name", queue)
    return None if ids is None else check_job_ids(ids)
