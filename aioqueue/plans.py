"""Reading PostgreSQL query plans: run a statement under EXPLAIN (optionally ANALYZE, inside a
transaction that is rolled back so nothing it writes stays), get the generic plan a prepared
statement may switch to, and list the scans and indexes a plan uses.

The library itself never calls this; the plan tests and the benchmark do, so they read plans
one way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeAlias

from .job import Connection

__all__ = ["Plan", "Scan", "buffers_touched", "explain", "explain_generic", "indexes", "nodes", "scans"]

#: One plan as ``EXPLAIN (FORMAT JSON)`` returns it: ``{"Plan": {...}, "Execution Time": ...}``.
Plan: TypeAlias = dict[str, Any]


class Scan(NamedTuple):
    """A plan node that reads a table: its node type, the index it reads (if any), the table."""

    node_type: str
    index_name: str | None
    relation: str


async def explain(
    conn: Connection, sql: str, *args: Any, analyze: bool = False, buffers: bool = False, timing: bool = True
) -> Plan:
    """Return the plan the server picks for ``sql`` with these values (a custom plan).

    Without ``analyze`` the statement is planned, not run. With it, it runs inside a transaction
    that is rolled back, so the plan carries actual rows, loops and ``Execution Time`` (in ms)
    and the table is left as it was; ``buffers`` adds the pages touched, ``timing=False`` skips
    the per-node clock reads that inflate a short statement's time.
    """
    options = ["FORMAT JSON"]
    if analyze:
        options.append("ANALYZE")
        if not timing:
            options.append("TIMING OFF")  # TIMING is an option of ANALYZE only
    if buffers:
        options.append("BUFFERS")
    statement = f"EXPLAIN ({', '.join(options)}) {sql}"
    if not analyze:
        return _first(await conn.fetchval(statement, *args))
    tr = conn.transaction()
    await tr.start()
    try:
        raw = await conn.fetchval(statement, *args)
    finally:
        await tr.rollback()
    return _first(raw)


async def explain_generic(conn: Connection, sql: str, types: str, values: str) -> Plan:
    """Return the generic plan (planned without parameter values) that a prepared statement may
    switch to after a few executions. ``types`` lists the parameters' SQL types, ``values`` the
    literals to EXECUTE it with, both as SQL text (``"text[], int"``, ``"'{default}', 10"``)."""
    await conn.execute(f"PREPARE plan_probe ({types}) AS {sql}")
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe ({values})")
    finally:
        await conn.execute("RESET plan_cache_mode")
        await conn.execute("DEALLOCATE plan_probe")
    return _first(raw)


def nodes(plan: Plan) -> Iterator[dict[str, Any]]:
    """Every node of the plan, the top one first, depth first."""
    stack = [plan["Plan"]]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.get("Plans", [])))


def scans(plan: Plan, *, executed: bool = False) -> list[Scan]:
    """Every read of a table in the plan (the write node of an UPDATE or DELETE is not one).
    ``executed``: only the nodes that ran at least once (needs an ANALYZE plan)."""
    return [
        Scan(node["Node Type"], node.get("Index Name"), node["Relation Name"])
        for node in nodes(plan)
        if "Relation Name" in node
        and node["Node Type"] != "ModifyTable"
        and (not executed or node.get("Actual Loops", 0) > 0)
    ]


def indexes(plan: Plan) -> set[str]:
    """Every index the plan reads, bitmap index scans included."""
    return {node["Index Name"] for node in nodes(plan) if "Index Name" in node}


def buffers_touched(plan: Plan) -> int:
    """Shared buffers the whole statement touched, from cache or disk (needs ANALYZE, BUFFERS)."""
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def _first(raw: str) -> Plan:
    plan: Plan = json.loads(raw)[0]
    return plan
