"""A job reaped and claimed again by the very worker still running its old attempt (issue 16).

When a lease expires in database time (the server was down, the worker stalled), the reaper
returns the job to pending and any worker may claim it, this one included, while the old attempt
still runs here. Everything the worker tracks is keyed by the claim (job id, attempt): claiming
attempt k+1 interrupts attempt k at once (LEASE_LOST, no outcome written for it), the heartbeat
renews an expired lease only while the row is still running under the same attempt, and a claim
it cannot renew is lost and its handler interrupted. Before the fix both attempts ran at once and
the second to end raised KeyError out of the worker's task group, killing the worker.

The first two tests play the reaper and the rival claim with SQL on the test's own database;
the slow one stops a server the test owns (``fault_tools.owned_server``) for longer than the
lease and starts it again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import aioqueue
from aioqueue._claims import ClaimKey
from aioqueue._outcome import Interrupt
from aioqueue._queries import for_schema
from aioqueue._statements import int_array
from tests.support.fault_tools import owned_server
from tests.support.helpers import eventually

# What reap_expired does to a running job whose lease expired (queries.sql), for one job.
REAP = (
    "UPDATE aioqueue.jobs SET status = 'pending', run_at = now(), locked_by = NULL, locked_at = NULL, "
    "lease_expires_at = NULL WHERE id = $1"
)


async def row_of(db: asyncpg.Connection, job_id: int) -> tuple[str, int, str | None] | None:
    """The job's (status, attempts, locked_by), or None when its row is gone."""
    row = await db.fetchrow("SELECT status, attempts, locked_by FROM aioqueue.jobs WHERE id = $1", job_id)
    return None if row is None else (row["status"], row["attempts"], row["locked_by"])


class Attempts:
    """A handler that records, per claim, when it started and how it ended, and what else of the
    same job ran in this worker at its start.

    It waits for ``release[claim]`` for at most ``wait`` seconds; then it returns (``sleep``:
    the wait is the job's work) or raises TimeoutError (the test forgot it: a failure).
    """

    def __init__(self, wait: float, *, sleep: bool = False) -> None:
        self.wait = wait
        self.sleep = sleep
        self.worker: aioqueue.Worker | None = None
        self.release: collections.defaultdict[ClaimKey, anyio.Event] = collections.defaultdict(anyio.Event)
        self.started: dict[ClaimKey, float] = {}
        self.ended: dict[ClaimKey, tuple[str, float]] = {}
        self.live: set[ClaimKey] = set()
        self.alongside: dict[ClaimKey, dict[ClaimKey, tuple[bool, Interrupt | None]]] = {}
        """At each start: the other attempts of the same job the executor still ran, each with
        whether its cancellation was already requested and why."""
        self.handlers_alongside: dict[ClaimKey, set[ClaimKey]] = {}
        """At each start: the other attempts of the same job whose handler had not ended."""

    async def handle(self, n: int) -> None:
        job = aioqueue.current_job()
        claim = (job.id, job.attempt)
        self.started[claim] = time.monotonic()
        self.handlers_alongside[claim] = {c for c in self.live if c[0] == job.id}
        assert self.worker is not None and self.worker.executor is not None
        self.alongside[claim] = {
            other: (attempt.cancel_sent, attempt.interrupt)
            for other, attempt in self.worker.executor.running.items()
            if other[0] == job.id and other != claim
        }
        self.live.add(claim)
        try:
            if self.sleep:
                with anyio.move_on_after(self.wait):
                    await self.release[claim].wait()
            else:
                with anyio.fail_after(self.wait):
                    await self.release[claim].wait()
        except anyio.get_cancelled_exc_class():
            self.ended[claim] = ("cancelled", time.monotonic())
            raise
        except TimeoutError:
            self.ended[claim] = ("timed out", time.monotonic())
            raise
        finally:
            self.live.discard(claim)
        self.ended[claim] = ("returned", time.monotonic())

    def outcomes(self, job_id: int) -> list[tuple[int, str]]:
        """(attempt, how it ended) for every attempt of ``job_id`` that ended, in attempt order."""
        return sorted((a, how) for (j, a), (how, _) in self.ended.items() if j == job_id)


@dataclasses.dataclass
class RunState:
    """How a worker's ``run()`` ended, if it did."""

    ended: bool = False
    error: BaseException | None = None


@contextlib.asynccontextmanager
async def watched(worker: aioqueue.Worker) -> AsyncIterator[RunState]:
    """Like ``helpers.running``, and the body can see whether ``run()`` ended (and how)."""
    state = RunState()

    async def run() -> None:
        try:
            await worker.run()
        except BaseException as exc:
            state.error = exc
            raise
        finally:
            state.ended = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(30):
            await worker.ready.wait()
        try:
            yield state
        finally:
            worker.stop()


async def watch_running(worker: aioqueue.Worker, violations: list[str], overlaps: list[int]) -> None:
    """At every scheduling step, check the executor: when two attempts of one job are in
    ``running`` at once, every older one must already be cancelled for LEASE_LOST."""
    while True:
        executor = worker.executor
        if executor is not None:
            by_job: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
            for job_id, attempt in executor.running:
                by_job[job_id].append(attempt)
            for job_id, attempts in by_job.items():
                if len(attempts) < 2:
                    continue
                overlaps.append(job_id)
                for attempt in attempts:
                    if attempt == max(attempts):
                        continue
                    entry = executor.running[(job_id, attempt)]
                    if not (entry.cancel_sent and entry.interrupt is Interrupt.LEASE_LOST):
                        violations.append(
                            f"job {job_id}: attempt {attempt} running uncancelled ({entry.interrupt}) "
                            f"beside attempt {max(attempts)}"
                        )
        await anyio.lowlevel.checkpoint()


async def test_same_worker_reclaiming_a_reaped_job_interrupts_the_old_attempt(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    rec = Attempts(wait=20.0)
    hold = q.task(name="hold")(rec.handle)
    pings: list[int] = []

    @q.task(name="ping")
    async def ping(n: int) -> None:
        pings.append(n)

    worker = q.worker(concurrency=4, lease=30, heartbeat_interval=10, reap_interval=3600, poll_interval=0.05,
                      install_signal_handlers=False)
    rec.worker = worker
    job_id = await hold.enqueue(n=1)
    first, second = (job_id, 1), (job_id, 2)
    violations: list[str] = []
    overlaps: list[int] = []
    async with watched(worker) as state, anyio.create_task_group() as monitor:
        monitor.start_soon(watch_running, worker, violations, overlaps)
        await eventually(lambda: first in rec.started, timeout=10, what="attempt 1 to start")
        assert await row_of(db, job_id) == ("running", 1, worker.name)

        # The reaper's statement, as if the lease had expired in database time; then the wakeup
        # it sends. Nothing of this worker is told otherwise.
        reaped = time.monotonic()
        assert await db.execute(REAP, job_id) == "UPDATE 1"
        await db.execute("SELECT pg_notify('aioqueue_jobs', 'default')")

        await eventually(lambda: second in rec.started and first in rec.ended, timeout=10,
                         what="attempt 2 to start and attempt 1 to end")
        how, ended_at = rec.ended[first]
        assert how == "cancelled"
        assert ended_at - reaped < 2.0, f"attempt 1 ended {ended_at - reaped:.2f}s after the reap"
        # The same worker claimed it again.
        assert await row_of(db, job_id) == ("running", 2, worker.name)
        # The order the producer guarantees: Claims.take() drops the older claim and on_lost
        # cancels its handler before attempt 2 is handed to a runner, so when attempt 2 starts,
        # attempt 1 has either ended or has had its cancellation requested, for LEASE_LOST.
        assert rec.alongside[second] in ({}, {first: (True, Interrupt.LEASE_LOST)}), rec.alongside[second]
        assert rec.handlers_alongside[second] <= {first}
        assert rec.alongside[first] == {} and rec.handlers_alongside[first] == set()
        assert worker.claims.held() == [second]
        assert worker.executor is not None and list(worker.executor.running) == [second]
        # Attempt 1 is counted as interrupted and left no outcome to write: the row is attempt 2's.
        assert worker.stats == aioqueue.WorkerStats(claimed=2, interrupted=1)
        assert len(worker.executor.completer) == 0 and not worker.executor.completer.writing

        rec.release[second].set()
        await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs WHERE id = $1", job_id),
                         timeout=10, what="the job's row to be deleted")
        assert rec.outcomes(job_id) == [(1, "cancelled"), (2, "returned")]
        assert worker.stats == aioqueue.WorkerStats(claimed=2, succeeded=1, interrupted=1)
        assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE id = $1", job_id) == 0
        assert worker.claims.held() == [] and worker.active == 0

        # The worker lives on: a new job runs.
        ping_id = await ping.enqueue(n=7)
        await eventually(lambda: pings == [7], timeout=10, what="a job after the reclaim to run")
        await eventually(lambda: db.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs WHERE id = $1", ping_id),
                         timeout=10, what="the new job's row to be deleted")
        assert not state.ended
        monitor.cancel_scope.cancel()
        stopping = time.monotonic()
    assert state.ended and state.error is None
    assert time.monotonic() - stopping < 5.0
    # Both attempts may sit in `running` for a step or two (attempt 1 cancelled, not yet unwound).
    print(f"scheduling steps with two attempts of one job in the executor: {len(overlaps)}")
    assert violations == []
    assert worker.stats == aioqueue.WorkerStats(claimed=3, succeeded=2, interrupted=1)
    assert rec.outcomes(job_id) == [(1, "cancelled"), (2, "returned")]


async def test_heartbeat_renews_an_expired_unreaped_lease_only_for_the_claim_holding_it(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    rec = Attempts(wait=30.0)
    hold = q.task(name="hold")(rec.handle)
    worker = q.worker(concurrency=4, lease=2, heartbeat_interval=0.3, reap_interval=3600, poll_interval=0.05,
                      install_signal_handlers=False)
    rec.worker = worker
    job_id = await hold.enqueue(n=1)
    claim = (job_id, 1)
    async with watched(worker) as state:
        await eventually(lambda: claim in rec.started, timeout=10, what="attempt 1 to start")
        heartbeat = worker.heartbeat
        assert heartbeat is not None

        # Expired in database time, not reaped (the reaper runs hourly here): still ours.
        assert await db.execute(
            "UPDATE aioqueue.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1", job_id
        ) == "UPDATE 1"
        beats = heartbeat.beats
        await eventually(
            lambda: db.fetchval(
                "SELECT lease_expires_at > now() AND status = 'running' AND attempts = 1 AND locked_by = $2 "
                "FROM aioqueue.jobs WHERE id = $1", job_id, worker.name,
            ),
            timeout=5, what="the heartbeat to renew the expired lease",
        )
        # The beat that renewed it counts itself once its statement returns: wait for that too.
        await eventually(lambda: heartbeat.beats > beats, timeout=5, what="the renewing beat to be counted")
        assert claim not in rec.ended and claim in rec.live
        assert worker.claims.held() == [claim]

        # Another claim takes the row (as a reap and a claim elsewhere would): the old attempt
        # can no longer renew it, so its handler is interrupted, and it writes nothing.
        bumped = time.monotonic()
        assert await db.execute("UPDATE aioqueue.jobs SET attempts = attempts + 1 WHERE id = $1", job_id) == "UPDATE 1"
        before = await db.fetchrow("SELECT * FROM aioqueue.jobs WHERE id = $1", job_id)
        await eventually(lambda: claim in rec.ended, timeout=5, what="the old attempt to be interrupted")
        how, ended_at = rec.ended[claim]
        assert how == "cancelled"
        assert ended_at - bumped < 1.5, f"interrupted {ended_at - bumped:.2f}s after losing the row"
        assert worker.claims.held() == []
        assert worker.stats == aioqueue.WorkerStats(claimed=1, interrupted=1)
        assert not state.ended
    assert state.ended and state.error is None
    after = await db.fetchrow("SELECT * FROM aioqueue.jobs WHERE id = $1", job_id)
    assert before is not None and after is not None
    assert dict(after) == dict(before), "the old attempt touched a row it no longer held"
    assert (after["status"], after["attempts"]) == ("running", 2)
    assert worker.stats == aioqueue.WorkerStats(claimed=1, interrupted=1)
    assert rec.outcomes(job_id) == [(1, "cancelled")]


async def _outage_run(run: int) -> bool:
    """Stop a server the test owns for longer than the lease under a running job, start it
    again, and check what followed; return whether the job was reaped and claimed again (the
    other legitimate order, the heartbeat renewing the lease first, returns False)."""
    heartbeat, outage = 2.9, 5.0
    async with owned_server() as server:
        q = aioqueue.Queue(server.dsn, pool_max_size=5, connect_timeout=2)
        rec = Attempts(wait=12.0, sleep=True)
        hold = q.task(name="hold")(rec.handle)
        pings: list[int] = []

        @q.task(name="ping")
        async def ping(n: int) -> None:
            pings.append(n)

        async with q:
            worker = q.worker(concurrency=4, lease=3.0, poll_interval=0.1, heartbeat_interval=heartbeat,
                              reap_interval=0.1, install_signal_handlers=False)
            rec.worker = worker
            job_id = await hold.enqueue(n=run)
            first = (job_id, 1)
            async with watched(worker) as state:
                await eventually(lambda: first in rec.started, timeout=10, what="attempt 1 to start")
                # The fault schedule itself: stop 1 s into the attempt, for longer than the lease.
                await anyio.sleep(max(0.0, rec.started[first] + 1.0 - time.monotonic()))
                await server.stop("fast")
                stopped = time.monotonic()
                await anyio.sleep(outage)
                # The outage alone interrupts nothing: failed beats are retried, not taken as lost.
                assert first not in rec.ended and first in rec.live, rec.ended
                starting = time.monotonic()
                await server.start()  # returns once pg_ctl saw it accept connections
                restarted = time.monotonic()

                await eventually(lambda: first in rec.ended, timeout=12.0 + 10.0,
                                 what="the old attempt to end after the restart")
                how, old_ended = rec.ended[first]
                assert worker.maintenance is not None
                reaped = worker.maintenance.reaped
                if how == "cancelled":
                    # The reaper (every 0.1 s) found the lease expired and the job was claimed
                    # again here, or the heartbeat found the row gone: the old attempt is stopped.
                    assert reaped == 1
                    await eventually(lambda: any(c[0] == job_id and c[1] > 1 for c in rec.started),
                                     timeout=10, what="the job to be claimed again")
                # The worker runs new work after the outage.
                await ping.enqueue(n=run)
                await eventually(lambda: pings == [run], timeout=10, what="a new job after the outage")

                monitor = await asyncpg.connect(server.dsn)
                try:
                    await eventually(
                        lambda: monitor.fetchval("SELECT count(*) = 0 FROM aioqueue.jobs"),
                        timeout=12.0 + 10.0, interval=0.05, what="the job to finish after the outage",
                    )
                    done = await monitor.fetchval("SELECT count(*) FROM aioqueue.jobs_done")
                finally:
                    await monitor.close()
                assert not state.ended, state.error
            assert state.error is None

    outcomes = rec.outcomes(job_id)
    print(f"run {run}: attempts {outcomes}; reaped {reaped}; old attempt ended "
          f"{old_ended - restarted:+.2f}s after pg_ctl start returned ({old_ended - starting:+.2f}s after it "
          f"began); outage {starting - stopped:.1f}s; stats {worker.stats}")
    assert set(rec.started) == {(job_id, a) for a, _ in outcomes} and not rec.live
    assert done == 0  # not an archived task: a finished job leaves no row
    if how == "returned":
        # The one legitimate other order: the heartbeat's first beat after the restart came
        # before the reaper's and renewed the expired, unreaped lease of the attempt that still
        # held the row. Then nothing was reaped and the job ran once, unbroken.
        assert reaped == 0 and outcomes == [(1, "returned")], outcomes
        assert worker.stats == aioqueue.WorkerStats(claimed=2, succeeded=2)
        return False
    assert starting < old_ended < restarted + heartbeat + 5.0
    # Exactly one success, after the outage; every earlier attempt was interrupted, none ran on.
    assert [how for _, how in outcomes] == ["cancelled"] * (len(outcomes) - 1) + ["returned"], outcomes
    assert outcomes[-1][0] > 1 and rec.started[(job_id, outcomes[-1][0])] > starting
    # Each later attempt began with every older one ended or already cancelled for LEASE_LOST.
    for attempt, _ in outcomes[1:]:
        for other, (cancelled, reason) in rec.alongside[(job_id, attempt)].items():
            assert other[1] < attempt and cancelled and reason is Interrupt.LEASE_LOST
    assert worker.stats == aioqueue.WorkerStats(
        claimed=len(outcomes) + 1, succeeded=2, interrupted=len(outcomes) - 1
    )
    return True


@pytest.mark.timeout(300)
async def test_reclaim_after_a_real_server_outage() -> None:
    """The short form the default run makes: the job must be reaped and claimed again after a
    real outage at least once (a run where the heartbeat renewed the lease first proves nothing
    about reclaiming, so it is run again, at most three times in all)."""
    runs: list[bool] = []
    while not any(runs) and len(runs) < 3:
        runs.append(await _outage_run(len(runs)))
    assert any(runs), f"no run reclaimed the job: {runs}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_reclaim_after_server_outage_longer_than_the_lease() -> None:
    reclaimed = [await _outage_run(run) for run in range(20)]
    print(f"reclaimed in {sum(reclaimed)} of {len(reclaimed)} runs")
    assert sum(reclaimed) >= len(reclaimed) // 2, reclaimed


# -- one batch holding two claims of one job -------------------------------------------------

FINISHING = {
    # statement: (parameters after the ids and attempts, the row it leaves: None = deleted)
    "complete": (([None, None], "c", "d", "off"), None),
    "finish_cancelled": (("c", "d", "off"), None),
    "fail": ((["new", "stale"], [0.0, 0.0], [False, False], [1.0] * 2, [2.0] * 2, [60.0] * 2, [0.1] * 2,
              "c", "d", "e", "off"), ("pending", 2, "new")),
    "reschedule": (([0.0, 0.0], ["new", "stale"], "c", "d", "off"), ("pending", 2, "new")),
}


@pytest.mark.parametrize("statement", sorted(FINISHING))
async def test_a_batch_with_a_stale_claim_after_the_current_one_finishes_the_current_one(
    db: asyncpg.Connection, statement: str
) -> None:
    # The completer's batch can hold a job's current claim and, after it, an outcome of an older
    # attempt of the same job (reaped and claimed again): each statement must match every row to
    # its own claim (id and attempt), whatever else the batch holds for that id.
    sql = getattr(for_schema("aioqueue"), statement)
    job_id = await db.fetchval(
        "INSERT INTO aioqueue.jobs (task, status, attempts) VALUES ('t', 'running', 2) RETURNING id"
    )
    rest, expected = FINISHING[statement]
    await db.fetch(sql, int_array([job_id, job_id]), int_array([2, 1]), *rest)
    row = await db.fetchrow("SELECT status, attempts, last_error FROM aioqueue.jobs WHERE id = $1", job_id)
    assert (None if row is None else tuple(row)) == expected
