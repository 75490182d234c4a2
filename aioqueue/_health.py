"""Serve a worker's health over HTTP for an orchestrator's probes (``health_port``), or the
health of a group of workers run in one process (``run_workers(..., health_port=...)``).

``GET /live`` answers 200 while the event loop answers (a blocked loop answers nothing, which a
probe's timeout reads as a failure) and the worker's services are running. ``GET /ready``
answers 200 while, in addition, the database answered a check within ``unready_after`` seconds
and the schema is at least at this code's version; else 503, with the reason in the JSON body. The
database is checked in the background once a second or so, never by a probe, so probes cost the
database nothing. It runs in the worker's task group and never touches jobs. A group's
server answers 200 only while every worker would, and names each worker in the body.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from . import _migrate as migrations
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._database import Database

logger = logging.getLogger("aioqueue.health")

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class Health:
    """Liveness and readiness of one worker; :meth:`run` also serves them over HTTP."""

    def __init__(
        self,
        db: Database,
        serving: Callable[[], str | None],
        *,
        port: int = 0,
        host: str = "0.0.0.0",
        unready_after: float = 10.0,
        name: str = "",
    ) -> None:
        self.db = db
        self.serving = serving
        """Returns None while the worker's services run, ``"stopping"`` while it drains, else why
        they do not run."""
        self.name = name
        self.host = host
        self.port = port
        """The port served (the one the OS chose, when asked for port 0)."""
        self.unready_after = unready_after
        self.check_interval = min(1.0, unready_after / 3)
        self.last_answer = -math.inf
        """When the database last answered a check (monotonic seconds)."""
        self.schema_problem: str | None = "not checked yet"

    def live(self) -> tuple[bool, dict[str, object]]:
        """Whether the worker is alive, and the details a probe gets."""
        problem = self.serving()
        alive = problem in (None, "stopping")  # a draining worker is alive, only not ready
        return alive, {"status": "ok" if alive else "failing", "services": problem or "running"}

    def ready(self) -> tuple[bool, dict[str, object]]:
        """Whether the worker should be sent work (has a database and a current schema)."""
        alive, details = self.live()
        silent = time.monotonic() - self.last_answer
        database = "ok" if silent <= self.unready_after else (
            "never answered" if math.isinf(silent) else f"no answer for {silent:.1f}s"
        )
        ok = alive and details["services"] == "running" and database == "ok" and self.schema_problem is None
        details.update(status="ok" if ok else "failing", database=database, schema=self.schema_problem or "current")
        return ok, details

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Check the database and serve probes until cancelled; started once listening."""
        server = HealthServer([self], host=self.host, port=self.port)
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            self.port = server.port
            task_status.started()

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Ask the database for the schema's version about once a second, until cancelled;
        started once the first answer (or failure) is in."""
        latest = migrations.latest_version()
        first = True
        while True:
            try:
                with anyio.fail_after(max(self.check_interval, 1.0)):
                    async with self.db.connection() as conn:
                        version = await migrations.applied_version(conn, self.db.schema)
            except Exception as exc:
                logger.debug("health check of the database failed: %s: %s", type(exc).__name__, exc)
            else:
                self.last_answer = time.monotonic()
                # A newer schema is a rolling upgrade under way: this worker keeps working on it.
                self.schema_problem = None if version >= latest else f"at version {version}, code needs {latest}"
            if first:
                first = False
                task_status.started()
            await anyio.sleep(self.check_interval)

class HealthServer:
    """The HTTP server that answers probes for one worker's :class:`Health`, or for a group's:
    a group is live while every worker is, ready while every worker is."""

    def __init__(self, checks: Sequence[Health], *, host: str = "0.0.0.0", port: int = 0) -> None:
        if not checks:
            raise ValueError("a health server needs at least one worker to report on")
        self.checks = list(checks)
        self.host = host
        self.port = port
        """The port served (the one the OS chose, when asked for port 0)."""

    def live(self) -> tuple[bool, dict[str, object]]:
        """Whether every worker is alive, and the details a probe gets."""
        return self._combined([check.live() for check in self.checks])

    def ready(self) -> tuple[bool, dict[str, object]]:
        """Whether every worker should be sent work."""
        return self._combined([check.ready() for check in self.checks])

    def _combined(self, answers: list[tuple[bool, dict[str, object]]]) -> tuple[bool, dict[str, object]]:
        if len(answers) == 1:
            return answers[0]
        ok = all(answer for answer, _ in answers)
        workers = {check.name: details for check, (_, details) in zip(self.checks, answers, strict=True)}
        return ok, {"status": "ok" if ok else "failing", "workers": workers}

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Check each worker's database and serve probes until cancelled; started once listening."""
        try:
            listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port, reuse_port=False)
        except OSError as exc:
            # A port in use or an address not of this host: a restart would meet it again.
            why = "the port is already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigurationError(f"cannot serve health probes on {self.host}:{self.port}: {why}") from None
        async with listener, anyio.create_task_group() as tg:
            self.port = listener.extra(SocketAttribute.local_port)
            for check in self.checks:
                await tg.start(check.watch)
            logger.info("serving health probes at http://%s:%d/live and /ready", self.host, self.port)
            task_status.started()
            await listener.serve(self._answer, task_group=tg)

    async def _answer(self, stream: SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = b""
                    while b"\r\n\r\n" not in request and b"\n\n" not in request and len(request) < 8192:
                        request += await stream.receive(4096)
                    method, _, rest = request.decode("latin-1").partition(" ")
                    body: dict[str, object]
                    path = rest.partition(" ")[0].partition("?")[0]
                    if method not in ("GET", "HEAD"):
                        code, body = 405, {"error": "use GET"}
                    elif path in ("/live", "/livez", "/healthz"):
                        ok, body = self.live()
                        code = 200 if ok else 503
                    elif path in ("/ready", "/readyz"):
                        ok, body = self.ready()
                        code = 200 if ok else 503
                    else:
                        code, body = 404, {"error": "try /live or /ready"}
                    payload = (json.dumps(body) + "\n").encode() if method == "GET" else b""
                    head = (
                        f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                    )
                    await stream.send(head.encode() + payload)
            except (anyio.EndOfStream, anyio.BrokenResourceError, TimeoutError, OSError):
                pass  # a probe that hung up or dawdled gets nothing
