"""Turn a job's arguments and a handler's result into the JSON text stored in PostgreSQL, and
that text back into values.

Everything that could make PostgreSQL refuse a payload is caught here, before any write, and
reported naming the task and the argument: values JSON cannot hold, NaN and infinities, NUL
characters (``jsonb`` cannot store ``\\u0000``), unpaired surrogates, and oversized payloads.
Arguments go through JSON as ``json.dumps`` does it: tuples arrive as lists, and int, float,
bool or None dict keys arrive as strings.

Reading back, a stored value Python cannot decode (anyone may write a row: SQL, another client)
becomes an :class:`UndecodableValue` saying why, never an exception: the worker buries such a
job, and every operator view shows it in place of the value and lists the other jobs as usual.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ._checks import item_of
from ._errors import ConfigurationError, JobArgumentsError, PayloadTooLargeError

logger = logging.getLogger("aioqueue.payload")

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_DEPTH = 256
"""How deep lists and dicts may nest in one argument or result (``[[1]]`` is 2 deep).

jsonb itself takes some thousands of levels, but a worker decodes arguments with Python's
``json``, which gives up near the recursion limit (1,000 by default, less the worker's own stack):
deeper values are refused at enqueue rather than left for a worker that cannot read them."""

_CYCLE_OR_DEPTH = (
    "values that contain a reference cycle or are nested too deeply "
    f"(over {MAX_DEPTH} levels of lists and dicts) cannot be stored as JSON"
)


def _int_problem(value: int, path: str) -> str | None:
    limit = sys.get_int_max_str_digits()
    # Python refuses to print ints of more digits than the limit; a cheap bound skips the rest.
    if not limit or value.bit_length() <= 3 * limit:
        return None
    try:
        int.__repr__(value)
    except ValueError:
        return (
            f"{path} is an int too large for JSON (over {limit} digits, Python's limit for "
            "printing an int), so it is not JSON-serialisable; send it as a str"
        )
    return None


def _str_problem(value: str, path: str) -> str | None:
    if "\x00" in value:
        return f"{path} contains a NUL character (\\x00), which PostgreSQL jsonb cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{path} contains an unpaired surrogate, which is not valid UTF-8"
    return None


def _key_problem(key: Any, path: str) -> str | None:
    where = f"{path} key {key!r}" if not isinstance(key, int) or key.bit_length() < 64 else f"{path} key"
    if isinstance(key, str):
        return _str_problem(key, where)
    if key is None or isinstance(key, bool):
        return None
    if isinstance(key, int):
        return _int_problem(key, where)
    if isinstance(key, float):
        return None if math.isfinite(key) else f"{path} has the key {key!r}, which JSON cannot hold"
    return f"{path} has a key {key!r} of type {type(key).__name__}; JSON keys are str"


def _problem(value: Any, path: str) -> str | None:
    """Describe the first part of ``value`` that JSON/jsonb cannot hold, or None.

    Iterative, so no value can exhaust the stack; a container that holds itself, or nesting
    deeper than ``MAX_DEPTH``, is reported as such.
    """
    # Entries: (leaving, value, path, depth). A "leaving" entry marks the end of a container's
    # children, so `open_ids` holds exactly the containers on the current path.
    stack: list[tuple[bool, Any, str, int]] = [(False, value, path, 0)]
    open_ids: set[int] = set()
    while stack:
        leaving, item, where, depth = stack.pop()
        if leaving:
            open_ids.discard(id(item))
            continue
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            found = _int_problem(item, where)
        elif isinstance(item, float):
            found = None if math.isfinite(item) else f"{where} is {item!r}, which JSON cannot hold"
        elif isinstance(item, str):
            found = _str_problem(item, where)
        elif isinstance(item, list | tuple | dict):
            if id(item) in open_ids:
                return f"{where} is a list or dict that contains it (a reference cycle); {_CYCLE_OR_DEPTH}"
            if depth >= MAX_DEPTH:
                return f"{path} nests lists and dicts more than {MAX_DEPTH} levels deep; {_CYCLE_OR_DEPTH}"
            open_ids.add(id(item))
            stack.append((True, item, where, depth))
            children: list[tuple[bool, Any, str, int]] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    found = _key_problem(key, where)
                    if found:
                        return found
                    children.append((False, child, f"{where}[{key!r}]", depth + 1))
            else:
                children = [(False, child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item)]
            stack.extend(reversed(children))
            continue
        else:
            found = f"{where} is of type {type(item).__name__}, which is not JSON-serialisable"
        if found:
            return found
    return None


def check_json(value: Any, path: str) -> Any:
    """Return ``value`` if JSON and jsonb can hold all of it, else raise
    :class:`~aioqueue.ConfigurationError` naming the first part (under ``path``) that they
    cannot: for values other than job arguments that are sent as jsonb, such as a filter."""
    found = _problem(value, path)
    if found:
        raise ConfigurationError(found)
    return value


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# The standard library's C encoder, made once: ``json.dumps`` (and ``JSONEncoder.encode`` on a
# dict) builds a new one per call, which is most of the cost of encoding a small job's
# arguments. It is an implementation detail of CPython's ``json``, so
# where it is missing the plain encoder does the same job. No cycle check: a cycle recurses
# until RecursionError, which the callers treat as refused and then describe.
_c_make_encoder: Callable[..., Callable[[Any, int], Sequence[str]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)
_c_encode = (
    _c_make_encoder(None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    if _c_make_encoder is not None
    else None
)


def dumps(value: Any) -> str:
    """Serialise ``value`` compactly, as ``json.dumps(value, separators=(",", ":"),
    ensure_ascii=False, allow_nan=False)`` does; raises ``ValueError``/``TypeError`` (or
    ``RecursionError``) on what JSON refuses."""
    if _c_encode is None or isinstance(value, str):  # pragma: no cover - CPython has the C encoder
        return _ENCODER.encode(value)
    return "".join(_c_encode(value, 0))


def _checked_dumps(value: Any, find_problem: Callable[[], str | None]) -> tuple[str | None, int, str | None]:
    """Return ``(text, utf-8 size, None)`` for a storable value, or ``(None, 0, problem)``;
    ``find_problem`` describes what is wrong with the value, or returns None."""
    try:
        text: str | None = dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = None
    # The fast path only scans the text; the walk runs when something may be wrong: JSON
    # refused it, a NUL, or enough brackets that the nesting may be too deep.
    if text is None or "\\u0000" in text or "\x00" in text or text.count("[") + text.count("{") > MAX_DEPTH:
        found = find_problem()
        if found:
            return None, 0, found
        if text is None:  # pragma: no cover - _problem covers every case json.dumps refuses
            return None, 0, "arguments are not JSON-serialisable"
    if text.isascii():
        return text, len(text), None
    try:
        return text, len(text.encode("utf-8")), None
    except UnicodeEncodeError:
        return None, 0, find_problem() or "it is not valid UTF-8"


def _arguments_problem(args: dict[str, Any]) -> str | None:
    for name, value in args.items():
        found = _problem(value, f"argument {name!r}")
        if found:
            return found
    return None


def encode_args(task: str, args: dict[str, Any], max_bytes: int) -> str:
    """Return ``args`` as JSON text for ``task``, or raise naming the offending argument."""
    text, size, found = _checked_dumps(args, lambda: _arguments_problem(args))
    if text is None:
        raise JobArgumentsError(f"task {task!r}: {found}")
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"task {task!r}: arguments are {size} bytes as JSON, over the limit of {max_bytes} "
            "(Queue(max_payload_bytes=...)); store large data in a table and pass its id"
        )
    return text


def encode_value(what: str, value: Any, max_bytes: int) -> str:
    """Return ``value`` (any JSON value, such as an outbox event's payload) as JSON text, or raise
    :class:`~aioqueue.JobArgumentsError` naming ``what`` and the part JSON cannot hold, or
    :class:`~aioqueue.PayloadTooLargeError` past ``max_bytes``."""
    text, size, found = _checked_dumps(value, lambda: _problem(value, what))
    if text is None:
        raise JobArgumentsError(found)
    if size > max_bytes:
        raise PayloadTooLargeError(
            f"{what} is {size} bytes as JSON, over the limit of {max_bytes} (Queue(max_payload_bytes=...))"
        )
    return text


def encode_args_array(
    task: str, calls: list[dict[str, Any]], max_bytes: int, call: str, first: int = 0, total: int | None = None
) -> str:
    """Return many jobs' arguments as one JSON array (each element as :func:`encode_args` would
    write it), or raise naming the first offending item of ``call`` (``calls[0]`` being its item
    ``first``, from 0, of ``total``: by default, ``calls`` is the whole call) and its argument.

    The batch is encoded in one call, which costs a fifth of encoding it job by job; the checks
    :func:`encode_args` makes on each job's text are made on the whole array where that proves
    every job passes them, and job by job (naming the culprit) where it cannot.
    """
    try:
        array: str | None = dumps(calls)
    except (TypeError, ValueError, RecursionError):
        array = None
    if array is not None and "\\u0000" not in array and "\x00" not in array:
        fits = len(array) <= max_bytes if array.isascii() else _utf8_size(array) <= max_bytes
        # A job's own brackets bound its depth; only jobs holding lists or dicts can be deep.
        # Past each job's own braces, the batch's brackets bound every job's depth.
        shallow = array.count("[") + array.count("{") - 1 - len(calls) < MAX_DEPTH or not any(
            _deep(args) for args in calls if not _FLAT.issuperset(map(type, args.values()))
        )
        if fits and shallow:
            return array
    texts = []
    for i, args in enumerate(calls):
        try:
            texts.append(encode_args(task, args, max_bytes))
        except JobArgumentsError as exc:
            count = len(calls) if total is None else total
            raise type(exc)(f"{item_of(call, first + i, count)}: {exc}") from None
    return "[" + ",".join(texts) + "]"


def _utf8_size(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # an unpaired surrogate: let the job-by-job checks name it
        return sys.maxsize


_FLAT = frozenset({str, int, float, bool, type(None)})


def _deep(args: dict[str, Any]) -> bool:
    """Could this job's arguments nest more than ``MAX_DEPTH`` levels? (Its text's brackets
    bound the depth, as in ``_checked_dumps``.)"""
    for value in args.values():
        if isinstance(value, list | tuple | dict):
            text = dumps(args)
            return text.count("[") + text.count("{") > MAX_DEPTH
    return False


def encode_result(value: Any, whose: str = "a job") -> str | None:
    """Return a handler's result as JSON text, or None when it cannot be stored (logged at
    WARNING with the reason, naming ``whose`` result it is). Never raises: a result must not stop
    the worker."""
    if value is None:
        return None
    try:
        text, _, found = _checked_dumps(value, lambda: _problem(value, "result"))
    except Exception as exc:  # a broken __eq__/__hash__ and the like: still only a NULL result
        text, found = None, f"{type(exc).__name__}: {exc}"
    if text is None:
        logger.warning("%s: its result is stored as NULL: %s", whose, found)
    return text


# -- reading back ------------------------------------------------------------------------------

#: What a stored value is: a job's arguments or a handler's result.
Stored = Literal["arguments", "result"]


@dataclasses.dataclass(frozen=True, slots=True)
class UndecodableValue:
    """Stands for a stored value (a job's arguments or result) that aioqueue cannot read back:
    ``error`` says why, in the words of the ``last_error`` a worker gives such a job."""

    error: str

    def __str__(self) -> str:
        return f"undecodable: {self.error}"


def decode(text: str, what: Stored = "arguments") -> Any:
    """Return stored JSON text (jsonb as text, so valid JSON) as a value, or an
    :class:`UndecodableValue` when Python cannot decode it: nesting past its recursion limit, or
    an int of more digits than it converts."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return UndecodableValue(_undecodable(what, "cannot be decoded", _why(exc, what)))


# A run of digits long enough to be a number past the largest float (about 1.8e308): jsonb
# writes numbers without exponents, so such a number is one of these.
_PAST_FLOATS = re.compile(r"[0-9]{309}")


def decode_shown(text: str | None, what: Stored) -> Any:
    """:func:`decode` for the operator views, which also show as undecodable a value that nests
    more than ``MAX_DEPTH`` levels deep or holds a number no float holds (which decodes as an
    infinity). aioqueue never writes either; the views render values with code that recurses
    per level, with less stack left than the decoder had, and print JSON, which has no
    infinities. None (no value stored) stays None."""
    if text is None:
        return None
    value = decode(text, what)
    if isinstance(value, UndecodableValue):
        return value
    if text.count("[") + text.count("{") > MAX_DEPTH or _PAST_FLOATS.search(text):
        found = (
            _arguments_problem(value)
            if what == "arguments" and type(value) is dict
            else _problem(value, "the result" if what == "result" else "the arguments")
        )
        if found:
            why = f"{found} (as Python reads it back; aioqueue writes no such value)"
            return UndecodableValue(_undecodable(what, "cannot be shown", why))
    return value


def _undecodable(what: Stored, cannot: str, why: str) -> str:
    kind = "UndecodableArguments" if what == "arguments" else "UndecodableResult"
    return f"{kind}: the stored {what} {cannot}: {why}"


def _why(exc: Exception, what: Stored) -> str:
    if isinstance(exc, RecursionError):
        they = "they nest" if what == "arguments" else "it nests"
        return f"{they} lists and objects deeper than Python's json can decode ({type(exc).__name__})"
    return f"{exc} ({type(exc).__name__})"
