"""Periodic upkeep every worker runs: the reaper, archive retention, pruning of the
throughput counters that ``status`` reads, of the durable steps of jobs that are gone and of
the job starts that per-key rate windows no longer hold, and VACUUM of the queue's tables once
their dead rows pass a threshold.

The reaper returns running jobs whose lease expired (their worker crashed, hung or lost its
connection) to pending, or to dead when their attempts are spent. Retention drops the
archive's day partitions once past the retention period, and makes the days ahead. Each is a
single statement that skips rows, or work, other workers hold, so every worker may run them
with no leader. VACUUM, which cannot run in a transaction, skips a table another worker is
vacuuming instead of waiting for it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ._database import Database
    from ._job import Connection

logger = logging.getLogger("aioqueue.maintenance")


#: Seconds between two passes of :meth:`Maintenance.release_stranded`.
STRANDED_INTERVAL = 30.0

#: Seconds between two looks at the queue's tables' dead rows (at most: the reap interval if
#: shorter). Each look reads the server's statistics only; under a steady flood of jobs a table
#: gathers dead rows fast, and the sooner VACUUM makes their space reusable the less it grows.
VACUUM_INTERVAL = 5.0


async def reap(db: Database, batch: int = 1000, conn: Connection | None = None) -> int:
    """Return every job whose lease expired to pending (or dead when its attempts are spent),
    a batch per statement (on ``conn`` if given), and wake the workers of their queues; return
    how many."""
    total = 0
    while True:
        async with db.connection(conn) as c:
            rows = await c.fetch(db.queries.reap_expired, batch, db.channels.jobs, db.channels.done)
        total += len(rows)
        if len(rows) < batch:
            return total


@dataclasses.dataclass(eq=False)
class Maintenance:
    """Runs the reaper every ``reap_interval`` and retention every ``prune_interval``."""

    db: Database
    _: dataclasses.KW_ONLY
    reap_interval: float
    archive_retention: float | None
    reap_batch: int = 1000
    prune_batch: int = 5000
    _stranded_at: float = dataclasses.field(default=float("-inf"), init=False)
    reaped: int = dataclasses.field(default=0, init=False)
    """Jobs reaped so far."""
    passes: int = dataclasses.field(default=0, init=False)
    """Upkeep passes finished so far (what a test waits on to know the reaper has looked)."""
    partitions_ahead: int = 2
    """Days of archive partitions kept made ahead of today."""
    partitions_dropped: int = dataclasses.field(default=0, init=False)
    """Archive partitions dropped by retention so far."""
    steps_interval: float = 300.0
    """Seconds between two prunings of the steps of jobs that are gone (it reads all of
    ``job_steps``: far less often than the reaper)."""
    _steps_pruned_at: float = dataclasses.field(default=-math.inf, init=False)
    vacuum_threshold: int = 0
    """Dead rows in one of the queue's tables (and at least a fifth of its live rows) past which
    :meth:`vacuum` VACUUMs it; 0: never."""
    vacuum_interval: float = VACUUM_INTERVAL
    """Seconds between two looks by :meth:`run_vacuum`."""
    vacuums: int = dataclasses.field(default=0, init=False)
    """VACUUMs run so far."""
    _not_allowed: set[str] = dataclasses.field(default_factory=set, init=False)

    async def reap(self, conn: Connection | None = None) -> int:
        """Reap expired leases, a batch at a time (on ``conn`` if given), until none are left;
        return how many."""
        total = await reap(self.db, self.reap_batch, conn)
        if total:
            logger.warning("reaped %d job(s) whose lease expired", total)
        self.reaped += total
        return total

    async def prune(self) -> int:
        """Make the archive's partitions for the days ahead, then retire the ones past
        retention: whole partitions are dropped, and the rows past it in the two partitions
        without a day (the pre-partitioning table, the default one) deleted a bounded batch per
        statement. Returns the rows deleted (a dropped partition's rows are not counted)."""
        async with self.db.connection() as conn:
            await conn.fetchval(self.db.queries.archive_partitions, self.partitions_ahead)
        if self.archive_retention is None:
            return 0
        total = 0
        while True:
            async with self.db.connection() as conn:
                row = await conn.fetchrow(self.db.queries.prune_archive, self.archive_retention, self.prune_batch)
            assert row is not None
            deleted = int(row["deleted"])
            self.partitions_dropped += int(row["dropped"])
            total += deleted
            if deleted < self.prune_batch:
                return total

    async def release_stranded(self) -> int:
        """Workflows: make ready (or cancel) the waiting jobs whose dependencies were all finished
        by workers of a release before workflows, which do not count dependants; return how many.
        Reads every waiting job, so it runs at most every ``STRANDED_INTERVAL`` seconds."""
        now = time.monotonic()
        if now - self._stranded_at < STRANDED_INTERVAL:
            return 0
        self._stranded_at = now
        async with self.db.connection() as conn:
            return int(await conn.fetchval(self.db.queries.release_stranded, 1000))

    async def prune_steps(self) -> int:
        """Delete the durable steps of jobs that are gone (finished without an archive, or
        pruned from it), a bounded batch of jobs per statement; return how many rows."""
        if time.monotonic() - self._steps_pruned_at < self.steps_interval:
            return 0
        self._steps_pruned_at = time.monotonic()
        return await self._delete_until_none(self.db.queries.prune_steps)

    async def prune_key_starts(self) -> int:
        """Delete the recorded starts that no per-key rate window holds any more, a bounded
        batch per statement; return how many."""
        return await self._delete_until_none(self.db.queries.prune_key_starts)

    async def _delete_until_none(self, statement: str) -> int:
        """Run the deleting ``statement`` (its one parameter: a batch) until it deletes nothing;
        return how many rows it deleted."""
        total = 0
        while True:
            async with self.db.connection() as conn:
                status = await conn.execute(statement, self.prune_batch)
            deleted = int(status.split()[-1])
            total += deleted
            if deleted == 0:
                return total

    async def prune_stats(self) -> int:
        """Delete throughput counters (``queue_stats``) older than an hour; return how many."""
        async with self.db.connection() as conn:
            status = await conn.execute(self.db.queries.prune_queue_stats, 3600.0)
        return int(status.split()[-1])

    async def vacuum(self) -> int:
        """VACUUM each of the queue's tables whose dead rows passed ``vacuum_threshold``, one at
        a time; return how many were vacuumed. A table this role may not vacuum is left to the
        server's autovacuum, said once in the log."""
        if self.vacuum_threshold <= 0:
            return 0
        async with self.db.connection() as conn:
            rows = await conn.fetch(self.db.queries.vacuum_candidates, self.vacuum_threshold)
        done = 0
        for row in rows:
            target = str(row["target"])
            if not row["allowed"]:
                if target not in self._not_allowed:
                    self._not_allowed.add(target)
                    logger.warning(
                        "%s has %d dead rows, but this role may not VACUUM it (only its owner, the "
                        "database's owner or a superuser may): autovacuum has to, or turn this off "
                        "with vacuum_threshold=0", target, row["dead"],
                    )
                continue
            async with self.db.connection() as conn:
                # A statement of its own, never in a transaction: VACUUM refuses to run in one.
                await conn.execute(self.db.queries.vacuum_table.replace("{table}", target))
            logger.debug("vacuumed %s (%d dead rows)", target, row["dead"])
            done += 1
        self.vacuums += done
        return done

    async def run_vacuum(self) -> None:
        """:meth:`vacuum` every ``vacuum_interval`` until cancelled (at once: never, when the
        threshold is 0)."""
        while self.vacuum_threshold > 0:
            await self.step(self.vacuum)
            await anyio.sleep(self.vacuum_interval)

    async def step(self, step: Callable[[], Awaitable[int]]) -> None:
        """Run one upkeep step; a failure is logged, and left to the next pass."""
        try:
            await step()
        except Exception as exc:
            logger.warning("maintenance step %s failed (%s: %s)", step.__name__, type(exc).__name__, exc)

    async def run(self, *, reaped: bool = False, settled: Callable[[float], Awaitable[bool]] | None = None) -> None:
        """Run upkeep at start and then every ``reap_interval`` until cancelled (``reaped``: the
        caller has just reaped, so the first pass does not), and :meth:`run_vacuum` beside it.
        ``settled(seconds)``: awaited before each of them begins, it waits at most ``seconds``
        (``reap_interval`` for upkeep, ``vacuum_interval`` for the vacuum checks) for the
        worker to settle and returns whether it did; an upkeep that waited the whole interval
        reaps in its first pass after all."""

        async def vacuum_once_settled() -> None:
            if settled is not None:
                await settled(self.vacuum_interval)
            await self.run_vacuum()

        async with anyio.create_task_group() as tg:
            tg.start_soon(vacuum_once_settled)
            if settled is not None and not await settled(self.reap_interval):
                reaped = False
            await self._run_upkeep(reaped)

    async def _run_upkeep(self, reaped: bool) -> None:
        while True:
            for step in (self.reap, self.prune, self.prune_steps, self.prune_key_starts, self.prune_stats,
                         self.release_stranded):
                if reaped and step == self.reap:
                    reaped = False
                    continue
                await self.step(step)
            self.passes += 1
            await anyio.sleep(self.reap_interval)
