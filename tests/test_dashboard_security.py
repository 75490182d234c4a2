"""What the dashboard refuses at its doors, over HTTP against a real database: credentials that
cannot work. Every refusal names what was wrong and changes nothing."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import aioqueue
from aioqueue.dashboard import create_app

from .cli_tools import aioqueue_cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- credentials ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("credentials", "why"), [
    ("ops:pw", "tuple"),
    (("ops", ""), "password"),
    (("", ""), "user"),
    (("ops", None), "password"),
    ((None, "pw"), "user"),
    (("a:b", "pw"), "':'"),
    (("ops",), "tuple"),
    (("ops", "pw", "x"), "tuple"),
    ((b"ops", b"pw"), "user"),
    (["ops", "pw"], "tuple"),
])
async def test_credentials_that_cannot_work_are_refused_at_create_app(
    q: aioqueue.Queue, credentials: Any, why: str
) -> None:
    with pytest.raises(aioqueue.ConfigurationError, match=why):
        create_app(q, credentials=credentials)


async def test_credentials_from_the_environment_are_checked_too(
    q: aioqueue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_USER", "ops:admin")
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_PASSWORD", "pw")
    with pytest.raises(aioqueue.ConfigurationError, match="AIOQUEUE_DASHBOARD_USER"):
        create_app(q)


async def test_the_command_refuses_unusable_credentials_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before it loads anything or connects: the DSN here leads nowhere."""
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_USER", "ops:admin")
    monkeypatch.setenv("AIOQUEUE_DASHBOARD_PASSWORD", "pw")
    status, _out, err = await aioqueue_cli(
        "dashboard", "--port", str(free_port()), dsn="postgresql://nobody@127.0.0.1:1/none")
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("aioqueue: error: ") and "AIOQUEUE_DASHBOARD_USER" in err
    assert "':'" in err
