"""Validate values at the call that received them, before anything is written or started.

Each check returns the value in the form the caller stores (a float for seconds, a list for a
sequence) or raises :class:`~aioqueue.ConfigurationError` naming what was given and what is
allowed. Nothing here touches the database.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ._errors import ConfigurationError

INT32_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1
MAX_DELAY_SECONDS = 10 * 365 * 86400.0
MAX_NAME_LENGTH = 255
MAX_KEY_LENGTH = 1000
MAX_KEY_BYTES = 2000
MAX_PARTITION_KEY_BYTES = 1000
MAX_CONCURRENCY = 10_000
# The run_at range: every instant Python can hold in UTC. asyncpg can neither send a datetime
# whose UTC instant leaves this range nor read one back (see check_run_at).
MIN_RUN_AT = datetime.datetime.min.replace(tzinfo=datetime.UTC)
MAX_RUN_AT = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def check_name(kind: str, value: object, limit: int = MAX_NAME_LENGTH) -> str:
    """Return ``value`` if it is a usable queue/task name or dedup key, else raise."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{kind} must be a non-empty str, got {value!r}")
    if len(value) > limit:
        raise ConfigurationError(f"{kind} is {len(value)} characters long; the limit is {limit}")
    if "\x00" in value:
        raise ConfigurationError(f"{kind} {value!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{kind} {value!r} is not valid UTF-8") from None
    return value


def check_key(value: object) -> str:
    """Return ``value`` if it is a usable dedup key, else raise."""
    key = check_name("dedup key", value, MAX_KEY_LENGTH)
    # A btree entry holds at most 2704 bytes; a character takes at most 4 in UTF-8.
    if len(key) * 4 > MAX_KEY_BYTES and (size := len(key.encode("utf-8"))) > MAX_KEY_BYTES:
        raise ConfigurationError(f"dedup key is {size} bytes in UTF-8; the limit is {MAX_KEY_BYTES}")
    return key


def check_partition_key(value: object) -> str:
    """Return ``value`` if it is a usable partition key (the key per-key limits and fair claims
    go by), else raise."""
    key = check_name("partition key", value, MAX_NAME_LENGTH)
    # Short enough for the claim's index entries, whatever the other columns hold.
    if len(key) * 4 > MAX_PARTITION_KEY_BYTES and (size := len(key.encode("utf-8"))) > MAX_PARTITION_KEY_BYTES:
        raise ConfigurationError(f"partition key is {size} bytes in UTF-8; the limit is {MAX_PARTITION_KEY_BYTES}")
    return key


def item_of(call: str, index: int, count: int) -> str:
    """How an error names item ``index`` (from 0) of a bulk ``call`` of ``count`` items: counted
    from 1, with the total, as SQL's ``add_jobs()`` names a job (``job 3 of 5``)."""
    return f"{call}: item {index + 1} of {count}"


def check_keys(keys: object, count: int, call: str) -> list[str | None] | None:
    """Return one checked dedup key (or None) per item of a bulk ``call`` of ``count`` items,
    or None when no item has one; else raise, naming the item."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Iterable):
        raise ConfigurationError(f"{call}: keys must be a list of one dedup key (or None) per item, got {keys!r}")
    listed: list[Any] = list(keys)
    if len(listed) != count:
        raise ConfigurationError(
            f"{call}: {len(listed)} keys for {count} item{'' if count == 1 else 's'}; give one key (or None) per item"
        )
    for i, key in enumerate(listed):
        if key is not None:
            try:
                check_key(key)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{item_of(call, i, count)}: {exc}") from None
    return listed if listed.count(None) < count else None


def check_int(kind: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int in [low, high], else raise."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(f"{kind} must be an int from {low} to {high}, got {value!r}")
    return value


def check_seconds(kind: str, value: object, *, allow_zero: bool = True) -> float:
    """Return ``value`` as float seconds if finite, non-negative and at most ten years."""
    # Compare before converting: float(10**400) raises OverflowError, the comparison does not.
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 <= value <= MAX_DELAY_SECONDS
        and math.isfinite(value)
        and (allow_zero or value > 0)
    ):
        return float(value)
    low = "0" if allow_zero else "more than 0"
    raise ConfigurationError(f"{kind} must be {low} to ten years in seconds, got {value!r}")


def check_run_at(value: object) -> datetime.datetime:
    """Return ``value`` if it is a timezone-aware datetime whose instant, in UTC, lies in
    0001-01-01 00:00 to 9999-12-31 23:59:59.999999, else raise."""
    if not isinstance(value, datetime.datetime) or value.utcoffset() is None:
        raise ConfigurationError(f"run_at must be a timezone-aware datetime, got {value!r}")
    # Near the ends of the calendar a zone's offset can carry the instant into year 0 or
    # 10000, which neither Python nor asyncpg can represent.
    try:
        value.astimezone(datetime.UTC)
    except OverflowError:
        raise ConfigurationError(
            f"run_at {value.isoformat()} is outside the supported range: its instant in UTC must lie "
            f"from {MIN_RUN_AT.isoformat()} to {MAX_RUN_AT.isoformat()}"
        ) from None
    return value


def check_job_id(value: object) -> int:
    """Return ``value`` if it is a job id: an int (not a bool) from 1 to 2**63-1."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= BIGINT_MAX:
        return int(value)
    raise ConfigurationError(f"a job id must be an int from 1 to {BIGINT_MAX} (2**63-1), got {value!r}")


def check_job_ids(values: object) -> list[int]:
    """Return ``values`` as a list of job ids; each must pass :func:`check_job_id`."""
    if isinstance(values, int):
        raise ConfigurationError(f"job ids must be a list of ints, got the single {values!r}; pass [{values!r}]")
    if isinstance(values, str | bytes | bytearray | memoryview) or not isinstance(values, Iterable):
        raise ConfigurationError(f"job ids must be a list (or other iterable) of ints, got {values!r}")
    return [check_job_id(value) for value in values]


def check_limit(name: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an int from ``low`` to ``high`` (a row count, a page size)."""
    return check_int(name, value, low, high)


def check_rate(value: object, kind: str = "rate") -> tuple[int, float]:
    """Return ``value`` as ``(count, seconds)``: at most ``count`` jobs started per ``seconds``."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise ConfigurationError(
            f"{kind} must be a pair (count, seconds), such as (10, 1.0) for 10 jobs a second; got {value!r}"
        )
    count = check_int(f"{kind} count", value[0], 0, 100_000)
    return count, check_seconds(f"{kind} period", value[1], allow_zero=False)


def check_queue_names(value: object) -> list[str]:
    """Return ``value`` as a list of distinct queue names; a bare str is refused."""
    if isinstance(value, str):
        raise ConfigurationError(f"queues must be a list of queue names, got the str {value!r}; pass [{value!r}]")
    if not isinstance(value, Iterable) or isinstance(value, bytes | bytearray | memoryview):
        raise ConfigurationError(f"queues must be a list of queue names, got {value!r}")
    names = [check_name("queue name", name) for name in value]
    if not names:
        raise ConfigurationError("queues must name at least one queue; omit it for every queue")
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ConfigurationError(f"queues names a queue more than once: {twice!r}")
    return names


def check_concurrency(value: object) -> int:
    """Return ``value`` if it is a worker concurrency: an int from 1 to 10,000."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY:
        return int(value)
    raise ConfigurationError(
        f"concurrency must be an int from 1 to {MAX_CONCURRENCY} (jobs running at once in one worker); "
        f"got {value!r}"
    )
