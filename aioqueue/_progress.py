"""Progress reported by a running handler: :func:`set_progress`, its checks, and where the value
goes (the worker's completer, which writes the latest value per job in batches, fenced by the
claim, and always before the job's outcome).

A call costs the handler no round trip: it checks the value (encoding only its data), then
replaces whatever its job reported before and was not written yet. The completer writes what is buffered about
twice a second (``Completer.progress_interval``) in one statement, and a job's buffered value in
the same flush as its outcome, first. Readers (``JobInfo.progress``) show a value to later
attempts of the job only when it was reported with ``keep=True``.
"""

from __future__ import annotations

import contextvars
import math
from typing import Any, NamedTuple, Protocol

from . import _payload as payload
from ._claims import ClaimKey
from ._errors import AioqueueError, ConfigurationError
from ._job import _current

MAX_MESSAGE_CHARS = 500
"""The longest message :func:`set_progress` takes, in characters."""

MAX_DATA_BYTES = 8192
"""The largest document :func:`set_progress` takes, as compact JSON in UTF-8 bytes."""


class Reported(NamedTuple):
    """One call's value, checked: the latest per claim waits in the completer's buffer, and is
    made a JSON document only when it is written (so a call encodes no more than its data)."""

    fraction: float | None
    message: str | None
    data: str | None
    """The data as JSON text."""
    keep: bool

    def document(self, attempt: int) -> str:
        """The value as the JSON object stored in ``jobs.progress`` (the writer adds ``at``)."""
        parts = []
        if self.fraction is not None:
            parts.append(f'"fraction":{self.fraction!r}')  # a finite float's repr is a JSON number
        if self.message is not None:
            parts.append(f'"message":{payload.dumps(self.message)}')
        if self.data is not None:
            parts.append(f'"data":{self.data}')
        parts.append(f'"attempt":{attempt},"keep":{"true" if self.keep else "false"}')
        return "{" + ",".join(parts) + "}"


class ProgressSink(Protocol):
    """Where reported progress goes: the worker's completer."""

    def progress_reported(self, claim: ClaimKey, value: Reported) -> None: ...


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
    job = _current.get(None)
    if job is None:
        raise AioqueueError("aioqueue.set_progress() is called from inside a running handler only")
    sink = _sink.get(None)
    if sink is None:
        raise AioqueueError("aioqueue.set_progress(): this job was not started by an aioqueue worker")
    # The common values pass the first test; the others are checked (and told) in full.
    if fraction is not None and not (type(fraction) is float and 0.0 <= fraction <= 1.0):
        fraction = _checked_fraction(fraction)
    if message is not None and not (
        type(message) is str and len(message) <= MAX_MESSAGE_CHARS and message.isascii() and "\x00" not in message
    ):
        message = _checked_message(message)
    if fraction is None and message is None and data is None:
        raise ConfigurationError("aioqueue.set_progress(): give a fraction, a message or data (all were None)")
    if keep is not True and keep is not False:
        raise ConfigurationError(f"aioqueue.set_progress(): keep must be True or False, got {keep!r}")
    text = None if data is None else _encoded_data(data)
    sink.progress_reported((job.id, job.attempt), Reported(fraction, message, text, keep))


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


def _encoded_data(data: Any) -> str:
    """``data`` as JSON text, refused if JSON or jsonb cannot hold it or it is too big."""
    text, size, found = payload._checked_dumps(data, lambda: payload._problem(data, "aioqueue.set_progress(): data"))
    if text is None:
        raise ConfigurationError(found)
    if size > MAX_DATA_BYTES:
        raise ConfigurationError(f"aioqueue.set_progress(): data is {size} bytes as JSON, more than {MAX_DATA_BYTES}")
    return text
