"""Pure helpers shared by the interfaces, with no database: ages as a person reads them (the CLI
and the dashboard), DSNs in messages, and the retry backoff's bounds."""

from __future__ import annotations

import pytest

import aioqueue
from aioqueue._dsn import describe_dsn, with_database
from aioqueue._format import format_age


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"),
    (0, "0.0s"),
    (4.24, "4.2s"),
    (59.9, "59.9s"),
    (60, "1m00s"),
    (725, "12m05s"),
    (3599, "59m59s"),
    (3600, "1h00m"),
    (3 * 3600 + 7 * 60 + 59, "3h07m"),
    (86399, "23h59m"),
    (86400, "1d00h"),
    (2 * 86400 + 4 * 3600 + 1, "2d04h"),
])
def test_format_age(seconds: float | None, shown: str) -> None:
    assert format_age(seconds) == shown


def test_with_database_changes_only_the_database() -> None:
    dsn = "postgresql://u:secret@db.example:6543/app?sslmode=require"
    assert with_database(dsn, "other") == "postgresql://u:secret@db.example:6543/other?sslmode=require"


@pytest.mark.parametrize(("dsn", "described"), [
    ("postgresql://u:secret@db.example:6543/app", "db.example:6543/app"),
    ("postgresql://u@db.example/app", "db.example:5432/app"),
    ("postgresql:///app?host=/run/pg&port=5433", "/run/pg:5433/app"),
    ("postgresql://h", "h:5432/(default database)"),
    (None, "the server named by the PG* environment variables"),
    ("", "the server named by the PG* environment variables"),
    ("postgresql://h:notaport/x", "the server of the given DSN"),
])
def test_describe_dsn_never_shows_the_password(dsn: str | None, described: str) -> None:
    assert describe_dsn(dsn) == described
    assert "secret" not in describe_dsn(dsn)


def test_backoff_bounds_grow_by_the_factor_within_the_jitter_and_stop_at_the_cap() -> None:
    backoff = aioqueue.Backoff(base=1.0, factor=2.0, max_delay=60.0, jitter=0.25)
    assert backoff.bounds(1) == (0.75, 1.25)
    assert backoff.bounds(3) == (3.0, 5.0)
    assert backoff.bounds(10) == (60.0, 60.0)
    assert backoff.bounds(10_000) == (60.0, 60.0)  # no overflow far past the cap


@pytest.mark.parametrize(("option", "value"), [
    ("base", -1.0), ("factor", 0.5), ("factor", 11.0), ("jitter", 1.5), ("max_delay", float("inf")), ("base", "1"),
])
def test_backoff_refuses_a_bad_parameter_naming_it(option: str, value: object) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=f"Backoff.{option}"):
        aioqueue.Backoff(**{option: value})  # type: ignore[arg-type]
