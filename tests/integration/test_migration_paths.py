"""Fresh installs and upgrades end with one schema, and the SQL functions are defined once.

The numbered migrations of releases before 0027 restated whole SQL functions; each function's
current definition is now a file of ``aioqueue/migrations/functions/``, re-applied by every
migration run that reaches the newest version, and the numbered files keep only tables, indexes
and data moves. A database that ran the old numbered files never runs them again, so the test
below takes each older release's migrations from git history (as test_upgrades.py does), applies
them as that release did, upgrades with this code, and compares the result with a fresh install:
the same functions (``pg_get_functiondef`` and comment of each), tables, columns, constraints
and indexes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from aioqueue import _migrate as migrate
from aioqueue._queries import for_schema
from tests.support.releases import old_release

# A day partition of the archive is named, and bounded, by the day it was made on.
_DAY = re.compile(r"\d{4}-?\d{2}-?\d{2}[ T\d:+.-]*")


async def _state(conn: asyncpg.Connection, schema: str = "aioqueue") -> dict[str, Any]:
    """What of ``schema`` a migration makes: functions, relations, columns, constraints, indexes."""
    async def rows(sql: str) -> list[tuple[Any, ...]]:
        return sorted(tuple(_DAY.sub("<day>", v) if isinstance(v, str) else v for v in r)
                      for r in await conn.fetch(sql, schema))

    return {
        "functions": await rows(
            "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc') "
            "FROM pg_proc AS p WHERE p.pronamespace = $1::regnamespace"),
        "relations": await rows(
            "SELECT c.relname, c.relkind::text, c.reloptions::text, pg_get_expr(c.relpartbound, c.oid), "
            "obj_description(c.oid, 'pg_class') FROM pg_class AS c WHERE c.relnamespace = $1::regnamespace"),
        "columns": await rows(
            "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.attidentity::text, a.attcollation::regcollation::text, pg_get_expr(d.adbin, d.adrelid) "
            "FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid "
            "LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE c.relnamespace = $1::regnamespace AND a.attnum > 0 AND NOT a.attisdropped"),
        "constraints": await rows(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) "
            "FROM pg_constraint AS c WHERE c.connamespace = $1::regnamespace"),
        "indexes": await rows("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1"),
        "versions": sorted(tuple(r) for r in await conn.fetch(f"SELECT version, name FROM {schema}.migrations")),
    }


@pytest.mark.parametrize("old_version", range(1, migrate.latest_version()))
async def test_an_upgrade_from_each_release_ends_as_a_fresh_install(
    dsn: str, empty_dsn: str, tmp_path: Path, old_version: int
) -> None:
    code = await anyio.to_thread.run_sync(old_release, old_version, tmp_path)
    files = sorted((code / "aioqueue" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert [int(p.name[:4]) for p in files] == list(range(1, old_version + 1))
    q = for_schema("aioqueue")
    upgraded = await asyncpg.connect(empty_dsn)
    fresh = await asyncpg.connect(dsn)  # cloned from the template this code migrated
    try:
        async with upgraded.transaction():  # as that release's migrate ran them
            await upgraded.execute(q.create_schema)
            await upgraded.execute(q.create_migrations_table)
            for path in files:
                m = migrate.Migration(int(path.name[:4]), path.stem[5:], path.read_text("utf-8"))
                if m.has_statements:  # a file of comments alone (0026 on) runs nothing
                    await upgraded.execute(m.render("aioqueue"))
                await upgraded.execute(q.record_migration, m.version, m.name)
        later = list(range(old_version + 1, migrate.latest_version() + 1))
        assert await migrate.migrate(upgraded, "aioqueue") == later
        before, after = await _state(fresh), await _state(upgraded)
        for part in before:
            assert after[part] == before[part], part
    finally:
        await fresh.close()
        await upgraded.close()


async def test_a_run_below_the_newest_version_leaves_the_functions_and_the_next_applies_them(
    empty_dsn: str,
) -> None:
    conn = await asyncpg.connect(empty_dsn)
    try:
        latest = migrate.latest_version()
        defined = ("SELECT array_agg(proname::text ORDER BY proname) FROM pg_proc "
                   "WHERE pronamespace = 'aioqueue'::regnamespace")
        assert await migrate.migrate(conn, "aioqueue", to=latest - 1) == list(range(1, latest))
        # Only the one a numbered migration calls itself: the columns' defaults of 0012.
        assert await conn.fetchval(defined) == ["now"]
        assert await migrate.migrate(conn, "aioqueue") == [latest]
        assert await conn.fetchval(defined) == sorted(f.name for f in migrate.functions())
        # Up to date, a run applies nothing, functions included: a test's moved clock stays moved.
        await conn.execute("CREATE OR REPLACE FUNCTION aioqueue.now() RETURNS timestamptz LANGUAGE sql STABLE "
                           "AS $$SELECT pg_catalog.now() + interval '1 day'$$")
        assert await migrate.migrate(conn, "aioqueue") == []
        assert await conn.fetchval("SELECT aioqueue.now() - now()") == await conn.fetchval("SELECT interval '1 day'")
    finally:
        await conn.close()


async def test_every_function_body_checks_against_the_newest_schema(dsn: str) -> None:
    """migrate applies the files with bodies unchecked (a body may call a function of a file
    applied after it); once all exist, each must pass PostgreSQL's check at creation."""
    conn = await asyncpg.connect(dsn)
    try:
        tr = conn.transaction()
        await tr.start()
        try:
            await conn.execute("SET LOCAL check_function_bodies = on")
            for f in migrate.functions():
                await conn.execute(f.render("aioqueue"))
        finally:
            await tr.rollback()
    finally:
        await conn.close()
