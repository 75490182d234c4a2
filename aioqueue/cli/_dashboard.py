"""The ``aioqueue dashboard`` command: serve the web dashboard (:mod:`aioqueue.dashboard`) with
uvicorn, on loopback unless credentials are set."""

from __future__ import annotations

import argparse
from typing import Any

from .._app import Queue
from ._common import EXIT_OK, UsageError, check_schema, load_queue, logger, port, resolve_dsn, run_async, schema_arg


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``dashboard`` to the command line's subcommands."""
    board = commands.add_parser(
        "dashboard", parents=[common], help="serve the web dashboard (needs aioqueue[dashboard])",
        description="Serve the web dashboard with uvicorn. Credentials come from "
        "AIOQUEUE_DASHBOARD_USER and AIOQUEUE_DASHBOARD_PASSWORD; without them it serves only a "
        "loopback address.",
    )
    board.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    board.add_argument("--port", type=port, default=8080, help="port to serve on (default: 8080)")
    board.add_argument("--app", default=None, metavar="MODULE:ATTR",
                       help="your Queue, to show its periodic schedules and registered queues")
    board.add_argument("--read-only", action="store_true", help="show everything, allow no action")


def run_dashboard_command(args: argparse.Namespace) -> int:
    """``aioqueue dashboard``: serve the dashboard with uvicorn until interrupted."""
    try:
        import uvicorn

        from ..dashboard import create_app
        from ..dashboard._security import PASSWORD_ENV, USER_ENV, credentials_from_env, is_loopback
    except ImportError as exc:
        raise UsageError(f"the dashboard needs its extra: pip install 'aioqueue[dashboard]' ({exc})") from None
    # Checked before the app is loaded or the database reached: a typo here is the operator's
    # to fix, named in one line, whatever else is wrong.
    credentials = credentials_from_env()
    if args.app is not None:
        queue = load_queue(args.app)
        if getattr(args, "dsn", None) or queue.dsn is None:
            queue.dsn = resolve_dsn(args)
    else:
        queue = Queue(resolve_dsn(args), schema=schema_arg(args), pool_min_size=1, pool_max_size=4)
    app = create_app(queue, credentials=credentials, read_only=args.read_only)
    if not app.state.dashboard.protected and not is_loopback(args.host):
        raise UsageError(
            f"refusing to serve the dashboard on {args.host}, a non-loopback address, without "
            f"authentication: set {USER_ENV} and {PASSWORD_ENV}, or serve on 127.0.0.1 "
            "(or mount create_app(queue, auth=...) in your own application)"
        )
    run_async(check_schema, queue)
    logger.warning("serving the aioqueue dashboard at http://%s:%d/", args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return EXIT_OK
