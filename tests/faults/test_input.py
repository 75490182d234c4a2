"""Bad input at every entry: arguments, payload sizes, strings, names, keys, delays and
priorities, rows written behind aioqueue's back, and a schema that is missing or not this
code's. Each gets a clear error at the call that caused it (and nothing is written) or a
documented outcome; nothing is lost or corrupted.

The payload and option spaces are explored with hypothesis, on one database per test: each
example claims what it enqueued through the worker's own claim, so ``job.args`` is exactly what
the handler would be called with.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator
from typing import Any, TypeVar

import asyncpg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import aioqueue
from aioqueue import _migrate as migrate
from aioqueue._config import WorkerConfig
from aioqueue._producer import Producer
from aioqueue._task import MAX_DELAY_SECONDS
from tests.support.helpers import LoopHarness, closed_after, noop_task, recording_task

T = TypeVar("T")
MAX_BYTES = 300
_ODD = ["\u2028", "\ufeff", "\uffff", "\U0001f600", "e\u0301", "\u202e", "\\u0000", "'", '"', ";", "\\",
        "a", " ", "\x01", "\x7f"]
_UNSTORABLE = ["\x00", "\ud800", "\udfff"]


class Harness(LoopHarness):
    """An event loop of the test's own, a queue on the test's database, and a claim."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, max_payload_bytes=MAX_BYTES, pool_max_size=2)

        @self.queue.task(name="take")
        async def take(**kwargs: Any) -> None:
            pass

        self.take = take
        self.producer = Producer(self.queue.database, WorkerConfig(name="hypothesis", lease=60), queues=["default"])

    def count(self) -> int:
        return int(self.run(self.conn.fetchval("SELECT count(*) FROM aioqueue.jobs")))


@pytest.fixture
def harness(dsn: str) -> Iterator[Harness]:
    yield from closed_after(Harness(dsn))


def _refusable(value: Any) -> bool:
    """Whether ``value`` holds something jsonb cannot store: NUL or an unpaired surrogate."""
    if isinstance(value, str):
        return "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list | tuple):
        return any(_refusable(v) for v in value)
    if isinstance(value, dict):
        return any(_refusable(k) or _refusable(v) for k, v in value.items())
    return False


texts = st.text(max_size=12) | st.lists(st.sampled_from(_ODD), max_size=12).map("".join)
unstorable_texts = st.lists(st.sampled_from(_ODD + _UNSTORABLE), min_size=1, max_size=6).map("".join).filter(
    lambda t: any(c in t for c in _UNSTORABLE)
)
scalars = (
    st.none() | st.booleans() | st.integers()
    # Floats below 1e16 in magnitude: larger ones come back as ints (see the xfail test below).
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(texts | st.integers() | st.booleans() | st.none(), inner, max_size=4),
    max_leaves=24,
)
not_json = st.sampled_from([object(), {1, 2}, b"bytes", math.nan, -math.inf, 1 + 2j, datetime.date(2020, 1, 1)])
unstorable = not_json | unstorable_texts | st.lists(unstorable_texts, min_size=1, max_size=2) | st.dictionaries(
    unstorable_texts, st.none(), min_size=1, max_size=1
)
arg_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
# Mostly storable arguments; about one call in four carries one value that is not.
call_args = st.builds(
    lambda good, bad: {**good, **bad},
    st.dictionaries(arg_names, json_values, max_size=4),
    st.sampled_from([0, 0, 0, 1]).flatmap(lambda n: st.dictionaries(arg_names, unstorable, min_size=n, max_size=n)),
)

_SETTINGS = settings(
    max_examples=120, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_SETTINGS
@given(args=call_args)
def test_payload_round_trips_or_is_refused_writing_nothing(harness: Harness, args: dict[str, Any]) -> None:
    text = None
    try:
        text = json.dumps(args, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError):
        size = None
    bad = text is None or _refusable(args)
    refused: aioqueue.JobArgumentsError | None = None
    try:
        job_id = harness.run(harness.take.enqueue(**args))
    except aioqueue.JobArgumentsError as exc:
        refused = exc
    if refused is not None:
        assert harness.count() == 0
        assert "task 'take'" in str(refused)
        if isinstance(refused, aioqueue.PayloadTooLargeError):
            event("refused: too large")
            assert not bad and size is not None and size > MAX_BYTES, (args, refused)
            assert f"over the limit of {MAX_BYTES}" in str(refused)
        else:
            event("refused: not storable")
            assert bad, (args, refused)
        return
    assert not bad and text is not None and size is not None and size <= MAX_BYTES, args
    event("accepted")
    jobs = harness.run(harness.producer.claim(10))
    assert [j.id for j in jobs] == [job_id]
    assert jobs[0].args == json.loads(text)  # what the handler is called with: equal after JSON
    harness.run(harness.conn.execute("DELETE FROM aioqueue.jobs"))


def _seconds_ok(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= MAX_DELAY_SECONDS)


def _int_ok(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _name_ok(value: Any, chars: int, max_bytes: int | None = None) -> bool:
    if not isinstance(value, str) or not 1 <= len(value) <= chars or _refusable(value):
        return False
    return max_bytes is None or len(value.encode("utf-8")) <= max_bytes


any_names = (
    st.text(min_size=0, max_size=20)
    | st.lists(st.sampled_from(_ODD + _UNSTORABLE), min_size=1, max_size=40).map("".join)
    | st.builds(lambda c, n: c * n, st.sampled_from(["x", "\U0001f600", "'", ";"]), st.integers(200, 1100))
    | st.integers() | st.none()
)
good_names = st.text(min_size=1, max_size=30).filter(lambda t: not _refusable(t)) | st.lists(
    st.sampled_from(_ODD), min_size=1, max_size=60
).map("".join)
any_numbers = (
    st.integers(-(2**40), 2**40) | st.floats() | st.booleans() | st.text(max_size=3)
    | st.sampled_from([0, 2**31 - 1, -(2**31) + 1, 2**31, MAX_DELAY_SECONDS, MAX_DELAY_SECONDS + 1, -0.0])
)
VALID = {
    "delay": st.floats(0, MAX_DELAY_SECONDS) | st.integers(0, int(MAX_DELAY_SECONDS)),
    "priority": st.integers(-(2**31) + 1, 2**31 - 1),
    "max_attempts": st.integers(1, 10_000),
    "queue": good_names,
    "key": good_names,
}
ANY = {"delay": any_numbers, "priority": any_numbers, "max_attempts": any_numbers, "queue": any_names,
       "key": any_names}


@st.composite
def enqueue_options(draw: st.DrawFn) -> dict[str, Any]:
    """All options valid, or one of them drawn from anything at all."""
    broken = draw(st.sampled_from([None, None, *VALID]))
    return {name: draw(ANY[name] if name == broken else VALID[name]) for name in VALID}


@_SETTINGS
@given(options=enqueue_options())
def test_options_are_stored_exactly_or_refused_writing_nothing(harness: Harness, options: dict[str, Any]) -> None:
    delay, priority, max_attempts, queue, key = (options[k] for k in ("delay", "priority", "max_attempts",
                                                                      "queue", "key"))
    ok = (
        _seconds_ok(delay) and _int_ok(priority, -(2**31) + 1, 2**31 - 1) and _int_ok(max_attempts, 1, 10_000)
        # None means "not given": the task's queue, no dedup key.
        and (queue is None or _name_ok(queue, 255)) and (key is None or _name_ok(key, 1000, 2000))
    )
    try:
        enqueuer = harness.take.options(
            delay=delay, priority=priority, max_attempts=max_attempts, queue=queue, key=key
        )
    except aioqueue.ConfigurationError:
        event("refused")
        assert not ok, (delay, priority, max_attempts, queue, key)
        assert harness.count() == 0
        return
    assert ok, (delay, priority, max_attempts, queue, key)
    event("accepted")
    job_id = harness.run(enqueuer.enqueue())
    row = harness.run(harness.conn.fetchrow(
        "SELECT queue, priority, max_attempts, dedup_key, extract(epoch FROM run_at - created_at) AS wait "
        "FROM aioqueue.jobs WHERE id = $1", job_id,
    ))
    assert row is not None
    assert (row["queue"], row["priority"], row["max_attempts"], row["dedup_key"]) == (
        queue or "default", priority, max_attempts, key
    )
    assert abs(float(row["wait"]) - delay) < 1.0
    harness.run(harness.conn.execute("DELETE FROM aioqueue.jobs"))


@pytest.mark.xfail(strict=True, reason="jsonb stores numbers as numeric and prints 1e23 as a 24-digit "
                   "integer, so floats of magnitude >= 1e16 reach the handler as ints (docs: Reliability)")
async def test_large_floats_reach_the_handler_as_floats(q: aioqueue.Queue) -> None:
    received: list[Any] = []

    @q.task
    async def take(x: float) -> None:
        received.append(x)

    await take.enqueue(x=1e23)
    await q.worker().run_until_empty()
    assert received == [1e23] and isinstance(received[0], float)


async def test_cycles_and_deep_nesting_are_refused_at_enqueue(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def take(x: Any) -> None:
        pass

    cycle: list[Any] = []
    cycle.append(cycle)
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for value in (cycle, deep):
        with pytest.raises(aioqueue.JobArgumentsError, match="reference cycle or are nested too deeply"):
            await take.enqueue(x=value)
    with pytest.raises(aioqueue.JobArgumentsError, match="not JSON-serialisable"):
        await take.enqueue(x=10**5000)  # more digits than Python will print
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_payload_limit_is_exact_and_bulk_all_or_nothing(dsn: str, db: asyncpg.Connection) -> None:
    async with aioqueue.Queue(dsn, max_payload_bytes=100) as q:
        take = noop_task(q, "take")
        fits = "\U0001f600" * ((100 - len('{"s":""}')) // 4)  # 4 bytes each in UTF-8
        await take.enqueue(s=fits)
        with pytest.raises(aioqueue.PayloadTooLargeError, match="over the limit of 100"):
            await take.enqueue(s=fits + "x" * 5)
        with pytest.raises(aioqueue.PayloadTooLargeError, match="enqueue_many: item 2 of 3: "):
            await take.enqueue_many([{"s": "ok"}, {"s": "x" * 200}, {"s": "ok"}])
    assert aioqueue.Queue("postgresql://x/y").max_payload_bytes == 1024 * 1024  # the documented default
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1


async def test_bulk_checks_each_job_not_the_batch(dsn: str, db: asyncpg.Connection) -> None:
    """enqueue_many encodes the batch as one JSON array; the limits still apply job by job."""
    async with aioqueue.Queue(dsn, max_payload_bytes=100) as q:
        take = noop_task(q, "take")
        deep: list[Any] = []
        for _ in range(300):
            deep = [deep]
        nested = [{"a": [1, {"b": [2, [3]]}]} for _ in range(400)]  # 3,200 brackets, each job 6 deep
        mixed = [[], ["é"], {"k": None}, (1, 2)]
        # 2,000 jobs of 30-odd bytes each: the batch is far over 100 bytes, each job is not.
        ids = await take.enqueue_many([{"x": v} for v in [*range(1000), *nested, *mixed * 150]])
        assert len(ids) == 2000
        stored = [r["args"] for r in await db.fetch("SELECT args::text AS args FROM aioqueue.jobs ORDER BY id")]
        assert stored[0] == '{"x": 0}' and stored[1000] == '{"x": {"a": [1, {"b": [2, [3]]}]}}'
        assert stored[1400:1404] == ['{"x": []}', '{"x": ["é"]}', '{"x": {"k": null}}', '{"x": [1, 2]}']
        for bad, error, what in [
            (deep, aioqueue.JobArgumentsError, "nests lists and dicts more than 256 levels"),
            ("a\x00b", aioqueue.JobArgumentsError, "NUL character"),
            ("\ud800", aioqueue.JobArgumentsError, "unpaired surrogate"),
            (float("nan"), aioqueue.JobArgumentsError, "JSON cannot hold"),
            ({1j: 1}, aioqueue.JobArgumentsError, "JSON keys are str"),
            ("y" * 200, aioqueue.PayloadTooLargeError, "over the limit of 100"),
        ]:
            named = "arguments" if error is aioqueue.PayloadTooLargeError else "argument 'x'"
            with pytest.raises(error, match=f"enqueue_many: item 1501 of 1502: task 'take': {named}.*{what}"):
                await take.enqueue_many([{"x": i} for i in range(1500)] + [{"x": bad}, {"x": 0}])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 2000  # no job of a refused batch


HOSTILE = [
    "'; DROP TABLE aioqueue.jobs; --",
    'q"uote',
    "$1",
    "a;b",
    "\\",
    "\u202eevil",
    "\U0001f600" * 255,
    "x" * 255,
]


async def test_hostile_queue_names_and_keys_are_data_not_sql(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    runs: list[str] = []

    @q.task
    async def take(tag: str) -> None:
        runs.append(tag)

    for name in HOSTILE:
        await take.options(queue=name, key=name).enqueue(tag=name)
        again = await take.options(queue=name, key=name).enqueue(tag="duplicate")
        assert again == await db.fetchval("SELECT id FROM aioqueue.jobs WHERE dedup_key = $1", name)
    await take.options(key="\U0001f600" * 500).enqueue(tag="long key")  # 2000 bytes: the limit
    with pytest.raises(aioqueue.ConfigurationError, match="dedup key is 4000 bytes"):
        take.options(key="\U0001f600" * 1000)
    with pytest.raises(aioqueue.ConfigurationError, match="queue name is 256 characters"):
        take.options(queue="x" * 256)
    stats = await q.worker(queues=[*HOSTILE, "default"]).run_until_empty()
    assert stats.succeeded == len(HOSTILE) + 1
    assert sorted(runs) == sorted([*HOSTILE, "long key"])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0


async def test_extreme_schedules_and_priorities(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    order: list[str] = []

    @q.task
    async def take(tag: str) -> None:
        order.append(tag)

    await take.options(priority=-(2**31) + 1).enqueue(tag="lowest")
    await take.options(priority=2**31 - 1).enqueue(tag="highest")
    await take.options(run_at=datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)).enqueue(tag="year 1")
    far = await take.options(delay=MAX_DELAY_SECONDS,
                             run_at=datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)).enqueue(tag="far")
    tz = datetime.timezone(datetime.timedelta(hours=-11, minutes=-30))
    await take.options(run_at=datetime.datetime(2000, 1, 1, tzinfo=tz)).enqueue(tag="odd zone")
    await q.worker(concurrency=1).run_until_empty()
    assert order == ["highest", "year 1", "odd zone", "lowest"]
    # Ten years past 9999-12-31 stops at its last instant, which every client can read back.
    info = await q.get_job(far)
    assert info is not None and info.run_at == datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC)


async def _write_behind_aioqueues_back(db: asyncpg.Connection, jobs: list[tuple[str, str, int]]) -> None:
    """Write ``jobs`` (task, arguments as JSON text, max_attempts) straight into the table, as
    SQL from outside aioqueue could: none of the checks its enqueue makes, ids in list order."""
    await db.executemany("INSERT INTO aioqueue.jobs (task, args, max_attempts) VALUES ($1, $2::jsonb, $3)", jobs)


async def test_rows_written_behind_aioqueues_back_become_dead_not_a_crash_loop(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    _, runs = recording_task(q, "take", max_attempts=1)
    await _write_behind_aioqueues_back(db, [
        ("no such task; DROP TABLE x", "{}", 3),  # unknown task
        ("take", '{"wrong": 1}', 1),  # arguments that do not fit the signature
        ("take", "[1, 2]", 1),  # not an object
        ("take", "null", 1),
        ("take", '{"n": 7}', 1),  # a good one between them
    ])
    stats = await q.worker().run_until_empty()
    assert runs == [7]
    assert stats.dead == 4
    rows = await db.fetch("SELECT task, args::text, status, last_error FROM aioqueue.jobs ORDER BY id")
    assert [r["status"] for r in rows] == ["dead"] * 4
    assert rows[0]["last_error"].startswith("UnknownTask: no task named 'no such task; DROP TABLE x'")
    for row in rows[1:]:
        assert row["last_error"].startswith("TypeError:"), row


async def test_missing_or_foreign_schema_says_what_to_do(empty_dsn: str) -> None:
    async with aioqueue.Queue(empty_dsn) as q:
        take = noop_task(q, "take")
        with pytest.raises(aioqueue.SchemaNotReadyError, match="run `aioqueue migrate`"):
            await take.enqueue()
        with pytest.raises(aioqueue.SchemaNotReadyError, match="does not exist"):
            await q.worker().run_until_empty()
        conn = await asyncpg.connect(empty_dsn)
        try:
            await migrate.migrate(conn, "aioqueue")
            await conn.execute("INSERT INTO aioqueue.migrations (version, name) VALUES (9999, 'future')")
        finally:
            await conn.close()
        with pytest.raises(aioqueue.SchemaNotReadyError, match=r"newer than this code's .*upgrade aioqueue"):
            await q.worker().run_until_empty()


def _nested(depth: int) -> list[Any]:
    """A list nested ``depth`` levels deep: ``_nested(2) == [[]]``."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def test_unstorable_results_are_stored_as_null_and_the_worker_goes_on(
    q: aioqueue.Queue, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    results: dict[str, Any] = {"cycle": cycle, "deep": _nested(5000), "huge": 10**5000, "too deep": _nested(257),
                               "deepest kept": _nested(256), "fine": {"a": [1, 2]}}

    @q.task(archive=True)
    async def give(which: str) -> Any:
        return results[which]

    ids = {which: await give.enqueue(which=which) for which in results}
    with caplog.at_level("WARNING", logger="aioqueue.payload"):
        stats = await q.worker(concurrency=2).run_until_empty()
    assert stats.succeeded == len(results)
    rows = {r["id"]: r for r in await db.fetch("SELECT id, status, result::text FROM aioqueue.jobs_done")}
    assert all(rows[i]["status"] == "succeeded" for i in ids.values())
    for which in ("cycle", "deep", "huge", "too deep"):
        assert rows[ids[which]]["result"] is None, which
    assert await ids["fine"].result(timeout=5) == {"a": [1, 2]}
    assert await ids["deepest kept"].result(timeout=5) == _nested(256)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert f"job {ids['cycle']} (task 'give'): its result is stored as NULL: result[0] is a list or dict" in warned
    assert f"job {ids['huge']} (task 'give'): its result is stored as NULL: result is an int too large" in warned
    assert "result nests lists and dicts more than 256 levels deep" in warned


async def test_argument_limits_name_the_argument(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    received: list[Any] = []

    @q.task
    async def take(x: Any, y: Any = None) -> None:
        received.append(x)

    with pytest.raises(aioqueue.JobArgumentsError, match=r"task 'take': argument 'y' is an int too large for JSON "
                       r"\(over 4300 digits"):
        await take.enqueue(x=1, y=10**4300)
    with pytest.raises(aioqueue.JobArgumentsError, match="argument 'y' key is an int too large"):
        await take.enqueue(x=1, y={10**5000: 1})
    with pytest.raises(aioqueue.JobArgumentsError, match="argument 'x' nests lists and dicts more than 256 levels"):
        await take.enqueue(x=_nested(257))
    with pytest.raises(aioqueue.JobArgumentsError, match="argument 'x' nests lists and dicts more"):
        await take.enqueue(x=[0, {"k": _nested(256)}])
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    await take.enqueue(x=_nested(256))  # the limit itself
    await take.enqueue(x=10**4299)  # 4300 digits
    await q.worker().run_until_empty()
    assert received == [_nested(256), 10**4299]


async def test_rows_python_cannot_decode_go_dead_without_their_batch_mates(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    _, runs = recording_task(q, "ping", max_attempts=5)
    await _write_behind_aioqueues_back(db, [
        ("ping", '{"n":' + "[" * 1100 + "]" * 1100 + "}", 5),  # lists nested 1100 deep
        ("ping", '{"n": 7}', 5),
        ("ping", '{"n":' + "9" * 5000 + "}", 5),  # a number of 5000 digits
        ("ping", '{"n": 8}', 5),
    ])
    stats = await q.worker(concurrency=4).run_until_empty()
    assert sorted(runs) == [7, 8] and stats.succeeded == 2
    rows = await db.fetch("SELECT status, attempts, last_error FROM aioqueue.jobs ORDER BY id")
    assert [(r["status"], r["attempts"]) for r in rows] == [("dead", 1), ("dead", 1)]
    assert rows[0]["last_error"].startswith("UndecodableArguments: the stored arguments cannot be decoded: they nest")
    assert rows[1]["last_error"].startswith("UndecodableArguments: the stored arguments cannot be decoded: Exceeds "
                                            "the limit (4300 digits)")


async def test_bad_options_are_refused_where_they_are_passed(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def take() -> None:
        pass

    for conn in ("x", 5, q, object()):
        with pytest.raises(aioqueue.ConfigurationError, match=r"conn must be an asyncpg.Connection \(or one "
                           r"acquired from an asyncpg pool\), a SQLAlchemy AsyncSession"):
            take.options(conn=conn)  # type: ignore[arg-type]
    for delay in (10**400, -(10**400), 2**1024):
        with pytest.raises(aioqueue.ConfigurationError, match="delay must be 0 to ten years in seconds"):
            take.options(delay=delay)
    east = datetime.timezone(datetime.timedelta(hours=14))
    west = datetime.timezone(datetime.timedelta(hours=-11, minutes=-30))
    for run_at in (datetime.datetime(9999, 12, 31, 23, tzinfo=west), datetime.datetime(1, 1, 1, 0, 30, tzinfo=east)):
        with pytest.raises(aioqueue.ConfigurationError, match=r"run_at .* is outside the supported range"):
            take.options(run_at=run_at)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    async with q.connection() as conn, conn.transaction():  # a pool's connection is accepted
        await take.options(conn=conn).enqueue()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 1


async def test_run_at_edges_round_trip_exactly(q: aioqueue.Queue) -> None:
    @q.task
    async def take() -> None:
        pass

    east = datetime.timezone(datetime.timedelta(hours=14))
    west = datetime.timezone(datetime.timedelta(hours=-11, minutes=-30))
    edges = [
        datetime.datetime(1, 1, 1, tzinfo=datetime.UTC),
        datetime.datetime(1, 1, 1, 14, tzinfo=east),  # the same instant, in another zone
        datetime.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=datetime.UTC),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC),
        datetime.datetime(9999, 12, 31, 12, 29, 59, 999999, tzinfo=west),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=datetime.UTC),
    ]
    ids = [int(await take.options(run_at=at).enqueue()) for at in edges]
    ids += [int(i) for i in await take.options(run_at=edges[0]).enqueue_many([{}])]
    ids += [int(i) for i in await take.options(run_at=edges[3]).enqueue_many([{}])]
    # A delay past the last instant stops there: the job stays readable.
    ids += [int(await take.options(run_at=edges[5], delay=60).enqueue())]
    ids += [int(i) for i in await take.options(run_at=edges[4], delay=3600).enqueue_many([{}])]
    for job_id, at in zip(ids, [*edges, edges[0], edges[3], edges[3], edges[3]], strict=True):
        info = await q.get_job(job_id)
        assert info is not None and info.run_at == at and info.run_at.utcoffset() is not None, (at, info)
