"""Fixtures for every layer: a fresh database per test that asks for one (the server starts the
first time one does; see ``tests/support/pg.py``), the queue and connection on it, and the
header line naming the PostgreSQL in use. Where a new test goes: ``tests/README.md``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

import aioqueue
from tests.support.cli_tools import APP
from tests.support.pg import TEMPLATE, fresh_database, header, stop

# Workers that mostly wait on PostgreSQL and on child processes: a few more than the cores,
# but bounded, so a small machine does not thrash.
_MAX_WORKERS = 4
UNIT = Path(__file__).resolve().parent / "unit"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: no workers (one process) for the unit layer alone or a single named test,
    no more workers than named tests, else a few more than the cores, at most ``_MAX_WORKERS``."""
    args = config.args
    if args and all(Path(arg.split("::")[0]).resolve().is_relative_to(UNIT) for arg in args):
        return 0  # the database-free layer alone: starting workers would cost more than its tests
    most = min(_MAX_WORKERS, 2 * (os.cpu_count() or 1))
    if args and all("::" in arg for arg in args):
        most = min(most, len(args))
    return most if most > 1 else 0


def pytest_unconfigure(config: pytest.Config) -> None:
    stop()


def pytest_report_header(config: pytest.Config) -> str:
    return header()


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    """A fresh database, cloned from the migrated template, dropped after the test."""
    async with fresh_database("t", TEMPLATE) as url:
        yield url


@pytest.fixture
async def other_dsn() -> AsyncIterator[str]:
    """A second fresh migrated database, for a second Queue (say, the one heavy work goes to)."""
    async with fresh_database("o", TEMPLATE) as url:
        yield url


@pytest.fixture
async def empty_dsn() -> AsyncIterator[str]:
    """A fresh database with no aioqueue schema in it."""
    async with fresh_database("e", None) as url:
        yield url


@pytest.fixture
async def q(dsn: str) -> AsyncIterator[aioqueue.Queue]:
    """An open queue on a fresh, migrated database."""
    async with aioqueue.Queue(dsn) as queue:
        yield queue


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the test's database, for checking rows."""
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def app_dir(tmp_path: Path, db: asyncpg.Connection) -> Path:
    """A directory holding the CLI tests' app module (``cli_app:queue``), and the tables its
    tasks write to in the test's database."""
    (tmp_path / "cli_app.py").write_text(APP)
    await db.execute("CREATE TABLE seen (n int, pid int); CREATE TABLE begun (n int)")
    return tmp_path


@pytest.fixture
def django_db(dsn: str) -> Iterator[str]:
    """The test's database, for Django (``tests.support.django_db.django_connection``): Django's
    connection is closed after the test."""
    yield dsn
    from django.conf import settings
    from django.db import connection

    if settings.configured:  # not when the test failed before it used Django
        connection.close()
