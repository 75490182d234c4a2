"""The SQL function files (``aioqueue/migrations/functions/``): each defines its one function,
no numbered migration restates one, a change to them comes with a new schema version, and
``migrate --sql`` prints them after the numbered migrations. No database."""

from __future__ import annotations

import re

import pytest

from aioqueue import _migrate as migrate

_DEFINES = re.compile(r"^CREATE (OR REPLACE )?FUNCTION \{schema\}\.(\w+)\(", re.M)
_DIGEST = re.compile(r"^-- functions: ([0-9a-f]{64})$", re.M)
_BODY = re.compile(r"\bAS (\$\w*\$)(.*?)\1", re.S)

#: The functions a numbered migration creates as well as its file, because the migration's own
#: statements call them: the columns' defaults of 0012.
CALLED_BY_THEIR_MIGRATION = {12: {"now"}}


def test_each_function_file_defines_its_one_function_by_create_or_replace() -> None:
    files = migrate.functions()
    assert len(files) > 10
    for f in files:
        assert _DEFINES.findall(f.sql) == [("OR REPLACE ", f.name)], f"functions/{f.name}.sql"
        # The digest leaves out lines that begin with "--": none may be inside a body.
        for _, body in _BODY.findall(f.sql):
            assert not re.search(r"^--", body, re.M), f"functions/{f.name}.sql: indent the comments of its body"


def test_no_numbered_migration_defines_a_function_but_those_it_calls() -> None:
    files = {f.name for f in migrate.functions()}
    for m in migrate.migrations():
        defined = {name for _, name in _DEFINES.findall(m.sql)}
        assert defined == CALLED_BY_THEIR_MIGRATION.get(m.version, set()), (
            f"migration {m.version:04d} defines {sorted(defined)}: a function's definition belongs in "
            "aioqueue/migrations/functions/<name>.sql, applied after the numbered migrations"
        )
        assert defined <= files


def test_a_change_to_the_function_files_comes_with_a_new_schema_version() -> None:
    recorded = [(m.version, digest) for m in migrate.migrations() for digest in _DIGEST.findall(m.sql)]
    assert recorded, "no numbered migration records the digest of the function files"
    version, digest = recorded[-1]
    current = migrate.functions_digest()
    assert digest == current, (
        f"aioqueue/migrations/functions/ changed since migration {version:04d} recorded its digest. A "
        "database already at the newest version would keep the old definitions (a migration run applies "
        "the function files only when it applies a numbered migration), and workers would start on it. "
        f"Add aioqueue/migrations/{migrate.latest_version() + 1:04d}_<what changed>.sql: comments alone "
        "will do, saying what changed and why, with the line\n"
        f"-- functions: {current}"
    )


def test_the_digest_follows_the_definitions_not_the_prose_around_them(monkeypatch: pytest.MonkeyPatch) -> None:
    files = migrate.functions()
    first = files[0]

    def digest_with(sql: str) -> str:
        monkeypatch.setattr(migrate, "functions", lambda: (migrate.FunctionFile(first.name, sql), *files[1:]))
        return migrate.functions_digest()

    assert digest_with(first.sql) == migrate.functions_digest()
    assert digest_with("-- Reworded.\n" + first.sql) == digest_with(first.sql)
    assert digest_with(first.sql.replace("BEGIN", "BEGIN\n    NULL;", 1)) != digest_with(first.sql)


def test_the_printed_plan_applies_the_functions_after_the_numbered_migrations() -> None:
    latest = migrate.latest_version()
    plan = migrate.plan_sql("jobs_here", latest - 1)
    last = plan.index(f"INSERT INTO jobs_here.migrations (version, name) VALUES ({latest},")
    for f in migrate.functions():
        assert plan.index(f"CREATE OR REPLACE FUNCTION jobs_here.{f.name}(") > last, f.name
    assert plan.index("SET check_function_bodies = off;") > last
    assert plan.rstrip().endswith("RESET check_function_bodies;")
    assert "{schema}" not in plan
    assert "FUNCTION" not in migrate.plan_sql("jobs_here", latest)  # nothing to run, nothing to apply
