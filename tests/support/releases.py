"""Earlier releases of the package, taken from git history: the upgrade tests run their
workers and apply their migrations."""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def old_release(version: int, into: Path) -> Path:
    """Extract the package as it was when ``version`` was its newest migration; return where.

    Along main's first parent, so a migration that arrived in a merge is found at that merge."""
    nxt = f"aioqueue/migrations/{version + 1:04d}_*.sql"
    added = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--first-parent", "-m", "--diff-filter=A", "--format=%H", "--", nxt],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    if not added:
        raise RuntimeError(f"no git history of {nxt}: the upgrade tests need the repository's history")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", f"{added[-1]}^", "aioqueue"], capture_output=True, check=True
    ).stdout
    target = into / f"release_{version}"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target
