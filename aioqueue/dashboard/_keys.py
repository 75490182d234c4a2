"""The dashboard's page of one queue: its counts and limits, and its busiest partition keys (each
key's running jobs against the per-key limit, its pending and ready jobs, links to its jobs),
read through the Queue's operator calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from .._checks import check_name
from .._errors import ConfigurationError
from . import _inputs as inputs

if TYPE_CHECKING:
    from ._app import Dashboard

#: Keys the page shows unless the request asks for another number (``?top=``).
TOP_KEYS = 10
#: What each key's pending and ready jobs are counted up to.
KEY_COUNT_BOUND = 1000


async def queue_page(dashboard: Dashboard, request: Request) -> Response:
    """One queue (``?name=``): its counts, limits and per-key settings, and its busiest keys."""
    await dashboard.access.who(request, "view")
    name = request.query_params.get("name", "")
    try:
        check_name("queue name", name)
        top = inputs.optional_int(request.query_params.get("top"), "top") or TOP_KEYS
        await dashboard._open()
        keys = await dashboard.queue.busiest_keys(name, limit=top, bound=KEY_COUNT_BOUND)
    except ConfigurationError as exc:
        return dashboard.render(request, "refused.html", 400, nav="queues", heading="No such queue view",
                                error=str(exc), nothing_changed=False, back=request.url_for("queues").path)
    overview = await dashboard.admin.queue_overview([name], bound=dashboard.count_bound)
    row = next(r for r in overview if r["queue"] == name)
    settings = next((s for s in await dashboard.queue.queue_settings() if s["name"] == name), {})
    return dashboard.render(request, "queue.html", nav="queues", q=row, settings=settings, keys=keys,
                            bound=KEY_COUNT_BOUND, top=top)
