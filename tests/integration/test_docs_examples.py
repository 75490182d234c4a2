"""Every code block in the README and the documentation runs here, so a changed API breaks a test,
not a reader.

Each page's ``python`` and ``sql`` blocks run in order, in one namespace, against a fresh
migrated database named by ``AIOQUEUE_DSN`` (``await`` allowed at the top level, as in an async
REPL); hidden ``test:`` comments add set-up and checks (see ``docs_blocks.py``). ``sh`` blocks are
commands: each line must name something that exists (``aioqueue ...`` parses with the command's
own parser, ``pip install`` names real extras, a script or module named must be there). ``yaml``
and ``ini`` blocks are parsed, and PgBouncer's settings are loaded into a real PgBouncer. A block
in any other language fails the count test, and so does a block neither run nor marked.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import psycopg
import pytest
import yaml

import aioqueue
from aioqueue.cli import build_parser
from tests.support.docs_blocks import CHECK, OUTPUT, ROOT, RUN, Block, blocks, examples, pages

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _pages_with(langs: frozenset[str]) -> list[Any]:
    return [pytest.param(p, id=_rel(p)) for p in pages() if any(b.lang in langs and not b.skip for b in blocks(p))]


# -- the count: every block is run, checked, or output ----------------------------------------


def test_every_block_is_run_or_checked() -> None:
    found = examples()
    unknown = [f"{b.where}: ```{b.lang or '(no language)'}" for b in found if b.lang not in RUN | CHECK | OUTPUT]
    assert not unknown, (
        "blocks in a language no test runs (use python, sql, sh, yaml, ini, or text for output):\n"
        + "\n".join(unknown)
    )
    unexplained = [b.where for b in found if b.skip is not None and not b.skip.strip()]
    assert not unexplained, f"skipped without a reason: {unexplained}"
    code = [b for b in found if b.lang in RUN | CHECK]
    skipped = [b for b in code if b.skip]
    counts = Counter(b.lang for b in code if not b.skip)
    print(f"\n{len(code)} code blocks in {len(pages())} pages: {len(code) - len(skipped)} run or checked "
          f"({', '.join(f'{n} {lang}' for lang, n in sorted(counts.items()))}), {len(skipped)} marked not run")
    assert len(code) >= 80, "the pages lost their examples (or the collector stopped finding them)"
    assert not skipped, "every example should run: " + ", ".join(f"{b.where} ({b.skip})" for b in skipped)


# -- python and sql: run against the page's own database --------------------------------------


async def _close_what_is_open(namespace: dict[str, Any]) -> None:
    """Close the queues, pools and engines a page left open (a reader's process would exit)."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    for value in list(namespace.values()):
        with contextlib.suppress(Exception):
            if isinstance(value, aioqueue.Queue):
                await value.close()
            elif isinstance(value, AsyncEngine):
                await value.dispose()
            elif isinstance(value, asyncpg.Pool):
                await value.close()


async def run_block(block: Block, namespace: dict[str, Any], dsn: str) -> None:
    """Run one python or sql block in the page's namespace."""
    if block.lang == "sql":
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(block.code)
        finally:
            await conn.close()
        return
    source = "\n" * (block.line) + block.code  # tracebacks point at the page's own lines
    code = compile(source, str(block.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    if code.co_flags & inspect.CO_COROUTINE:
        await eval(code, namespace)
    else:
        exec(code, namespace)


@pytest.mark.parametrize("page", _pages_with(RUN))
async def test_page_examples_run(page: Path, dsn: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIOQUEUE_DSN", dsn)
    monkeypatch.chdir(tmp_path)  # files a page writes land here
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    ran = 0
    todo = [b for b in blocks(page) if b.lang in RUN and not b.skip]
    try:
        with anyio.fail_after(120):
            for block in todo:
                try:
                    await run_block(block, namespace, dsn)
                except Exception as exc:
                    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(page)]
                    line = f"{_rel(page)}:{lines[-1]}" if lines else block.where
                    raise AssertionError(f"{line}: the {block.lang} block failed: {exc!r}") from exc
                ran += 1
    finally:
        with anyio.CancelScope(shield=True):
            await _close_what_is_open(namespace)
    assert ran == len(todo)


# -- sh: commands a reader types ------------------------------------------------------------


def _commands(code: str) -> list[list[str]]:
    """Each command of a shell block: continuation lines joined, comments dropped, split at
    ``&&``, leading ``NAME=value`` assignments removed."""
    out: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word != "&&":
                command.append(word)
                continue
            while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", command[0]):
                command.pop(0)
            if command:
                out.append(command)
            command = []
    return out


def _parse_aioqueue(args: list[str], where: str) -> None:
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code != 0:  # --help and --version exit 0
            raise AssertionError(f"{where}: `aioqueue {shlex.join(args)}` does not parse") from exc


def _check_pip(args: list[str], where: str) -> None:
    assert args[:1] == ["install"], f"{where}: pip {args}"
    for arg in args[1:]:
        if arg.startswith("-"):
            continue
        name, _, extras = arg.partition("[")
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in EXTRAS, f"{where}: pip install names the extra {extra!r}, which pyproject.toml lacks"
        if name not in (".", "aioqueue"):
            assert importlib.util.find_spec(name.replace("-", "_")) is not None, f"{where}: {name} is not installed"


def _check_python(args: list[str], where: str) -> None:
    if args[:2] == ["-m", "pytest"]:
        for arg in args[2:]:
            if not arg.startswith("-") and "/" in arg:
                assert (ROOT / arg.split("::")[0]).exists(), f"{where}: no {arg}"
        return
    if args[:2] == ["-m", "aioqueue"]:
        _parse_aioqueue(args[2:], where)
        return
    if args[:2] == ["-m", "venv"]:
        return
    if args[:2] == ["-m", "sphinx"]:
        assert (ROOT / "docs" / "conf.py").exists()
        return
    script = ROOT / args[0]
    assert script.exists(), f"{where}: no {args[0]}"
    if args[0] == "benchmarks/bench.py":
        bench = _import_bench()
        if args[1:2] == ["report"]:
            return
        try:
            bench.parse_args(args[1:])
        except SystemExit as exc:
            raise AssertionError(f"{where}: `bench.py {shlex.join(args[1:])}` does not parse") from exc


def _import_bench() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("bench")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _check_curl(args: list[str], where: str, app: Any) -> None:
    assert app is not None, f"{where}: curl with no app started above it in the block"
    method = args[args.index("-X") + 1] if "-X" in args else "GET"
    url = next(a for a in args if "localhost" in a or "127.0.0.1" in a)
    path = "/" + url.split("/", 1)[1] if "/" in url else "/"
    for route in app.routes:
        if getattr(route, "path_regex", None) and route.path_regex.match(path) and method in route.methods:
            return
    raise AssertionError(f"{where}: {method} {path} is not a route of the app")


def _app(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def check_commands(block: Block) -> int:
    """Check every command of a shell block; return how many."""
    app = None
    commands = _commands(block.code)
    for words in commands:
        tool, args, where = words[0], words[1:], block.where
        if tool in ("python", "python3"):
            _check_python(args, where)
        elif tool == "aioqueue":
            _parse_aioqueue(args, where)
        elif tool == "pip":
            _check_pip(args, where)
        elif tool in (".", "source"):
            assert args == [".venv/bin/activate"], f"{where}: {words}"
        elif tool == "bash":
            assert (ROOT / args[0]).exists(), f"{where}: no {args[0]}"
        elif tool in ("ruff", "mypy"):
            assert shutil.which(tool), f"{where}: {tool} is not installed"
        elif tool == "git":  # a checkout of another commit beside this one, to measure both
            assert args[:2] == ["worktree", "add"] and shutil.which("git"), f"{where}: {words}"
        elif tool == "uvicorn":
            app = _app(args[0])
        elif tool == "curl":
            _check_curl(args, where, app)
        else:
            raise AssertionError(f"{where}: no check for the command {tool!r}: teach test_docs_examples.py")
    return len(commands)


@pytest.mark.parametrize("page", _pages_with(frozenset({"sh"})))
def test_page_commands_name_what_exists(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("AIOQUEUE_DSN", os.environ.get("AIOQUEUE_DSN", "postgresql://localhost/docs"))
    for block in blocks(page):
        if block.lang == "sh" and not block.skip:
            assert check_commands(block) > 0, f"{block.where}: an empty shell block"


# -- yaml and ini: configuration ------------------------------------------------------------


@pytest.mark.parametrize("page", _pages_with(frozenset({"yaml"})))
def test_yaml_blocks_load_and_their_commands_parse(page: Path) -> None:
    for block in blocks(page):
        if block.lang != "yaml" or block.skip:
            continue
        data = yaml.safe_load(block.code)
        commands = list(_find_commands(data))
        assert commands, f"{block.where}: a manifest with no aioqueue command"
        for command in commands:
            _parse_aioqueue([re.sub(r"\$\((\w+)\)", r"postgresql://\1", w) for w in command[1:]], block.where)


def _find_commands(data: Any) -> Any:
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "command" and isinstance(value, list) and value[:1] == ["aioqueue"]:
                yield value
            else:
                yield from _find_commands(value)
    elif isinstance(data, list):
        for item in data:
            yield from _find_commands(item)


@pytest.mark.parametrize("page", _pages_with(frozenset({"ini"})))
async def test_pgbouncer_settings_load_into_a_real_pgbouncer(page: Path) -> None:
    """PgBouncer's ``SHOW CONFIG`` must hold every setting of the block, with its value."""
    from tests.support import pooler_tools
    from tests.support.pg import server

    for block in blocks(page):
        if block.lang != "ini" or block.skip:
            continue
        parser = configparser.ConfigParser(inline_comment_prefixes=(";",))
        parser.read_string(block.code)
        settings = dict(parser["pgbouncer"])
        assert settings, f"{block.where}: no [pgbouncer] settings"
        # Not pytest's tmp_path: PgBouncer runs as another user, who cannot enter it.
        directory = Path(tempfile.mkdtemp(prefix="aioqueue-docs-pgbouncer-"))
        try:
            config = await _pgbouncer_config(settings, server().dsn, directory, pooler_tools)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        for key, value in settings.items():
            assert key in config, f"{block.where}: PgBouncer has no setting {key!r}"
            assert config[key] == value, f"{block.where}: {key} = {value} reads back as {config[key]!r}"


async def _pgbouncer_config(settings: dict[str, str], server_dsn: str, directory: Path, tools: Any) -> dict[str, str]:
    """Start PgBouncer with ``settings`` (and what it needs to listen locally), return its
    ``SHOW CONFIG``."""
    command, port, user = _pgbouncer_files(settings, server_dsn, directory, tools)
    process = await anyio.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(15):
            while True:
                with contextlib.suppress(psycopg.OperationalError):
                    return await anyio.to_thread.run_sync(_show_config, port, user)
                assert process.returncode is None, (directory / "pgbouncer.log").read_text()
                await anyio.sleep(0.05)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
            await process.wait()
            await process.aclose()


def _pgbouncer_files(
    settings: dict[str, str], server_dsn: str, directory: Path, tools: Any
) -> tuple[list[str], int, str]:
    """Write PgBouncer's ini (``settings`` plus a local listener and trust auth) and auth file;
    return its command line, port and user."""
    from urllib.parse import urlsplit

    parts = urlsplit(server_dsn)
    port = tools._free_port()
    user = parts.username or "postgres"
    local = {
        "listen_addr": "127.0.0.1", "listen_port": str(port), "unix_socket_dir": "", "auth_type": "trust",
        "auth_file": f"{directory}/users.txt", "admin_users": user, "logfile": f"{directory}/pgbouncer.log",
        "pidfile": f"{directory}/pgbouncer.pid",
    }
    ini = f"[databases]\n* = host={parts.hostname} port={parts.port or 5432}\n\n[pgbouncer]\n"
    ini += "".join(f"{k} = {v}\n" for k, v in {**settings, **local}.items())
    (directory / "pgbouncer.ini").write_text(ini)
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    run_as = tools._run_as()
    if run_as is not None:  # PgBouncer refuses to run as root
        directory.chmod(0o755)
        for path in (directory, *directory.iterdir()):
            shutil.chown(path, run_as)
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    return [binary, *(["-u", run_as] if run_as else []), str(directory / "pgbouncer.ini")], port, user


def _show_config(port: int, user: str) -> dict[str, str]:
    """PgBouncer's admin console speaks only the simple query protocol: a client-side cursor."""
    with psycopg.connect(host="127.0.0.1", port=port, user=user, dbname="pgbouncer", autocommit=True,
                         cursor_factory=psycopg.ClientCursor, connect_timeout=2) as conn:
        return {row[0]: row[1] for row in conn.execute("SHOW CONFIG").fetchall()}


# -- the reference pages name everything there is --------------------------------------------


def test_the_api_reference_documents_every_public_name() -> None:
    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    documented = set(re.findall(r"\.\. auto(?:class|function|exception):: aioqueue\.(\w+)\b", page))
    missing = set(aioqueue.__all__) - documented - {"__version__"}
    assert not missing, f"docs/reference/api.md lacks {sorted(missing)}"
    assert "__version__" in page


def test_the_options_reference_lists_every_option() -> None:
    from aioqueue._task import Task

    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)`", page, re.M)) | set(re.findall(r"^\| `\w+` / `(\w+)`", page, re.M))
    expected = {
        "worker": set(aioqueue.WorkerOptions.__annotations__),
        "enqueue": set(inspect.signature(Task.options).parameters) - {"self"},
        "task": set(inspect.signature(aioqueue.Queue.task).parameters) - {"self", "fn"},
        "queue": set(inspect.signature(aioqueue.Queue).parameters),
    }
    for kind, names in expected.items():
        assert names <= rows, f"docs/reference/options.md: {kind} options missing: {sorted(names - rows)}"


async def test_the_schema_reference_names_every_table_column_index_and_function(db: asyncpg.Connection) -> None:
    page = (ROOT / "docs" / "reference" / "schema.md").read_text()
    named = set(re.findall(r"`(\w+)", page))
    # Partitions are the archive's, named on the page, except the days (jobs_done_YYYYMMDD) and
    # their indexes, whose names change with the date.
    tables = await db.fetch(
        "SELECT c.relname, array_agg(a.attname::text) AS columns FROM pg_class c "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE c.relnamespace = 'aioqueue'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "GROUP BY c.relname"
    )
    others = await db.fetch(
        "SELECT relname AS name FROM pg_class WHERE relnamespace = 'aioqueue'::regnamespace "
        "AND (relkind IN ('i', 'I') OR relispartition) AND relname !~ '^jobs_done_[0-9]{8}' "
        "UNION SELECT proname FROM pg_proc WHERE pronamespace = 'aioqueue'::regnamespace "
        "UNION SELECT conname FROM pg_constraint WHERE connamespace = 'aioqueue'::regnamespace AND contype = 'c'"
    )
    missing = {r["relname"] for r in tables} - named
    missing |= {f"{r['relname']}.{c}" for r in tables for c in r["columns"] if c not in named}
    missing |= {r["name"] for r in others if r["name"] not in named}
    assert not missing, f"docs/reference/schema.md does not name {sorted(missing)}"
    tables_on_page = set(re.findall(r"^\| `(\w+)` \|", page.split("## Indexes")[0], re.M))
    assert tables_on_page == {r["relname"] for r in tables}, "the page's tables are not the schema's"
