"""How the dashboard's pages show values: stored JSON (or what stands for a value that cannot
be read), ages and moments. Used as the templates' filters."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

from .._format import format_age
from .._payload import UndecodableValue


def json_text(value: Any, indent: int | None = None) -> str:
    """A stored value as a page shows it: JSON, or what stands for a value that cannot be read."""
    if isinstance(value, UndecodableValue):
        return str(value)
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


def age(seconds: float | None) -> str:
    """An age in seconds as a page shows it (``-`` when unknown)."""
    if seconds is None or math.isnan(seconds):
        return "-"
    return format_age(max(0.0, seconds))


def when(value: datetime.datetime | None) -> str:
    """A moment as a page shows it, in UTC."""
    return "-" if value is None else value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
