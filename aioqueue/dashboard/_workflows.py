"""The dashboard's workflow pages: groups (counts, callbacks, state) and the graph around a job
(each node with its status, a link to its job, what it waits for), read through the Queue's
workflow calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from .._errors import ConfigurationError
from . import _inputs as inputs

if TYPE_CHECKING:
    from ._app import Dashboard


async def groups_page(dashboard: Dashboard, request: Request) -> Response:
    """Groups, newest first."""
    await dashboard.access.who(request, "view")
    await dashboard._open()
    groups = await dashboard.queue.list_groups(limit=dashboard.page_size)
    return dashboard.render(request, "groups.html", nav="groups", groups=groups)


async def _id_of(dashboard: Dashboard, request: Request, param: str) -> int | Response:
    """The id in the path, or the page that refuses it; the queue opened."""
    await dashboard.access.who(request, "view")
    try:
        value = inputs.job_id(request.path_params[param])
    except ConfigurationError as exc:
        return _refused(dashboard, request, 400, "No such id", str(exc))
    await dashboard._open()
    return value


def _refused(dashboard: Dashboard, request: Request, status: int, heading: str, error: str) -> Response:
    return dashboard.render(request, "refused.html", status, nav="groups", heading=heading, error=error,
                            nothing_changed=False, back=request.url_for("groups").path)


async def group_page(dashboard: Dashboard, request: Request) -> Response:
    """One group: its counts and its callbacks, linked to their jobs."""
    group_id = await _id_of(dashboard, request, "group_id")
    if isinstance(group_id, Response):
        return group_id
    counts = await dashboard.queue.group_counts(group_id)
    if counts is None:
        return _refused(dashboard, request, 404, f"No group {group_id}", "it does not exist")
    return dashboard.render(request, "group.html", nav="groups", group=counts)


async def workflow_page(dashboard: Dashboard, request: Request) -> Response:
    """The graph around a job."""
    job_id = await _id_of(dashboard, request, "job_id")
    if isinstance(job_id, Response):
        return job_id
    nodes = await dashboard.queue.workflow(job_id)
    return dashboard.render(request, "workflow.html", nav="groups", job_id=job_id, nodes=nodes)
