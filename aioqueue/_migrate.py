"""Create and upgrade the aioqueue schema from the SQL files in ``migrations/``.

Each numbered file ``NNNN_name.sql`` is one version: tables, indexes, data moves, forward only.
Each file of ``migrations/functions/`` is the current definition of one SQL function
(``CREATE OR REPLACE``), re-applied, every one, by a run that applies a numbered version and
reaches the newest: after the numbered files, in the same transaction, under the same advisory
lock, with function bodies checked only when called (as ``pg_dump`` restores them), since a
body may name a function of a file applied after it. ``migrate`` applies the missing versions
in order, so several processes may migrate at once and every one of them returns with the
schema at the newest version. It never drops data.

A run that stops below the newest version (``to=``, a step of the rolling-upgrade tests) applies
numbered files only and leaves the functions as they were: a function file is written for the
newest tables. So no numbered file drops a function that running workers call; a function
file drops the signature it replaces, just before creating the new one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
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

    @property
    def has_statements(self) -> bool:
        """False for a file of comments alone (a version whose change is in function files)."""
        return any(line.strip() and not line.lstrip().startswith("--") for line in self.sql.splitlines())


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


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionFile:
    """The current definition of one SQL function, named as its file."""

    name: str
    sql: str

    def render(self, schema: str) -> str:
        """Return this definition's SQL for ``schema``."""
        return self.sql.replace("{schema}", validate_schema(schema))


@functools.cache
def functions() -> tuple[FunctionFile, ...]:
    """Every function file shipped with this version of aioqueue, by name."""
    folder = resources.files(__package__).joinpath("migrations", "functions")
    found = [FunctionFile(entry.name.removesuffix(".sql"), entry.read_text("utf-8"))
             for entry in folder.iterdir() if entry.name.endswith(".sql")]
    return tuple(sorted(found, key=lambda f: f.name))


def functions_digest() -> str:
    """The SHA-256 of the function files as the database gets them: each file's name and its
    lines but those that begin with ``--`` (the files' prose, which the database does not keep;
    a comment inside a body is indented). The numbered migration that comes with a change to
    the functions records it in a line ``-- functions: <digest>``."""
    digest = hashlib.sha256()
    for f in functions():
        kept = "\n".join(line for line in f.sql.splitlines() if not line.startswith("--"))
        digest.update(f"{f.name}\0{kept}\0".encode())
    return digest.hexdigest()


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
    """Return the SQL that migrating from version ``applied`` would run, as one script: the
    numbered migrations it lacks, then, if there are any, every function file."""
    validate_schema(schema)
    parts = [_preamble(schema)]
    for m in migrations():
        if m.version > applied:
            parts.append(f"-- {m.version:04d}_{m.name}\n{m.render(schema)}")
            # A script to read and run by hand: the values are this package's own constants.
            parts.append(f"INSERT INTO {schema}.migrations (version, name) VALUES ({m.version}, '{m.name}');")
    if applied < latest_version():
        parts.append("-- functions: the current definitions (migrations/functions/), bodies checked when called\n"
                     "SET check_function_bodies = off;")
        parts.extend(f"-- functions/{f.name}.sql\n{f.render(schema)}" for f in functions())
        parts.append("RESET check_function_bodies;")
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
    """One try, in one transaction: the numbered migrations after the schema's version up to
    ``to``, then, if it applied any and reached the newest, every function file."""
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
            if m.has_statements:
                await conn.execute(m.render(schema))
            await conn.execute(q.record_migration, m.version, m.name)
            applied.append(m.version)
        if applied and to >= latest_version():
            await conn.execute(q.function_checks, "off")
            for f in functions():
                await conn.execute(f.render(schema))
            await conn.execute(q.function_checks, "on")
    return applied
