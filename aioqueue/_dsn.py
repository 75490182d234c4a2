"""DSN helpers: point a PostgreSQL DSN at another database, and describe a DSN for messages
without its password. Pure string work: nothing here connects to a server."""

from __future__ import annotations

import urllib.parse

__all__ = ["describe_dsn", "with_database"]


def with_database(dsn: str, database: str) -> str:
    """Return ``dsn`` pointing at ``database`` instead (same server, user and options)."""
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def describe_dsn(dsn: str | None) -> str:
    """Return ``host:port/database`` of a DSN for error messages, without the password."""
    if not dsn:
        return "the server named by the PG* environment variables"
    try:
        parts = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(parts.query)
        host = parts.hostname or query.get("host", ["localhost"])[0]
        port = parts.port or query.get("port", [5432])[0]
        database = parts.path.lstrip("/") or "(default database)"
    except ValueError:
        return "the server of the given DSN"
    return f"{host}:{port}/{database}"
