"""Smoke-run every competitor adapter with small sizes and print the figures.

Usage::

    python benchmarks/compare/smoke.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

For each competitor a throwaway database ``bench_cmp_<name>`` is dropped, recreated
(through the given DSN's server, with asyncpg), set up, benchmarked and dropped again
(``--keep-db`` keeps it). Sizes and the set of methods are adjustable, e.g. a single
larger drain::

    python benchmarks/compare/smoke.py --dsn ... --only drain --drain 20000
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script: make the relative imports below work
    _pkg_dir = Path(__file__).resolve().parent
    _root, _parts = _pkg_dir, list[str]()
    while (_root / "__init__.py").exists():
        _parts.insert(0, _root.name)
        _root = _root.parent
    sys.path.insert(0, str(_root))
    __package__ = ".".join(_parts)
    importlib.import_module(__package__)

from common import admin_execute, percentile

from aioqueue._dsn import with_database

from . import COMPETITORS, load_competitor
from .base import Competitor

METHODS = ("bulk", "single", "drain", "latency")


@dataclass(frozen=True)
class Sizes:
    bulk: int
    single: int
    callers: int
    drain: int
    concurrency: int
    latency: int


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:10,.0f} jobs/s  ({n} jobs in {seconds:.3f} s)"


async def run_competitor(
    competitor: Competitor, admin_dsn: str, sizes: Sizes, methods: list[str], keep_db: bool
) -> None:
    database = f"bench_cmp_{competitor.name}"
    drop = f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'
    await admin_execute(admin_dsn, drop, f'CREATE DATABASE "{database}"')
    print(f"== {competitor.name}  (database {database})", flush=True)
    try:
        await competitor.setup(with_database(admin_dsn, database))
        await competitor.setup(with_database(admin_dsn, database))  # idempotent
        try:
            if "bulk" in methods:
                seconds = await competitor.enqueue_bulk(sizes.bulk)
                print(f"  enqueue bulk              {rate(sizes.bulk, seconds)}", flush=True)
            if "single" in methods:
                seconds = await competitor.enqueue_one_by_one(sizes.single, sizes.callers)
                label = f"enqueue 1-by-1 x{sizes.callers} callers"
                print(f"  {label:<26}{rate(sizes.single, seconds)}", flush=True)
            if "drain" in methods:
                seconds = await competitor.drain(sizes.drain, sizes.concurrency)
                label = f"drain @ concurrency {sizes.concurrency}"
                print(f"  {label:<26}{rate(sizes.drain, seconds)}", flush=True)
            if "latency" in methods:
                samples = await competitor.wakeup_latency(sizes.latency)
                if len(samples) != sizes.latency:
                    raise RuntimeError(f"expected {sizes.latency} samples, got {len(samples)}")
                print(
                    f"  wake-up latency           p50 {percentile(samples, 50) * 1e3:7.2f} ms"
                    f"  p99 {percentile(samples, 99) * 1e3:7.2f} ms"
                    f"  max {max(samples) * 1e3:7.2f} ms  ({len(samples)} samples)",
                    flush=True,
                )
        finally:
            await competitor.teardown()
    finally:
        if not keep_db:
            await admin_execute(admin_dsn, drop)


async def main_async(args: argparse.Namespace) -> None:
    sizes = Sizes(
        bulk=args.bulk,
        single=args.single,
        callers=args.callers,
        drain=args.drain,
        concurrency=args.concurrency,
        latency=args.latency_samples,
    )
    for name in args.competitors:
        competitor = load_competitor(name, analyze=not args.no_analyze)
        await run_competitor(competitor, args.dsn, sizes, args.only, args.keep_db)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--dsn",
        required=True,
        help="DSN of an existing database; throwaway databases are created on its server",
    )
    parser.add_argument(
        "--competitors",
        nargs="+",
        choices=sorted(COMPETITORS),
        default=list(COMPETITORS),
        metavar="NAME",
        help=f"which competitors to run (default: all of {', '.join(COMPETITORS)})",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        metavar="METHOD",
        help=f"which methods to run (default: all of {', '.join(METHODS)})",
    )
    parser.add_argument("--bulk", type=int, default=2000, help="jobs for enqueue_bulk")
    parser.add_argument("--single", type=int, default=500, help="jobs for enqueue_one_by_one")
    parser.add_argument("--callers", type=int, default=10, help="callers for enqueue_one_by_one")
    parser.add_argument("--drain", type=int, default=2000, help="jobs for drain")
    parser.add_argument("--concurrency", type=int, default=10, help="worker concurrency for drain")
    parser.add_argument("--latency-samples", type=int, default=50, help="wake-up latency samples")
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="skip the ANALYZE the adapters run after pre-loading the drain jobs",
    )
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio")
    parser.add_argument("--keep-db", action="store_true", help="keep the throwaway databases")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.uvloop:
        import uvloop

        uvloop.run(main_async(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
