"""Turn a job's arguments and a handler's result into the JSON text stored in PostgreSQL.

Everything that could make PostgreSQL refuse a payload is caught here, before any write, and
reported naming the task and the argument: values JSON cannot hold, NaN and infinities, NUL
characters (``jsonb`` cannot store ``\\u0000``), unpaired surrogates, and oversized payloads.
Arguments go through JSON as ``json.dumps`` does it: tuples arrive as lists, and int, float,
bool or None dict keys arrive as strings.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import JobArgumentsError, PayloadTooLargeError

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


def _problem(value: Any, path: str) -> str | None:
    """Describe the first part of ``value`` that JSON/jsonb cannot hold, or None."""
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot hold"
    if isinstance(value, str):
        if "\x00" in value:
            return f"{path} contains a NUL character (\\x00), which PostgreSQL jsonb cannot store"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{path} contains an unpaired surrogate, which is not valid UTF-8"
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _problem(item, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return f"{path} has a key {key!r} of type {type(key).__name__}; JSON keys are str"
            found = _problem(str(key), f"{path} key {key!r}") or _problem(item, f"{path}[{key!r}]")
            if found:
                return found
        return None
    return f"{path} is of type {type(value).__name__}, which is not JSON-serialisable"


def dumps(value: Any) -> str:
    """Serialise ``value`` compactly; raises ``ValueError``/``TypeError`` on what JSON refuses."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_args(task: str, args: dict[str, Any], max_bytes: int) -> str:
    """Return ``args`` as JSON text for ``task``, or raise naming the offending argument."""
    try:
        return _encode_args(task, args, max_bytes)
    except RecursionError:  # a reference cycle, or nesting deeper than Python's recursion limit
        raise JobArgumentsError(
            f"task {task!r}: arguments contain a reference cycle or are nested too deeply for JSON"
        ) from None


def _encode_args(task: str, args: dict[str, Any], max_bytes: int) -> str:
    try:
        text = dumps(args)
    except (TypeError, ValueError):
        text = None
    # The fast path only scans the text; the walk runs when something may be wrong.
    if text is None or "\\u0000" in text or "\x00" in text:
        for name, value in args.items():
            found = _problem(value, f"argument {name!r}")
            if found:
                raise JobArgumentsError(f"task {task!r}: {found}") from None
        if text is None:  # pragma: no cover - _problem covers every case json.dumps refuses
            raise JobArgumentsError(f"task {task!r}: arguments are not JSON-serialisable")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        for name, value in args.items():
            found = _problem(value, f"argument {name!r}")
            if found:
                raise JobArgumentsError(f"task {task!r}: {found}") from None
        raise
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"task {task!r}: arguments are {size} bytes as JSON, over the limit of {max_bytes} "
            "(Queue(max_payload_bytes=...)); store large data in a table and pass its id"
        )
    return text


def encode_result(value: Any) -> str | None:
    """Return a handler's result as JSON text, or None when it cannot be stored."""
    if value is None or _problem(value, "result") is not None:
        return None
    return dumps(value)
