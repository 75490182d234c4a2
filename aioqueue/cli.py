"""The ``aioqueue`` command: run workers, migrate the schema, and operate queues from a terminal.

``aioqueue worker MODULE:ATTR`` runs the tasks of the Queue found there, in N supervised
processes with ``--processes`` (see :mod:`aioqueue.worker_command`); ``migrate``, ``status`` and
``dead list|retry|purge`` are thin shells over the operator calls (:mod:`aioqueue.admin`). The
database comes from ``--dsn``, else ``AIOQUEUE_DSN``, else ``DATABASE_URL``. Exit status: 0 done,
1 the database refused or is not ready, 2 bad usage or configuration, 130 interrupted. Runs on
uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from . import __version__
from . import migrate as migrations
from .app import Queue
from .errors import AioqueueError, ConfigurationError, SchemaNotReadyError
from .job import JobInfo
from .queries import validate_schema
from .supervisor import report, report_fd_from_env

if TYPE_CHECKING:
    pass

logger = logging.getLogger("aioqueue.cli")

T = TypeVar("T")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A command line that cannot be run as given; exits with status 2."""


# -- parsing ------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seconds_arg(text: str) -> float:
    """An argparse type: a finite number of seconds, at least 0."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got {value}")
    return value


def _job_id(text: str) -> int:
    value = int(text)
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"a job id is an integer from 1 to 2**63-1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the ``aioqueue`` command line."""
    # Options every command takes, before or after the command name. SUPPRESS keeps a
    # subcommand's unset option from overwriting the value given before the command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn", default=argparse.SUPPRESS,
        help="PostgreSQL DSN (default: $AIOQUEUE_DSN, else $DATABASE_URL)",
    )
    common.add_argument(
        "--schema", default=argparse.SUPPRESS, help="the aioqueue schema name (default: aioqueue)"
    )
    common.add_argument(
        "--log-level", default=argparse.SUPPRESS, metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default: INFO for worker, WARNING otherwise)",
    )

    parser = argparse.ArgumentParser(
        prog="aioqueue", parents=[common],
        description="An asyncio job queue in PostgreSQL: run workers and operate queues.",
    )
    parser.add_argument("--version", action="version", version=f"aioqueue {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = commands.add_parser(
        "worker", parents=[common], help="run workers for the tasks of a Queue",
        description="Run workers for the tasks registered on the aioqueue.Queue at MODULE:ATTR. "
        "SIGINT/SIGTERM stop claiming and let running jobs finish within the grace period; "
        "a second signal interrupts them (they go back to pending).",
    )
    worker.add_argument("target", metavar="MODULE:ATTR", nargs="+",
                        help="where the Queue is, e.g. myapp.jobs:queue; name several to serve Queues of "
                        "several databases in one process (each Queue's own DSN)")
    from .worker_command import add_worker_flags  # it imports this module's basics

    add_worker_flags(worker)
    worker.add_argument("-p", "--processes", type=_positive_int, default=1,
                        help="worker processes, supervised and restarted if they die (default: 1)")
    worker.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (process i of N: PORT+i); "
                        "needs prometheus-client")
    worker.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                        help="address for --metrics-port (default: 127.0.0.1)")
    worker.add_argument("--pool-max-size", type=_positive_int, default=None, metavar="N",
                        help="at most N pooled connections per process (default: the Queue's, 10); "
                        "a process holds this many plus one for LISTEN")
    worker.add_argument("--listen-dsn", default=None, metavar="DSN",
                        help="behind a transaction pooler: LISTEN on this DSN, straight to the server "
                        "(default: $AIOQUEUE_LISTEN_DSN; without one the worker polls)")
    # Set by the supervisor on its children.
    worker.add_argument("--supervised-by", type=int, default=None, help=argparse.SUPPRESS)

    migrate = commands.add_parser(
        "migrate", parents=[common], help="create or upgrade the aioqueue schema",
        description="Create or upgrade the aioqueue schema; safe to run from several places at once.",
    )
    migrate.add_argument("--sql", "--dry-run", dest="sql", action="store_true",
                         help="print the SQL the migration would run, and run nothing")

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
    dead_list.add_argument("--limit", type=_positive_int, default=100, help="at most this many (default: 100)")
    dead_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    for action, verb in (("retry", "send dead jobs back to pending now"), ("purge", "delete dead jobs")):
        p = dead_commands.add_parser(
            action, parents=[common], help=verb,
            description=f"{verb[0].upper()}{verb[1:]}: the IDs given, every one (--all), or those of a queue.",
        )
        p.add_argument("ids", nargs="*", type=_job_id, metavar="ID", help="dead job ids")
        p.add_argument("--all", action="store_true", help="every dead job (of --queue, if given)")
        p.add_argument("--queue", default=None, help="the dead jobs of this queue")
    board = commands.add_parser(
        "dashboard", parents=[common], help="serve the web dashboard (needs aioqueue[dashboard])",
        description="Serve the web dashboard with uvicorn. Credentials come from "
        "AIOQUEUE_DASHBOARD_USER and AIOQUEUE_DASHBOARD_PASSWORD; without them it serves only a "
        "loopback address.",
    )
    board.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    board.add_argument("--port", type=_port, default=8080, help="port to serve on (default: 8080)")
    board.add_argument("--app", default=None, metavar="MODULE:ATTR",
                       help="your Queue, to show its periodic schedules and registered queues")
    board.add_argument("--read-only", action="store_true", help="show everything, allow no action")
    return parser


# -- running ------------------------------------------------------------------------------------


def run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn(*args)`` on a new event loop: uvloop when installed, else asyncio's."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        use_uvloop = False
    else:
        use_uvloop = True
    return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": use_uvloop})


def resolve_dsn(args: argparse.Namespace) -> str:
    """The DSN from ``--dsn``, else AIOQUEUE_DSN, else DATABASE_URL; a UsageError when none."""
    dsn = getattr(args, "dsn", None) or os.environ.get("AIOQUEUE_DSN") or os.environ.get("DATABASE_URL")
    if not dsn:
        raise UsageError(
            "no database given: pass --dsn postgresql://..., or set AIOQUEUE_DSN (or DATABASE_URL)"
        )
    return dsn


def schema_arg(args: argparse.Namespace) -> str:
    schema = getattr(args, "schema", None)
    return "aioqueue" if schema is None else validate_schema(schema)


def _admin_queue(args: argparse.Namespace) -> Queue:
    return Queue(resolve_dsn(args), schema=schema_arg(args), pool_min_size=1, pool_max_size=2)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aioqueue`` command line; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", None) or ("INFO" if args.command == "worker" else "WARNING")
    try:
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
        )
    except ValueError:
        parser.error(f"unknown log level {level!r}")
    report_fd = report_fd_from_env()  # set when this is a worker process of a supervisor
    try:
        if args.command == "worker":
            from .worker_command import run_worker_command

            return run_worker_command(args)
        if args.command == "dashboard":
            from .dashboard_command import run_dashboard_command

            return run_dashboard_command(args)
        command = {"migrate": _migrate, "status": _status, "dead": _dead}[args.command]
        return run_async(command, args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:
        error = _single_error(exc)
        if isinstance(error, UsageError | ConfigurationError):
            status = EXIT_USAGE
        elif isinstance(error, AioqueueError):
            status = EXIT_ERROR
        else:
            raise
        # What no restart would fix goes to the supervisor, which stops every child and says it.
        fatal = isinstance(error, UsageError | ConfigurationError | SchemaNotReadyError)
        if not (fatal and report_fd is not None and report(report_fd, str(error))):
            print(f"aioqueue: error: {error}", file=sys.stderr)
        return status


def _single_error(exc: BaseException) -> BaseException:
    """The one error inside (nested) exception groups of one error, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# -- migrate ------------------------------------------------------------------------------------


async def _migrate(args: argparse.Namespace) -> int:
    latest = migrations.latest_version()
    async with _admin_queue(args) as queue:
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


def format_age(seconds: float | None) -> str:
    """A short human age: ``-``, ``4.2s``, ``12m05s``, ``3h07m``, ``2d04h``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """Align ``rows`` under ``headers``; ``align`` has an ``l`` or ``r`` per column."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


async def _status(args: argparse.Namespace) -> int:
    async with _admin_queue(args) as queue:
        rows = await queue.status()
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
    print(_workers_table(workers) if workers else "no live workers")
    return EXIT_OK


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
    async with _admin_queue(args) as queue:
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
