"""Run a worker inside a web application: the framework helpers (``aioqueue.integrations.fastapi``,
``aioqueue.integrations.aiohttp``) are thin wrappers around :class:`BackgroundWorker`, which
works with any asyncio framework that has a startup and a shutdown hook."""

from .background import BackgroundWorker

__all__ = ["BackgroundWorker"]
