"""The public face: ``aioqueue.__all__`` is sorted, complete and importable, and the modules
without a leading underscore are exactly the documented ones."""

from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path

import aioqueue

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"

#: The modules a user may import: the package's face, the command line, the dashboard, the
#: integrations, middleware, hooks, metrics, running several Queues' workers in one process,
#: and the throwaway server of the quick start. Everything else is private (``aioqueue._*``).
PUBLIC_MODULES = {
    "aioqueue",
    "aioqueue.cli",
    "aioqueue.dashboard",
    "aioqueue.embedded",
    "aioqueue.hooks",
    "aioqueue.integrations",
    "aioqueue.integrations.aiohttp",
    "aioqueue.integrations.background",
    "aioqueue.integrations.fastapi",
    "aioqueue.integrations.otel",
    "aioqueue.metrics",
    "aioqueue.middleware",
    "aioqueue.streams",
    "aioqueue.streams.kafka",
    "aioqueue.streams.redis",
    "aioqueue.testing",
    "aioqueue.testing.pytest_plugin",
    "aioqueue.worker_group",
}


def test_all_is_sorted_and_importable() -> None:
    assert aioqueue.__all__ == sorted(aioqueue.__all__)
    for name in aioqueue.__all__:
        assert hasattr(aioqueue, name), name


def test_every_public_class_and_function_is_exported() -> None:
    public = {
        name
        for name, value in vars(aioqueue).items()
        if not name.startswith("_") and (inspect.isclass(value) or inspect.isfunction(value))
    }
    assert public <= set(aioqueue.__all__)


def test_the_public_modules_are_the_documented_ones() -> None:
    found = {"aioqueue"} | {
        m.name for m in pkgutil.walk_packages(aioqueue.__path__, "aioqueue.")
        if not any(part.startswith("_") for part in m.name.split("."))
    }
    assert found == PUBLIC_MODULES
    reference = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    # background is documented through aioqueue.BackgroundWorker, which it defines.
    undocumented = {m for m in PUBLIC_MODULES - {"aioqueue.integrations.background"} if m not in reference}
    assert not undocumented
