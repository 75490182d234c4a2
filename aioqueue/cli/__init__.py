"""The ``aioqueue`` command: run workers, migrate the schema, and operate queues from a terminal.

``aioqueue worker MODULE:ATTR`` runs the tasks of the Queue found there, in N supervised
processes with ``--processes`` (see :mod:`aioqueue.cli._worker`); ``migrate``, ``status`` and
``dead list|retry|purge`` are thin shells over the operator calls (:mod:`aioqueue.cli._operate`),
and ``workflow show|cancel`` and ``group list|show|close`` over the workflow calls
(:mod:`aioqueue.cli._workflows`), ``keys QUEUE`` over the busiest keys (:mod:`aioqueue.cli._keys`);
``dashboard`` serves the web dashboard
(:mod:`aioqueue.cli._dashboard`); ``relay`` and ``outbox status`` publish and show the outbox
(:mod:`aioqueue.cli._relay`). The database comes from
``--dsn``, else ``AIOQUEUE_DSN``, else ``DATABASE_URL``. Exit status: 0 done, 1 the database
refused or is not ready, 2 bad usage or configuration, 130 interrupted. Runs on uvloop when it is
installed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from .._errors import AioqueueError, ConfigurationError, SchemaNotReadyError
from .._supervisor import report, report_fd_from_env
from . import _dashboard, _keys, _operate, _relay, _steps, _worker, _workflows
from ._common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, UsageError, run_async
from ._parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aioqueue`` command line; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", None) or ("INFO" if args.command in ("worker", "relay") else "WARNING")
    try:
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
        )
    except ValueError:
        parser.error(f"unknown log level {level!r}")
    report_fd = report_fd_from_env()  # set when this is a worker process of a supervisor
    try:
        if args.command == "worker":
            return _worker.run_worker_command(args)
        if args.command == "dashboard":
            return _dashboard.run_dashboard_command(args)
        if args.command == "relay":
            return _relay.run_relay_command(args)
        if args.command == "outbox":
            return run_async(_relay.run_outbox, args)
        if args.command in ("workflow", "group"):
            return run_async(_workflows.run, args)
        if args.command in _steps.COMMANDS:
            return run_async(_steps.run, args)
        if args.command in _keys.COMMANDS:
            return run_async(_keys.run, args)
        return run_async(_operate.run, args)
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
