"""Redis for the outbox tests: the shared server (``AIOQUEUE_TEST_REDIS``, default
127.0.0.1:6379, which .ci/run starts when none runs), a stream on it under a prefix of the test's
own, a private ``redis-server`` a fault test may kill, and the check that a stream holds every
event once, each key's in order."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from anyio.abc import Process

from aioqueue.streams.redis import RedisStream

REDIS_URL = os.environ.get("AIOQUEUE_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as exc:
        raise AssertionError(f"no Redis answers at {REDIS_URL} (.ci/run starts one): {exc}") from exc
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def prefix(redis_client: aioredis.Redis) -> AsyncIterator[str]:
    """A key prefix of the test's own; its keys are deleted after the test."""
    name = f"aioqueue-test-{uuid.uuid4().hex[:8]}:"
    yield name
    keys = [k async for k in redis_client.scan_iter(match=name + "*")]
    if keys:
        await redis_client.delete(*keys)


@pytest.fixture
async def redis_stream(prefix: str) -> AsyncIterator[RedisStream]:
    stream = RedisStream(REDIS_URL, prefix=prefix)
    try:
        yield stream
    finally:
        await stream.aclose()


Entry = tuple[int, str, str]  # (event id, key, payload)


async def entries(client: aioredis.Redis, key: str) -> list[Entry]:
    """Every entry of the Redis stream ``key``, in stream order."""
    out: list[Entry] = []
    start = "-"
    while True:
        batch: Any = await client.xrange(key, min=start, count=10_000)  # bytes, as the client decodes nothing
        for _entry_id, fields in batch:
            out.append((int(fields[b"id"]), fields[b"key"].decode(), fields[b"payload"].decode()))
        if len(batch) < 10_000:
            return out
        start = "(" + batch[-1][0].decode()


def check_arrivals(got: Sequence[Entry], committed: Mapping[str, Iterable[int]]) -> None:
    """Every committed event arrived once, and each key's in id (= commit) order."""
    ids = [e[0] for e in got]
    if len(ids) != len(set(ids)):
        seen: dict[int, list[tuple[str, str]]] = {}
        for event_id, key, payload in got:
            seen.setdefault(event_id, []).append((key, payload))
        twice = {i: v for i, v in seen.items() if len(v) > 1}
        examples = "; ".join(f"id {i}: {v}" for i, v in list(twice.items())[:3])
        raise AssertionError(f"{len(ids) - len(set(ids))} events arrived twice ({len(twice)} ids, "
                             f"each as (key, payload): {examples})")
    by_key: dict[str, list[int]] = {}
    for event_id, key, _ in got:
        by_key.setdefault(key, []).append(event_id)
    for key, arrived in by_key.items():
        assert arrived == sorted(arrived), f"key {key!r} arrived out of order"
    expected = {k: sorted(v) for k, v in committed.items() if v}
    assert by_key == expected


class OwnRedis:
    """A ``redis-server`` of the test's own, durable as the outbox docs ask (append-only file,
    fsync on every write), that a test may kill and start again on the same port and files.

    Its own in two ways, as the machine may run other tests' servers and relays: a password of
    its own (``url`` carries it), so a relay of another test that reaches the port writes
    nothing; and ``start`` returns only once the server answering is the process it started, so
    a test never goes on against another server that took the port while this one was down.
    """

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.password = secrets.token_hex(8)
        self.url = f"redis://:{self.password}@127.0.0.1:{port}/0"
        self.process: Process | None = None

    async def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (.ci/run installs Debian's)"
        self.process = process = await anyio.open_process(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no",
             "--requirepass", self.password],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = aioredis.from_url(self.url)
        try:
            with anyio.fail_after(10):
                while True:
                    assert process.returncode is None, (
                        f"redis-server on port {self.port} exited with status {process.returncode}: "
                        "another process has the port?")
                    try:
                        await client.ping()
                        info: Any = await client.info("server")
                    except Exception:
                        await anyio.sleep(0.02)
                        continue
                    assert int(info["process_id"]) == process.pid, (
                        f"port {self.port} answers as redis-server pid {info['process_id']}, not this "
                        f"test's pid {process.pid}")
                    return
        finally:
            await client.aclose()

    async def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        with anyio.fail_after(10):
            await self.process.wait()


@contextlib.asynccontextmanager
async def own_redis(directory: Path, port: int) -> AsyncIterator[OwnRedis]:
    server = OwnRedis(directory, port)
    await server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.returncode is None:
            await server.kill()
