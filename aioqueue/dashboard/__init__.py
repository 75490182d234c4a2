"""The web dashboard: an ASGI app (Starlette and Jinja2) that shows queues, jobs, dead jobs,
periodic schedules and live workers, and steers them through :class:`~aioqueue._admin.Admin`.

``create_app(queue)`` returns the app; mount it in a FastAPI or Starlette application at any
path, or serve it with ``aioqueue dashboard``. Needs the ``dashboard`` extra
(``pip install "aioqueue[dashboard]"``).
"""

from ._app import Authorizer, create_app

__all__ = ["Authorizer", "create_app"]
