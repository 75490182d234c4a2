"""Django's default database connection pointed at a given DSN: Django is configured once per
process (its settings cannot change after), and each caller's DSN replaces the connection's
settings. Shared by the tests of enqueue and publish through Django and the benchmark's Django
path (the tests' ``django_db`` fixture is in ``tests/conftest.py``)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

_lock = threading.Lock()


def django_connection(dsn: str) -> Any:
    """Django's default connection, on ``dsn`` (call in a thread with no event loop: Django's
    synchronous connection refuses to be used from one)."""
    import django
    from django.conf import settings

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname"),
        "USER": params.get("user", "postgres"),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", "127.0.0.1"),
        "PORT": str(params.get("port", "5432")),
    }
    with _lock:
        if not settings.configured:
            settings.configure(DATABASES={"default": database}, INSTALLED_APPS=[], USE_TZ=True)
            django.setup()
    from django.db import connection, connections

    connection.close()
    connections.settings["default"].update(database)
    return connection

