"""The ``keys QUEUE`` command: a queue's busiest partition keys, each with its running jobs
(against the queue's per-key limit) and its pending and ready jobs, a thin shell over
:meth:`aioqueue.Queue.busiest_keys`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._common import EXIT_OK, admin_queue, positive_int
from ._operate import format_table

COMMANDS = ("keys",)


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``keys`` to the command line's subcommands."""
    keys = commands.add_parser(
        "keys", parents=[common], help="show a queue's busiest partition keys",
        description="A queue's busiest partition keys: running jobs (exact, against the per-key limit), "
        "pending and ready jobs (each counted up to --bound), most first.",
    )
    keys.add_argument("queue", help="the queue's name")
    keys.add_argument("--limit", type=positive_int, default=10, help="at most this many keys, 1 to 100 (default: 10)")
    keys.add_argument("--bound", type=positive_int, default=1000,
                      help="count each key's pending jobs up to this, 1 to 100,000 (default: 1000)")
    keys.add_argument("--json", action="store_true", help="print JSON instead of a table")


async def run(args: argparse.Namespace) -> int:
    """Run ``keys``."""
    async with admin_queue(args) as queue:
        rows = await queue.busiest_keys(args.queue, limit=args.limit, bound=args.bound)
        settings = next((s for s in await queue.queue_settings() if s["name"] == args.queue), {})
    per_key = settings.get("key_concurrency_limit")
    if args.json:
        print(json.dumps({"queue": args.queue, "key_concurrency_limit": per_key, "bound": args.bound, "keys": rows},
                         indent=2))
    elif not rows:
        print(f"no key has running or pending jobs in queue {args.queue!r}")
    else:
        def counted(n: int) -> str:
            return f"{n}+" if n >= args.bound else str(n)

        limit = "" if per_key is None else f"/{per_key}"
        table = [[r["key"], f"{r['running']}{limit}", counted(r["pending"]), counted(r["ready"])] for r in rows]
        print(format_table(["KEY", "RUNNING", "PENDING", "READY"], table, "lrrr"))
    return EXIT_OK
