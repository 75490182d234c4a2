"""What a request carries, as the values the dashboard acts on: job ids (the jump box, the
``before`` cursor, a job's page, the jobs selected) and job filters (status, queue, task,
arguments, partition key). Every route reads them through here, so each is checked once, before anything is
read or changed; a value that does not pass raises :class:`~aioqueue.ConfigurationError`
naming it, which the routes answer with a 400 page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .._admin import JobFilter
from .._checks import BIGINT_MAX
from .._errors import ConfigurationError
from .._payload import MAX_DEPTH

#: The fields of a job filter, in query strings and forms.
FILTER_FIELDS = ("status", "queue", "task", "args", "key")
_ID_DIGITS = len(str(BIGINT_MAX))


def job_id(text: str, field: str = "") -> int:
    """``text`` (spaces around it allowed) as a job id: ASCII digits, from 1 to 2**63-1; a
    refusal names ``field``, when given."""
    text = text.strip()
    # ASCII only: str.isdigit() also passes '²' and other digits int() refuses; the length
    # first, so no number of thousands of digits is ever converted.
    if text.isascii() and text.isdigit() and len(text) <= _ID_DIGITS and 0 < int(text) <= BIGINT_MAX:
        return int(text)
    where = f"{field}: " if field else ""
    raise ConfigurationError(f"{where}a job id is a whole number from 1 to 2**63-1, not {shown(text)}")


def job_ids(texts: Iterable[object]) -> list[int]:
    """The jobs selected in a form, each checked as :func:`job_id`."""
    return [job_id(text if isinstance(text, str) else repr(text), "selected jobs") for text in texts]


def before(text: str) -> int | None:
    """The ``before`` cursor of a listing: a job id, or None when empty."""
    return job_id(text, "before") if text.strip() else None


def job_filter(fields: Mapping[str, str]) -> JobFilter:
    """The :class:`~aioqueue._admin.JobFilter` that a listing's or a bulk action's fields ask for
    (``status`` defaults to pending; ``key``: a partition key); :class:`JobFilter` checks the
    names, the key and the arguments' values, as it does for every caller."""
    return JobFilter(
        status=fields.get("status") or "pending",  # type: ignore[arg-type]  # JobFilter checks it
        queue=fields.get("queue") or None,
        task=fields.get("task") or None,
        args=arguments(fields.get("args", "")),
        partition_key=fields.get("key") or None,
    )


def arguments(text: str) -> dict[str, Any] | None:
    """The arguments filter, a JSON object (None when empty)."""
    if not text:
        return None
    try:
        parsed = json.loads(text)
    except RecursionError:
        raise ConfigurationError(
            f"the arguments filter nests lists and dicts more than {MAX_DEPTH} levels deep"
        ) from None
    except ValueError as exc:
        raise ConfigurationError(f"the arguments filter is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ConfigurationError('the arguments filter must be a JSON object, such as {"user": 7}')
    return parsed


def optional_int(value: object, what: str) -> int | None:
    """A whole number typed into a form, or None when empty; its range is the caller's to check."""
    text = str(value or "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= _ID_DIGITS):
        raise ConfigurationError(f"{what} must be a whole number, not {shown(text)}")
    return int(text)


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, cut short when long."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"
