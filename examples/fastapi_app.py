"""FastAPI + aioqueue: an order endpoint that writes the order and its confirmation job in one
transaction, and a worker pool that runs in the same process, started and drained by the app's
lifespan.

Run it (PostgreSQL from AIOQUEUE_DSN or DATABASE_URL):

    pip install -e ".[fastapi]" uvicorn
    AIOQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"item": "widget", "quantity": 2}'
    curl localhost:8000/orders/1        # confirmed_at is set once the job has run

Ordering more than the stock holds fails the stock update after the job was enqueued: the
transaction rolls back, and neither the order nor its job exists (HTTP 409).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import aioqueue
from aioqueue.integrations.fastapi import lifespan as aioqueue_lifespan

queue = aioqueue.Queue(
    os.environ.get("AIOQUEUE_DSN") or os.environ.get("DATABASE_URL")
    or "postgresql://postgres@127.0.0.1:5432/postgres"
)

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


@queue.task(queue="email", max_attempts=5, timeout=30)
async def send_order_confirmation(order_id: int) -> None:
    """Send the confirmation (here: mark the order confirmed). Idempotent, as jobs should be."""
    async with queue.pool.acquire() as conn:
        await conn.execute(
            "UPDATE orders SET confirmed_at = coalesce(confirmed_at, now()) WHERE id = $1", order_id
        )


worker_lifespan = aioqueue_lifespan(queue, migrate=True, concurrency=8, grace_period=10.0)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The helper opens queue.pool, migrates, starts the workers; on shutdown it drains them.
    async with worker_lifespan(app):
        async with queue.pool.acquire() as conn:
            await conn.execute(TABLES)
        yield


app = FastAPI(title="aioqueue + FastAPI", lifespan=lifespan)


class OrderIn(BaseModel):
    item: str
    quantity: int


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn) -> dict[str, int]:
    """Write the order, enqueue its confirmation and take the stock, all in one transaction."""
    try:
        async with queue.pool.acquire() as conn, conn.transaction():
            order_id: int = await conn.fetchval(
                "INSERT INTO orders (item, quantity) VALUES ($1, $2) RETURNING id",
                order.item, order.quantity,
            )
            job_id = await send_order_confirmation.options(conn=conn).enqueue(order_id=order_id)
            await conn.execute(
                "UPDATE stock SET available = available - $2 WHERE item = $1", order.item, order.quantity
            )
    except asyncpg.CheckViolationError:
        raise HTTPException(409, f"not enough {order.item} in stock") from None
    except asyncpg.ForeignKeyViolationError:
        raise HTTPException(404, f"no such item: {order.item}") from None
    return {"order_id": order_id, "job_id": job_id}


@app.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, Any]:
    """Return an order, with ``confirmed_at`` once its confirmation job has run."""
    async with queue.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT id, item, quantity, confirmed_at FROM orders WHERE id = $1", order_id)
    if row is None:
        raise HTTPException(404, "no such order")
    return dict(row)
