"""Create and upgrade the aioqueue schema from the numbered SQL files in ``migrations/``.

Each file ``NNNN_name.sql`` is one version. ``migrate`` applies the missing ones in order, all
in one transaction under an advisory lock, so several processes may migrate at once and every
one of them returns with the schema at the newest version. It never drops data.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from importlib import resources

import anyio
import asyncpg

from ._job import Connection
from ._queries import for_schema, validate_schema

_FILE = re.compile(r"(\d{4})_(\w+)\.sql")


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema change."""

    version: int
    name: str
    sql: str

    def render(self, schema: str) -> str:
        """Return this migration's SQL for ``schema``."""
        return self.sql.replace("{schema}", validate_schema(schema))


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this version of aioqueue, oldest first."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"aioqueue migrations are not numbered 1..n: {versions}")
    return tuple(found)


def latest_version() -> int:
    """The schema version this code needs."""
    return migrations()[-1].version


def _lock_key(schema: str) -> int:
    # A stable 32-bit key per schema, so migrations of different schemas do not wait on each other.
    return zlib.crc32(f"aioqueue.migrate.{schema}".encode())


def _preamble(schema: str) -> str:
    q = for_schema(schema)
    return f"{q.create_schema};\n{q.create_migrations_table};"


def plan_sql(schema: str, applied: int = 0) -> str:
    """Return the SQL that migrating from version ``applied`` would run, as one script."""
    validate_schema(schema)
    parts = [_preamble(schema)]
    for m in migrations():
        if m.version > applied:
            parts.append(f"-- {m.version:04d}_{m.name}\n{m.render(schema)}")
            # A script to read and run by hand: the values are this package's own constants.
            parts.append(f"INSERT INTO {schema}.migrations (version, name) VALUES ({m.version}, '{m.name}');")
    return "\n\n".join(parts) + "\n"


async def applied_version(conn: Connection, schema: str) -> int:
    """Return the schema's version, 0 when it has never been migrated. Outside a transaction
    that is one statement (a worker's first, before its first claim), its missing table the
    rare answer 0; inside one, whose error would abort it, the table is looked up first."""
    q = for_schema(schema)
    if not conn.is_in_transaction():
        try:
            return int(await conn.fetchval(q.schema_version))
        except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
            return 0
    if not await conn.fetchval(q.schema_exists, f"{schema}.migrations"):
        return 0
    return int(await conn.fetchval(q.schema_version))


# A migration takes its tables' locks in its own order (an ALTER of jobs, then of queues) while
# running workers of the release before take them in theirs (a claim reads a queue's settings,
# then jobs): the server breaks such a cycle by failing one side with a deadlock error. The whole
# migration is one transaction, so the failed try changed nothing and is simply run again.
_DEADLOCK_TRIES = 5


async def migrate(conn: Connection, schema: str, *, to: int | None = None) -> list[int]:
    """Bring ``schema`` to the newest version (or to version ``to``); return the versions this call
    applied. A try that a deadlock with running workers rolled back is tried again."""
    for attempt in range(1, _DEADLOCK_TRIES + 1):
        try:
            return await _migrate_once(conn, schema, latest_version() if to is None else to)
        except asyncpg.DeadlockDetectedError:
            if attempt == _DEADLOCK_TRIES:
                raise
            await anyio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


async def _migrate_once(conn: Connection, schema: str, to: int) -> list[int]:
    q = for_schema(schema)
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute(q.migration_lock, _lock_key(schema))
        await conn.execute(q.create_schema)
        await conn.execute(q.create_migrations_table)
        current = await applied_version(conn, schema)
        for m in migrations():
            if m.version <= current or m.version > to:
                continue
            await conn.execute(m.render(schema))
            await conn.execute(q.record_migration, m.version, m.name)
            applied.append(m.version)
    return applied
