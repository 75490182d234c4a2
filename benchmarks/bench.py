"""The bundled benchmark: how fast aioqueue drains, enqueues and wakes up, what a claim costs
with a deep history or backlog, and how much memory a worker needs, on one PostgreSQL.

    python benchmarks/bench.py                      # embedded PostgreSQL, full run
    python benchmarks/bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres --repeat 3
    python benchmarks/bench.py --quick --compare pgqueuer procrastinate --json out.json
    python benchmarks/bench.py --quick --scenarios drain   # the drain alone, in each worker setting
    python benchmarks/bench.py --scenarios scaling         # 1, 2, 4, 8 worker processes
    python benchmarks/bench.py --scenarios sustained       # enqueue and work together, 10 minutes
    python benchmarks/bench.py --quick --save --note "..." # store the run in benchmarks/results/
    python benchmarks/bench.py report                      # BENCHMARKS.md from the stored runs

Every measurement runs in a database of its own, created for it and dropped after it, on the
server of the DSN (``--dsn``, else ``AIOQUEUE_DSN``, else an embedded server). Handlers are
no-ops. ``--repeat N`` runs everything N times, interleaving the systems, and reports medians.
``--compare`` puts the same drain, enqueue and latency workloads through other queues (see
``benchmarks/compare``) in the same run and prints aioqueue's ratio to each. Progress goes to
stderr, the report to stdout, its summary first. ``--save`` stores the run (date, commit, machine,
command, figures) as a JSON file in ``benchmarks/results/``; ``report`` regenerates BENCHMARKS.md
and the README's table from every stored run (see ``results.py``). It never changes server
settings: enqueues and the reference lane commit durably; aioqueue's claims and outcomes skip the
WAL flush unless ``durable_claims`` (a setting measured side by side).

This file is the command line and the runner; each scenario lives in ``scenarios/``, the goals
in ``targets.py``, the console report in ``report.py``, the stored runs in ``results.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # these modules, also in spawned workers
# The repository root: the claim scenario reads plans with tests/support/plans.py, as the plan tests do.
# Last, not first: aioqueue itself comes from PYTHONPATH or the installed package, so that
# `PYTHONPATH=<other tree> python benchmarks/bench.py` measures that tree's code (the report
# says which one ran).
sys.path.append(str(Path(__file__).resolve().parent.parent))

import report
import results
import targets
from common import FULL, QUICK, Run, progress, run_loop
from compare import COMPETITORS
from scenarios import ON_REQUEST, SCENARIOS


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("AIOQUEUE_DSN"),
                        help="admin DSN of the server to use (default: AIOQUEUE_DSN, else embedded PostgreSQL)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a fast smoke run")
    parser.add_argument("--repeat", type=int, default=1, help="run everything N times; report medians")
    default = [name for name in SCENARIOS if name not in ON_REQUEST]
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=default, metavar="NAME",
                        help=f"which scenarios to run (default: {', '.join(default)}; "
                             f"on request: {', '.join(sorted(ON_REQUEST))})")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="how long the sustained scenario enqueues and works (default: 600, --quick: 30)")
    parser.add_argument("--flood", type=int, default=None, metavar="JOBS",
                        help="the per-key scenario's flood (default: 100,000, --quick: 10,000; the goal's: 1,000,000)")
    parser.add_argument("--compare", nargs="*", choices=sorted(COMPETITORS), default=[], metavar="NAME",
                        help="also run the drain, enqueue and latency scenarios through these queues")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON here")
    parser.add_argument("--save", action="store_true",
                        help="also store the run in benchmarks/results/ (then: bench.py report)")
    parser.add_argument("--note", default=None, metavar="TEXT",
                        help="a note stored with the run, shown in BENCHMARKS.md (e.g. the machine was busy)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.flood is not None and args.flood < 1:
        parser.error("--flood must be at least 1 job")
    if args.duration is not None and not args.duration > 0:
        parser.error("--duration must be a positive number of seconds")
    return args


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, bool]]:
    """The admin DSN to measure on, and whether it is an embedded server started for the run."""
    if dsn:
        yield dsn, False
        return
    from aioqueue.embedded import embedded_server

    progress("no --dsn or AIOQUEUE_DSN: starting an embedded PostgreSQL")
    with embedded_server() as embedded:
        yield embedded, True


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        sys.exit(results.main(argv[1:]))
    args = parse_args(argv)
    env: dict[str, Any] = {}
    with server(args.dsn) as (admin_dsn, embedded):
        run = Run(admin_dsn, QUICK if args.quick else FULL, args.compare)
        run.sustained_seconds = args.duration or (30.0 if args.quick else 600.0)
        run.per_key_flood = args.flood
        for name in SCENARIOS:  # the registry's order, whatever the order on the command line
            if name in args.scenarios:
                SCENARIOS[name](run)

        async def go() -> None:
            env.update(await report.environment(admin_dsn, embedded))
            progress(f"Python {env['python']} on {env['event_loop']}, PostgreSQL {env['postgresql']}")
            await run.run_steps(args.repeat)

        run_loop(go)
    print(report.render(env, run.results, run.competitors, args.repeat, argv))
    if args.json or args.save:
        payload = {
            "command": ["python", "benchmarks/bench.py", *argv],
            "environment": env,
            "sizes": dataclasses.asdict(run.sizes),
            "results": [dataclasses.asdict(r) | {"median": r.median} for r in run.results.items.values()],
            "ratios": report.ratios(run.results, ["reference", *run.competitors]),
            "targets": [v.as_json() for v in targets.check(run.results)],
        }
        if args.json:
            args.json.write_text(json.dumps(payload, indent=2) + "\n")
            progress(f"wrote {args.json}")
        if args.save:
            stored = results.save(payload, args.note)
            progress(f"stored {stored}: python benchmarks/bench.py report writes BENCHMARKS.md")


if __name__ == "__main__":
    main()
