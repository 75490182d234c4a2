"""aiohttp + aioqueue: an order endpoint that writes the order and its confirmation job in one
transaction, and a worker pool that runs in the same process through ``app.cleanup_ctx``.

Run it (PostgreSQL from AIOQUEUE_DSN or DATABASE_URL):

    pip install -e ".[aiohttp]"
    AIOQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres python examples/aiohttp_app.py
    curl -X POST localhost:8080/orders -H 'content-type: application/json' \\
         -d '{"item": "widget", "quantity": 2}'
    curl localhost:8080/orders/1        # confirmed_at is set once the job has run

Ordering more than the stock holds fails the stock update after the job was enqueued: the
transaction rolls back, and neither the order nor its job exists (HTTP 409).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

import aioqueue
from aioqueue.integrations import aiohttp as aioqueue_aiohttp

TABLES = """
CREATE TABLE IF NOT EXISTS stock (
    item      text PRIMARY KEY,
    available int  NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item         text        NOT NULL REFERENCES stock,
    quantity     int         NOT NULL,
    confirmed_at timestamptz
);
INSERT INTO stock VALUES ('widget', 100) ON CONFLICT DO NOTHING;
"""

queue = aioqueue.Queue(
    os.environ.get("AIOQUEUE_DSN") or os.environ.get("DATABASE_URL")
    or "postgresql://postgres@127.0.0.1:5432/postgres"
)


@queue.task(queue="email", max_attempts=5, timeout=30)
async def send_order_confirmation(order_id: int) -> None:
    """Send the confirmation (here: mark the order confirmed). Idempotent, as jobs should be."""
    async with queue.pool.acquire() as conn:
        await conn.execute(
            "UPDATE orders SET confirmed_at = coalesce(confirmed_at, now()) WHERE id = $1", order_id
        )


async def create_order(request: web.Request) -> web.Response:
    """Write the order, enqueue its confirmation and take the stock, all in one transaction."""
    body = await request.json()
    item, quantity = str(body["item"]), int(body["quantity"])
    q = request.app[aioqueue_aiohttp.QUEUE_KEY]
    try:
        async with q.pool.acquire() as conn, conn.transaction():
            order_id: int = await conn.fetchval(
                "INSERT INTO orders (item, quantity) VALUES ($1, $2) RETURNING id", item, quantity
            )
            job_id = await send_order_confirmation.options(conn=conn).enqueue(order_id=order_id)
            await conn.execute("UPDATE stock SET available = available - $2 WHERE item = $1", item, quantity)
    except asyncpg.CheckViolationError:
        raise web.HTTPConflict(text=f"not enough {item} in stock") from None
    except asyncpg.ForeignKeyViolationError:
        raise web.HTTPNotFound(text=f"no such item: {item}") from None
    return web.json_response({"order_id": order_id, "job_id": job_id}, status=201)


async def get_order(request: web.Request) -> web.Response:
    """Return an order, with ``confirmed_at`` once its confirmation job has run."""
    q = request.app[aioqueue_aiohttp.QUEUE_KEY]
    async with q.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT id, item, quantity, confirmed_at::text FROM orders WHERE id = $1",
            int(request.match_info["order_id"]),
        )
    if row is None:
        raise web.HTTPNotFound(text="no such order")
    return web.json_response(dict(row))


async def create_tables(app: web.Application) -> AsyncIterator[None]:
    async with app[aioqueue_aiohttp.QUEUE_KEY].pool.acquire() as conn:
        await conn.execute(TABLES)
    yield


def create_app() -> web.Application:
    app = web.Application()
    # Opens queue.pool, migrates and starts the workers on startup; drains them on cleanup.
    aioqueue_aiohttp.setup(app, queue, migrate=True, concurrency=8, grace_period=10.0)
    app.cleanup_ctx.append(create_tables)  # after setup's entry: the pool is open by then
    app.router.add_post("/orders", create_order)
    app.router.add_get("/orders/{order_id}", get_order)
    return app


if __name__ == "__main__":
    web.run_app(create_app())
