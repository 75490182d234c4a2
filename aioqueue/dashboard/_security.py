"""Who may look and who may act: the host names a dashboard answers, an authorisation hook or
HTTP basic credentials, and the origin and CSRF token of every form. Runs on every request
before a page or an action; touches no jobs.

A dashboard with neither hook nor credentials answers only localhost and loopback addresses on
the port it is served on, so a page whose own name is made to resolve to 127.0.0.1 (DNS rebinding) can neither
read it nor post to it: the browser sends that page's name as ``Host`` and ``Origin``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hmac
import inspect
import ipaddress
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._errors import ConfigurationError

#: Decides whether ``request`` may do ``action``: ``"view"`` for every page, else the action's
#: name (``retry``, ``cancel``, ``delete``, ``pause``, ``resume``, ``limits``).
Authorizer = Callable[[Request, str], bool | Awaitable[bool]]

USER_ENV = "AIOQUEUE_DASHBOARD_USER"
PASSWORD_ENV = "AIOQUEUE_DASHBOARD_PASSWORD"
CSRF_COOKIE = "aioqueue_csrf"
CSRF_FIELD = "csrf"
#: How a browser names a dashboard served on loopback (any loopback address is answered).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
#: A host as ``Host`` and origins write it, ``name[:port]``: a DNS name or IPv4 address, or an
#: IPv6 address in brackets, and a port from 1 to 65535 (checked after the match).
_AUTHORITY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::([0-9]{1,5}))?", re.ASCII)
_DEFAULT_PORTS = {"http": 80, "https": 443}

#: ``(name, port)``, the name in lower case; port None when the text gives none, as browsers
#: write the default port of the scheme.
Authority = tuple[str, int | None]


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


def parse_authority(text: str) -> Authority | None:
    """``name[:port]`` as an :data:`Authority`; None when it is not one."""
    found = _AUTHORITY.fullmatch(text.lower()) if text.isascii() else None
    if found is None:
        return None
    port = None if found[2] is None else int(found[2])
    if port is not None and not 1 <= port <= 65535:
        return None
    return found[1], port


class ServedHosts:
    """The hosts a dashboard answers (its requests' ``Host``), and so the origins its forms may
    come from: those given (``allowed_hosts``); else, with neither hook nor credentials,
    localhost and loopback addresses on the port the server listens on (the ASGI scope's
    ``server``), names no page elsewhere can make a browser send; else any host, a form then
    having to come from the host it was posted to."""

    def __init__(self, allowed: Iterable[str] | None, *, loopback: bool) -> None:
        self.allowed = None if allowed is None else _check_hosts(allowed)
        self.loopback = loopback

    @property
    def any_host(self) -> bool:
        return self.allowed is None and not self.loopback

    def answers(self, host: Authority | None, scope: Scope) -> bool:
        """Whether ``host`` (None: not a host) is served, for a request of ``scope``."""
        if self.any_host:
            return True
        if host is None:
            return False
        if self.allowed is not None:
            return host in self.allowed
        return is_loopback(host[0]) and host[1] in _served_ports(scope)

    def describe(self, scope: Scope) -> str:
        if self.allowed is not None:
            return ", ".join(sorted(name if port is None else f"{name}:{port}" for name, port in self.allowed))
        port = next((p for p in _served_ports(scope) if p is not None), None)
        names = " or ".join(LOOPBACK_NAMES)
        return f"{names} (or another loopback address)" + ("" if port is None else f" on port {port}")


def _served_ports(scope: Scope) -> set[int | None]:
    """The port a browser names in ``Host`` for the server of ``scope``: its own, or none when
    that is the scheme's default."""
    server = scope.get("server")
    port: int | None = server[1] if server else None
    ports = {port}
    if port is not None and _DEFAULT_PORTS.get(scope.get("scheme", "")) == port:
        ports.add(None)
    return ports


def _check_hosts(allowed: Iterable[str]) -> frozenset[Authority]:
    if isinstance(allowed, str | bytes) or not isinstance(allowed, Iterable):
        raise ConfigurationError(
            f"allowed_hosts must be a list of host names, such as ['queue.example.com'], got {allowed!r}"
        )
    hosts = set()
    for host in allowed:
        authority = parse_authority(host) if isinstance(host, str) else None
        if authority is None:
            raise ConfigurationError(
                f"allowed_hosts: {host!r} is not a host as a Host header gives it: a name or address "
                "and, unless the scheme's default, a port from 1 to 65535 (queue.example.com, "
                "127.0.0.1:8080, [::1]:8080)"
            )
        hosts.add(authority)
    if not hosts:
        raise ConfigurationError("allowed_hosts is empty: name at least one host, or pass None")
    return frozenset(hosts)


class HostGuard:
    """ASGI middleware: answer a request only if its ``Host`` is one the dashboard serves;
    otherwise a 400 that says which hosts it answers, and nothing of the dashboard."""

    def __init__(self, app: ASGIApp, hosts: ServedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not self.hosts.answers(parse_authority(host), scope):
                shown = repr(host[:100]) if host else "none"
                hint = "list them in create_app(allowed_hosts=[...])"
                if self.hosts.allowed is None:
                    hint += ", or require credentials or an auth hook"
                response = PlainTextResponse(
                    f"This dashboard answers only at {self.hosts.describe(scope)}; the request named the "
                    f"host {shown}. To serve it under other names, {hint}.\n",
                    400,
                    headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclasses.dataclass(frozen=True)
class Access:
    """Who may use one dashboard: its authorisation hook and its basic credentials (either, both
    or neither), and the hosts it answers."""

    auth: Authorizer | None
    credentials: tuple[str, str] | None
    hosts: ServedHosts

    @property
    def protected(self) -> bool:
        """Whether requests must pass an authorisation hook or basic credentials."""
        return self.auth is not None or self.credentials is not None

    async def who(self, request: Request, action: str) -> str:
        """Check the request may do ``action``; return who it is, for the log."""
        user = "anonymous"
        if self.credentials is not None:
            found = basic_user(request, self.credentials)
            if found is None:
                raise HTTPException(401, "credentials required", {"WWW-Authenticate": 'Basic realm="aioqueue"'})
            user = found
        if self.auth is not None and not await allowed(self.auth, request, action):
            raise HTTPException(403, f"not allowed to {action}")
        client = request.client.host if request.client else "?"
        return f"{user}@{client}"


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


def from_served_origin(request: Request, hosts: ServedHosts) -> bool:
    """Whether a form came from an address the dashboard serves: the host of its ``Origin``
    header (else of its ``Referer``) is one ``hosts`` answers (the request's own ``Host``,
    when they are any host).
    ``Origin: null`` (a sandboxed page, a file) and a form that says nothing of where it came
    from are refused: browsers send ``Origin`` with every POST."""
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    try:
        parts = urlsplit(source)
    except ValueError:  # a malformed IPv6 address
        return False
    if parts.scheme not in _DEFAULT_PORTS:
        return False
    origin = parse_authority(parts.netloc)
    if hosts.any_host:
        return origin is not None and origin == parse_authority(request.headers.get("host", ""))
    return hosts.answers(origin, request.scope)


def csrf_ok(request: Request, submitted: object) -> bool:
    """A form is genuine when its token equals the cookie's (double submit)."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    return isinstance(submitted, str) and len(cookie) == 43 and hmac.compare_digest(cookie, submitted)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses: the only hosts served without credentials."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
