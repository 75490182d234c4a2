"""Hostile handler results and hostile rows never stop a worker or strand a job.

Hypothesis mixes, in one batch claimed several jobs at a time: archived jobs whose handler
returns something JSON or jsonb cannot hold (cycles, deep nesting, huge ints, NaN, objects, NUL,
surrogates), and rows written straight into the jobs table (nesting past what Python decodes,
arguments that are not an object or do not fit the signature, huge numbers, unknown tasks),
next to good jobs. After the worker drains the queue no job is left running or pending, every
bad job is dead with a last error that says why (or succeeded with a NULL result, for results),
and every good job ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.test_input import json_values
from tests.support.helpers import LoopHarness, closed_after

T = TypeVar("T")


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _cycle_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def _cycle_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = [value]
    return value


# (result, whether it can be stored): a handler's result that cannot is kept as NULL.
unstorable_results = st.one_of(
    st.builds(_cycle_list), st.builds(_cycle_dict),
    st.integers(257, 5000).map(_nested),
    st.integers(4301, 6000).map(lambda digits: 10**digits),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), object(), {1, 2}, b"bytes", "a\x00b", "\ud800",
                     {"k": object()}, {(1, 2): "tuple key"}, [1, float("nan")], {"x": ["\x00"]}]),
).map(lambda value: (value, False))
# A NUL character is the one thing a JSON value from json_values may hold that jsonb cannot.
storable_json = json_values.filter(lambda value: "\\u0000" not in json.dumps(value))
storable_results = (storable_json | st.just(_nested(256)) | st.just(10**4299)).map(lambda value: (value, True))

# (SQL text of args, task, what last_error starts with; None: the job runs and succeeds).
_DEEP = "('{{\"n\":' || repeat('[', {0}) || repeat(']', {0}) || '}}')"
hostile_rows = st.one_of(
    # Deeper than Python decodes, even under hypothesis (which raises the recursion limit by 2,000).
    st.sampled_from([3000, 5000, 10000]).map(lambda d: (_DEEP.format(d), "ping", "UndecodableArguments: ")),
    st.integers(4301, 6000).map(
        lambda digits: (f"('{{\"n\":' || repeat('9', {digits}) || '}}')", "ping", "UndecodableArguments: ")
    ),
    st.sampled_from(["'[1, 2]'", "'5'", "'null'", "'\"text\"'", "'true'"]).map(lambda a: (a, "ping", "TypeError: ")),
    st.just(("'{\"zzz\": 1}'", "ping", "TypeError: ")),
    st.sampled_from(["nope", "'; DROP TABLE x", "\U0001f600"]).map(lambda t: ("'{}'", t, "UnknownTask: ")),
    st.sampled_from(["'{\"n\": 1e400}'", "'{\"n\": -0}'", "'{\"n\": 1e-400}'", _DEEP.format(100)]).map(
        lambda a: (a, "ping", None)
    ),
)


class Harness(LoopHarness):
    """An event loop of the test's own, an open queue with its tasks, and a direct connection."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, pool_max_size=3)
        self.results: list[Any] = []
        self.pinged = 0

        @self.queue.task(name="give", archive=True, max_attempts=1)
        async def give(i: int) -> Any:
            return self.results[i]

        @self.queue.task(name="ping", max_attempts=1)
        async def ping(n: Any = None) -> None:
            self.pinged += 1

        self.give = give


@pytest.fixture
def harness(dsn: str) -> Iterator[Harness]:
    yield from closed_after(Harness(dsn))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    results=st.lists(unstorable_results | storable_results, max_size=4),
    rows=st.lists(hostile_rows, min_size=1, max_size=5),
    good=st.integers(1, 4),
    concurrency=st.integers(2, 8),
)
def test_hostile_results_and_rows_never_strand_a_job(
    harness: Harness, results: list[tuple[Any, bool]], rows: list[tuple[str, str, str | None]], good: int,
    concurrency: int,
) -> None:
    h = harness
    h.run(h.conn.execute("DELETE FROM aioqueue.jobs; DELETE FROM aioqueue.jobs_done"))
    h.results = [value for value, _ in results]
    h.pinged = 0
    given_ids = [int(h.run(h.give.enqueue(i=i))) for i in range(len(results))]
    # Hostile rows interleaved with good ones, so they share claims.
    row_ids: list[tuple[int, str | None]] = []
    for k, (args_sql, task, error) in enumerate(rows):
        row_id = h.run(h.conn.fetchval(
            f"INSERT INTO aioqueue.jobs (task, args, max_attempts) VALUES ($1, {args_sql}::jsonb, 1) RETURNING id",
            task,
        ))
        row_ids.append((row_id, error))
        if k < good:
            good_id = h.run(h.conn.fetchval(
                "INSERT INTO aioqueue.jobs (task, args, max_attempts) VALUES ('ping', $1::jsonb, 1) RETURNING id",
                json.dumps({"n": k}),
            ))
            row_ids.append((good_id, None))

    stats = h.run(h.queue.worker(concurrency=concurrency, poll_interval=0.05).run_until_empty())

    left = h.run(h.conn.fetch("SELECT id, status, last_error FROM aioqueue.jobs"))
    assert [r for r in left if r["status"] != "dead"] == [], "a job was left running or pending"
    dead = {r["id"]: r["last_error"] for r in left}
    succeeded_rows = 0
    for row_id, error in row_ids:
        if error is None:
            assert row_id not in dead, (row_id, dead.get(row_id))
            succeeded_rows += 1
        else:
            assert dead[row_id].startswith(error), (row_id, error, dead[row_id])
    assert len(dead) == len(row_ids) - succeeded_rows
    assert h.pinged == succeeded_rows
    assert stats.succeeded == succeeded_rows + len(results)

    done = h.run(h.conn.fetch("SELECT id, result::text FROM aioqueue.jobs_done WHERE task = 'give'"))
    stored: dict[int, str | None] = {r["id"]: r["result"] for r in done}
    for job_id, (value, storable) in zip(given_ids, results, strict=True):
        text = stored[job_id]
        if storable:
            assert (None if text is None else json.loads(text)) == json.loads(json.dumps(value))
        else:
            assert text is None, value
