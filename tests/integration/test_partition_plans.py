"""Guard the keyed claim (claim_keyed, migrations 0018, 0020) and the busiest-keys view with 100,000
distinct keys pending: every statement they run reads an index, never the table, and the rows
they read follow the jobs claimed (the keys counted), not the keys or jobs waiting, in the
table states that mislead the planner (fresh statistics, statistics taken before the burst,
statistics taken while one key flooded the queue, and again once it had drained, dead entries
left by a fast drain, a deep history of dead and archived jobs).

Plans and row counts only, never timings: speed is the benchmark's business.
"""

from __future__ import annotations

import asyncpg
import pytest

from aioqueue import _keys as keys
from aioqueue._queries import for_schema
from aioqueue._statements import int_array
from tests.support.plans import explain, explain_nested, indexes, nodes, scans

Q = for_schema("aioqueue")
KEYS = 100_000
#: The partition indexes, the primary key, and the ready index (jobs without a key, from a
#: bounded window of its head), and the index of one key's recorded starts (per-key rate limits).
ALLOWED = {
    "jobs_partition_ready_idx", "jobs_partition_running_idx", "jobs_pkey", "jobs_ready_idx", "key_starts_key_idx",
}


async def keyed_backlog(db: asyncpg.Connection, state: str) -> None:
    """One job for each of 100,000 keys, and a flood of 50,000 for one more key, in front."""
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, partition_key) "
        "SELECT 'tenants', 'noop', 'flood' FROM generate_series(1, 50000)")
    if state == "flooded":
        await db.execute("ANALYZE aioqueue.jobs")  # statistics that know one key
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, partition_key) "
        "SELECT 'tenants', 'noop', 'key-' || g FROM generate_series(1, $1) AS g", KEYS)


async def keyed_claim(db: asyncpg.Connection, n: int) -> list[asyncpg.Record]:
    async with db.transaction():
        await db.execute(Q.lock_queues, ["tenants"])
        return await db.fetch(Q.claim, ["tenants"], [n], "plan-test", 300.0, n, "off")


async def drain(db: asyncpg.Connection, jobs: int, batch: int = 500) -> None:
    done = 0
    while done < jobs:
        rows = await keyed_claim(db, batch)
        assert rows
        await db.execute(Q.complete, int_array([r["id"] for r in rows]), int_array([r["attempts"] for r in rows]),
                         [None] * len(rows), "plan-test", "plan-test", "off")
        done += len(rows)


async def table_in(db: asyncpg.Connection, state: str, fair: bool = False) -> None:
    """The keyed backlog in queue 'tenants' (one job per key running at most, or ``fair``: keys in
    turn without a limit), in ``state``."""
    await db.execute("ALTER TABLE aioqueue.jobs SET (autovacuum_enabled = false)")
    await db.execute("INSERT INTO aioqueue.queues (name, key_concurrency_limit, fair) VALUES ('tenants', $1, $2)",
                     None if fair else 1, fair)
    if state == "stale":
        await db.execute("ANALYZE aioqueue.jobs")  # statistics of the empty table
    if state == "history":
        await db.execute(
            "INSERT INTO aioqueue.jobs (queue, task, status, attempts, partition_key) "
            "SELECT 'tenants', 'noop', 'dead', 5, 'key-' || g FROM generate_series(1, 20000) AS g")
        await db.execute(
            "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at) "
            "SELECT -g, 'tenants', 'noop', '{}', 'succeeded', 0, 1, now() FROM generate_series(1, 100000) AS g")
    if state == "emptied":
        # A flood came and went before the backlog: statistics taken while it was pending, and
        # again once its jobs were done, before a VACUUM freed its pages. The last count no live
        # row on those pages (and, sampling none, keep the columns' statistics): the planner
        # then counts no row on any page, however many jobs arrive after, and prices a scan of
        # the queue's pending jobs at one row (without column statistics, the defaults still
        # chose the keyed index).
        await db.execute(
            "INSERT INTO aioqueue.jobs (queue, task, partition_key) "
            "SELECT 'tenants', 'noop', 'flood' FROM generate_series(1, 50000)")
        await db.execute("ANALYZE aioqueue.jobs")
        await db.execute("DELETE FROM aioqueue.jobs")  # as its jobs' outcomes delete them
        await db.execute("ANALYZE aioqueue.jobs")
    await keyed_backlog(db, state)
    if state in ("analysed", "history"):
        await db.execute("ANALYZE aioqueue.jobs")
    if state == "drained":
        await drain(db, 20_000)  # dead entries in the keyed index, behind the cursor
        await db.execute("UPDATE aioqueue.queues SET key_cursor = NULL")  # the walk starts over them


@pytest.mark.parametrize("fair", [False, True], ids=["limit-1", "fair"])
@pytest.mark.parametrize("state", ["analysed", "stale", "flooded", "emptied", "drained", "history"])
async def test_the_keyed_claim_reads_indexes_and_rows_bounded_by_its_batch(
    db: asyncpg.Connection, state: str, fair: bool
) -> None:
    """Under a per-key limit of 1, and in a fair queue without limits."""
    await table_in(db, state, fair)
    # Under the limit, half the batch's keys are at it: the flood's running job holds its key.
    await keyed_claim(db, 1)
    ran = await explain_nested(db, Q.claim, ["tenants"], [10], "plan-test", 300.0, 10, "off")
    read = [s for plan in ran for s in scans(plan, executed=True) if s.relation == "jobs"]
    assert read, [p.get("Query Text") for p in ran]
    used = {node["Index Name"] for plan in ran for node in nodes(plan)
            if "Index Name" in node and node.get("Actual Loops", 0) > 0 and node["Index Name"] != "queues_pkey"}
    assert used <= ALLOWED, [(p.get("Query Text"), indexes(p)) for p in ran if indexes(p) - ALLOWED]
    assert all(s.node_type != "Seq Scan" for s in read), read
    # Rows a scan read and filtered out count too: a key's turn that walks another index and
    # filters the key out returns few rows but reads the queue.
    rows_read = sum(
        (int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0)))
        * int(node.get("Actual Loops", 1))
        for plan in ran for node in nodes(plan)
        if node.get("Relation Name") == "jobs" and node["Node Type"] != "ModifyTable"
    )
    # Ten jobs claimed: a few probes each (the next key, its running count, its oldest job) and
    # the bounded window for jobs without a key; never a walk over 100,000 keys.
    assert rows_read < 2_000, rows_read
    assert len(await keyed_claim(db, 10)) == 10


@pytest.mark.parametrize("state", ["analysed", "stale", "drained", "history"])
async def test_the_busiest_keys_read_indexes_and_rows_bounded_by_the_candidates(
    db: asyncpg.Connection, state: str
) -> None:
    """Queue.busiest_keys with 100,000 keys pending: the running index, the newest jobs of the
    primary key, the head of the ready index, and a bounded range of the keyed index per
    candidate key; never every key. The flood is found in every state, statistics or none."""
    await table_in(db, state)
    await keyed_claim(db, 1)  # the flood's key comes first in byte order: one of its jobs runs
    limit, bound = 10, 1000
    params = ("tenants", limit, bound, keys.RECENT_JOBS, keys.CANDIDATES_PER_KEY * limit)
    async with db.transaction():
        await db.execute(Q.index_reads_only)  # as Queue.busiest_keys runs it
        plan = await explain(db, Q.busiest_keys, *params, analyze=True)
    read = [s for s in scans(plan, executed=True) if s.relation == "jobs"]
    assert read and all(s.node_type != "Seq Scan" for s in read), read
    used = {s.index_name for s in read}
    assert used <= ALLOWED, [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows"), n.get("Actual Loops"))
                             for n in nodes(plan) if n.get("Relation Name") == "jobs" or "Index Name" in n]
    rows_read = sum(
        (int(n.get("Actual Rows", 0)) + int(n.get("Rows Removed by Filter", 0))) * int(n.get("Actual Loops", 1))
        for n in nodes(plan) if n.get("Relation Name") == "jobs"
    )
    # The newest jobs, the first ready ones, and at most `bound` entries per candidate key (here
    # the flood's, and one or two for each other key): never the 100,000 keys or the flood's
    # 50,000 jobs.
    assert rows_read <= 2 * keys.RECENT_JOBS + 3 * bound, rows_read
    top = await db.fetch(Q.busiest_keys, *params)
    # The flood first (one of its jobs runs), counted up to the bound.
    assert dict(top[0]) == {"key": "flood", "running": 1, "pending": bound, "ready": bound}
    assert len(top) == limit and all(r["running"] + r["pending"] >= 1 for r in top)
