"""Claim ready jobs for one worker, end to end: how many, when, and in one statement.

The producer owns the worker's claiming: it works out the free capacity (slots not taken by
active handlers, plus an adaptive prefetch buffer, see :mod:`aioqueue._prefetch`, capped per
queue when the worker caps queues), holds off while the completer has no room for more outcomes, and waits
for a reason to look (a freed slot, the end of a claim that filled every slot, or one of its
:mod:`~aioqueue._wakeups`: a notification, the earliest known due time, the poll tick). It then
claims with ``FOR UPDATE SKIP LOCKED`` in a single short statement, records the claims, and
hands the jobs to the worker's runners. It never runs a handler, never holds a transaction open
beyond the claim, and writes no outcome itself: rows it cannot decode go to the completer.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._claimed import Undecodable, decode_claim, from_epoch
from ._claims import ClaimKey, Claims
from ._completer import Completer
from ._job import Connection, Job
from ._prefetch import Prefetch
from ._wakeups import Wakeups

if TYPE_CHECKING:
    import asyncpg

    from ._config import WorkerConfig
    from ._database import Database

logger = logging.getLogger("aioqueue.producer")


class Producer:
    """Claims jobs of ``queues`` for one worker, as its capacity allows."""

    def __init__(
        self,
        db: Database,
        config: WorkerConfig,
        *,
        queues: Sequence[str],
        claims: Claims | None = None,
        completer: Completer | None = None,
        on_lost: Callable[[ClaimKey], object] = lambda claim: None,
        ready: anyio.Event | None = None,
    ) -> None:
        self.db = db
        self.config = config
        self.worker_id = config.name or "aioqueue"
        self.queues = list(queues)
        self.wakeups = Wakeups(self.queues, config.poll_interval)
        """What makes the producer look again short of a free slot; the listener's callbacks."""
        self._claim_started = time.monotonic()
        # The database time of our last claim (every claim of ours tells it: see claim_timed).
        self._claimed_at: datetime.datetime | None = None
        self.claims = claims if claims is not None else Claims()
        self.completer = completer
        # Buried rows go to the worker's completer, or to one of its own for a producer used alone.
        self._outcomes = completer if completer is not None else Completer(db, commit_mode=config.commit_mode)
        self.on_lost = on_lost
        self.ready = ready if ready is not None else anyio.Event()
        """Set once the producer has looked for work (and the listener, if any, was started)."""
        self.caught_up = anyio.Event()
        """Set once a claim found fewer ready jobs than it asked for (or claiming stopped)."""
        self.connected = anyio.Event()
        """Set once the first claim holds its connection (or claiming stopped): the worker's
        other first statements then take the pool's next one."""
        self.statements = 0
        self.claimed = 0
        self.buried = 0
        """Claimed jobs made dead at once because no handler could be called with their row."""
        self._stopping = False
        self._slots = config.slots_by_queue
        self.prefetch = Prefetch(config.prefetch_cap, slots=config.concurrency)
        # Queues with a global limit or per-key settings (claimed by the limits' statement) and,
        # of those, the ones with a global limit, whose settings rows a claim locks first, and
        # those with a rate (global or per key), whose short claims ask when to look again
        # (prefetch.keyed: one has a per-key concurrency limit). Re-read every `limits_refresh` s.
        self.limited: list[str] = []
        self.locked: list[str] = []
        self.rated: list[str] = []
        self.limits_refresh = max(config.poll_interval, 1.0)
        self._limits_read_at = -math.inf
        self._held: tuple[Connection, contextlib.AsyncExitStack] | None = None  # see _hold
        # Seconds the last claim spent re-reading those settings: no part of a claim's round trip.
        self._limits_took = 0.0
        self._too_small = False  # the last _should_wait held back a keyed claim too small for a turn

    # -- steering ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns at its next step."""
        self._stopping = True
        self.wakeups.stop()
        self.claims.freed.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    # -- capacity ------------------------------------------------------------------------------

    def capacity(self) -> tuple[int, list[int] | None]:
        """How many jobs to claim now in all, and per queue when the worker caps queues."""
        cfg, now = self.config, time.monotonic()
        self.prefetch.finished(self.claims.finished_total, now, self.claims.busy_total)
        if not self.claims.active:
            self.prefetch.idle(now, self.claims.last_ended - self.claims.first_begun)
        self.prefetch.running = min(self.claims.active, cfg.concurrency)
        free = min(cfg.concurrency + self.prefetch.target(now) - self.claims.active, cfg.claim_batch,
                   self.prefetch.most(now))
        if self._slots is None:
            return free, None
        per_queue = [
            max(0, min(free, self._slots.get(q, free) - self.claims.active_in(q))) for q in self.queues
        ]
        return min(free, sum(per_queue)), per_queue

    def _should_wait(self, free: int) -> bool:
        self._too_small = False
        if free <= 0:
            return True
        # Below a worthwhile refill (half the buffer), wait for more room only while jobs in
        # hand keep us busy: a buffer refills in large claims rather than one job at a time.
        cfg, pace = self.config, self.prefetch
        if free < min(cfg.claim_batch, pace.target() // 2, pace.most()) and self.claims.active:
            return True
        if self._slots is None and pace.too_small(free, self.claims.active, time.monotonic(), cfg.claim_batch):
            self._too_small = True
            return True
        return self.completer is not None and not self.completer.has_room()

    async def _wait_for_capacity(self) -> None:
        if self.completer is not None and not self.completer.has_room():
            await self.completer.wait_for_room(self.config.poll_interval)
            return
        self.claims.freed.clear()
        wait = self.config.poll_interval
        if self._too_small:  # a round trip at most (see Prefetch.too_small)
            wait = min(wait, self.prefetch.short_wait(time.monotonic()))
        await self.claims.freed.wait(wait)

    def _keep_connection(self) -> bool:
        """Whether to keep the claim connection while the producer waits a moment for its next
        claim under a per-key limit (for more room, while the jobs in hand are quicker than a
        claim or not yet timed; or, in a burst, after a short claim), while the pool has another
        free for anyone else. A connection that has not claimed yet plans the keyed claim's
        statements inside the queue's turn, which every worker's claim waits for; and the pool
        lends a connection given back to its next taker, most often the completer."""
        pace = self.prefetch
        return pace.keyed and self._pool_has_room() and (self._too_small or pace.handler_time <= pace.round_trip)

    # -- the loop ------------------------------------------------------------------------------

    async def run(
        self,
        runners: Callable[[list[Job]], None],
        *,
        burst: bool = False,
        started: Callable[[], Awaitable[bool]] | None = None,
        listen: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Claim jobs and hand each claim's jobs to ``runners`` until stopped (or, in ``burst``
        mode, until no job is ready, none is running and every outcome is written). ``started``:
        awaited once before a burst ends, it waits for the worker's other first statements
        and returns whether they may have made jobs ready (the reaper's), to claim again.
        ``listen``: awaited the first time a burst finds jobs a limit holds back: its wake-ups."""

        def hand_over(jobs: list[Job]) -> None:
            if jobs:
                for lost in self.claims.take(jobs):
                    self.on_lost(lost)
                runners(jobs)

        try:
            while not self._stopping:
                free, per_queue = self.capacity()
                if self._should_wait(free):
                    # Kept, or not held: wait. Given back: look again (giving it back takes loop
                    # turns, in which handlers may finish).
                    if self._keep_connection() or not await self._let_go():
                        await self._wait_for_capacity()
                    continue
                writes = self.completer.writes if self.completer is not None else 0
                stirs = self.completer.stirs if self.completer is not None else 0
                finished = self.claims.finished_total
                jobs = await self._claim_with_retry(free, per_queue, hand_over)
                # No claim at once (a burst's keyed claims keep it: the next follows as soon as it
                # may find jobs), or one may wait for it.
                if (len(jobs) < free and not (burst and self._keep_connection())) or not self._pool_has_room():
                    if jobs:  # the runners first: giving the connection back runs until its first await
                        await anyio.lowlevel.checkpoint()
                    await self._let_go()
                self.ready.set()
                self.prefetch.handed_over(len(jobs), len(jobs) == free, time.monotonic())
                if len(jobs) < free:
                    self.caught_up.set()
                # After the hand-over, so the handlers need not wait for it. A burst waits for no
                # due time (jobs due later do not keep it going) unless a limit holds jobs back.
                due_unknown = self.wakeups.check_due or not self.config.listen  # no listener tells due times
                # A concurrency limit (global or per key) wakes us when a slot frees; a rate tells
                # when it opens only to a claim that asks.
                if len(jobs) < free and (self.rated or (due_unknown and not burst)):
                    await self._learn_due()
                if len(jobs) == free:
                    continue  # every slot filled: there may be more ready right now
                if not burst:
                    await self.wakeups.wait()
                    continue
                if jobs:
                    continue
                if self.claims.active:
                    await self._wait_for_capacity()
                    continue
                if self.claims.finished_total != finished:
                    # A handler returned while the claim ran: a job it enqueued may have committed
                    # after the claim's snapshot, so the empty answer does not cover it.
                    continue
                if self.completer is not None:
                    if not self.completer.idle:
                        self.completer.hurry()  # no handler runs: nothing more will gather
                        await self.completer.wait_idle()  # outcomes first: a retry may be ready at once
                    # Claim again if outcomes written since the claim may have made jobs ready: a
                    # retry due now, a woken dependant or group callback, a limited queue's slot.
                    # Successes that woke nothing leave the claim's answer standing.
                    if self.completer.writes != writes and (self.limited or self.completer.stirs != stirs):
                        continue
                if self.limited and await self._held_back():
                    # Ready jobs a limit holds back: wait for the outcome that frees a slot to wake
                    # us. The first time, listen, then look again (a slot freed before woke no one).
                    if listen is not None:
                        await listen()
                        listen = None
                    else:
                        await self.wakeups.wait()
                elif started is not None:
                    more, started = await started(), None
                    if not more:
                        return
                else:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                await self._let_go()
            self.ready.set()
            self.caught_up.set()
            self.connected.set()

    async def _learn_due(self) -> None:
        """Ask the database when to look next (delayed jobs, rate windows); a failure is left to
        the poll."""
        try:
            async with self.db.connection() as conn:
                since = time.monotonic() - self._claim_started
                seconds = await conn.fetchval(
                    self.db.queries.next_wakeup, self.queues, since + 0.001, self._claimed_at
                )
        except Exception as exc:
            logger.warning("reading the next due time failed (%s: %s)", type(exc).__name__, exc)
            return
        self.wakeups.check_due = False
        if seconds is not None:
            self.wakeups.due_in(seconds)

    async def _held_back(self) -> bool:
        """Whether ready jobs wait in our queues though we claimed none (a limit holds them)."""
        async with self.db.connection() as conn:
            return bool(await conn.fetchval(self.db.queries.ready_jobs, self.queues))

    # -- claiming ------------------------------------------------------------------------------

    async def claim(
        self,
        limit: int,
        per_queue: Sequence[int] | None = None,
        hand_over: Callable[[list[Job]], None] | None = None,
        conn: Connection | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` ready jobs (and up to ``per_queue[i]`` of ``queues[i]``) in one
        statement; they are running under our lease.

        Claims on queues with a global limit run in a short transaction that first locks those
        queues' settings rows, so concurrent workers take turns and the limit holds; per-key
        limits hold by claim_keyed's locks of keys.
        ``hand_over(jobs)`` is called with the committed claim before the connection goes back to
        the pool: giving it back costs the event loop a few turns (asyncpg shields the release in
        a task of its own), which handlers of an idle worker's wake-up need not wait for.
        ``conn``: claim on it (and keep it), else on a pooled connection given back at the end.
        """
        self.statements += 1
        self._claim_started = time.monotonic()
        q = self.db.queries
        wants = list(per_queue) if per_queue is not None else [limit] * len(self.queues)
        claim = functools.partial(
            self.db.statements.claim, queues=self.queues, wants=wants, worker=self.worker_id,
            lease=self.config.lease, limit=limit, commit_mode=self.config.commit_mode,
        )
        handed: list[Job] | None = None
        self._limits_took = 0.0
        try:
            async with self.db.connection(conn) as conn:
                self.connected.set()
                now = time.monotonic()
                if now - self._limits_read_at >= self.limits_refresh:
                    self.take_limits(await conn.fetch(q.limited_queues, self.queues))
                    self._limits_took = time.monotonic() - now
                while True:
                    b = claim(limited=bool(self.limited), timed=True, keyed_only=not self.locked)
                    if self.locked:
                        async with conn.transaction():
                            await conn.execute(q.lock_queues, self.locked)
                            row = await conn.fetchrow(b.sql, *b.args)
                    else:
                        row = await conn.fetchrow(b.sql, *b.args)
                    assert row is not None  # an aggregate: one row, claimed or not
                    self._claimed_at = from_epoch(row["claimed_at"])
                    jobs, bad = decode_claim(row)  # in claim order
                    self.claimed += len(jobs)
                    if bad:
                        await self._bury(conn, bad)
                        # An empty claim tells the worker nothing is ready: claim again rather
                        # than return one that is empty only because every row in it was buried.
                        if not jobs:
                            continue
                    if hand_over is not None:
                        hand_over(jobs)
                        handed = jobs
                    return jobs
        except Exception as exc:
            if handed is None:
                raise
            # The claim committed and its jobs are with the runners: only giving the connection
            # back failed (the pool replaces it). Claiming again now would take more than fits.
            logger.warning("returning a connection to the pool after a claim failed (%s: %s)",
                           type(exc).__name__, exc)
            return handed

    def take_limits(self, rows: Sequence[asyncpg.Record]) -> None:
        """Keep the rows of ``limited_queues``, read just now (the worker's first read)."""
        self.limited, self.locked = [r["name"] for r in rows], [r["name"] for r in rows if r["locked"]]
        self.rated = [r["name"] for r in rows if r["rated"]]
        self.prefetch.keyed, self._limits_read_at = any(r["key_limited"] for r in rows), time.monotonic()

    async def _bury(self, conn: Connection, bad: list[Undecodable]) -> None:
        """Make dead at once, through the completer, the claimed jobs no handler could be called
        for: no attempt could decode them, and leaving them running would hold them until their
        lease expires."""
        await self._outcomes.bury(conn, [((b.id, b.attempt), b.error) for b in bad])
        self.buried += len(bad)
        for b in bad:
            logger.error("job %d: marked dead: %s", b.id, b.error)

    async def _claim_with_retry(
        self, limit: int, per_queue: Sequence[int] | None, hand_over: Callable[[list[Job]], None]
    ) -> list[Job]:
        """Claim (see :meth:`claim`), and on a database error log it and back off rather than
        fail the worker; return nothing once stopping."""
        failures = 0
        while not self._stopping:
            try:
                self.wakeups.claiming()
                started = time.monotonic()
                jobs = await self.claim(limit, per_queue, hand_over, await self._hold())
                # Less the settings read (a producer's first, unless take_limits came first, is a
                # cold server session's first statement): it can take many claims' time on a loaded
                # machine, and the buffer it would then size holds long jobs back from other workers.
                self.prefetch.claimed(time.monotonic() - started - self._limits_took)
                return jobs
            except Exception as exc:
                await self._let_go()
                failures += 1
                delay = min(max(self.config.poll_interval, 0.1) * 5, 0.05 * 2**failures)
                logger.warning("claiming jobs failed (%s: %s); retrying in %.2fs",
                               type(exc).__name__, exc, delay)
                await self.wakeups.flag.wait(delay)
        return []

    async def _hold(self) -> Connection:
        """The connection to claim on, kept while claims follow each other (see performance.md)."""
        if self._held is None:
            stack = contextlib.AsyncExitStack()
            self._held = (await stack.enter_async_context(self.db.connection()), stack)
        return self._held[0]

    async def _let_go(self) -> bool:
        """Give the claim connection back to the pool if held (return whether it was; a failure
        is the pool's to mend)."""
        if self._held is None:
            return False
        stack, self._held = self._held[1], None
        try:
            await stack.aclose()
        except Exception as exc:
            logger.warning("returning a connection to the pool after a claim failed (%s: %s)",
                           type(exc).__name__, exc)
        return True

    def _pool_has_room(self) -> bool:
        """Whether the pool can lend another connection without waiting (so no one waits)."""
        return (pool := self.db.pool).get_idle_size() > 0 or pool.get_size() < pool.get_max_size()
