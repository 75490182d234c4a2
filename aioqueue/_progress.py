"""Progress reported by a running handler: :func:`set_progress`, its checks, and where the value
goes (the worker's completer, which writes the latest value per job in batches, fenced by the
claim, and always before the job's outcome).

A call costs the handler no round trip: it checks and encodes the value, then replaces whatever
its job reported before and was not written yet. The completer writes what is buffered about
twice a second (``Completer.progress_interval``) in one statement, and a job's buffered value in
the same flush as its outcome, first. Readers (``JobInfo.progress``) show a value to later
attempts of the job only when it was reported with ``keep=True``.
"""

from __future__ import annotations

import contextvars
import math
from typing import Any, Protocol

from . import _payload as payload
from ._claims import ClaimKey
from ._errors import AioqueueError, ConfigurationError
from ._job import current_job

MAX_MESSAGE_CHARS = 500
"""The longest message :func:`set_progress` takes, in characters."""

MAX_DATA_BYTES = 8192
"""The largest document :func:`set_progress` takes, as compact JSON in UTF-8 bytes."""


class ProgressSink(Protocol):
    """Where reported progress goes: the worker's completer."""

    def progress_reported(self, claim: ClaimKey, value: str) -> None: ...


_sink: contextvars.ContextVar[ProgressSink] = contextvars.ContextVar("aioqueue_progress_sink")


def bind(sink: ProgressSink) -> None:
    """Make ``sink`` where the handlers run in this context report progress (a worker binds its
    completer once, before it starts its runners, which inherit it)."""
    _sink.set(sink)


def set_progress(
    fraction: float | None = None, message: str | None = None, *, data: Any = None, keep: bool = False
) -> None:
    """Report the running job's progress: ``fraction`` done (0.0 to 1.0), a short ``message``
    (up to 500 characters) and/or ``data``, a small JSON document (up to 8 KiB as JSON). Each
    call replaces what the job reported before; give at least one of the three.

    Not awaited and no round trip: the worker writes the latest value of each job in batches,
    within about half a second, and before the job's outcome. ``get_job`` shows it while the job
    runs and after it ends; a later attempt of the job (a retry, a resumed sleep, a snooze) shows
    it too only when it was reported with ``keep=True``, until that attempt reports its own.
    Bad values raise :class:`~aioqueue.ConfigurationError` here, and nothing is reported.
    """
    try:
        job = current_job()
    except LookupError:
        raise AioqueueError("aioqueue.set_progress() is called from inside a running handler only") from None
    try:
        sink = _sink.get()
    except LookupError:
        raise AioqueueError("aioqueue.set_progress(): this job was not started by an aioqueue worker") from None
    doc: dict[str, Any] = {}
    if fraction is not None:
        doc["fraction"] = _checked_fraction(fraction)
    if message is not None:
        doc["message"] = _checked_message(message)
    if data is not None:
        doc["data"] = data
    if not doc:
        raise ConfigurationError("aioqueue.set_progress(): give a fraction, a message or data (all were None)")
    if not isinstance(keep, bool):
        raise ConfigurationError(f"aioqueue.set_progress(): keep must be True or False, got {keep!r}")
    doc["attempt"] = job.attempt
    doc["keep"] = keep
    sink.progress_reported((job.id, job.attempt), _encoded(doc, data))


def _checked_fraction(fraction: object) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or math.isnan(fraction) \
            or not 0 <= fraction <= 1:
        raise ConfigurationError(
            f"aioqueue.set_progress(): fraction must be a number from 0.0 to 1.0, got {fraction!r}"
        )
    return float(fraction)


def _checked_message(message: object) -> str:
    if not isinstance(message, str):
        raise ConfigurationError(f"aioqueue.set_progress(): message must be a string, got {type(message).__name__}")
    if len(message) > MAX_MESSAGE_CHARS:
        raise ConfigurationError(
            f"aioqueue.set_progress(): message is {len(message)} characters long, more than {MAX_MESSAGE_CHARS}"
        )
    payload.check_json(message, "aioqueue.set_progress(): message")  # a NUL, an unpaired surrogate
    return message


def _encoded(doc: dict[str, Any], data: Any) -> str:
    """``doc`` as JSON text, refusing ``data`` that JSON or jsonb cannot hold or that is too big."""
    text, size, found = payload._checked_dumps(doc, lambda: payload._problem(data, "aioqueue.set_progress(): data"))
    if text is None:
        raise ConfigurationError(found)
    if size > MAX_DATA_BYTES and data is not None:  # the whole is bigger than its data: measure that alone
        size = len(payload.dumps(data).encode())
        if size > MAX_DATA_BYTES:
            raise ConfigurationError(
                f"aioqueue.set_progress(): data is {size} bytes as JSON, more than {MAX_DATA_BYTES}"
            )
    return text
