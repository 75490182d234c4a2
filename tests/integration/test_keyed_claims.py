"""Claims under a per-key limit, as a worker makes them: each takes the queue's turn, which every
worker's keyed claim waits for, so a worker makes none too small for it and keeps the connection
whose plans are made."""

from __future__ import annotations

import collections
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aioqueue
from aioqueue._producer import Producer


async def test_under_a_per_key_limit_a_worker_claims_no_small_refills_on_one_connection(
    q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await q.set_key_limits("default", concurrency=1)
    claims: list[tuple[int, int, int]] = []  # (jobs asked for, handlers running, server pid)
    claim = Producer.claim

    async def recorded(self: Producer, limit: int, *args: Any, **kwargs: Any) -> Any:
        conn = args[2] if len(args) > 2 else kwargs.get("conn")
        claims.append((limit, self.claims.active, conn.get_server_pid() if conn is not None else 0))
        return await claim(self, limit, *args, **kwargs)

    monkeypatch.setattr(Producer, "claim", recorded)

    @q.task(name="keyed_quick")
    async def quick(n: int) -> None:
        await anyio.lowlevel.checkpoint()

    async def drained() -> tuple[list[tuple[int, int, int]], int]:
        """One worker's drain of 3,000 jobs of 500 keys: its claims, and how many ran on the
        connection it claimed on most."""
        claims.clear()
        async with q.connection() as conn:
            await conn.execute(
                "INSERT INTO aioqueue.jobs (queue, task, args, partition_key) "
                "SELECT 'default', $1, jsonb_build_object('n', g), 'key-' || (g % 500) "
                "FROM generate_series(1, $2) AS g", "keyed_quick", 3000)
        with anyio.fail_after(60):
            assert (await q.worker(concurrency=10).run_until_empty()).succeeded == 3000
        return list(claims), collections.Counter(c[2] for c in claims).most_common(1)[0][1]

    # While handlers ran, no claim asked for fewer jobs than the slots (before: the slots that
    # had freed so far, 4 of 10 at the second claim), and the claims ran on one connection
    # (before: the pool lent the one given back while the producer waited to the completer,
    # and the next claim went to a connection that had never planned one: 9 to 14 claims of 44
    # to 66 on a second one, in every drain). A connection is kept only while the jobs are
    # quicker than a claim, as the worker measures both: on a loaded machine (the whole suite
    # at once, or CI running two suites) a handler's time, which counts its wait for the busy
    # event loop, can pass a round trip's for a while, and a few claims then go to another
    # connection (7 of 39 once): one drain more is allowed to show it.
    for last in (False, True):
        made, most = await drained()
        assert not [c for c in made if c[1] and c[0] < 10], made
        if most >= len(made) - 2 or last:
            break
    assert most >= len(made) - 2, made
