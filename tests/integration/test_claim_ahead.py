"""The claim a burst sends before the last claim's jobs are handed over: it runs every job once,
never holds more than any claim may, and its jobs are run or given back whatever ends the worker
(a stop, a failed statement, rows no handler can be called for)."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._claim_connection import ClaimConnection


def _count_ahead(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the limit of every claim sent ahead, in order."""
    sent: list[int] = []
    send_ahead = ClaimConnection.send_ahead

    def recorded(self: ClaimConnection, sql: str, args: tuple[Any, ...], limit: int, marks: Any) -> None:
        sent.append(limit)
        send_ahead(self, sql, args, limit, marks)

    monkeypatch.setattr(ClaimConnection, "send_ahead", recorded)
    return sent


async def test_a_burst_claims_while_it_hands_over_and_runs_each_job_once(
    q: aioqueue.Queue, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _count_ahead(monkeypatch)
    ran: list[int] = []

    @q.task
    async def io(n: int) -> None:
        ran.append(n)
        await anyio.sleep(0.01)

    await io.enqueue_many([{"n": i} for i in range(5000)])
    worker = q.worker(concurrency=1000)
    with anyio.fail_after(60):
        assert (await worker.run_until_empty()).succeeded == 5000
    assert len(sent) >= 2, sent  # the burst's claims went out ahead of their hand-overs
    assert max(sent) <= 1000  # each no larger than any claim of the worker
    assert sorted(ran) == list(range(5000))
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0  # all archived, once each


async def test_long_jobs_are_never_claimed_ahead(q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _count_ahead(monkeypatch)
    # No prefetch buffer: with the default one, a machine loaded enough to make a claim take a
    # good part of 0.5 s makes such jobs worth buffering (test_prefetch.py), and the room that
    # buffer grows between two claims is room a claim ahead may take.
    worker = q.worker(concurrency=4, prefetch=0)
    held: list[int] = []

    @q.task
    async def slow(n: int) -> None:
        held.append(worker.active)
        await anyio.sleep(0.5)

    await slow.enqueue_many([{"n": i} for i in range(12)])
    with anyio.fail_after(60):
        assert (await worker.run_until_empty()).succeeded == 12
    assert sent == []  # a claim that filled the slots left no room to claim ahead
    assert max(held) <= 4


async def test_stopping_with_a_claim_in_flight_gives_its_jobs_back(
    q: aioqueue.Queue, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight = anyio.Event()
    worker = q.worker(concurrency=1000, poll_interval=5.0)
    send_ahead = ClaimConnection.send_ahead

    def stop_then_send(self: ClaimConnection, *args: Any) -> None:
        if not in_flight.is_set():
            in_flight.set()
            worker.stop()  # stopped before the claim goes out: its jobs still come back
        send_ahead(self, *args)

    monkeypatch.setattr(ClaimConnection, "send_ahead", stop_then_send)

    @q.task
    async def io(n: int) -> None:
        await anyio.sleep(0.01)

    await io.enqueue_many([{"n": i} for i in range(20000)])
    allowed = await db.fetchval("SELECT max_attempts FROM aioqueue.jobs LIMIT 1")
    with anyio.fail_after(60):
        await worker.run()
    assert in_flight.is_set()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status <> 'pending'") == 0
    # Given back without spending an attempt (attempts never go down: max_attempts goes up).
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE max_attempts - attempts <> $1", allowed) == 0
    done = await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done")
    assert done + await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 20000


async def test_a_failed_claim_sent_ahead_is_made_again(
    q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import aioqueue._claim_connection as claim_connection

    failed: list[int] = []
    fetch = claim_connection._fetch

    async def failing(conn: Any, sql: str, args: tuple[Any, ...]) -> tuple[asyncpg.Record, float]:
        if not failed:  # the first one fails before it reaches the server
            failed.append(1)
            raise ConnectionResetError("the connection dropped")
        return await fetch(conn, sql, args)

    monkeypatch.setattr(claim_connection, "_fetch", failing)

    @q.task
    async def io(n: int) -> None:
        await anyio.sleep(0.01)

    await io.enqueue_many([{"n": i} for i in range(5000)])
    with anyio.fail_after(60):
        assert (await q.worker(concurrency=1000).run_until_empty()).succeeded == 5000
    assert failed
    assert any("claiming jobs failed (ConnectionResetError" in r.getMessage() for r in caplog.records)


async def test_rows_no_handler_can_take_are_buried_while_a_claim_is_in_flight(
    q: aioqueue.Queue, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _count_ahead(monkeypatch)

    @q.task
    async def io(n: int) -> None:
        await anyio.sleep(0.01)

    await io.enqueue_many([{"n": i} for i in range(5000)])
    # Arguments that are not an object, in every claim of the burst.
    await db.execute("UPDATE aioqueue.jobs SET args = '[1, 2]' WHERE id % 500 = 0")
    with anyio.fail_after(60):
        stats = await q.worker(concurrency=1000).run_until_empty()
    assert stats.succeeded == 4990
    assert sent
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'dead'") == 10
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status <> 'dead'") == 0
