"""Per-key rate limits against the real server: at most R starts per key per interval, counted
at the claims in the queue's clock across workers; a key at its rate holds back only its own
jobs; held-back jobs start when the key's window opens, not at the next poll; the recorded
starts are pruned; bad rates are refused at the call with nothing written."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import itertools
import json
import math
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._claimed import from_epoch
from aioqueue._maintenance import Maintenance
from aioqueue._queries import for_schema
from aioqueue.testing import Clock
from tests.support.cli_tools import aioqueue_cli
from tests.support.helpers import eventually, running

SECOND = datetime.timedelta(seconds=1)


class Claims:
    """Each key's claim times (``locked_at``, the queue's clock), as the handlers read them."""

    def __init__(self, q: aioqueue.Queue) -> None:
        self.q = q
        self.at: dict[str, list[datetime.datetime]] = collections.defaultdict(list)

    async def record(self, key: str) -> None:
        async with self.q.connection() as conn:
            self.at[key].append(await conn.fetchval(
                "SELECT locked_at FROM aioqueue.jobs WHERE id = $1", aioqueue.current_job().id))

    def count(self) -> int:
        return sum(len(v) for v in self.at.values())


async def test_per_key_rate_holds_across_workers_in_database_time(dsn: str, q: aioqueue.Queue) -> None:
    claims = Claims(q)
    queues = [aioqueue.Queue(dsn) for _ in range(3)]
    for queue in queues:

        @queue.task(name="call", queue="api")
        async def call(key: str) -> None:
            await claims.record(key)

    await q.set_key_limits("api", rate=(3, 1.0))
    async with contextlib.AsyncExitStack() as stack:
        for queue in queues:
            await stack.enter_async_context(queue)
        for key in ("acme", "globex"):
            await queues[0].tasks["call"].options(partition_key=key).enqueue_many([{"key": key}] * 7)
        for queue in queues:
            await stack.enter_async_context(running(queue.worker(concurrency=5, poll_interval=0.02)))
        await eventually(lambda: claims.count() == 14, timeout=30, what="14 rate-limited jobs")
    for key, at in claims.at.items():
        at.sort()
        # At most 3 claims of a key in any second of the queue's clock: the 4th after any claim
        # comes a second or more after it (a start leaves the window a second after it).
        for i in range(3, len(at)):
            assert at[i] - at[i - 3] >= SECOND, (key, at)
    # Each key had its own window: both keys' first three went in the first second together.
    first = min(min(at) for at in claims.at.values())
    assert all(sorted(at)[2] - first < SECOND for at in claims.at.values()), claims.at


async def test_a_key_at_its_rate_holds_back_only_its_own_jobs(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    ran: list[str] = []

    @q.task(queue="api")
    async def call(key: str) -> None:
        ran.append(key)

    await q.set_key_limits("api", rate=(1, 3600.0))  # one start per key an hour
    await call.options(partition_key="busy").enqueue_many([{"key": "busy"}] * 3)
    for i in range(5):
        await call.options(partition_key=f"calm-{i}").enqueue(key=f"calm-{i}")
    worker = q.worker(concurrency=4, poll_interval=0.05)
    async with running(worker):
        await eventually(lambda: len(ran) == 6, what="one job of every key")
        await anyio.sleep(0.3)  # give a wrong second start of "busy" the time to show
    assert sorted(ran) == ["busy", *(f"calm-{i}" for i in range(5))]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 2


async def test_many_keys_at_their_rate_do_not_hide_a_fresh_key(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """Two hundred keys at their rate, each with a job ready, sorted before a key with room: the
    claim passes them over and takes that key's job, with no poll in a minute."""
    ran: list[str] = []

    @q.task(queue="api")
    async def call(key: str) -> None:
        ran.append(key)

    await q.set_key_limits("api", rate=(1, 3600.0))
    held = [f"k{i:03d}" for i in range(200)]
    # Every key but "later" started a job a moment ago, so is at its rate.
    await db.execute("INSERT INTO aioqueue.key_starts SELECT 'api', k, aioqueue.now() FROM unnest($1::text[]) AS k",
                     held)
    jobs = [{"task": "call", "queue": "api", "args": {"key": k}, "partition_key": k} for k in [*held, "later"]]
    await db.execute("SELECT count(*) FROM aioqueue.add_jobs($1::jsonb)", json.dumps(jobs))
    async with running(q.worker(concurrency=4, poll_interval=60)):
        await eventually(lambda: "later" in ran, timeout=30, what="the key with room, well before a poll")
        await anyio.sleep(0.2)  # give a wrong start of a held key the time to show
    assert ran == ["later"]


async def test_held_back_jobs_start_when_the_window_opens_not_at_a_poll(dsn: str) -> None:
    """Two workers in two Queue instances, polling once a minute: a key's next job starts when
    its window opens, on whichever worker."""
    claims: Claims | None = None
    async with aioqueue.Queue(dsn) as a, aioqueue.Queue(dsn) as b:
        claims = Claims(a)
        for queue in (a, b):

            @queue.task(name="call", queue="api")
            async def call(key: str) -> None:
                assert claims is not None
                await claims.record(key)

        await a.set_key_limits("api", rate=(1, 0.5))
        await a.tasks["call"].options(partition_key="acme").enqueue_many([{"key": "acme"}] * 4)
        async with running(a.worker(poll_interval=60)), running(b.worker(poll_interval=60)):
            await eventually(lambda: claims.count() == 4, timeout=20, what="4 jobs, well before a poll")
    at = sorted(claims.at["acme"])
    assert all(later - earlier >= SECOND / 2 for earlier, later in itertools.pairwise(at)), at
    assert at[-1] - at[0] < 3 * SECOND  # each began near its window's opening, not a poll later


async def test_a_wake_up_counts_from_the_claims_database_time(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """A worker's limited claim tells its database time (claim_timed); next_wakeup compares the
    key-rate wake-up and the due times against it exactly: one that passed a millisecond before
    the claim started is the claim's (no second look), one a millisecond after is a look now."""
    queries = for_schema("aioqueue")

    @q.task(name="call", queue="api")
    async def call(key: str) -> None: ...

    await q.set_key_limits("api", rate=(1, 60.0))
    await q.tasks["call"].options(partition_key="acme").enqueue_many([{"key": "acme"}] * 2)
    row = await db.fetchrow(queries.claim_timed, ["api"], [5], "w", 60.0, 5, "off")
    assert row is not None and len(row["id"]) == 1  # one job (the key's rate), and the time
    claimed_at = from_epoch(row["claimed_at"])  # as the producer reads it
    assert claimed_at == await db.fetchval("SELECT locked_at FROM aioqueue.jobs WHERE id = $1", row["id"][0])
    ms = datetime.timedelta(milliseconds=1)

    async def wakeup(wake: datetime.datetime | None, due: datetime.datetime) -> float | None:
        await db.execute("UPDATE aioqueue.queues SET key_rate_wake = $1 WHERE name = 'api'", wake)
        await db.execute("UPDATE aioqueue.jobs SET run_at = $1 WHERE status = 'pending'", due)
        # `since` (the worker's own clock) says the claim ran an hour ago: the time wins.
        seconds: float | None = await db.fetchval(queries.next_wakeup, ["api"], 3600.0, claimed_at)
        return seconds

    assert await wakeup(claimed_at - ms, claimed_at) is None  # both passed when the claim ran
    assert (await wakeup(claimed_at + ms, claimed_at) or 0) < 0  # set after it and passed: look now
    assert (await wakeup(None, claimed_at + ms) or 0) < 0  # due after it: look now
    later = await wakeup(claimed_at + 30 * SECOND, claimed_at + 40 * SECOND)
    assert later is not None and 0 < later <= 30
    # Without the claim's time (an unlimited claim): `since` seconds ago, as before.
    assert await db.fetchval(queries.next_wakeup, ["api"], 0.0, None) == pytest.approx(later, abs=1)



async def test_a_claim_that_meets_another_on_the_queue_row_keeps_the_wake_up(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Two claims of one key-rate limited queue at once: one holds the queue's row and sets no
    wake-up (it took nothing; its snapshot saw the key under its rate), the other takes the key's
    job. The wake-up the second one sets, when the key's window opens again, is not lost: it waits
    for the row instead of passing over it, and sets it once the first has committed."""
    queries = for_schema("aioqueue")

    @q.task(name="call", queue="api")
    async def call(key: str) -> None: ...

    await q.set_key_limits("api", rate=(1, 60.0))
    await q.tasks["call"].options(partition_key="acme").enqueue_many([{"key": "acme"}] * 2)
    other = await asyncpg.connect(dsn)
    try:
        holder = other.transaction()
        await holder.start()
        # What the first claim leaves: the row locked, the wake-up cleared, until it commits.
        await other.execute("UPDATE aioqueue.queues SET key_rate_wake = NULL WHERE name = 'api'")
        claiming = await db.fetchval("SELECT pg_backend_pid()")

        async def waiting_or_done() -> bool:
            return claim.done() or bool(await other.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", claiming))

        claim = asyncio.ensure_future(db.fetchrow(queries.claim_timed, ["api"], [5], "w", 60.0, 5, "off"))
        await eventually(waiting_or_done, what="the claim to finish or wait for the queue's row")
        await holder.commit()
        row = await asyncio.wait_for(claim, 10)
    finally:
        await other.close()
    assert row is not None
    [taken] = row["id"]
    started = await db.fetchval("SELECT locked_at FROM aioqueue.jobs WHERE id = $1", taken)
    wake = await db.fetchval("SELECT key_rate_wake FROM aioqueue.queues WHERE name = 'api'")
    assert wake == started + 60 * SECOND


def _key_limits(settings: dict[str, Any]) -> tuple[Any, ...]:
    return (settings["key_concurrency_limit"], settings["key_rate_limit"], settings["key_rate_period"])


async def test_settings_show_and_clear_and_old_starts_are_pruned(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task(queue="api")
    async def call() -> None:
        pass

    await q.set_key_limits("api", concurrency=2, rate=(10, 60.0))
    [settings] = await q.queue_settings()
    assert _key_limits(settings) == (2, 10, 60.0)
    clock = Clock(q, any_schema=True)
    await clock.freeze()
    await call.options(partition_key="acme").enqueue_many([{}] * 3)
    await q.worker().run_until_empty()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.key_starts") == 3
    maintenance = Maintenance(q.database, reap_interval=60, archive_retention=None, prune_batch=2)
    # Inside the window the starts stay; once out of it, the upkeep deletes them, a batch a time.
    await clock.advance(59.9)
    assert await maintenance.prune_key_starts() == 0
    await clock.advance(0.1)
    assert await maintenance.prune_key_starts() == 3
    assert await db.fetchval("SELECT count(*) FROM aioqueue.key_starts") == 0
    # A queue whose key rate is cleared keeps no starts.
    await call.options(partition_key="acme").enqueue_many([{}] * 2)
    await q.set_key_limits("api", rate=(10, 3600.0))
    await q.worker().run_until_empty()
    await q.set_key_limits("api", concurrency=2)
    assert await maintenance.prune_key_starts() == 2
    [settings] = await q.queue_settings()
    assert _key_limits(settings) == (2, None, None)


@pytest.mark.parametrize(
    ("rate", "message"),
    [
        ((-1, 1.0), "per-key rate count must be an int from 0 to 100000"),
        ((10**6, 1.0), "per-key rate count must be an int from 0 to 100000"),
        ((1.5, 1.0), "per-key rate count must be"),
        ((True, 1.0), "per-key rate count must be"),
        ((math.nan, 1.0), "per-key rate count must be"),
        ((5, 0), "per-key rate period"),
        ((5, -1.0), "per-key rate period"),
        ((5, math.nan), "per-key rate period"),
        ((5, math.inf), "per-key rate period"),
        ((5, 10**12), "per-key rate period"),
        ((5, "1s"), "per-key rate period"),
        ("5/s", r"per-key rate must be a pair \(count, seconds\)"),
        (5, r"per-key rate must be a pair \(count, seconds\)"),
        ((5, 1.0, 2), r"per-key rate must be a pair \(count, seconds\)"),
    ],
)
async def test_bad_key_rates_are_refused_and_nothing_is_written(
    q: aioqueue.Queue, db: asyncpg.Connection, rate: Any, message: str
) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.set_key_limits("api", rate=rate)
    with pytest.raises(aioqueue.ConfigurationError, match=message):
        await q.set_key_limits("api", concurrency=1, rate=rate, fair=True)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.queues") == 0
    # The database refuses them too, whoever writes the row.
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("INSERT INTO aioqueue.queues (name, key_rate_limit, key_rate_period) VALUES ('api', 5, 0)")
    with pytest.raises(asyncpg.CheckViolationError):
        await db.execute("INSERT INTO aioqueue.queues (name, key_rate_limit) VALUES ('api', 5)")
    await q.set_key_limits("api", rate=(5, 1))  # the control: an int period is seconds too
    assert [(s["key_rate_limit"], s["key_rate_period"]) for s in await q.queue_settings()] == [(5, 1.0)]


async def test_the_command_sets_shows_and_refuses_key_limits(q: aioqueue.Queue, dsn: str) -> None:
    status, out, err = await aioqueue_cli("key-limits", "sync", "--concurrency", "1", "--rate", "2/0.5", dsn=dsn)
    assert status == 0, err
    assert out.strip() == "queue 'sync': keys in turn; per key at most 1 running and at most 2 started in any 0.5s"
    [settings] = await q.queue_settings()
    assert _key_limits(settings) == (1, 2, 0.5)
    status, out, err = await aioqueue_cli("key-limits", "sync", "--json", dsn=dsn)
    assert status == 0, err
    assert json.loads(out) == {"queue": "sync", "key_concurrency_limit": 1, "key_rate_limit": 2,
                               "key_rate_period": 0.5, "fair": False, "keys_in_turn": True}
    status, out, err = await aioqueue_cli("status", dsn=dsn)
    assert status == 0, err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("QUEUE  PAUSED"))
    assert lines[header].split("  ")[-1].strip() == "KEYS IN TURN"
    assert lines[header + 1].split() == ["sync", "no", "-", "-", "1", "2/0.5s", "yes"]
    for bad, message in [
        (["--rate", "2/0"], "per-key rate period"),
        (["--rate", "2/nan"], "per-key rate period"),
        (["--rate=-1/1"], "per-key rate count must be an int from 0 to 100000"),
        (["--rate", "1000000/1"], "per-key rate count must be an int from 0 to 100000"),
        (["--rate", "two"], "write a rate as COUNT/SECONDS"),
        (["--concurrency", "-1"], "per-key concurrency must be"),
        (["--clear", "--fair"], "give it alone"),
    ]:
        status, _out, err = await aioqueue_cli("key-limits", "sync", *bad, dsn=dsn)
        assert status == 2, (bad, status, err)
        assert message in err and "Traceback" not in err, (bad, err)
    [settings] = await q.queue_settings()
    assert _key_limits(settings) == (1, 2, 0.5)  # nothing written
    status, out, err = await aioqueue_cli("key-limits", "sync", "--clear", dsn=dsn)
    assert status == 0, err
    assert out.strip() == "queue 'sync': no per-key settings (first in, first out)"
    [settings] = await q.queue_settings()
    assert _key_limits(settings) == (None, None, None) and not settings["fair"]
