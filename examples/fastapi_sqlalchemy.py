"""FastAPI + SQLAlchemy 2 (async) + aioqueue: the common stack. Each request gets a session; the
order row and its confirmation job are written in the session's transaction, so they commit
together or not at all. The worker runs in the app's lifespan.

Run it (PostgreSQL from AIOQUEUE_DSN or DATABASE_URL):

    pip install -e ".[fastapi,sqlalchemy]" uvicorn
    AIOQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres uvicorn examples.fastapi_sqlalchemy:app
    curl -X POST localhost:8000/orders -H 'content-type: application/json' -d '{"item": "widget", "quantity": 2}'
    curl localhost:8000/orders/1        # confirmed is true once the job has run
    curl -X POST localhost:8000/orders -H 'content-type: application/json' -d '{"item": "widget", "quantity": 1000}'
                                        # 409: the stock update fails after the job was enqueued,
                                        # and neither the order nor its job exists
"""

# No `from __future__ import annotations`: SQLAlchemy reads the Mapped[...] annotations at class
# creation, and string annotations would need this module importable by name.
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import CheckConstraint, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import aioqueue
from aioqueue.integrations.fastapi import lifespan as aioqueue_lifespan

DSN = os.environ.get("AIOQUEUE_DSN") or os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"

# aioqueue writes through SQLAlchemy's asyncpg driver: postgresql+asyncpg://...
engine = create_async_engine(DSN.replace("postgresql://", "postgresql+asyncpg://", 1))
Session = async_sessionmaker(engine, expire_on_commit=False)
queue = aioqueue.Queue(DSN)


class Base(DeclarativeBase):
    pass


class Stock(Base):
    __tablename__ = "sa_stock"
    __table_args__ = (CheckConstraint("available >= 0", name="sa_stock_available"),)

    item: Mapped[str] = mapped_column(primary_key=True)
    available: Mapped[int]


class Order(Base):
    __tablename__ = "sa_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]
    quantity: Mapped[int]
    confirmed: Mapped[bool] = mapped_column(default=False)


@queue.task(queue="email", max_attempts=5, timeout=30)
async def send_order_confirmation(order_id: int) -> None:
    """Send the confirmation (here: mark the order confirmed). Idempotent, as jobs should be."""
    async with Session.begin() as session:
        order = await session.get(Order, order_id)
        if order is not None:
            order.confirmed = True


worker_lifespan = aioqueue_lifespan(queue, migrate=True, concurrency=8, grace_period=10.0)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    async with Session.begin() as session:
        if await session.get(Stock, "widget") is None:
            session.add(Stock(item="widget", available=100))
    async with worker_lifespan(app):
        yield
    await engine.dispose()


app = FastAPI(title="aioqueue + FastAPI + SQLAlchemy", lifespan=lifespan)


async def session_per_request() -> AsyncIterator[AsyncSession]:
    async with Session() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(session_per_request)]


class OrderIn(BaseModel):
    item: str
    quantity: int


@app.post("/orders", status_code=201)
async def create_order(order: OrderIn, session: SessionDep) -> dict[str, int]:
    """Write the order, enqueue its confirmation and take the stock in the request's transaction."""
    try:
        async with session.begin():
            row = Order(item=order.item, quantity=order.quantity)
            session.add(row)
            await session.flush()  # the order's id
            job = await send_order_confirmation.options(conn=session).enqueue(order_id=row.id)
            await session.execute(
                update(Stock).where(Stock.item == order.item).values(available=Stock.available - order.quantity)
            )
    except IntegrityError:
        raise HTTPException(409, f"not enough {order.item} in stock") from None
    return {"order_id": row.id, "job_id": job}


@app.get("/orders/{order_id}")
async def get_order(order_id: int, session: SessionDep) -> dict[str, object]:
    """Return an order; ``confirmed`` turns true once its confirmation job has run."""
    order = (await session.execute(select(Order).where(Order.id == order_id))).scalar_one_or_none()
    if order is None:
        raise HTTPException(404, "no such order")
    return {"id": order.id, "item": order.item, "quantity": order.quantity, "confirmed": order.confirmed}
