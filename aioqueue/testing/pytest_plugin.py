"""pytest fixtures for tests of code that uses aioqueue. Opt in from your ``conftest.py``::

    pytest_plugins = ["aioqueue.testing.pytest_plugin"]

and override ``aioqueue_app`` to return your application's :class:`~aioqueue.Queue`. Each test
that asks for ``aioqueue_queue`` gets that queue on a fresh migrated schema of its own
(:func:`~aioqueue.testing.isolated`), dropped after the test; ``aioqueue_clock`` is its
:class:`~aioqueue.testing.Clock`. Async fixtures: needs pytest-asyncio
(``pip install "aioqueue[testing]"``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from aioqueue import Queue

from . import Clock, isolated

try:
    import pytest_asyncio
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aioqueue.testing.pytest_plugin needs pytest-asyncio: pip install "aioqueue[testing]"'
    ) from exc


@pytest.fixture
def aioqueue_app() -> Queue:
    """Your application's Queue: override this fixture in your ``conftest.py`` to return it."""
    raise pytest.UsageError(
        "override the aioqueue_app fixture in your conftest.py to return your application's aioqueue.Queue"
    )


@pytest_asyncio.fixture
async def aioqueue_queue(aioqueue_app: Queue) -> AsyncIterator[Queue]:
    """``aioqueue_app``, open, on a fresh migrated schema for this test (see
    :func:`~aioqueue.testing.isolated`); the schema is dropped after the test."""
    async with isolated(aioqueue_app) as queue:
        yield queue


@pytest.fixture
def aioqueue_clock(aioqueue_queue: Queue) -> Clock:
    """The queue's clock in this test's schema (see :class:`~aioqueue.testing.Clock`)."""
    return Clock(aioqueue_queue)
