"""The operator commands: ``migrate`` (or print its SQL), ``status`` (every queue's backlog, its
settings and the live workers), ``dead list|retry|purge`` and ``key-limits`` (a queue's per-key
settings), thin shells over the operator calls (:class:`~aioqueue._admin.Admin`) that print
tables or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .. import _migrate as migrations
from .._format import format_age
from .._job import JobInfo
from ._common import EXIT_ERROR, EXIT_OK, UsageError, admin_queue, job_id, positive_int, rate_arg


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``migrate``, ``status``, ``dead`` and ``key-limits`` to the command line's subcommands."""
    migrate = commands.add_parser(
        "migrate", parents=[common], help="create or upgrade the aioqueue schema",
        description="Create or upgrade the aioqueue schema; safe to run from several places at once.",
    )
    migrate.add_argument("--sql", "--dry-run", dest="sql", action="store_true",
                         help="print the SQL the migration would run (the numbered migrations, then the "
                         "function files), and run nothing")

    status = commands.add_parser(
        "status", parents=[common], help="show every queue's backlog and throughput",
        description="Per queue: pending jobs, ready now, scheduled for later, running, dead, "
        "how long the oldest ready job has waited, and jobs that succeeded in the last minute.",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    dead = commands.add_parser("dead", parents=[common], help="list, retry or purge dead jobs")
    dead_commands = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dead_list = dead_commands.add_parser("list", parents=[common], help="list dead jobs, newest first")
    dead_list.add_argument("--queue", default=None, help="only this queue")
    dead_list.add_argument("--limit", type=positive_int, default=100, help="at most this many (default: 100)")
    dead_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for action, verb in (("retry", "send dead jobs back to pending now"), ("purge", "delete dead jobs")):
        p = dead_commands.add_parser(
            action, parents=[common], help=verb,
            description=f"{verb[0].upper()}{verb[1:]}: the IDs given, every one (--all), or those of a queue.",
        )
        p.add_argument("ids", nargs="*", type=job_id, metavar="ID", help="dead job ids")
        p.add_argument("--all", action="store_true", help="every dead job (of --queue, if given)")
        p.add_argument("--queue", default=None, help="the dead jobs of this queue")

    keys = commands.add_parser(
        "key-limits", parents=[common], help="show or set a queue's per-key limits",
        description="Show a queue's per-key settings, or set them, as Queue.set_key_limits does: at most N "
        "running jobs (--concurrency) and COUNT starts in any SECONDS (--rate) per partition key, keys "
        "claimed in turn (--fair, implied by a limit). Setting sets all three: one left out is cleared.",
    )
    keys.add_argument("queue", help="the queue's name")
    keys.add_argument("--concurrency", type=int, default=None, metavar="N", help="at most N running jobs per key")
    keys.add_argument("--rate", type=rate_arg, default=None, metavar="COUNT/SECONDS",
                      help="at most COUNT jobs per key started in any SECONDS, such as 10/60")
    keys.add_argument("--fair", action="store_true", help="claim keys in turn, even without a per-key limit")
    keys.add_argument("--clear", action="store_true", help="clear every per-key setting of the queue")
    keys.add_argument("--json", action="store_true", help="print the settings as JSON")


async def run(args: argparse.Namespace) -> int:
    """Run the operator command ``args`` names."""
    command = {"migrate": _migrate, "status": _status, "dead": _dead, "key-limits": _key_limits}[args.command]
    return await command(args)


# -- migrate ------------------------------------------------------------------------------------


async def _migrate(args: argparse.Namespace) -> int:
    latest = migrations.latest_version()
    async with admin_queue(args) as queue:
        if args.sql:
            async with queue.connection() as conn:
                applied = await migrations.applied_version(conn, queue.schema)
            if applied >= latest:
                print(f"-- schema {queue.schema!r} is at version {applied}: nothing to run")
            else:
                print(f"-- schema {queue.schema!r}: version {applied} -> {latest}")
                print(migrations.plan_sql(queue.schema, applied), end="")
            return EXIT_OK
        applied_now = await queue.migrate()
    if applied_now:
        print(f"schema {queue.schema!r}: applied {', '.join(f'{v:04d}' for v in applied_now)}; "
              f"now at version {latest}")
    else:
        print(f"schema {queue.schema!r} is up to date (version {latest})")
    return EXIT_OK


# -- status -------------------------------------------------------------------------------------

_STATUS_COLUMNS = (
    ("queue", "QUEUE"),
    ("pending", "PENDING"),
    ("ready", "READY"),
    ("scheduled", "SCHEDULED"),
    ("running", "RUNNING"),
    ("dead", "DEAD"),
    ("oldest_ready_age", "OLDEST READY"),
    ("completed_last_minute", "DONE/MIN"),
)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """Align ``rows`` under ``headers``; ``align`` has an ``l`` or ``r`` per column."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


async def _status(args: argparse.Namespace) -> int:
    async with admin_queue(args) as queue:
        rows = await queue.status()
        settings = await queue.queue_settings()
        workers = await queue.admin.list_workers()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no jobs in any queue")
    else:
        cells = [
            [format_age(r[key]) if key == "oldest_ready_age" else str(r[key]) for key, _ in _STATUS_COLUMNS]
            for r in rows
        ]
        print(format_table([title for _, title in _STATUS_COLUMNS], cells, "lrrrrrrr"))
    if settings:
        print(_settings_table(settings))
    print(_workers_table(workers) if workers else "no live workers")
    return EXIT_OK


def _rate_text(count: int | None, seconds: float | None) -> str:
    return "-" if count is None or seconds is None else f"{count}/{seconds:g}s"


def _settings_table(settings: Sequence[dict[str, Any]]) -> str:
    """The queues with settings: pause, global limits, per-key limits, keys in turn."""
    rows = [
        [s["name"], "yes" if s["paused"] else "no",
         "-" if s["concurrency_limit"] is None else str(s["concurrency_limit"]),
         _rate_text(s["rate_limit"], s["rate_period"]),
         "-" if s["key_concurrency_limit"] is None else str(s["key_concurrency_limit"]),
         _rate_text(s["key_rate_limit"], s["key_rate_period"]),
         "yes" if _in_turn(s) else "no"]
        for s in settings
    ]
    return format_table(["QUEUE", "PAUSED", "CONCURRENCY", "RATE", "KEY CONCURRENCY", "KEY RATE", "KEYS IN TURN"],
                        rows, "llrrrrl")


def _in_turn(settings: dict[str, Any]) -> bool:
    """Whether a queue's claims take keys in turn: it is fair, or has a per-key limit."""
    limited = settings["key_concurrency_limit"] is not None or settings["key_rate_limit"] is not None
    return bool(settings["fair"]) or limited


def _workers_table(workers: Sequence[dict[str, Any]]) -> str:
    rows = [
        [w["name"], w["host"], str(w["pid"]), ",".join(w["queues"]), f"{w['running']}/{w['concurrency']}",
         w["version"], w["started_at"].strftime("%Y-%m-%d %H:%M:%S")]
        for w in workers
    ]
    return format_table(["WORKER", "HOST", "PID", "QUEUES", "RUNNING", "VERSION", "STARTED (UTC)"], rows, "lllrrll")


# -- dead ---------------------------------------------------------------------------------------


def _first_line(text: str | None, limit: int = 70) -> str:
    line = (text or "").splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _dead_table(jobs: Sequence[JobInfo]) -> str:
    rows = [
        [str(j.id), j.queue, j.task, f"{j.attempts}/{j.max_attempts}", _first_line(j.last_error)]
        for j in jobs
    ]
    return format_table(["ID", "QUEUE", "TASK", "ATTEMPTS", "LAST ERROR"], rows, "rllrl")


async def _dead(args: argparse.Namespace) -> int:
    async with admin_queue(args) as queue:
        if args.dead_command == "list":
            jobs = await queue.list_dead(queue=args.queue, limit=args.limit)
            if args.json:
                print(json.dumps([j.to_dict() for j in jobs], indent=2))
            elif not jobs:
                print("no dead jobs" + (f" in queue {args.queue!r}" if args.queue else ""))
            else:
                print(_dead_table(jobs))
            return EXIT_OK
        if not args.ids and not args.all and args.queue is None:
            raise UsageError(f"dead {args.dead_command}: name job IDs, or pass --all or --queue Q")
        action = queue.retry_dead if args.dead_command == "retry" else queue.purge_dead
        ids = await action(args.ids or None, queue=args.queue, all=args.all)
    done = "retried" if args.dead_command == "retry" else "purged"
    if ids:
        print(f"{done} {len(ids)} dead job(s): {', '.join(map(str, ids))}")
    else:
        print(f"no dead jobs matched: nothing {done}")
    missing = sorted(set(args.ids) - set(ids))
    if missing:
        # Named jobs that are not dead (missing, pending, running, archived): say so, and fail.
        print(f"aioqueue: error: no dead job with id {', '.join(map(str, missing))}: it does not exist "
              "or is not dead (see `aioqueue dead list`)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


# -- key-limits ---------------------------------------------------------------------------------

_KEY_SETTINGS = ("key_concurrency_limit", "key_rate_limit", "key_rate_period", "fair")


async def _key_limits(args: argparse.Namespace) -> int:
    sets = args.fair or args.concurrency is not None or args.rate is not None
    if args.clear and sets:
        raise UsageError("key-limits: --clear clears every per-key setting; give it alone")
    async with admin_queue(args) as queue:
        if sets or args.clear:
            await queue.set_key_limits(args.queue, concurrency=args.concurrency, rate=args.rate, fair=args.fair)
        found = [s for s in await queue.queue_settings() if s["name"] == args.queue]
    settings = {key: found[0][key] if found else None for key in _KEY_SETTINGS}
    settings["fair"] = bool(settings["fair"])
    if args.json:
        print(json.dumps({"queue": args.queue, **settings, "keys_in_turn": _in_turn(settings)}))
        return EXIT_OK
    if not _in_turn(settings):
        print(f"queue {args.queue!r}: no per-key settings (first in, first out)")
        return EXIT_OK
    limits = []
    if settings["key_concurrency_limit"] is not None:
        limits.append(f"at most {settings['key_concurrency_limit']} running")
    if settings["key_rate_limit"] is not None:
        limits.append(f"at most {settings['key_rate_limit']} started in any {settings['key_rate_period']:g}s")
    print(f"queue {args.queue!r}: keys in turn" + (f"; per key {' and '.join(limits)}" if limits else ""))
    return EXIT_OK
