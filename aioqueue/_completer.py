"""Write the outcomes of finished jobs back to PostgreSQL, many per statement: the one writer
of outcomes.

Handlers hand their outcome to the completer without waiting (``succeeded``, ``failed``,
``rescheduled``, ``cancelled``, ``suspended``; the worker gives back claimed jobs it never started the same
way); its loop writes each kind with one statement for up to ``batch_size`` buffered jobs,
flushing when the buffer reaches ``batch_size`` or ``interval`` after the first outcome arrived,
and always on shutdown. The producer's claimed rows that no handler can be called for are made
dead at once through :meth:`Completer.bury`, on the claim's own connection. It owns its
back-pressure: while more outcomes wait than ``max_backlog``, ``has_room()`` is false and the
producer waits in ``wait_for_room()`` before claiming more. If a write fails (the connection
dropped, the server restarted) the outcomes stay buffered and the write is retried with
backoff; while they wait, the heartbeat keeps their leases, so nothing is lost. Every write is
fenced by the claim (id, attempt), and by default commits without waiting for its WAL flush
(see the ``commit_mode`` fragment of ``queries.sql``).

It also writes the progress handlers report (``aioqueue._progress``): only the latest value per
claim is kept, all of them written in one statement ``progress_interval`` after the first
arrived, and a claim's value always in the flush that writes its outcome, before it, so the
last progress is neither lost nor written after the outcome (which the claim's fence would drop).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from ._claims import ClaimKey
from ._job import Connection
from ._outcome_batch import NO_RETRY, Batch, Failure, Writing
from ._progress import Reported
from ._retry import Backoff
from ._signal import Flag

if TYPE_CHECKING:
    from ._database import Database
    from ._job import Job

logger = logging.getLogger("aioqueue.completer")


class SharedConnection:
    """A connection the completer's writes share, taking turns, with whoever lent it (the
    worker's first statements), until it is taken back: outcomes need not wait for those
    statements, nor the pool open one connection more for them."""

    def __init__(self, conn: Connection) -> None:
        self.conn: Connection | None = conn
        self._lock = anyio.Lock()
        self._returned = anyio.Event()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[Connection | None]:
        """Hold the connection for one statement or a few; once it is taken back, None, after it
        is back in the pool (asking the pool before would open one connection more)."""
        async with self._lock:
            conn = self.conn
            if conn is None:
                await self._returned.wait()
            yield conn

    async def take_back(self) -> None:
        """Wait for the turn in progress to end; the completer then writes on the pool's
        connection, once :meth:`handed_back` says this one is back in the pool."""
        async with self._lock:
            self.conn = None

    def handed_back(self) -> None:
        """The connection is back in the pool (or lost): turns go on, on the pool's."""
        self._returned.set()


class Completer:
    """Buffers job outcomes and writes them in batches."""

    def __init__(
        self,
        db: Database,
        *,
        batch_size: int = 1000,
        interval: float = 0.002,
        max_backlog: int | None = None,
        on_written: Callable[[list[int], list[int]], None] = lambda ids, attempts: None,
        commit_mode: str | None = "off",
        progress_interval: float = 0.5,
    ) -> None:
        self.db = db
        self.commit_mode = commit_mode
        """The finishing statements' ``synchronous_commit`` ('off', or None: the session's)."""
        self.batch_size = batch_size
        self.interval = interval
        self.max_backlog = max_backlog if max_backlog is not None else batch_size * 4
        self.on_written = on_written
        """Called with the ids and attempts of the claims whose outcomes were written."""
        # Claims whose outcome is being written right now: the heartbeat must not take a job
        # that vanished under such a write for a lost lease.
        self.writing = Writing()
        self._batch = Batch()
        self._ready = Flag()
        self._idle = Flag()
        self._idle.set()
        self._room = Flag()
        self._room.set()
        # Raised by hurry(): no more outcomes are coming soon, so the gathering ends now.
        self._hurry = Flag()
        self.writes = 0
        """Batches written so far: a claim made before a write may have missed the slots it freed."""
        self.stirs = 0
        """Batches written so far that may have made a job ready on a queue without limits: any
        with an outcome other than success, or whose successes woke workflow dependants or
        groups. A burst that ends claims again only after such a write (or on a limited queue)."""
        self.progress_interval = progress_interval
        self._progress: dict[ClaimKey, Reported] = {}
        self._progress_due: float | None = None
        self.progress_writes = 0
        """Statements that wrote reported progress so far."""
        self.warmed = anyio.Event()
        """Set once :meth:`warm_up` has run (by :meth:`run`, unless the caller did it first)."""
        self.shared: SharedConnection | None = None
        """A connection lent to the writes, taken in turns, until it is taken back (then None)."""

    def __len__(self) -> int:
        """Outcomes buffered and not yet written."""
        return len(self._batch)

    # -- back-pressure ---------------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether the buffer is below ``max_backlog``: the producer may claim more."""
        return len(self._batch) <= self.max_backlog

    async def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`has_room`; return whether it became true within ``timeout``."""
        while not self.has_room():
            self._room.clear()
            if not await self._room.wait(timeout):
                return self.has_room()
        return True

    @property
    def idle(self) -> bool:
        """Whether nothing is buffered or being written."""
        return self._idle.is_set()

    # -- handing over outcomes (never blocks) -------------------------------------------------

    def succeeded(self, job: Job, result: str | None) -> None:
        """Record that ``job`` succeeded, with its JSON result (kept only if archived)."""
        b = self._batch
        b.done_ids.append(job.id)
        b.done_attempts.append(job.attempt)
        b.done_results.append(result)
        # _arrived(), without its calls (one success a job): the flags are most often already
        # as it leaves them.
        self._idle.raised = False
        if not self._ready.raised:
            self._ready.set()

    def failed(
        self, job: Job, error: str, retry: Backoff, *, delay: float | None = None, dead: bool = False
    ) -> None:
        """Record a failed attempt: retried after ``delay`` (None: backoff) or dead."""
        self._batch.failures.append(Failure(job.id, job.attempt, error, delay, dead, retry))
        self._arrived()

    def rescheduled(self, job: Job, delay: float, note: str | None = None) -> None:
        """Record that ``job`` goes back to pending after ``delay`` without spending an attempt."""
        self._batch.reschedules.append((job.id, job.attempt, delay, note))
        self._arrived()

    def suspended(self, job: Job) -> None:
        """Record that ``job``'s handler stopped at a sleep or an event wait: back to pending,
        due when it wakes (see ``aioqueue._steps``), without spending an attempt."""
        self._batch.suspends.append((job.id, job.attempt))
        self._arrived()

    def cancelled(self, job: Job) -> None:
        """Record that ``job``'s handler was cancelled on request: archive it as cancelled."""
        self._batch.cancels.append((job.id, job.attempt))
        self._arrived()

    async def bury(self, conn: Connection, buried: Sequence[tuple[ClaimKey, str]]) -> None:
        """Make dead now, on ``conn``, the claims ``buried`` names with why: claimed rows no
        handler could be called for. Written at once rather than buffered, so that the claim
        that found them returns only after they are dead."""
        failures = [Failure(job_id, attempt, error, None, True, NO_RETRY) for (job_id, attempt), error in buried]
        await self._write_on(conn, Batch(failures=failures))

    def progress_reported(self, claim: ClaimKey, value: Reported) -> None:
        """Keep ``value`` as the latest progress of ``claim``, to be written
        within ``progress_interval``, or with the claim's outcome if that comes first."""
        if not self._progress:
            self._progress_due = time.monotonic() + self.progress_interval
            self._ready.set()  # the loop may be waiting without a deadline: give it one
        self._progress[claim] = value

    def _arrived(self) -> None:
        self._idle.clear()
        self._ready.set()

    # -- writing -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Warm up (unless done), then flush buffered outcomes until cancelled; retry failed
        writes with backoff."""
        if not self.warmed.is_set():
            await self.warm_up()
        failures = 0
        while True:
            due = self._progress_due
            await self._ready.wait(None if due is None else max(0.0, due - time.monotonic()))
            if not len(self._batch):
                self._ready.clear()  # woken for progress only
            elif len(self._batch) < self.batch_size and self.interval > 0 and not self._hurry.is_set():
                # Let a burst of outcomes gather into one statement.
                await self._hurry.wait(self.interval)
            self._hurry.clear()
            try:
                await self.flush()
                due = self._progress_due
                if due is not None and due <= time.monotonic():
                    await self.flush_progress()
                failures = 0
            except Exception as exc:
                failures += 1
                delay = min(5.0, 0.05 * 2**failures)
                logger.warning(
                    "writing %d job outcomes failed (%s: %s); retrying in %.2fs",
                    len(self._batch), type(exc).__name__, exc, delay,
                )
                await anyio.sleep(delay)

    async def flush(self) -> None:
        """Write everything buffered now; on failure the outcomes stay buffered."""
        while len(self._batch):
            # At most batch_size outcomes a statement: while one write is in flight, up to
            # max_backlog gather, and one statement for them all holds their rows' locks longer.
            batch, self._batch = self._batch.split(self.batch_size)
            self._ready.clear()
            # The successes' ids and attempts, as the lists they are (a write replaces them in
            # the batch once done), and the claims of the other outcomes (failures, reschedules,
            # cancels, suspends), which may have made jobs ready.
            ids, attempts, others = batch.done_ids, batch.done_attempts, batch.others()
            stirs = bool(others)
            writing = self.writing.add(ids, attempts, others)
            try:
                stirs = await self._write(batch) or stirs
            except BaseException:
                unwritten = set(batch.claims())
                written = [c for c in (*zip(ids, attempts, strict=True), *others) if c not in unwritten]
                self.on_written([c[0] for c in written], [c[1] for c in written])
                self._merge_back(batch)
                raise
            finally:
                self.writing.discard(writing)
                self._room.set()
            self.writes += 1
            if stirs:
                self.stirs += 1
            if others:
                ids, attempts = ids + [c[0] for c in others], attempts + [c[1] for c in others]
            self.on_written(ids, attempts)
        self._idle.set()

    async def flush_progress(self) -> None:
        """Write every buffered progress value now; on failure they stay buffered (unless a
        newer value of the same claim arrived meanwhile)."""
        if not self._progress:
            return
        async with self.db.connection() as conn:
            await self._write_progress(conn, list(self._progress))

    async def _write_progress(self, conn: Connection, claims: list[ClaimKey]) -> None:
        """Write the buffered progress of those of ``claims`` that have some, taking it out of
        the buffer first; put back on failure."""
        taken = {c: v for c in claims if (v := self._progress.pop(c, None)) is not None}
        if not self._progress:
            self._progress_due = None
        if not taken:
            return
        b = self.db.statements.write_progress(
            ids=[c[0] for c in taken], attempts=[c[1] for c in taken],
            values=[v.document(c[1]) for c, v in taken.items()],
            commit_mode=self.commit_mode,
        )
        try:
            await conn.execute(b.sql, *b.args)
        except BaseException:
            for claim, value in taken.items():
                self._progress.setdefault(claim, value)
            if self._progress_due is None:
                self._progress_due = time.monotonic() + self.progress_interval
            raise
        self.progress_writes += 1

    async def warm_up(self, conn: Connection | None = None) -> None:
        """Plan the success write on a connection for the writes (``conn``, else the pool's
        next, opened if need be), writing nothing, so that the first outcomes wait neither for
        a new connection nor for a cold plan (a fresh backend plans the write over the
        archive's partitions); then set :attr:`warmed`. A failure is left to the first real
        write."""
        try:
            async with self.db.connection(conn) as c:
                b = self.db.statements.complete(ids=[], attempts=[], results=[], commit_mode=self.commit_mode)
                await c.execute(b.sql, *b.args)
        except Exception as exc:
            logger.debug("warming up the outcome writes failed (%s: %s)", type(exc).__name__, exc)
        self.warmed.set()

    def hurry(self) -> None:
        """Write what is buffered without waiting for more to gather: its caller knows no more
        outcomes are coming soon (a burst's last handler has finished)."""
        self._hurry.set()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is buffered; return whether that happened within ``timeout``."""
        return await self._idle.wait(timeout)

    def _merge_back(self, batch: Batch) -> None:
        batch.extend(self._batch)
        self._batch = batch
        if len(batch):
            self._ready.set()

    async def _write(self, batch: Batch) -> bool:
        if (shared := self.shared) is not None:
            async with shared.turn() as lent:
                if lent is not None:
                    return await self._write_on(lent, batch)
        async with self.db.connection() as conn:
            return await self._write_on(conn, batch)

    async def _write_on(self, conn: Connection, batch: Batch) -> bool:
        """Write ``batch`` on ``conn``, one statement per kind; a kind written is emptied, so a
        failure leaves only the unwritten ones in the batch. Return whether its successes
        woke workflow dependants or groups (see :attr:`stirs`)."""
        flowed = False
        stmts, mode = self.db.statements, self.commit_mode
        if self._progress:  # the batch's last progress first: after its outcome, the fence drops it
            await self._write_progress(conn, batch.claims())
        if batch.done_ids:
            b = stmts.complete(
                ids=batch.done_ids, attempts=batch.done_attempts, results=batch.done_results, commit_mode=mode
            )
            row = await conn.fetchrow(b.sql, *b.args)
            flowed = row is not None and bool(row["flowed"])
            batch.done_ids, batch.done_attempts, batch.done_results = [], [], []
        if batch.failures:
            f = batch.failures
            b = stmts.fail(
                ids=[x.job_id for x in f],
                attempts=[x.attempt for x in f],
                errors=[x.error for x in f],
                delays=[x.delay for x in f],
                dead=[x.dead for x in f],
                base=[x.retry.base for x in f],
                factor=[x.retry.factor for x in f],
                max_delay=[x.retry.max_delay for x in f],
                jitter=[x.retry.jitter for x in f],
                commit_mode=mode,
            )
            await conn.execute(b.sql, *b.args)
            batch.failures = []
        if batch.reschedules:
            r = batch.reschedules
            b = stmts.reschedule(
                ids=[x[0] for x in r], attempts=[x[1] for x in r], delays=[x[2] for x in r],
                notes=[x[3] for x in r], commit_mode=mode,
            )
            await conn.execute(b.sql, *b.args)
            batch.reschedules = []
        if batch.cancels:
            c = batch.cancels
            b = stmts.finish_cancelled(ids=[x[0] for x in c], attempts=[x[1] for x in c], commit_mode=mode)
            await conn.execute(b.sql, *b.args)
            batch.cancels = []
        if batch.suspends:
            s = batch.suspends
            b = stmts.suspend(ids=[x[0] for x in s], attempts=[x[1] for x in s], commit_mode=mode)
            await conn.execute(b.sql, *b.args)
            batch.suspends = []
        return flowed
