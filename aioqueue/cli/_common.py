"""What every command of the ``aioqueue`` command line shares: exit statuses, the usage error,
argument types, the DSN and schema it works on, the Queue it loads from ``MODULE:ATTR``, and
the event loop it runs on."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from .._app import Queue
from .._queries import validate_schema

logger = logging.getLogger("aioqueue.cli")

T = TypeVar("T")

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """A command line that cannot be run as given; exits with status 2."""


# -- argument types -------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An argparse type: an integer, at least 1."""
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


def rate_arg(text: str) -> tuple[int, float]:
    """An argparse type: a rate written ``COUNT/SECONDS`` (the values are checked by the call)."""
    count, slash, seconds = text.partition("/")
    try:
        if not slash:
            raise ValueError(text)
        return int(count), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"write a rate as COUNT/SECONDS, such as 10/60, got {text!r}") from None


def port(text: str) -> int:
    """An argparse type: a TCP port."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to 65535, got {value}")
    return value


def job_id(text: str) -> int:
    """An argparse type: a job id."""
    value = int(text)
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"a job id is an integer from 1 to 2**63-1, got {text}")
    return value


# -- running --------------------------------------------------------------------------------


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
    """The schema from ``--schema``, validated; ``aioqueue`` when not given."""
    schema = getattr(args, "schema", None)
    return "aioqueue" if schema is None else validate_schema(schema)


def admin_queue(args: argparse.Namespace) -> Queue:
    """A Queue with a small pool for the operator commands."""
    return Queue(resolve_dsn(args), schema=schema_arg(args), pool_min_size=1, pool_max_size=2)


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
        if exc.name is not None and module_name.startswith(exc.name):
            raise UsageError(f"cannot import {module_name!r}: {exc}") from None
        raise _import_failed(module_name, exc) from None  # it imports something missing
    except Exception as exc:
        raise _import_failed(module_name, exc) from None
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(found, Queue):
        raise UsageError(f"{target} is a {type(found).__name__}, not an aioqueue.Queue")
    return found


def _import_failed(module_name: str, exc: Exception) -> UsageError:
    """The app's own code failed as it was imported: a restart would fail the same way. Log
    where (the traceback), and return the one-line error."""
    logger.error("importing %r failed", module_name, exc_info=exc)
    return UsageError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")


async def check_schema(queue: Queue) -> None:
    """Open ``queue`` and check that its schema is migrated (a clear error if not)."""
    async with queue:
        await queue.check_schema()
