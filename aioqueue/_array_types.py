"""The array types of PostgreSQL's own that aioqueue's statements send and read, made known to
each connection of the pools aioqueue opens as the connection opens, with no round trip.

asyncpg knows only ``text[]`` and ``oid[]`` by itself: the first statement on a connection
that binds or returns any other array (the claim's wanted counts, the finishing writes' ids and
attempts) waits for a catalog query that describes the type, a query the new backend plans cold.
Those types are built into every PostgreSQL at the same fixed oids, so the description is
handed to the connection instead. Nothing here talks to the database.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

logger = logging.getLogger("aioqueue.database")

#: Array type oid: (its name in pg_type, its element type's oid). Fixed in PostgreSQL's
#: catalog (pg_type.dat) since long before the oldest server aioqueue supports.
BUILTIN_ARRAYS: dict[int, tuple[str, int]] = {
    1000: ("_bool", 16),
    1005: ("_int2", 21),
    1007: ("_int4", 23),
    1016: ("_int8", 20),
    1021: ("_float4", 700),
    1022: ("_float8", 701),
    1185: ("_timestamptz", 1184),
    2951: ("_uuid", 2950),
    3807: ("_jsonb", 3802),
}


#: The types as asyncpg's type introspection would describe them (the fields it reads), built
#: once: asyncpg only reads them.
_TYPE_ROWS: list[dict[str, Any]] = [
    {"oid": oid, "ns": "pg_catalog", "name": name, "kind": b"b", "basetype": None, "elemtype": elem,
     "elemdelim": ",", "range_subtype": None, "attrtypoids": None, "attrnames": None, "depth": 0,
     "basetype_name": None, "elemtype_name": None, "range_subtype_name": None}
    for oid, (name, elem) in BUILTIN_ARRAYS.items()
]


def declare(conn: asyncpg.Connection) -> bool:
    """Make the :data:`BUILTIN_ARRAYS` known to ``conn``; return whether that worked. It goes
    through asyncpg's codec settings, which its API does not name: should they change, the
    connection is left as it was and asyncpg describes the types itself, as it always could."""
    try:
        conn._protocol.get_settings().register_data_types(_TYPE_ROWS)  # type: ignore[attr-defined]
    except Exception as exc:
        logger.debug("could not declare the built-in array types (%s: %s)", type(exc).__name__, exc)
        return False
    return True


async def declare_on_connect(conn: asyncpg.Connection) -> None:
    """A pool's ``init`` hook: :func:`declare` on each new connection."""
    declare(conn)
