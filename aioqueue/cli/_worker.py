"""The ``aioqueue worker`` command: its flags (generated from :class:`~aioqueue.WorkerConfig`'s
fields), loading the Queue at ``MODULE:ATTR``, and running one worker in this process or a
supervisor of N processes that hands each child the validated configuration (as JSON in its
environment, never on its public command line)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._app import Queue
from .._config import WorkerConfig, worker_flags
from .._queries import validate_schema
from .._supervisor import Supervisor
from .._worker import Worker
from ..worker_group import run_workers
from ._common import (
    EXIT_OK,
    UsageError,
    check_schema,
    load_queue,
    logger,
    port,
    positive_int,
    resolve_dsn,
    run_async,
    seconds_arg,
)

if TYPE_CHECKING:
    from ..metrics import PrometheusMetrics

def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker`` to the command line's subcommands."""
    worker = commands.add_parser(
        "worker", parents=[common], help="run workers for the tasks of a Queue",
        description="Run workers for the tasks registered on the aioqueue.Queue at MODULE:ATTR. "
        "SIGINT/SIGTERM stop claiming and let running jobs finish within the grace period; "
        "a second signal interrupts them (they go back to pending).",
    )
    worker.add_argument("target", metavar="MODULE:ATTR", nargs="+",
                        help="where the Queue is, e.g. myapp.jobs:queue; name several to serve Queues of "
                        "several databases in one process (each Queue's own DSN)")
    add_worker_flags(worker)
    worker.add_argument("-p", "--processes", type=positive_int, default=1,
                        help="worker processes, supervised and restarted if they die (default: 1)")
    worker.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (process i of N: PORT+i); "
                        "needs prometheus-client")
    worker.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                        help="address for --metrics-port (default: 127.0.0.1)")
    worker.add_argument("--pool-max-size", type=positive_int, default=None, metavar="N",
                        help="at most N pooled connections per process (default: the Queue's, 10); "
                        "a process holds this many plus one for LISTEN")
    worker.add_argument("--listen-dsn", default=None, metavar="DSN",
                        help="behind a transaction pooler: LISTEN on this DSN, straight to the server "
                        "(default: $AIOQUEUE_LISTEN_DSN; without one the worker polls)")
    # Set by the supervisor on its children.
    worker.add_argument("--supervised-by", type=int, default=None, help=argparse.SUPPRESS)



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
        return seconds_arg
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
    if getattr(args, "pool_max_size", None) is not None:
        queue.database.cap_pool(args.pool_max_size)
    listen_dsn = getattr(args, "listen_dsn", None) or os.environ.get(_LISTEN_DSN)
    if listen_dsn:
        queue.database.listen_dsn = listen_dsn


#: Where a supervisor hands its children their configuration and DSN (never in argv, which is
#: public: a DSN may hold a password).
_CHILD_CONFIG = "AIOQUEUE_WORKER_CONFIG"
_CHILD_DSN = "AIOQUEUE_WORKER_DSN"
#: Where LISTEN goes past a transaction pooler (``--listen-dsn``); children inherit it.
_LISTEN_DSN = "AIOQUEUE_LISTEN_DSN"


def _worker_config(args: argparse.Namespace) -> WorkerConfig:
    if args.supervised_by is not None and os.environ.get(_CHILD_CONFIG):
        config = WorkerConfig.from_json(os.environ[_CHILD_CONFIG])
        if args.health_port is not None:  # each child probes on a port of its own
            config = WorkerConfig.from_options({"health_port": args.health_port}, base=config)
        return config
    return WorkerConfig.from_options(worker_options(args))


def run_worker_command(args: argparse.Namespace) -> int:
    """``aioqueue worker``: one worker in this process, or a supervisor of N processes."""
    targets: list[str] = list(args.target) if isinstance(args.target, list) else [args.target]
    if len(targets) > 1:
        return _run_several(targets, args)
    args.target = targets[0]
    queue = load_queue(args.target)
    _configure(queue, args)
    config = _worker_config(args)  # bad options fail here, once, before any child starts
    if args.processes == 1:
        return run_async(_work, queue, config, args)
    # Check once here: children that cannot start would only be restarted over and over.
    run_async(check_schema, queue)
    env = {**os.environ, _CHILD_CONFIG: config.to_json()}
    if queue.dsn:
        env[_CHILD_DSN] = queue.dsn
    if queue.database.listen_dsn:
        env[_LISTEN_DSN] = queue.database.listen_dsn
    supervisor = Supervisor(
        lambda slot: _child_command(args, slot),
        args.processes,
        shutdown_timeout=config.grace_period + 30.0,
        env=env,
    )
    return _supervise(supervisor)


def _run_several(targets: list[str], args: argparse.Namespace) -> int:
    """Serve several Queues (each in its own database) from one process, or from each of N."""
    refused = [flag for flag, value in (("--dsn", getattr(args, "dsn", None)), ("--listen-dsn", args.listen_dsn))
               if value is not None]
    if refused:
        raise UsageError(f"{', '.join(refused)} take(s) one target: with several, each Queue names its own database")
    queues = [load_queue(target) for target in targets]
    for queue in queues:
        if queue.dsn is None and not queue.database.is_open:
            raise UsageError("with several targets every Queue needs a DSN of its own: Queue(dsn=...)")
        if args.pool_max_size is not None:
            queue.database.cap_pool(args.pool_max_size)
    config = _worker_config(args)
    if args.processes == 1:
        return run_async(_work_several, queues, config, args)
    for queue in queues:
        run_async(check_schema, queue)
    def command(slot: int) -> list[str]:
        line = _child_command(args, slot, targets[0])
        at = line.index(targets[0]) + 1
        return [*line[:at], *targets[1:], *line[at:]]

    supervisor = Supervisor(command, args.processes, shutdown_timeout=config.grace_period + 30.0,
                            env={**os.environ, _CHILD_CONFIG: config.to_json()})
    return _supervise(supervisor)


def _supervise(supervisor: Supervisor) -> int:
    """Run the supervisor; if a child stopped them all with an error, end with its message."""
    code = run_async(supervisor.run)
    if supervisor.error is not None:
        print(f"aioqueue: error: {supervisor.error}", file=sys.stderr)
    return code


async def _work_several(queues: list[Queue], config: WorkerConfig, args: argparse.Namespace) -> int:
    options = {**_as_options(config), "install_signal_handlers": False}
    options.pop("name")  # each worker names itself
    options.pop("health_port", None)  # one server answers for the group
    workers = [queue.worker(**options) for queue in queues]
    metrics = _serve_metrics(queues[0], args)
    async with contextlib.AsyncExitStack() as stack:
        for queue in queues:
            if metrics is not None and queue is not queues[0]:
                queue.use(metrics)
            await stack.enter_async_context(queue)
        async with anyio.create_task_group() as tg:
            if metrics is not None:
                for queue in queues:
                    tg.start_soon(metrics.poll, queue)
            if args.supervised_by is not None:
                for worker in workers:
                    tg.start_soon(_stop_when_orphaned, args.supervised_by, worker)
            await run_workers(workers, health_port=config.health_port, health_addr=config.health_addr,
                              unready_after=config.unready_after)
            tg.cancel_scope.cancel()
    return EXIT_OK


def _child_command(args: argparse.Namespace, slot: int, target: str | None = None) -> list[str]:
    """A child's command line: the target and where it reports; its worker configuration and
    DSN travel in the environment (``AIOQUEUE_WORKER_CONFIG``, ``AIOQUEUE_WORKER_DSN``)."""
    command = [
        sys.executable, "-m", "aioqueue", "worker", target or args.target,
        "--log-level", str(getattr(args, "log_level", None) or "INFO"),
        "--supervised-by", str(os.getpid()),
    ]
    if getattr(args, "schema", None):
        command += ["--schema", args.schema]
    if args.metrics_port is not None:
        command += ["--metrics-port", str(args.metrics_port + slot), "--metrics-addr", args.metrics_addr]
    if args.health_port:
        command += ["--health-port", str(args.health_port + slot)]
    if args.pool_max_size is not None:
        command += ["--pool-max-size", str(args.pool_max_size)]
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
        from ..metrics import PrometheusMetrics
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
