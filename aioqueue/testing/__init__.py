"""A test kit for your own tests of code that uses aioqueue: a fresh migrated schema per test,
assertions on what was enqueued, a drain that runs the queue in the test, an inline mode, and
the queue's clock, which moves in the database.

Everything runs against the real database, as production does: jobs are rows, a drain is a real
worker in burst mode on the test's event loop, and every time aioqueue acts on is the database's
(the schema's ``now()``, which :class:`Clock` moves). Nothing here imports pytest; the fixtures
are in :mod:`aioqueue.testing.pytest_plugin`, which a ``conftest.py`` opts into.
"""

from ._clock import Clock
from ._drain import Attempt, drain, inline
from ._isolated import isolated
from ._jobs import assert_enqueued, refute_enqueued

__all__ = ["Attempt", "Clock", "assert_enqueued", "drain", "inline", "isolated", "refute_enqueued"]
