"""Adapters that run aioqueue's benchmark workload against other PostgreSQL job queues.

The competitor libraries are optional (``pip install -e '.[compare]'``), so the adapter
modules are imported lazily: importing this package needs neither of them.

    competitors = load_competitors(["pgqueuer", "procrastinate"])
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from .base import Competitor, CompetitorError, CompetitorTimeout, JobTracker, WorkerDied

__all__ = [
    "COMPETITORS",
    "Competitor",
    "CompetitorError",
    "CompetitorTimeout",
    "JobTracker",
    "WorkerDied",
    "load_competitor",
    "load_competitors",
]

#: Competitor name -> (module inside this package, adapter class name).
COMPETITORS: dict[str, tuple[str, str]] = {
    "pgqueuer": ("pgqueuer_adapter", "PgQueuerAdapter"),
    "procrastinate": ("procrastinate_adapter", "ProcrastinateAdapter"),
}


def load_competitor(name: str, **options: Any) -> Competitor:
    """Instantiate the adapter called *name*; *options* go to its constructor."""
    try:
        module_name, class_name = COMPETITORS[name]
    except KeyError:
        raise ValueError(f"unknown competitor {name!r}; choose from {sorted(COMPETITORS)}") from None
    module = importlib.import_module(f".{module_name}", __name__)
    adapter: Competitor = getattr(module, class_name)(**options)
    return adapter


def load_competitors(names: Iterable[str] | None = None, **options: Any) -> list[Competitor]:
    """Instantiate the named adapters (all of them when *names* is None)."""
    return [load_competitor(name, **options) for name in (names or COMPETITORS)]
