"""The warm-up of a pool aioqueue has just opened: its connection made ready for a worker's first
statements, before any job waits for them.

A fresh server session plans a statement the first time it runs it and keeps the plan of a
PL/pgSQL function for the session; asyncpg prepares a statement the first time a connection
sends it, one round trip more. A worker's first statements are the schema check and the claim:
cold, the first claim of a burst took 5 to 6 ms for ten rows (2.9 ms of the server's time, 0.7
warm), and every job of the burst waited for it. So when a queue opens its pool, the schema
check and the claim run once on the connection it opened, reading and claiming nothing (no
queue, no row), while nothing waits for them: one round trip each, at open. A failure (no schema
yet, a server that refuses) is left to the worker's own first statements, which report it.
"""

from __future__ import annotations

import logging

import asyncpg

from ._statements import Statements

logger = logging.getLogger("aioqueue.database")


async def warm_up(pool: asyncpg.Pool, statements: Statements) -> None:
    """Run a worker's first statements once, on no queue, on a connection of ``pool``."""
    claim = statements.claim(
        queues=[], wants=[], worker="", lease=1.0, limit=0, commit_mode=None, limited=False, timed=True
    )
    try:
        async with pool.acquire() as conn:
            await conn.fetch(statements.queries.limited_queues_at_version, [])
            await conn.fetch(claim.sql, *claim.args)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        logger.debug("warming up the pool's connection failed (%s: %s)", type(exc).__name__, exc)
