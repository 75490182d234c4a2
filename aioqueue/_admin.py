"""The operator's calls: look at jobs and queues, and steer them.

``Admin`` answers status, job lookups and listings (keyset pages filtered by status, queue,
task and arguments), dead-job listings, the live workers and the periodic schedules; it retries
and purges dead jobs, cancels and deletes jobs (by id, or every job a filter matches, in bounded
batches), pauses and resumes queues, sets their limits, reaps expired leases, and waits for
results. The ``Queue`` methods of the same names, the ``aioqueue`` command and any other front
end go through it, so every way in shares one code path. Each call is one short statement (or
one short transaction); none runs a handler.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import anyio

from . import _maintenance as maintenance
from ._checks import check_int, check_job_id, check_job_ids, check_limit, check_name, check_partition_key, check_rate
from ._errors import ConfigurationError, JobCancelled, JobFailed, ResultUnavailable
from ._job import JobInfo, Progress, shown_args
from ._notifier import Notifier
from ._payload import UndecodableValue, check_json, decode_shown
from ._registry import DEFAULT_INTERVAL, EXPIRY_INTERVALS
from ._signal import Flag

if TYPE_CHECKING:
    from ._database import Database
    from ._periodic import Periodic

logger = logging.getLogger("aioqueue.admin")

#: The statuses a job listing can show: live (pending, running, dead) or archived.
JobStatus = Literal["pending", "running", "dead", "succeeded", "cancelled"]
JOB_STATUSES: tuple[JobStatus, ...] = ("pending", "running", "dead", "succeeded", "cancelled")
#: What a bulk action does to the jobs a filter matches.
BulkAction = Literal["retry", "cancel", "delete"]
#: Jobs succeeded per minute: (minute, count), oldest first.
Series = list[tuple[datetime.datetime, int]]
#: How many rows a listing page reads, at most, looking for jobs that match its filter. A page
#: of pending jobs walks the primary key (no index lists them: an enqueue would pay for it), so
#: a filter that matches few of them (a rare task, an arguments search) shows what this many
#: rows held and offers to go on from there.
PAGE_SCAN = 5000


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing or a bulk action covers: one status, optionally one queue, one task,
    arguments that contain ``args`` (a JSON object, as PostgreSQL's ``@>``), and one partition
    key (live jobs only: the archive keeps no key)."""

    status: JobStatus = "pending"
    queue: str | None = None
    task: str | None = None
    args: dict[str, Any] | None = None
    partition_key: str | None = None

    def __post_init__(self) -> None:
        if self.status not in JOB_STATUSES:
            raise ConfigurationError(f"status must be one of {', '.join(JOB_STATUSES)}; got {self.status!r}")
        if self.queue is not None:
            check_name("queue name", self.queue)
        if self.task is not None:
            check_name("task name", self.task)
        if self.args is not None:
            if not isinstance(self.args, dict):
                raise ConfigurationError(f"args must be a JSON object (a dict), got {self.args!r}")
            check_json(self.args, "args")
        if self.partition_key is not None:
            check_partition_key(self.partition_key)
            if self.status in ("succeeded", "cancelled"):
                raise ConfigurationError(f"the archive keeps no partition key: filter pending, running or "
                                         f"dead jobs by key, not {self.status} ones")


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a job listing, and the keyset to pass as ``before`` for the next (None: last).

    ``searched`` is set when the page came up short because it read as many rows as a page
    reads (:data:`PAGE_SCAN`): how many it read; the next page goes on from there.
    """

    jobs: list[dict[str, Any]]
    next_before: int | None
    searched: int | None = None


class Admin:
    """Operator calls on the jobs and queues of one :class:`~aioqueue._database.Database`."""

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
        """Every queue with settings: name, paused, concurrency_limit, rate_limit, rate_period,
        fair, key_concurrency_limit, key_rate_limit, key_rate_period."""
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.queue_settings)
        return [dict(r) for r in rows]

    async def list_jobs(self, where: JobFilter, *, before: int | None = None, limit: int = 50) -> JobPage:
        """Return a page of jobs matching ``where``, newest first, with ids below ``before``.

        Pages by keyset (the id), never by offset. A page reads at most :data:`PAGE_SCAN` rows
        (or ``limit``, if more): pending jobs are read from the primary key, newest first, and
        filtered, so a filter that matches few of them (or an ``args`` filter) may give a page
        of fewer than ``limit`` jobs that still has a next one (``searched`` says so).
        """
        check_limit("limit", limit, 1, 1000)
        if before is not None:
            before = check_job_id(before)
        scan = rows_to_read(where, limit)
        statement = {
            "running": self.db.queries.list_running_jobs,
            "succeeded": self.db.queries.list_archived_jobs,
            "cancelled": self.db.queries.list_archived_jobs,
        }.get(where.status, self.db.queries.list_jobs)
        args = None if where.args is None else json.dumps(where.args)
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                statement, where.status, where.queue, where.task, before, args, scan, limit, where.partition_key
            )
        jobs = [_listed(r) for r in rows if r["id"] is not None]
        scanned, scanned_to = (rows[0]["scanned"], rows[0]["scanned_to"]) if rows else (0, None)
        if len(jobs) == limit:
            return JobPage(jobs, jobs[-1]["id"])
        if scanned == scan and scanned_to is not None:
            # A sparse search: go on from where this read stopped.
            return JobPage(jobs, int(scanned_to), searched=int(scanned))
        return JobPage(jobs, None)

    async def job_detail(self, job_id: int) -> dict[str, Any] | None:
        """Return everything stored about a job, live or archived: ``get_job``'s fields plus its
        lease (``lease_expires_at``, ``locked_at``), the worker that holds it (``locked_by``),
        ``cancel_requested`` and ``progress`` (a :class:`Progress` or None); None when it is gone."""
        async with self.db.connection() as conn:
            row = await conn.fetchrow(self.db.queries.get_job_detail, check_job_id(job_id))
        if row is None:
            return None
        detail = dict(row)
        detail["args"] = shown_args(row["args"])
        detail["result"] = decode_shown(row["result"], "result")
        detail["progress"] = Progress.shown(row["progress"], row["attempts"])
        return detail

    async def list_workers(self, *, expiry: float | None = None) -> list[dict[str, Any]]:
        """Return the live workers (seen within ``expiry`` seconds; default: three registry
        intervals), oldest first, each with the number of jobs it runs (``running``) and what
        it did so far as of its last refresh (``counts``: a dict of its ``WorkerStats``)."""
        seconds = DEFAULT_INTERVAL * EXPIRY_INTERVALS if expiry is None else expiry
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.list_workers, float(seconds))
        return [{**r, "counts": json.loads(r["counts"])} for r in rows]

    async def periodic_schedules(self, periodics: Mapping[str, Periodic] | None = None) -> list[dict[str, Any]]:
        """Every periodic task: ``name``, its newest enqueued slot (``last_slot``), and, for the
        schedules in ``periodics`` (a Queue's ``periodics``), ``schedule`` and ``next_slot``."""
        known = dict(periodics or {})
        async with self.db.connection() as conn:
            rows = {r["name"]: dict(r) for r in await conn.fetch(self.db.queries.list_periodic)}
            now: datetime.datetime = await conn.fetchval(self.db.queries.database_now)
        out = []
        for name in sorted(set(rows) | set(known)):
            row = rows.get(name, {"name": name, "last_slot": None, "updated_at": None})
            p = known.get(name)
            row["schedule"] = None if p is None else (p.cron or f"every {p.every:g}s")
            row["next_slot"] = None if p is None else p.next_slot(now)
            out.append(row)
        return out

    async def queue_overview(self, queues: Iterable[str] = (), *, bound: int = 10_000) -> list[dict[str, Any]]:
        """Per queue (every queue with jobs, settings or recent throughput, and ``queues``):
        ready, scheduled, running and dead counts, each counted up to ``bound`` (a count equal
        to ``bound`` means at least that many), ``oldest_ready_age`` (seconds the oldest ready
        job has waited), ``paused`` and the limits. Costs at most ``bound`` index entries per
        count (per priority for ready and scheduled), however deep the backlog."""
        names = [check_name("queue name", q) for q in queues]
        check_limit("bound", bound, 1, 10_000_000)
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(self.db.queries.without_jit)
            rows = await conn.fetch(self.db.queries.queue_overview, names, bound)
        return [dict(r) for r in rows]

    async def throughput(self, minutes: int = 60) -> tuple[datetime.datetime, dict[str, Series]]:
        """Return the database's clock and, per queue, jobs succeeded per minute over the last
        ``minutes`` (1 to 60: counters are kept for an hour); minutes with none are left out."""
        check_limit("minutes", minutes, 1, 60)
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.queue_throughput, minutes)
            now: datetime.datetime = rows[0]["now"] if rows else await conn.fetchval(self.db.queries.database_now)
        series: dict[str, Series] = {}
        for r in rows:
            series.setdefault(r["queue"], []).append((r["minute"], int(r["succeeded"])))
        return now, series

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

    async def cancel_jobs(self, ids: Iterable[int]) -> dict[int, str]:
        """Cancel many jobs in one statement; return ``{id: "cancelled" | "requested"}`` for the
        jobs that were pending or running (the others are left out)."""
        selected = check_job_ids(ids)
        async with self.db.connection() as conn:
            rows = await conn.fetch(
                self.db.queries.cancel_jobs, selected, self.db.channels.cancel, self.db.channels.done
            )
        return {int(r["id"]): str(r["outcome"]) for r in rows}

    async def delete_jobs(self, ids: Iterable[int]) -> list[int]:
        """Delete jobs for good, live or archived, except running ones (cancel those); return
        the ids deleted."""
        selected = check_job_ids(ids)
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.delete_jobs, selected)
        return sorted(int(r["id"]) for r in rows)

    async def bulk(
        self, action: BulkAction, where: JobFilter, *, batch: int = 1000, limit: int | None = None
    ) -> int:
        """Retry, cancel or delete every job ``where`` matches (up to ``limit``), ``batch`` jobs
        per statement, each batch its own short transaction, so a million matches never lock
        the table at once; return how many jobs were acted on. Retry acts on dead jobs only."""
        if action not in ("retry", "cancel", "delete"):
            raise ConfigurationError(f"action must be retry, cancel or delete; got {action!r}")
        check_limit("batch", batch, 1, 10_000)
        if limit is not None:
            check_limit("limit", limit, 1, 2**62)
        done, before = 0, None
        while limit is None or done < limit:
            size = batch if limit is None else min(batch, limit - done)
            page = await self.list_jobs(where, before=before, limit=size)
            ids = [j["id"] for j in page.jobs]
            if ids:
                if action == "retry":
                    done += len(await self.retry_dead(ids))
                elif action == "cancel":
                    done += len(await self.cancel_jobs(ids))
                else:
                    done += len(await self.delete_jobs(ids))
            if page.next_before is None:
                break
            before = page.next_before
        return done

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
        if isinstance(info.result, UndecodableValue):
            raise ResultUnavailable(f"job {job_id} succeeded, but its result cannot be read back: {info.result.error}")
        return info.result

    async def _final_state(self, job_id: int, wake: Flag, poll_interval: float) -> JobInfo | None:
        """Wait until job ``job_id`` is succeeded, dead, cancelled or gone; return it (None: gone)."""
        while True:
            wake.clear()
            info = await self.get_job(job_id)
            if info is None or info.status in ("succeeded", "dead", "cancelled"):
                return info
            await wake.wait(poll_interval)


def rows_to_read(where: JobFilter, limit: int) -> int:
    """How many candidate rows a listing page of ``limit`` jobs reads at most: ``limit`` when
    its index holds exactly the jobs ``where`` matches (dead or archived jobs filtered by queue
    or by task, not both; running jobs), else :data:`PAGE_SCAN` (pending jobs, read from the
    primary key; a second filter; arguments; a partition key). The page stops reading once it has ``limit``
    jobs either way; an exact bound keeps the planner on the index's order."""
    exact = where.args is None and where.partition_key is None and (
        where.status == "running" or (where.status != "pending" and (where.queue is None or where.task is None))
    )
    return limit if exact else max(limit, PAGE_SCAN)


def _select_dead(ids: Iterable[int] | None, queue: str | None, all: bool) -> list[int] | None:
    if ids is not None and all:
        raise ConfigurationError("pass either ids or all=True, not both")
    if ids is None and not all and queue is None:
        raise ConfigurationError("name the dead jobs: ids, queue=..., or all=True")
    if queue is not None:
        check_name("queue name", queue)
    return None if ids is None else check_job_ids(ids)


def _listed(row: Any) -> dict[str, Any]:
    job = dict(row)
    del job["scanned"], job["scanned_to"]
    job["args"] = shown_args(row["args"])
    return job
