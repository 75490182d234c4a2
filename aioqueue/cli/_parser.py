"""The parser of the ``aioqueue`` command line: the options every command takes, and each command
family's own (``worker``, the operator commands, ``dashboard``), added by its module."""

from __future__ import annotations

import argparse

from .._version import __version__
from . import _dashboard, _keys, _operate, _relay, _steps, _worker, _workflows


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
        help="DEBUG, INFO, WARNING or ERROR (default: INFO for worker and relay, WARNING otherwise)",
    )

    parser = argparse.ArgumentParser(
        prog="aioqueue", parents=[common],
        description="An asyncio job queue in PostgreSQL: run workers and operate queues.",
    )
    parser.add_argument("--version", action="version", version=f"aioqueue {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _worker.add_parser(commands, common)
    _operate.add_parsers(commands, common)
    _workflows.add_parsers(commands, common)
    _steps.add_parsers(commands, common)
    _keys.add_parsers(commands, common)
    _dashboard.add_parser(commands, common)
    _relay.add_parsers(commands, common)
    return parser
