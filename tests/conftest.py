"""Test harness: one PostgreSQL server per session (see ``pg.py``), a migrated template
database, and a fresh database cloned from it for every test."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue._dsn import with_database

from .cli_tools import APP
from .pg import Server, find_server

_stack = contextlib.ExitStack()
_server: Server | None = None
_version = "?"  # the server's version, read when the template is made
_names = itertools.count()
TEMPLATE = f"aioqueue_tpl_{os.getpid()}"


async def _create_template(admin_dsn: str) -> str:
    """Make the migrated template database; return the server's version."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        version = str(await conn.fetchval("SHOW server_version"))
        await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await conn.close()
    tpl = await asyncpg.connect(with_database(admin_dsn, TEMPLATE))
    try:
        await migrate.migrate(tpl, "aioqueue")
    finally:
        await tpl.close()
    return version


async def _drop(admin_dsn: str, names: list[str]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for name in names:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


def server() -> Server:
    assert _server is not None, "the PostgreSQL server was not started"
    return _server


def pytest_configure(config: pytest.Config) -> None:
    global _server, _version
    _server = _stack.enter_context(find_server())
    _version = asyncio.run(_create_template(_server.dsn))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        with contextlib.suppress(Exception):
            asyncio.run(_drop(_server.dsn, [TEMPLATE]))
    _stack.close()


def pytest_report_header(config: pytest.Config) -> str:
    return f"aioqueue tests: PostgreSQL {_version} from {server().source}"


@contextlib.asynccontextmanager
async def fresh_database(prefix: str, template: str | None) -> AsyncIterator[str]:
    """Create a database (a copy of ``template``, or empty), yield its DSN, drop it after."""
    name = f"aioqueue_{prefix}{os.getpid()}_{next(_names)}"
    admin = await asyncpg.connect(server().dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    finally:
        await admin.close()
    try:
        yield with_database(server().dsn, name)
    finally:
        await _drop(server().dsn, [name])


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
