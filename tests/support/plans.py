"""Reading PostgreSQL query plans: run a statement under EXPLAIN (optionally ANALYZE, inside a
transaction that is rolled back so nothing it writes stays), get the generic plan a prepared
statement may switch to, and list the scans and indexes a plan uses.

The library itself never calls this; the plan tests and the benchmark do, so they read plans
one way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeAlias

from aioqueue._job import Connection

__all__ = [
    "Plan", "Scan", "buffers_touched", "explain", "explain_generic", "explain_nested", "function_query", "indexes",
    "nodes", "scans",
]

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


async def explain_generic(
    conn: Connection, sql: str, types: str, values: str, *, analyze: bool = False, mode: str = "force_generic_plan"
) -> Plan:
    """Return the generic plan (planned without parameter values) that a prepared statement may
    switch to after a few executions, as PL/pgSQL functions run theirs. ``types`` lists the
    parameters' SQL types, ``values`` the literals to EXECUTE it with, both as SQL text
    (``"text[], int"``, ``"'{default}', 10"``). ``mode``: the ``plan_cache_mode`` to plan under
    (``"force_custom_plan"`` for the plan of these values). With ``analyze`` it runs (rows,
    loops, no per-node timing) inside a transaction that is rolled back."""
    if mode not in ("force_generic_plan", "force_custom_plan", "auto"):
        raise ValueError(f"plan_cache_mode {mode!r} is not one of force_generic_plan, force_custom_plan, auto")
    await conn.execute(f"PREPARE plan_probe ({types}) AS {sql}")
    tr = conn.transaction()
    await tr.start()
    try:
        await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        options = "ANALYZE, TIMING OFF, FORMAT JSON" if analyze else "FORMAT JSON"
        raw = await conn.fetchval(f"EXPLAIN ({options}) EXECUTE plan_probe ({values})")
    finally:
        await tr.rollback()
        await conn.execute("DEALLOCATE plan_probe")
    return _first(raw)


_RETURN_QUERY = re.compile(r"\bRETURN\s+QUERY\s+(.*?);\s*END\s*;?\s*$", re.IGNORECASE | re.DOTALL)


async def function_query(conn: Connection, function: str) -> str:
    """Return the query a PL/pgSQL ``function`` (``"schema.name"``) returns, its ``RETURN QUERY``,
    as it is installed: SQL whose values are the function's positional parameters ``$1``,
    ``$2``..., to explain or run outside the function. The session takes the planner settings
    of the function's SET clauses (claim_jobs: ``enable_seqscan`` and ``jit`` off), so the query
    plans as it does inside; all but ``plan_cache_mode``, which the caller chooses (a custom plan
    or the generic one, see :func:`explain_generic`)."""
    row = await conn.fetchrow(
        "SELECT p.prosrc, p.proconfig FROM pg_proc AS p WHERE p.oid = to_regproc($1)", function
    )
    if row is None:
        raise LookupError(f"no function {function}")
    source = row["prosrc"]
    for setting in row["proconfig"] or ():
        name, value = setting.split("=", 1)
        if name != "plan_cache_mode":
            await conn.execute("SELECT set_config($1, $2, false)", name, value)
    found = _RETURN_QUERY.search(source)
    if found is None:
        raise LookupError(f"{function} has no RETURN QUERY as its last statement")
    return found[1]


async def explain_nested(conn: Connection, sql: str, *args: Any) -> list[Plan]:
    """Run ``sql`` in a transaction that is rolled back, and return the plans of the statements
    it ran, its own and those inside the functions it calls, as they ran, with actual rows and
    loops (the server module ``auto_explain``, loaded into this session: needs a superuser).
    This shows the plan a function keeps, under the settings the function sets."""
    plans: list[Plan] = []

    def collect(_conn: object, message: Any) -> None:
        text = str(message.message)
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    await conn.execute("LOAD 'auto_explain'")
    conn.add_log_listener(collect)
    tr = conn.transaction()
    await tr.start()
    try:
        for setting, value in [("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_analyze", "on"),
                               ("log_timing", "off"), ("log_format", "json"), ("log_level", "notice")]:
            await conn.execute(f"SET LOCAL auto_explain.{setting} = {value}")
        await conn.fetch(sql, *args)
        # One more round trip: the statement's notices have all arrived (and none more will).
        await conn.execute("SET LOCAL auto_explain.log_min_duration = -1")
    finally:
        await tr.rollback()
        conn.remove_log_listener(collect)
    return plans


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
