"""The ``aioqueue`` command: run workers, migrate the schema, and operate queues from a terminal.

``aioqueue worker MODULE:ATTR`` runs the tasks of the Queue found there (in N supervised
processes with ``--processes``); ``migrate``, ``status`` and ``dead list|retry|purge`` are thin
shells over the Queue's admin calls. The database comes from ``--dsn``, else ``AIOQUEUE_DSN``,
else ``DATABASE_URL``. Exit status: 0 done, 1 the database refused or is not ready, 2 bad usage
or configuration, 130 interrupted. Runs on uvloop when it is installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
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
from .config import WorkerConfig, worker_flags
from .errors import AioqueueError, ConfigurationError
from .job import JobInfo
from .queries import validate_schema
from .worker import Worker

if TYPE_CHECKING:
    from .metrics import PrometheusMetrics

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


def _seconds(text: str) -> float:
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


def _queues(text: str) -> list[str] | dict[str, int]:
    """``Q1,Q2`` (queues sharing every slot) or ``Q1=4,Q2=2`` (a cap on each queue's slots)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one queue")
    if not any("=" in n for n in names):
        return names
    slots: dict[str, int] = {}
    for item in names:
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit():
            raise argparse.ArgumentTypeError(f"write every queue as NAME=SLOTS, got {item!r}")
        slots[name.strip()] = int(count)
    return slots


def _flag_type(field: dataclasses.Field[Any]) -> Callable[[str], Any]:
    kind = str(field.type)
    if kind.startswith("int"):
        return int
    if kind.startswith("float"):
        return _seconds
    return str


def add_worker_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every worker option that has one (from :class:`~aioqueue.WorkerConfig`'s
    fields), and ``--queues``. Unset flags stay None: the config's defaults apply."""
    defaults = WorkerConfig.__dataclass_fields__
    for flag, field in worker_flags():
        default = defaults[field.name].default
        help_text = f"{field.metadata['help']} (default: {'derived' if default is None else default})"
        names = [flag, "-c"] if field.name == "concurrency" else [flag]
        if str(field.type) == "bool":
            parser.add_argument(*names, dest=field.name, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            parser.add_argument(*names, dest=field.name, type=_flag_type(field), default=None,
                                metavar=field.name.upper(), help=help_text)
    parser.add_argument("-q", "--queues", type=_queues, default=None, metavar="Q1,Q2",
                        help="queues to work, or Q1=SLOTS,Q2=SLOTS to cap each one's share of the slots "
                        "(default: every queue a registered task uses)")


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    """The worker options given on the command line (flags left unset are not included)."""
    names = [field.name for _, field in worker_flags()] + ["queues"]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


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
    worker.add_argument("target", metavar="MODULE:ATTR", help="where the Queue is, e.g. myapp.jobs:queue")
    add_worker_flags(worker)
    worker.add_argument("-p", "--processes", type=_positive_int, default=1,
                        help="worker processes, supervised and restarted if they die (default: 1)")
    worker.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (process i of N: PORT+i); "
                        "needs prometheus-client")
    worker.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                        help="address for --metrics-port (default: 127.0.0.1)")
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


def _schema(args: argparse.Namespace) -> str:
    schema = getattr(args, "schema", None)
    return "aioqueue" if schema is None else validate_schema(schema)


def _admin_queue(args: argparse.Namespace) -> Queue:
    return Queue(resolve_dsn(args), schema=_schema(args), pool_min_size=1, pool_max_size=2)


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
    try:
        if args.command == "worker":
            return run_worker_command(args)
        if args.command == "dashboard":
            return run_dashboard_command(args)
        command = {"migrate": _migrate, "status": _status, "dead": _dead}[args.command]
        return run_async(command, args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:
        error = _single_error(exc)
        if isinstance(error, UsageError | ConfigurationError):
            print(f"aioqueue: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(error, AioqueueError):
            print(f"aioqueue: error: {error}", file=sys.stderr)
            return EXIT_ERROR
        raise


def _single_error(exc: BaseException) -> BaseException:
    """The one error inside (nested) exception groups of one error, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# -- worker -------------------------------------------------------------------------------------


def load_queue(target: str) -> Queue:
    """Import ``MODULE:ATTR`` (from the current directory too) and return the Queue there."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise UsageError(f"the worker target must be MODULE:ATTR (e.g. myapp.jobs:queue), got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the module exists but imports something missing: show the traceback
        raise UsageError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(found, Queue):
        raise UsageError(f"{target} is a {type(found).__name__}, not an aioqueue.Queue")
    return found


def _configure(queue: Queue, args: argparse.Namespace) -> None:
    """Apply ``--dsn`` and check ``--schema`` against the queue the module built."""
    schema = getattr(args, "schema", None)
    if schema is not None and validate_schema(schema) != queue.schema:
        raise UsageError(
            f"{args.target} uses schema {queue.schema!r}, not {schema!r}: set it in Queue(schema=...)"
        )
    if args.supervised_by is not None and os.environ.get(_CHILD_DSN):
        queue.dsn = os.environ[_CHILD_DSN]
    elif getattr(args, "dsn", None):
        queue.dsn = args.dsn
    elif queue.dsn is None and not queue.database.is_open:
        queue.dsn = resolve_dsn(args)


#: Where a supervisor hands its children their configuration and DSN (never in argv, which is
#: public: a DSN may hold a password).
_CHILD_CONFIG = "AIOQUEUE_WORKER_CONFIG"
_CHILD_DSN = "AIOQUEUE_WORKER_DSN"


def _worker_config(args: argparse.Namespace) -> WorkerConfig:
    if args.supervised_by is not None and os.environ.get(_CHILD_CONFIG):
        return WorkerConfig.from_json(os.environ[_CHILD_CONFIG])
    return WorkerConfig.from_options(worker_options(args))


def run_worker_command(args: argparse.Namespace) -> int:
    """``aioqueue worker``: one worker in this process, or a supervisor of N processes."""
    queue = load_queue(args.target)
    _configure(queue, args)
    config = _worker_config(args)  # bad options fail here, once, before any child starts
    if args.processes == 1:
        return run_async(_work, queue, config, args)
    from .supervisor import Supervisor

    # Check once here: children that cannot start would only be restarted over and over.
    run_async(_check_schema, queue)
    env = {**os.environ, _CHILD_CONFIG: config.to_json()}
    if queue.dsn:
        env[_CHILD_DSN] = queue.dsn
    supervisor = Supervisor(
        lambda slot: _child_command(args, slot),
        args.processes,
        shutdown_timeout=config.grace_period + 30.0,
        env=env,
    )
    return run_async(supervisor.run)


async def _check_schema(queue: Queue) -> None:
    async with queue:
        await queue.check_schema()


def _child_command(args: argparse.Namespace, slot: int) -> list[str]:
    """A child's command line: the target and where it reports; its worker configuration and
    DSN travel in the environment (``AIOQUEUE_WORKER_CONFIG``, ``AIOQUEUE_WORKER_DSN``)."""
    command = [
        sys.executable, "-m", "aioqueue", "worker", args.target,
        "--log-level", str(getattr(args, "log_level", None) or "INFO"),
        "--supervised-by", str(os.getpid()),
    ]
    if getattr(args, "schema", None):
        command += ["--schema", args.schema]
    if args.metrics_port is not None:
        command += ["--metrics-port", str(args.metrics_port + slot), "--metrics-addr", args.metrics_addr]
    return command


async def _work(queue: Queue, config: WorkerConfig, args: argparse.Namespace) -> int:
    worker = queue.worker(**_as_options(config))
    metrics = _serve_metrics(queue, args)
    async with queue, anyio.create_task_group() as tg:
        if metrics is not None:
            tg.start_soon(metrics.poll, queue)
        if args.supervised_by is not None:
            tg.start_soon(_stop_when_orphaned, args.supervised_by, worker)
        await worker.run()
        tg.cancel_scope.cancel()
    return EXIT_OK


def _as_options(config: WorkerConfig) -> Any:
    """``config`` as worker options (``queue_slots`` folded back into ``queues``)."""
    options = config.changes()
    slots = options.pop("queue_slots")
    if slots is not None:
        options["queues"] = dict(slots)
    options["install_signal_handlers"] = True
    return options


async def _stop_when_orphaned(parent_pid: int, worker: Worker) -> None:
    # Nothing signals a child that its parent died (it is re-parented): poll for it.
    while os.getppid() == parent_pid:  # noqa: ASYNC110
        await anyio.sleep(1.0)
    logger.error("the supervisor (pid %d) is gone: stopping", parent_pid)
    worker.stop()


def _serve_metrics(queue: Queue, args: argparse.Namespace) -> PrometheusMetrics | None:
    if args.metrics_port is None:
        return None
    try:
        from .metrics import PrometheusMetrics
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    metrics = PrometheusMetrics()
    queue.use(metrics)
    try:
        metrics.serve(args.metrics_port, args.metrics_addr)
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc}") from None
    logger.info("serving Prometheus metrics at http://%s:%d/metrics", args.metrics_addr, args.metrics_port)
    return metrics


# -- dashboard ----------------------------------------------------------------------------------


def run_dashboard_command(args: argparse.Namespace) -> int:
    """``aioqueue dashboard``: serve the dashboard with uvicorn until interrupted."""
    try:
        import uvicorn

        from .dashboard import create_app
        from .dashboard.security import PASSWORD_ENV, USER_ENV, is_loopback
    except ImportError as exc:
        raise UsageError(f"the dashboard needs its extra: pip install 'aioqueue[dashboard]' ({exc})") from None
    if args.app is not None:
        queue = load_queue(args.app)
        if getattr(args, "dsn", None) or queue.dsn is None:
            queue.dsn = resolve_dsn(args)
    else:
        queue = Queue(resolve_dsn(args), schema=_schema(args), pool_min_size=1, pool_max_size=4)
    app = create_app(queue, read_only=args.read_only)
    if not app.state.dashboard.protected and not is_loopback(args.host):
        raise UsageError(
            f"refusing to serve the dashboard on {args.host}, a non-loopback address, without "
            f"authentication: set {USER_ENV} and {PASSWORD_ENV}, or serve on 127.0.0.1 "
            "(or mount create_app(queue, auth=...) in your own application)"
        )
    run_async(_check_schema, queue)
    logger.warning("serving the aioqueue dashboard at http://%s:%d/", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK


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
    return EXIT_OK
