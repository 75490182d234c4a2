"""The dashboard's routes: pages that read through :class:`~aioqueue._admin.Admin` and actions
(POST, in :mod:`._actions`: checked for their origin and CSRF token, confirmed when destructive,
logged) that steer through it. Nothing a request carries reaches SQL text: every value is read through
:mod:`.inputs` and is a parameter of Admin's named statements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._admin import JOB_STATUSES
from .._errors import ConfigurationError
from . import _actions as actions
from . import _charts as charts
from . import _inputs as inputs
from . import _keys as keys
from . import _text as text
from . import _workflows as workflows
from ._inputs import FILTER_FIELDS
from ._security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    Access,
    Authorizer,
    HostGuard,
    ServedHosts,
    check_credentials,
    credentials_from_env,
    csrf_token,
)

if TYPE_CHECKING:
    from .._app import Queue

__all__ = ["Authorizer", "create_app"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclasses.dataclass(eq=False)
class Dashboard:
    """The pages and actions of one dashboard over one :class:`~aioqueue.Queue`."""

    queue: Queue
    _: dataclasses.KW_ONLY
    access: Access
    read_only: bool
    refresh: float
    page_size: int
    bulk_batch: int
    count_bound: int

    def __post_init__(self) -> None:
        self.admin = self.queue.admin
        self._opening = anyio.Lock()
        self._opened = False
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("aioqueue.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["age"] = text.age
        self.templates.filters["when"] = text.when
        self.templates.filters["count"] = lambda n: f"{n:,}+" if n >= self.count_bound else f"{n:,}"
        self.templates.filters["json"] = lambda v: text.json_text(v, indent=2)
        self.templates.filters["compact"] = text.json_text
        self.templates.filters["first_line"] = lambda t: (t or "").strip().splitlines()[0][:200] if t else ""

    @property
    def protected(self) -> bool:
        """Whether requests must pass an authorisation hook or basic credentials."""
        return self.access.protected

    # -- plumbing ------------------------------------------------------------------------------

    async def _open(self) -> None:
        if not self.queue.database.is_open:
            async with self._opening:
                if not self.queue.database.is_open:
                    await self.queue.open()
                    self._opened = True

    async def close(self) -> None:
        """Close the queue if the dashboard opened it (when the app's lifespan ends)."""
        if self._opened:
            self._opened = False
            await self.queue.close()

    def can(self, action: str) -> bool:
        return not self.read_only

    def render(self, request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        token = csrf_token(request)

        def path(name: str, /, query: dict[str, Any] | None = None, **params: Any) -> str:
            url = request.url_for(name, **params).path
            clean = {k: v for k, v in (query or {}).items() if v not in (None, "")}
            return url + ("?" + urlencode(clean) if clean else "")

        html = self.templates.get_template(template).render(
            request=request, path=path, csrf=token, csrf_field=CSRF_FIELD, read_only=self.read_only,
            refresh=self.refresh, notice=request.query_params.get("notice", ""), can=self.can,
            statuses=JOB_STATUSES, **context,
        )
        response = HTMLResponse(html, status_code)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        if request.cookies.get(CSRF_COOKIE) != token:
            root = request.scope.get("root_path", "") or "/"
            response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path=root,
                                secure=request.url.scheme == "https")
        return response

    # -- pages ---------------------------------------------------------------------------------

    async def queues_page(self, request: Request) -> Response:
        await self.access.who(request, "view")
        await self._open()
        registered = sorted({t.queue for t in self.queue.tasks.values()})
        rows = await self.admin.queue_overview(registered, bound=self.count_bound)
        now, series = await self.admin.throughput(60)
        total: dict[datetime.datetime, int] = {}
        for points in series.values():
            for minute, n in points:
                total[minute] = total.get(minute, 0) + n
        for row in rows:
            row["chart"] = charts.minute_bars(series.get(row["queue"], []), now)
        overall = charts.minute_bars(sorted(total.items()), now, width=600, height=80)
        outbox = await self.queue.outbox_status()
        return self.render(request, "queues.html", nav="queues", queues=rows, overall=overall, outbox=outbox)

    async def jobs_page(self, request: Request) -> Response:
        return await self._jobs(request, "pending", "jobs")

    async def dead_page(self, request: Request) -> Response:
        return await self._jobs(request, "dead", "dead")

    async def _jobs(self, request: Request, default_status: str, nav: str) -> Response:
        await self.access.who(request, "view")
        await self._open()
        params = request.query_params
        filters = {k: params.get(k, "").strip() for k in FILTER_FIELDS}
        filters["status"] = filters["status"] or default_status
        try:
            if params.get("id", "").strip():
                job_id = inputs.job_id(params["id"])
                return RedirectResponse(request.url_for("job", job_id=job_id).path, 303)
            where = inputs.job_filter(filters)
            before = inputs.before(params.get("before", ""))
            page = await self.admin.list_jobs(where, before=before, limit=self.page_size)
        except ConfigurationError as exc:
            return self.render(request, "jobs.html", 400, nav=nav, filters=filters, jobs=[],
                               next_before=None, searched=None, error=str(exc), status=filters["status"])
        return self.render(request, "jobs.html", nav=nav, filters=filters, jobs=page.jobs,
                           next_before=page.next_before, searched=page.searched, error="",
                           status=where.status)

    async def job_page(self, request: Request) -> Response:
        await self.access.who(request, "view")
        try:
            job_id = inputs.job_id(request.path_params["job_id"])
        except ConfigurationError as exc:
            return self.render(request, "refused.html", 400, nav="jobs", heading="No such job id",
                               error=str(exc), nothing_changed=False, back=request.url_for("jobs").path)
        await self._open()
        job = await self.admin.job_detail(job_id)
        if job is None:
            return self.render(request, "missing.html", 404, nav="jobs", job_id=job_id)
        steps = await self.queue.job_steps(job_id)  # its durable steps, sleeps and event waits
        return self.render(request, "job.html", nav="jobs", job=job, steps=steps)

    async def periodic_page(self, request: Request) -> Response:
        await self.access.who(request, "view")
        await self._open()
        rows = await self.admin.periodic_schedules(self.queue.periodics)
        return self.render(request, "periodic.html", nav="periodic", schedules=rows)

    async def workers_page(self, request: Request) -> Response:
        await self.access.who(request, "view")
        await self._open()
        rows = await self.admin.list_workers()
        return self.render(request, "workers.html", nav="workers", workers=rows)


def create_app(
    queue: Queue,
    *,
    auth: Authorizer | None = None,
    credentials: tuple[str, str] | None = None,
    allowed_hosts: Iterable[str] | None = None,
    read_only: bool = False,
    refresh: float = 5.0,
    page_size: int = 50,
    bulk_batch: int = 1000,
    count_bound: int = 10_000,
) -> Starlette:
    """Return the dashboard of ``queue`` as an ASGI app, to mount at any path.

    ``auth(request, action)`` (sync or async) says whether a request may ``"view"`` the pages or
    do an action (``retry``, ``cancel``, ``delete``, ``pause``, ``resume``, ``limits``).
    ``credentials`` (user, password), else AIOQUEUE_DASHBOARD_USER and _PASSWORD from the
    environment, require HTTP basic authentication; with both, a request needs both.
    ``allowed_hosts`` lists the hosts the app answers (its requests' ``Host``), each a name or
    ``name:port`` (a name alone matches requests that give no port, as browsers send 80 and
    443); forms must come from one of them (their ``Origin``). By default, with neither
    ``auth`` nor ``credentials``, it answers only 127.0.0.1, localhost and [::1] on the port
    its server listens on, so that a page whose name resolves to 127.0.0.1 (DNS rebinding)
    can neither read nor steer it; with either, any host, forms coming from the host asked for.
    ``read_only`` hides and refuses every action. ``refresh`` is the seconds between page
    refreshes while the page is visible (0: never). Opens ``queue`` on the first request if it
    is not open yet.
    """
    basic = check_credentials(credentials) if credentials is not None else credentials_from_env()
    hosts = ServedHosts(allowed_hosts, loopback=auth is None and basic is None)
    dashboard = Dashboard(
        queue,
        access=Access(auth, basic, hosts),
        read_only=read_only,
        refresh=refresh,
        page_size=page_size,
        bulk_batch=bulk_batch,
        count_bound=count_bound,
    )
    static = StaticFiles(directory=str(resources.files("aioqueue.dashboard").joinpath("static")))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dashboard.close()

    app = Starlette(
        lifespan=lifespan,
        middleware=[Middleware(HostGuard, hosts=hosts)],
        routes=[
            Route("/", dashboard.queues_page, name="queues"),
            Route("/queue", functools.partial(keys.queue_page, dashboard), name="queue"),
            Route("/jobs", dashboard.jobs_page, name="jobs"),
            Route("/jobs/{job_id}", dashboard.job_page, name="job"),
            Route("/dead", dashboard.dead_page, name="dead"),
            Route("/periodic", dashboard.periodic_page, name="periodic"),
            Route("/workers", dashboard.workers_page, name="workers"),
            Route("/groups", functools.partial(workflows.groups_page, dashboard), name="groups"),
            Route("/groups/{group_id}", functools.partial(workflows.group_page, dashboard), name="group"),
            Route("/workflows/{job_id}", functools.partial(workflows.workflow_page, dashboard), name="workflow"),
            Route("/actions/jobs", functools.partial(actions.job_action, dashboard), methods=["POST"],
                  name="job_action"),
            Route("/actions/queues", functools.partial(actions.queue_action, dashboard), methods=["POST"],
                  name="queue_action"),
            Mount("/static", static, name="static"),
        ],
    )
    app.state.dashboard = dashboard
    return app
