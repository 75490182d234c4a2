"""Django + aioqueue: a sync view writes an order and enqueues its confirmation inside
``transaction.atomic()``, on Django's own connection; an aioqueue worker (async, in its own
process) runs the job. Django needs its PostgreSQL backend with psycopg 3.

Run it (PostgreSQL from AIOQUEUE_DSN or DATABASE_URL):

    pip install -e ".[django]"
    export AIOQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/postgres
    python examples/django_app.py demo         # one order through the view, then a worker drains it
    python examples/django_app.py runserver    # and, in another shell, the worker:
    PYTHONPATH=examples aioqueue worker django_app:queue
    curl -X POST 'localhost:8000/orders?item=widget&quantity=2'
"""

from __future__ import annotations

import asyncio
import os
import sys

import django
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

import aioqueue

DSN = os.environ.get("AIOQUEUE_DSN") or os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"

queue = aioqueue.Queue(DSN)


@queue.task(queue="email")
async def send_order_confirmation(order_id: int) -> None:
    """Mark the order confirmed (a real app sends the mail). Idempotent, as jobs should be."""
    async with queue.connection() as conn:
        await conn.execute("UPDATE django_orders SET confirmed = true WHERE id = $1", order_id)


def create_order(request: HttpRequest) -> HttpResponse:
    """Write the order and its job in one transaction: both commit, or neither does."""
    if request.method != "POST":
        return HttpResponse(status=405)
    item, quantity = request.GET.get("item", ""), int(request.GET.get("quantity", "1"))
    if not item:
        return JsonResponse({"error": "item is required"}, status=400)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("INSERT INTO django_orders (item, quantity) VALUES (%s, %s) RETURNING id", [item, quantity])
        order_id = cur.fetchone()[0]
        job_id = send_order_confirmation.options(conn=connection).enqueue_sync(order_id=order_id)
    return JsonResponse({"order_id": order_id, "job_id": job_id}, status=201)


urlpatterns = [path("orders", create_order)]


def configure() -> None:
    """Point Django at the DSN, create the orders table and aioqueue's schema."""
    params = psycopg.conninfo.conninfo_to_dict(DSN)
    settings.configure(
        DEBUG=True,
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        SECRET_KEY="example-only",
        USE_TZ=True,
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname", "postgres"),
                "USER": params.get("user", "postgres"),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", "127.0.0.1"),
                "PORT": str(params.get("port", "5432")),
            }
        },
    )
    django.setup()
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS django_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "item text NOT NULL, quantity int NOT NULL, confirmed boolean NOT NULL DEFAULT false)"
        )


async def _drain() -> int:
    async with queue:
        await queue.migrate()
        stats = await queue.worker().run_until_empty()
    return stats.succeeded


def demo() -> None:
    """Place one order through the view, then let a worker run its job."""
    from django.test import Client

    asyncio.run(_migrate())
    response = Client().post("/orders?item=widget&quantity=2")
    order_id = response.json()["order_id"]
    print("created", response.json())
    print("jobs run:", asyncio.run(_drain()))
    with connection.cursor() as cur:
        cur.execute("SELECT confirmed FROM django_orders WHERE id = %s", [order_id])
        print("order", order_id, "confirmed:", cur.fetchone()[0])


async def _migrate() -> None:
    async with queue:
        await queue.migrate()


if __name__ == "__main__":
    configure()
    if sys.argv[1:] == ["demo"]:
        demo()
    else:
        from django.core.management import execute_from_command_line

        asyncio.run(_migrate())
        execute_from_command_line(sys.argv)
