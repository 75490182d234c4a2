"""The dashboard's actions: POST forms that retry, cancel or delete jobs and pause, resume or
limit queues, each checked for who asks, its origin and its CSRF token, confirmed when it
changes jobs for good or reaches every job a filter matches, logged, and answered by a redirect
back to the page it came from. They steer only through :class:`~aioqueue._admin.Admin`; every
value a form carries is read through :mod:`._inputs`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._admin import BulkAction
from .._errors import AioqueueError, ConfigurationError
from . import _inputs as inputs
from ._inputs import FILTER_FIELDS
from ._security import CSRF_FIELD, csrf_ok, from_served_origin

if TYPE_CHECKING:
    from ._app import Dashboard

logger = logging.getLogger("aioqueue.dashboard")

A = TypeVar("A", bound=str)

#: Actions that change or remove jobs for good: each asks for a confirmation first.
DESTRUCTIVE = frozenset({"cancel", "delete"})
JOB_ACTIONS: tuple[BulkAction, ...] = ("retry", "cancel", "delete")
QUEUE_ACTIONS = ("pause", "resume", "limits")


async def job_action(dashboard: Dashboard, request: Request) -> Response:
    """Retry, cancel or delete jobs: those selected (``ids``) or every job the filter
    matches (``scope=filter``), in bounded batches."""
    action, form, who, back = await _action(dashboard, request, JOB_ACTIONS)
    scope = str(form.get("scope", "ids"))
    try:
        if scope == "filter":
            where = inputs.job_filter({k: str(form.get(k, "")).strip() for k in FILTER_FIELDS})
            target = f"every {where.status} job" + "".join(
                f" {k}={v!r}" for k, v in (("queue", where.queue), ("task", where.task), ("args", where.args),
                                           ("key", where.partition_key)) if v is not None)
        else:
            ids = inputs.job_ids(form.getlist("ids"))
            if not ids:
                return _redirect(back, "select at least one job")
            where, target = None, f"job(s) {', '.join(map(str, ids))}"
        if (action in DESTRUCTIVE or scope == "filter") and form.get("confirmed") != "1":
            return dashboard.render(request, "confirm.html", nav="jobs", action=action, target=target,
                                    fields=[(k, str(v)) for k, v in form.multi_items()
                                            if k not in (CSRF_FIELD, "confirmed")])
        if where is not None:
            done = await dashboard.admin.bulk(action, where, batch=dashboard.bulk_batch)
        elif action == "retry":
            done = len(await dashboard.admin.retry_dead(ids))
        elif action == "cancel":
            done = len(await dashboard.admin.cancel_jobs(ids))
        else:
            done = len(await dashboard.admin.delete_jobs(ids))
    except ConfigurationError as exc:
        return dashboard.render(request, "refused.html", 400, nav="jobs",
                                heading=f"{action.capitalize()} refused", error=str(exc), nothing_changed=True,
                                back=back)
    logger.info("dashboard: %s %s by %s: %d job(s)", action, target, who, done)
    return _redirect(back, f"{action}: {done} job(s)")


async def queue_action(dashboard: Dashboard, request: Request) -> Response:
    """Pause, resume or set the limits of a queue."""
    action, form, who, back = await _action(dashboard, request, QUEUE_ACTIONS)
    name = str(form.get("queue", ""))
    try:
        if action in ("pause", "resume"):
            await dashboard.admin.set_paused(name, action == "pause")
            done = f"{action}d queue {name}"
        else:
            concurrency = inputs.optional_int(form.get("concurrency"), "concurrency")
            rate_count = inputs.optional_int(form.get("rate_count"), "rate count")
            period_text = str(form.get("rate_period", "")).strip()
            rate = None if rate_count is None else (rate_count, float(period_text or "1"))
            await dashboard.admin.set_limits(name, concurrency=concurrency, rate=rate)
            done = f"limits of queue {name}: concurrency {concurrency}, rate {rate}"
    except (AioqueueError, ValueError) as exc:
        return _redirect(back, f"{action} refused: {exc}")
    logger.info("dashboard: %s by %s", done, who)
    return _redirect(back, done)


async def _action(dashboard: Dashboard, request: Request, allowed: Iterable[A]) -> tuple[A, FormData, str, str]:
    """An action's name (one of ``allowed``), its checked form, who asks, and where to go after."""
    asked = str((await request.form()).get("action", ""))
    action = next((name for name in allowed if name == asked), None)
    if action is None:
        raise HTTPException(400, f"unknown action {asked!r}")
    form, who = await _form(dashboard, request, action)
    return action, form, who, _back(request, form)


async def _form(dashboard: Dashboard, request: Request, action: str) -> tuple[FormData, str]:
    if dashboard.read_only:
        raise HTTPException(403, "this dashboard is read-only")
    who = await dashboard.access.who(request, action)
    if not from_served_origin(request, dashboard.access.hosts):
        raise HTTPException(
            403, "the form did not come from this dashboard: its Origin (or Referer) header must "
            "name the address the dashboard is served at",
        )
    form = await request.form()
    if not csrf_ok(request, form.get(CSRF_FIELD)):
        raise HTTPException(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    await dashboard._open()
    return form, who


def _back(request: Request, form: FormData) -> str:
    """Where to go after an action: the form's ``next`` if it is a path in this app."""
    root = request.url_for("queues").path
    target = str(form.get("next", ""))
    if target.startswith(root.rstrip("/") + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return root


def _redirect(back: str, notice: str) -> RedirectResponse:
    path, _, query = back.partition("?")
    kept = [p for p in query.split("&") if p and not p.startswith("notice=")]
    kept.append(urlencode({"notice": notice}))
    return RedirectResponse(f"{path}?{'&'.join(kept)}", 303)
