"""Who may look and who may act: an authorisation hook or HTTP basic credentials, and CSRF
tokens for every form. Runs on every request before a page or an action; touches no jobs."""

from __future__ import annotations

import base64
import binascii
import hmac
import inspect
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request

from ..errors import ConfigurationError

#: Decides whether ``request`` may do ``action``: ``"view"`` for every page, else the action's
#: name (``retry``, ``cancel``, ``delete``, ``pause``, ``resume``, ``limits``).
Authorizer = Callable[[Request, str], bool | Awaitable[bool]]

USER_ENV = "AIOQUEUE_DASHBOARD_USER"
PASSWORD_ENV = "AIOQUEUE_DASHBOARD_PASSWORD"
CSRF_COOKIE = "aioqueue_csrf"
CSRF_FIELD = "csrf"


def check_credentials(
    value: object, user_name: str = "the user", password_name: str = "the password"
) -> tuple[str, str] | None:
    """Return ``value`` if it is usable HTTP basic credentials, a ``(user, password)`` tuple of
    two non-empty str with no ``:`` in the user (everything after the first ``:`` is the
    password), or None for none; else raise, naming what is wrong (never the password)."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        shape = f"a {len(value)}-item tuple" if isinstance(value, tuple) else f"a {type(value).__name__}"
        raise ConfigurationError(
            f"credentials must be a (user, password) tuple of two non-empty str, or None; got {shape}"
        )
    user, password = value
    if not isinstance(user, str) or not user:
        raise ConfigurationError(f"{user_name} must be a non-empty str, got {user!r}")
    if ":" in user:
        raise ConfigurationError(
            f"{user_name} {user!r} contains ':', which HTTP basic authentication cannot carry in a "
            "user name (everything after the first ':' is the password)"
        )
    if not isinstance(password, str) or not password:
        given = "an empty str" if password == "" else f"a {type(password).__name__}"
        raise ConfigurationError(f"{password_name} must be a non-empty str, got {given}")
    return user, password


def credentials_from_env() -> tuple[str, str] | None:
    """The basic credentials in AIOQUEUE_DASHBOARD_USER/_PASSWORD; None when neither is set."""
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if not user and not password:
        return None
    if not user or not password:
        raise ConfigurationError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
    return check_credentials((user, password), USER_ENV, PASSWORD_ENV)


def basic_user(request: Request, credentials: tuple[str, str]) -> str | None:
    """The user name if the request carries these basic credentials, else None."""
    header = request.headers.get("authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    good_user = hmac.compare_digest(user.encode(), credentials[0].encode())
    good_password = hmac.compare_digest(password.encode(), credentials[1].encode())
    return user if good_user and good_password else None


async def allowed(auth: Authorizer, request: Request, action: str) -> bool:
    """Ask the hook; it may be sync or async."""
    verdict = auth(request, action)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    return verdict is True


def csrf_token(request: Request) -> str:
    """The request's CSRF token (from its cookie), or a new one to set."""
    token = request.cookies.get(CSRF_COOKIE, "")
    return token if len(token) == 43 else secrets.token_urlsafe(32)


def csrf_ok(request: Request, submitted: object) -> bool:
    """A form is genuine when its token equals the cookie's (double submit) and, when the
    browser says where the form came from, it came from this host."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not isinstance(submitted, str) or len(cookie) != 43 or not hmac.compare_digest(cookie, submitted):
        return False
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = request.headers.get("host", "")
        return origin.split("://", 1)[-1] == host
    return True


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses: the only hosts served without credentials."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
