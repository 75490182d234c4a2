"""A real PgBouncer in transaction mode, started by the tests in front of the test server.

It writes its own ini and auth file into a temporary directory, listens on a free local port,
passes every database through to the server (``[databases] * = host=... port=...``), and is
stopped afterwards. PgBouncer refuses to run as root, so as root it runs as ``postgres`` (or
``nobody``). A machine without ``pgbouncer`` fails these tests: ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio

INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,statement_timeout
server_reset_query =
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and no postgres or nobody user to run pgbouncer as")


def via(dsn: str, port: int) -> str:
    """``dsn`` with its host and port replaced by the pooler's."""
    parts = urlsplit(dsn)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def _prepare(server_dsn: str, pool_size: int) -> tuple[Path, int, list[str]]:
    """Write the ini and auth file into a new directory; return it, the port and the command."""
    binary = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
    parts = urlsplit(server_dsn)
    if parts.hostname in (None, "", "localhost") and not parts.port:
        raise RuntimeError(f"the pooler tests need a TCP server DSN, got {server_dsn!r}")
    user = _run_as()
    directory = Path(tempfile.mkdtemp(prefix="aioqueue-pgbouncer-"))
    directory.chmod(0o755)
    port = _free_port()
    (directory / "pgbouncer.ini").write_text(INI.format(
        host=parts.hostname, port=parts.port or 5432, listen_port=port, dir=directory, pool_size=pool_size,
    ))
    (directory / "users.txt").write_text(f'"{parts.username or "postgres"}" ""\n')
    if user is not None:
        shutil.chown(directory, user)
        for f in directory.iterdir():
            shutil.chown(f, user)
    return directory, port, [binary, *(["-u", user] if user else []), str(directory / "pgbouncer.ini")]


def _log(directory: Path) -> str:
    log = directory / "pgbouncer.log"
    return log.read_text() if log.exists() else ""


@contextlib.asynccontextmanager
async def pgbouncer(server_dsn: str, pool_size: int = 5, timeout: float = 15.0) -> AsyncIterator[int]:
    """Run PgBouncer (transaction mode) in front of ``server_dsn``'s server; yield its port."""
    directory, port, command = _prepare(server_dsn, pool_size)
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(timeout):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"pgbouncer exited with {process.returncode}: {_log(directory)}")
                with contextlib.suppress(OSError):
                    stream = await anyio.connect_tcp("127.0.0.1", port)
                    await stream.aclose()
                    break
                await anyio.sleep(0.02)
        yield port
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            await process.aclose()
            shutil.rmtree(directory, ignore_errors=True)
