"""How a duration reads to a person, the same on the terminal and on the dashboard's pages."""

from __future__ import annotations


def format_age(seconds: float | None) -> str:
    """A short human age: ``-``, ``4.2s``, ``12m05s``, ``3h07m``, ``2d04h``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
