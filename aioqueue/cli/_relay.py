"""The outbox commands: ``aioqueue relay`` publishes outbox streams to a stream (Redis Streams,
Kafka) until SIGINT/SIGTERM, with health probes and Prometheus metrics like a worker, and
``aioqueue outbox status`` prints each stream's waiting events, lag and relay."""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio

from .._app import Queue
from .._errors import ConfigurationError
from .._format import format_age
from ..streams import open_stream
from ._common import (
    EXIT_OK,
    UsageError,
    admin_queue,
    port,
    positive_int,
    resolve_dsn,
    run_async,
    schema_arg,
    seconds_arg,
)
from ._operate import format_table


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``relay`` and ``outbox`` to the command line's subcommands."""
    relay = commands.add_parser(
        "relay", parents=[common], help="publish outbox streams to Redis Streams or Kafka",
        description="Publish the events of the outbox streams named (Queue.publish) to the stream at "
        "--to, in commit order per key, until SIGINT/SIGTERM (the batch in hand is published first; a "
        "second signal stops at once). Several relays may run: one publishes each stream, the others "
        "stand by.",
    )
    relay.add_argument("--to", required=True, metavar="URL",
                       help="where to publish: redis://HOST:PORT/DB (exactly once) or kafka://HOST:PORT[,...] "
                       "(at least once, with the event id)")
    relay.add_argument("-s", "--streams", required=True, type=_names, metavar="S1,S2",
                       help="the outbox streams to publish (each to the Redis stream or Kafka topic of its name)")
    relay.add_argument("--prefix", default="", help="put this before each stream's name on the target")
    relay.add_argument("--batch-size", type=positive_int, default=500, metavar="N",
                       help="events per read and per publish (default: 500)")
    relay.add_argument("--poll-interval", type=seconds_arg, default=1.0, metavar="SECONDS",
                       help="seconds between reads of a quiet stream; NOTIFY wakes it sooner (default: 1)")
    relay.add_argument("--lease", type=seconds_arg, default=30.0, metavar="SECONDS",
                       help="seconds before a standby relay takes over a stream from one that died (default: 30)")
    relay.add_argument("--name", default=None, help="the relay's name in the registry (default: relay-HOST-PID-...)")
    relay.add_argument("--health-port", type=port, default=None, metavar="PORT",
                       help="serve /live and /ready on this port")
    relay.add_argument("--health-addr", default="0.0.0.0", metavar="ADDR",
                       help="address for --health-port (default: 0.0.0.0)")
    relay.add_argument("--metrics-port", type=port, default=None, metavar="PORT",
                       help="serve Prometheus metrics (aioqueue_outbox_lag_seconds, ...) on this port")
    relay.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                       help="address for --metrics-port (default: 127.0.0.1)")

    outbox = commands.add_parser("outbox", parents=[common], help="show the outbox's streams")
    actions = outbox.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status", parents=[common], help="per stream: events waiting, lag, events published, relay",
        description="Per outbox stream: events waiting to be published, how long the oldest has waited "
        "(the relay's lag), events published so far, and the relay that holds the stream's lease.",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("name at least one outbox stream")
    return names


def run_relay_command(args: argparse.Namespace) -> int:
    """``aioqueue relay``: one relay in this process until stopped."""
    queue = Queue(resolve_dsn(args), schema=schema_arg(args), pool_min_size=1, pool_max_size=len(args.streams) + 3)
    return run_async(_relay, queue, args)


async def _relay(queue: Queue, args: argparse.Namespace) -> int:
    try:
        stream = open_stream(args.to, prefix=args.prefix)
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    metrics: Any = None
    if args.metrics_port is not None:
        try:
            from ..metrics import PrometheusMetrics
        except ImportError as exc:
            raise UsageError(str(exc)) from None
        metrics = PrometheusMetrics()
        try:
            metrics.serve(args.metrics_port, args.metrics_addr)
        except OSError as exc:
            raise UsageError(f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc}") from None
    try:
        relay = queue.relay(
            stream, args.streams, batch_size=args.batch_size, poll_interval=args.poll_interval, lease=args.lease,
            health_port=args.health_port, health_addr=args.health_addr, install_signal_handlers=True,
            **({"name": args.name} if args.name else {}),
        )
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    try:
        async with queue, anyio.create_task_group() as tg:
            if metrics is not None:
                tg.start_soon(metrics.poll, queue)
            await relay.run()
            tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await stream.aclose()
    return EXIT_OK


async def run_outbox(args: argparse.Namespace) -> int:
    """``aioqueue outbox status``."""
    async with admin_queue(args) as queue:
        rows = await queue.outbox_status()
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no outbox stream has events or a relay")
        return EXIT_OK
    cells = [[r["stream"], str(r["waiting"]), format_age(r["lag"]), str(r["published"]), r["relay"] or "-"]
             for r in rows]
    print(format_table(["STREAM", "WAITING", "LAG", "PUBLISHED", "RELAY"], cells, "lrrrl"))
    return EXIT_OK
