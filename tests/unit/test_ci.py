"""``.ci/run`` runs what the README tells a new user to run, word for word, as a new user runs
it: from a new shell, with no DSN in the environment."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DSN_VARIABLES = {"AIOQUEUE_TEST_DSN", "AIOQUEUE_DSN", "DATABASE_URL"}


def _readme_command(ending: str) -> str:
    """The README's one shell command (in a ``sh`` block) that ends with ``ending``."""
    blocks: list[str] = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    found = [line for block in blocks for line in block.splitlines() if line.rstrip().endswith(ending)]
    assert len(found) == 1, f"the README should show one command ending in {ending!r}, found {found}"
    return found[0].strip()


def _assigned(script: str, name: str) -> str:
    """The value that the shell line ``NAME=...`` in ``script`` gives ``name``."""
    [line] = [line for line in script.splitlines() if line.startswith(f"{name}=")]
    [word] = shlex.split(line.removeprefix(f"{name}="))
    return word


def test_ci_runs_the_readmes_commands_word_for_word_with_no_dsn() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _assigned(ci, "QUICK_START") == _readme_command("python examples/quickstart.py")
    assert _assigned(ci, "TESTS") == _readme_command("python -m pytest")
    [no_dsn] = [line for line in ci.splitlines() if line.startswith("NO_DSN=(")]
    words = shlex.split(no_dsn.removeprefix("NO_DSN=(").removesuffix(")"))
    assert words[0] == "env" and set(words[1::2]) == {"-u"} and set(words[2::2]) == DSN_VARIABLES, no_dsn
    runs = [line for line in ci.splitlines() if re.search(r'bash -c "\$(QUICK_START|TESTS)"', line)]
    assert len(runs) == 2 and all(line.startswith('"${NO_DSN[@]}" ') for line in runs), runs
    # The quick start first, as the README orders them: it makes the venv the tests use.
    assert "$QUICK_START" in runs[0] and "$TESTS" in runs[1]
