"""Guard the plans of the hot statements: the claim reads pending jobs through
``jobs_ready_idx`` and never scans the table, and the finishing writes find their rows by
primary key, in the states that have misled the planner before: fresh statistics, statistics
taken before a burst (autovacuum has not analysed yet), dead index entries left at the head of
the ready index by a fast drain, a deep history of archived and dead jobs; and the generic plan
a prepared statement may switch to after a few executions.

Plans only, never timings: speed is the benchmark's business.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from aioqueue._queries import for_schema
from aioqueue._statements import int_array
from tests.support.plans import explain, explain_generic, explain_nested, function_query, nodes, scans

Q = for_schema("aioqueue")
CLAIM_ARGS: tuple[Any, ...] = (["default"], [10], "plan-test", 300.0, 10)
CLAIM_PARAMS = "text[], int[], text, float8, int"
CLAIM_VALUES = "'{default}', '{10}', 'plan-test', 300, 10"
COMPLETE_PARAMS = "text, text, text[], text, text, text"  # claims as array literals: see int_array
FAIL_PARAMS = "text, text, text[], float8[], bool[], " + "float8[], " * 4 + "text, text, text, text"


def assert_claim_reads_ready_index(plan: dict[str, Any]) -> None:
    """The claim picks its rows through the ready index and finds them again for its UPDATE by
    their addresses (a TID scan): never a scan of the table, no descent of the primary key per
    row."""
    on_jobs = [(kind, index) for kind, index, rel in scans(plan) if rel == "jobs"]
    assert ("Index Scan", "jobs_ready_idx") in on_jobs, on_jobs
    assert ("Tid Scan", None) in on_jobs, on_jobs
    assert all(index != "jobs_pkey" for _, index in on_jobs), on_jobs
    assert all(kind != "Seq Scan" for kind, _ in on_jobs), on_jobs
    assert all(index != "jobs_dead_idx" for _, index in on_jobs), on_jobs
    assert not [s for s in scans(plan) if s[2].startswith("jobs_done")], "the claim must not read the archive"


async def claim_query(db: asyncpg.Connection) -> str:
    """The query both claims run, inside the function claim_jobs, as installed."""
    return await function_query(db, "aioqueue.claim_jobs")


async def assert_claim_plans_read_ready_index(db: asyncpg.Connection) -> None:
    """The claim's query reads the ready index in its generic plan (the one claim_jobs keeps)
    and in the custom plan of these values."""
    sql = await claim_query(db)
    assert_claim_reads_ready_index(await explain_generic(db, sql, CLAIM_PARAMS, CLAIM_VALUES))
    assert_claim_reads_ready_index(await explain(db, sql, *CLAIM_ARGS))


def assert_found_by_primary_key(plan: dict[str, Any]) -> None:
    """The rows are looked up by primary key: never a loop over jobs_lease_idx, never a scan
    of the whole table (hashed against a large batch, it looks cheap to the planner; in a
    table swollen with dead rows it took over 10 s)."""
    on_jobs = [(kind, index) for kind, index, rel in scans(plan) if rel == "jobs"]
    assert on_jobs, plan
    assert all(index == "jobs_pkey" for _, index in on_jobs), on_jobs


async def pending(db: asyncpg.Connection, n: int) -> None:
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args) "
        "SELECT 'default', 'noop', '{}' FROM generate_series(1, $1)",
        n,
    )


async def drain(db: asyncpg.Connection, batch: int = 500) -> int:
    """Claim and complete every ready job with the library's statements, as a fast worker does."""
    done = 0
    while rows := await db.fetch(Q.claim, ["default"], [batch], "plan-test", 300.0, batch, "off"):
        await db.execute(Q.complete, int_array([r["id"] for r in rows]), int_array([r["attempts"] for r in rows]),
                         [None] * len(rows), "plan-test", "plan-test", "off")
        done += len(rows)
    return done


async def claimed_ids(db: asyncpg.Connection, n: int) -> tuple[list[int], list[int]]:
    rows = await db.fetch(Q.claim, ["default"], [n], "plan-test", 300.0, n, "off")
    return [r["id"] for r in rows], [r["attempts"] for r in rows]


async def no_autovacuum(db: asyncpg.Connection) -> None:
    """Keep the statistics as the test leaves them (autovacuum would analyse mid-test)."""
    await db.execute("ALTER TABLE aioqueue.jobs SET (autovacuum_enabled = false)")


async def test_claim_uses_ready_index_with_fresh_statistics(db: asyncpg.Connection) -> None:
    await pending(db, 20_000)
    await db.execute("ANALYZE aioqueue.jobs")
    await assert_claim_plans_read_ready_index(db)


async def test_claim_uses_ready_index_when_statistics_predate_a_burst(db: asyncpg.Connection) -> None:
    await no_autovacuum(db)
    await db.execute("ANALYZE aioqueue.jobs")  # statistics of the empty table
    await pending(db, 50_000)  # the burst, before any ANALYZE
    await assert_claim_plans_read_ready_index(db)
    big_claim = await explain(db, await claim_query(db), ["default"], [1000], "plan-test", 300.0, 1000)
    assert_claim_reads_ready_index(big_claim)


async def test_claim_uses_ready_index_after_a_fast_drain(db: asyncpg.Connection) -> None:
    await no_autovacuum(db)
    await pending(db, 20_000)
    await db.execute("ANALYZE aioqueue.jobs")
    assert await drain(db) == 20_000  # leaves 20,000 dead entries at the head of the ready index
    await pending(db, 20_000)
    await assert_claim_plans_read_ready_index(db)
    assert await drain(db) == 20_000  # and the claim still takes every job, none twice


@pytest.mark.parametrize("before", ["never analysed", "analysed with few jobs"])
async def test_the_claims_kept_plan_from_a_quiet_table_finds_a_burst_by_address(
    db: asyncpg.Connection, before: str
) -> None:
    # An idle worker's connection plans the claim while the table holds a few jobs and keeps the
    # plan through the burst that follows, until an ANALYZE. Made on a nearly empty table, it
    # found the claimed rows for the UPDATE by a scan of the whole table, each row tested
    # against every id picked: 750 ms for a claim of 1,000 of a burst of 200,000 (7.5 ms by key;
    # now by the locked rows' addresses).
    await no_autovacuum(db)
    await pending(db, 100)
    if before != "never analysed":
        await db.execute("ANALYZE aioqueue.jobs")
    assert await drain(db, batch=10) == 100  # the plan is made and kept here
    await pending(db, 20_000)  # the burst, before any ANALYZE
    ran = await explain_nested(db, Q.claim_unlimited, ["default"], [1000], "plan-test", 300.0, 1000, "off")
    claims = [p for p in ran if any(s.index_name == "jobs_ready_idx" for s in scans(p))]
    assert len(claims) == 1, [p.get("Query Text") for p in ran]
    assert_claim_reads_ready_index(claims[0])
    assert claims[0]["Plan"]["Actual Rows"] == 1000


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "stale"])
async def test_claim_uses_ready_index_with_a_deep_history(db: asyncpg.Connection, analyze: bool) -> None:
    await no_autovacuum(db)
    if not analyze:
        await db.execute("ANALYZE aioqueue.jobs")
        await db.execute("ANALYZE aioqueue.jobs_done")
    await db.execute(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, created_at) "
        "SELECT g, 'default', 'noop', '{}', 'succeeded', 0, 1, now() FROM generate_series(1, 200000) AS g"
    )
    await db.execute(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, attempts, last_error) "
        "SELECT 'default', 'noop', '{}', 'dead', 5, 'boom' FROM generate_series(1, 20000)"
    )
    await pending(db, 100)
    if analyze:
        await db.execute("ANALYZE aioqueue.jobs")
        await db.execute("ANALYZE aioqueue.jobs_done")
    await assert_claim_plans_read_ready_index(db)


@pytest.mark.parametrize("batch", [10, 1000, 5000])
async def test_finishing_writes_find_rows_by_primary_key_with_stale_statistics(
    db: asyncpg.Connection, batch: int
) -> None:
    # Statistics taken while nothing ran make jobs_lease_idx (running rows only) look empty;
    # a nested loop over it for every finished job is quadratic in the batch. And a batch of
    # thousands, counted by the planner, makes one scan of the table look cheaper than as many
    # lookups by primary key.
    await no_autovacuum(db)
    await pending(db, 50_000)
    await db.execute("ANALYZE aioqueue.jobs")
    ids, attempts = await claimed_ids(db, batch)
    assert len(ids) == batch
    claims = int_array(ids), int_array(attempts)
    for sql, args in [
        (Q.complete, (*claims, [None] * batch, "plan-test", "plan-test", "off")),
        (Q.extend_leases, (*claims, 300.0)),
        (Q.reschedule, (*claims, [0.0] * batch, [None] * batch, "plan-test", "plan-test", "off")),
        (Q.cancel_requests, claims),
        (Q.finish_cancelled, (*claims, "plan-test", "plan-test", "off")),
    ]:
        assert_found_by_primary_key(await explain(db, sql, *args))
    generic = await explain_generic(db, Q.complete, COMPLETE_PARAMS, "'{1,2}', '{1,1}', '{NULL,NULL}', 'c', 'c', 'off'")
    assert_found_by_primary_key(generic)


def finishing_statements(ids: list[int], attempts: list[int]) -> list[tuple[str, str, str]]:
    """The finishing statements and the heartbeat over these claims, as (sql, parameter types,
    values as SQL literals) for explain_generic."""
    def each(value: str) -> str:
        return f"'{{{','.join([value] * len(ids))}}}'"

    claims = f"'{{{','.join(map(str, ids))}}}', '{{{','.join(map(str, attempts))}}}'"
    backoff = ", ".join(each(v) for v in ("1.0", "2.0", "60.0", "0.1"))
    return [
        (Q.complete, COMPLETE_PARAMS, f"{claims}, {each('NULL')}, 'c', 'c', 'off'"),
        (Q.extend_leases, "text, text, float8", f"{claims}, 300"),
        (Q.fail, FAIL_PARAMS,
         f"{claims}, {each('e')}, {each('NULL')}, {each('false')}, {backoff}, 'c', 'c', 'c', 'off'"),
        (Q.reschedule, "text, text, float8[], text[], text, text, text",
         f"{claims}, {each('0')}, {each('NULL')}, 'c', 'c', 'off'"),
        (Q.finish_cancelled, "text, text, text, text, text", f"{claims}, 'c', 'c', 'off'"),
        (Q.cancel_requests, "text, text", claims),
    ]


def written(sql: str, plan: dict[str, Any]) -> int:
    """Rows a finishing statement wrote, as its UPDATE or DELETE returned them; for the
    heartbeat and the cancel check (no RETURNING there), the claims they report."""
    if sql in (Q.extend_leases, Q.cancel_requests):
        return int(plan["Plan"]["Actual Rows"])
    return sum(
        n["Actual Rows"] for n in nodes(plan)
        if n["Node Type"] == "ModifyTable" and n["Operation"] in ("Update", "Delete")
    )


def work(plan: dict[str, Any]) -> int:
    """Rows produced or filtered out by every node of an analysed plan, over all its loops: the
    statement's work, linear in the batch when each row is found by primary key."""
    return sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Join Filter", 0))
        * n.get("Actual Loops", 1)
        for n in nodes(plan)
    )


async def test_outcomes_and_heartbeat_stay_linear_when_statistics_saw_a_nearly_empty_table(
    db: asyncpg.Connection,
) -> None:
    # The soak's stall: autovacuum analysed the jobs table when it held a hundred rows spread
    # over thousands of pages, beside indexes swollen by millions of jobs before (fillfactor 10
    # makes them so with fewer rows here); then 10,000 jobs ran. One index lookup then looks
    # dearer than reading the whole table, and the table looks one row long: planned as joins,
    # the outcome write and the heartbeat scanned every row and looped over the whole batch for
    # each (10 million rows for 1,000 outcomes, 1-5 s; leases expired meanwhile).
    await no_autovacuum(db)
    for index in ("jobs_pkey", "jobs_ready_idx"):
        await db.execute(f"ALTER INDEX aioqueue.{index} SET (fillfactor = 10)")
        await db.execute(f"REINDEX INDEX aioqueue.{index}")
    await pending(db, 300_000)
    await db.execute("DELETE FROM aioqueue.jobs")
    await db.execute("VACUUM aioqueue.jobs")
    await pending(db, 200_000)
    await db.execute("DELETE FROM aioqueue.jobs WHERE id % 2000 <> 0")
    await db.execute("VACUUM ANALYZE aioqueue.jobs")  # 100 rows over 2,858 pages
    await pending(db, 10_000)
    ids, attempts = await claimed_ids(db, 5_000)
    ids, attempts = ids[:1000], attempts[:1000]
    for mode in ("force_custom_plan", "force_generic_plan"):
        for sql, types, values in finishing_statements(ids, attempts):
            ran = await explain_generic(db, sql, types, values, analyze=True, mode=mode)
            assert work(ran) <= 50 * 1000, (mode, sql[:40], work(ran))
            assert written(sql, ran) == (0 if sql is Q.cancel_requests else 1000), (mode, sql[:40])


async def test_a_large_complete_in_a_table_swollen_with_dead_rows_finds_rows_by_primary_key(
    db: asyncpg.Connection,
) -> None:
    # The soak's state: a table of many pages, nearly all dead rows, a few thousand running
    # jobs, statistics fresh; the completer writes 4,000 outcomes at once.
    await no_autovacuum(db)
    await pending(db, 200_000)
    await db.execute("DELETE FROM aioqueue.jobs WHERE id % 50 <> 0")
    await db.execute("ANALYZE aioqueue.jobs")
    ids, attempts = await claimed_ids(db, 4000)
    assert len(ids) == 4000
    claims = int_array(ids), int_array(attempts)
    plan = await explain(db, Q.complete, *claims, [None] * 4000, "plan-test", "plan-test", "off")
    assert_found_by_primary_key(plan)
    # And the work is linear in the batch, in the custom plan and in the generic one a prepared
    # statement may switch to after a few executions: rows produced or filtered out by every
    # node, over all its loops. (A join filter matching each job against the whole batch is
    # quadratic: 16 million rows here; it made the drain 8x slower.)
    for mode in ("force_custom_plan", "force_generic_plan"):
        for sql, types, values in finishing_statements(ids, attempts)[:4]:  # complete, heartbeat, fail, reschedule
            ran = await explain_generic(db, sql, types, values, analyze=True, mode=mode)
            assert work(ran) <= 50 * 4000, (mode, sql[:40], work(ran))
            assert written(sql, ran) == 4000, (mode, sql[:40])

    fail = await explain(
        db, Q.fail, *claims, ["e"] * 4000, [None] * 4000, [False] * 4000, [1.0] * 4000, [2.0] * 4000,
        [60.0] * 4000, [0.1] * 4000, "c", "c", "c", "off",
    )
    assert_found_by_primary_key(fail)


JIT_COSTS = ("jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost")


@pytest.mark.parametrize("statement", ["claim_unlimited", "claim"])
async def test_the_claim_runs_its_kept_plan_without_jit(db: asyncpg.Connection, statement: str) -> None:
    """What the claims run inside claim_jobs, as auto_explain saw it: the ready index, with JIT
    off even where the session would compile every statement (a claim's estimate with a deep
    backlog is over jit_above_cost; compiling took milliseconds at every execution), in a burst
    that stale statistics do not know of, after a fast drain and analysed."""
    await no_autovacuum(db)
    await db.execute("ANALYZE aioqueue.jobs")  # statistics of the empty table
    sql = getattr(Q, statement)
    args = (["default"], [10], "plan-test", 300.0, 10, "off")
    await pending(db, 50_000)  # a burst before any ANALYZE
    for state in ("burst", "drained", "analysed"):
        if state == "drained":
            assert await drain(db) == 50_000  # dead entries at the head of the ready index
            await pending(db, 20_000)
        elif state == "analysed":
            await db.execute("ANALYZE aioqueue.jobs")
        for setting in JIT_COSTS:  # the session compiles every statement...
            await db.execute(f"SET {setting} = 0")
        ran = await explain_nested(db, sql, *args)
        for setting in JIT_COSTS:
            await db.execute(f"RESET {setting}")
        claims = [p for p in ran if any(s.index_name == "jobs_ready_idx" for s in scans(p))]
        assert len(claims) == 1, (state, [p.get("Query Text") for p in ran])
        assert_claim_reads_ready_index(claims[0])
        assert "JIT" not in claims[0], (state, claims[0]["JIT"])
    # ...so the claim escapes it only by the function's own setting.
    if await db.fetchval("SELECT pg_jit_available()"):
        assert any("JIT" in p for p in ran), [p.get("Query Text") for p in ran]


async def test_complete_builds_its_claims_object_only_for_a_batch_of_mixed_attempts(db: asyncpg.Connection) -> None:
    # The fence of a batch whose claims are all at one attempt (first attempts, the common
    # batch) compares the row's attempt with it; the jsonb object of 'id:attempt' keys, a third
    # of complete's cost at 1,000 rows, is built only when the attempts differ, and only
    # archived jobs read their result from it.
    await pending(db, 20)
    ids, attempts = await claimed_ids(db, 20)
    await db.execute("UPDATE aioqueue.jobs SET attempts = 2 WHERE id = ANY($1::bigint[])", ids[:5])
    mixed = [2] * 5 + attempts[5:]
    for claims, built in [(attempts, False), (mixed, True)]:
        plan = await explain(db, Q.complete, int_array(ids), int_array(claims), None, "c", "c", "off", analyze=True)
        loops = [n["Actual Loops"] for n in nodes(plan) if n.get("Subplan Name") == "CTE claims"]
        assert loops == [1 if built else 0], loops
        written = sum(n["Actual Rows"] for n in nodes(plan) if n["Node Type"] == "ModifyTable"
                      and n["Operation"] == "Delete")
        assert written == (20 if built else 15), (claims, written)  # the 5 at attempt 2 are fenced off


@pytest.mark.parametrize("statement", ["claim_timed", "claim_keyed_timed"])
async def test_the_limited_claim_keeps_a_generic_plan(db: asyncpg.Connection, statement: str) -> None:
    """The claim of a worker whose queues have limits (here a per-key one; claim_keyed_timed: per-key
    ones only), prepared as the driver prepares it: after the five custom plans every prepared
    statement starts with, it runs the generic plan rather than planning each claim anew (with an
    array parameter taken for ten queues, the generic plan cost more than a custom one, and a
    third of a millisecond of planning went with every claim)."""
    await db.execute("INSERT INTO aioqueue.queues (name, key_concurrency_limit) VALUES ('default', 1)")
    await db.execute(  # the benchmark's per-key drain: 1,000 keys x 20, a tenth of them running
        "INSERT INTO aioqueue.jobs (queue, task, args, partition_key, status, lease_expires_at) "
        "SELECT 'default', 't', '{}', 'k' || g % 1000, CASE WHEN g <= 100 THEN 'running' ELSE 'pending' END, "
        "CASE WHEN g <= 100 THEN now() + interval '1 hour' END FROM generate_series(1, 20000) AS g")
    await db.execute("ANALYZE aioqueue.jobs")
    sql = getattr(Q, statement)
    claim = await db.prepare(sql)
    for _ in range(10):
        async with db.transaction():
            await claim.fetch(["default"], [5], "plan-test", 300.0, 5, None)
    plans = await db.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", sql)
    assert plans is not None
    assert plans["generic_plans"] >= 5, dict(plans)
