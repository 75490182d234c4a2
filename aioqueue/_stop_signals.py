"""Hold SIGINT/SIGTERM that reach the ``aioqueue worker`` (or ``relay``) command before it
watches for them.

Python's default handlers end a process at once (status 143 for SIGTERM), and the command
spends its first fifth of a second importing. When this process is the ``aioqueue worker``
command (``sys.orig_argv`` says so), importing aioqueue installs handlers that only remember
the signal; the worker and the supervisor take it when they start watching, and stop cleanly
(status 0, no orphans). Imported as a library, it changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

_received: list[int] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def is_worker_command(argv: list[str]) -> bool:
    """Whether ``argv`` (an interpreter's original argv) runs ``aioqueue worker``."""
    args = argv[1:]
    if len(args) >= 2 and args[0] == "-m" and args[1] == "aioqueue":
        rest = args[2:]
    elif args and os.path.basename(args[0]) == "aioqueue":
        rest = args[1:]
    else:
        return False
    return "worker" in rest or "relay" in rest


def hold() -> None:
    """Remember SIGINT and SIGTERM instead of dying of them (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _remember)
        signal.signal(signal.SIGTERM, _remember)


def take() -> int | None:
    """The first signal remembered and not yet taken, or None."""
    return _received.pop(0) if _received else None


if is_worker_command(list(getattr(sys, "orig_argv", []))):
    hold()
