"""Decoding a worker's claim (one row of column arrays) into jobs in claim order, without a database."""

from __future__ import annotations

import dataclasses
import itertools
import json
import pickle
import random
from typing import Any

import pytest

from aioqueue._claimed import decode_claim
from aioqueue._job import HEADERS_KEY, Job

# (id, priority, run_at): claim order is priority (highest first), then run_at, then id.
Row = tuple[int, int, float]


def columns(rows: list[Row], bad: int | None = None) -> list[list[Any]]:
    """A claim's nine columns over ``rows``, in the order given; the job ``bad`` with arguments
    that are not an object."""
    texts = ["[1]" if r[0] == bad else json.dumps({"i": r[0]}) for r in rows]
    return [
        [r[0] for r in rows], ["default"] * len(rows), ["t"] * len(rows), texts, [r[1] for r in rows],
        [1] * len(rows), [25] * len(rows), [r[2] for r in rows], [0.0] * len(rows),
    ]


def claim_order(rows: list[Row]) -> list[int]:
    return [r[0] for r in sorted(rows, key=lambda r: (-r[1], r[2], r[0]))]


CASES = {
    "in claim order": [(1, 0, 5.0), (2, 0, 5.0), (3, 0, 6.0), (7, 0, 9.0)],
    "ids sorted, run_at not": [(1, 0, 9.0), (2, 0, 5.0), (3, 0, 6.0)],
    "run_at sorted, tied ids not": [(4, 0, 5.0), (2, 0, 5.0), (3, 0, 6.0)],
    "both sorted, priorities differ": [(1, 0, 5.0), (2, 3, 6.0), (3, 1, 7.0)],
}


@pytest.mark.parametrize("rows", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("bad", [None, 2])
def test_jobs_come_in_claim_order_whatever_order_the_rows_came_in(rows: list[Row], bad: int | None) -> None:
    for shuffled in itertools.islice(itertools.permutations(rows), 24):
        jobs, undecodable = decode_claim(columns(list(shuffled), bad))
        assert [j.id for j in jobs] == [i for i in claim_order(rows) if i != bad]
        assert all(j.args == {"i": j.id} and j.priority == {r[0]: r[1] for r in rows}[j.id] for j in jobs)
        assert [u.id for u in undecodable] == ([bad] if bad is not None and bad in [r[0] for r in rows] else [])


def test_a_large_claim_in_any_order() -> None:
    rng = random.Random(7)
    rows = [(i, rng.choice([0, 0, 1]), float(rng.randrange(5))) for i in range(1, 500)]
    for listed in (sorted(rows, key=lambda r: (-r[1], r[2], r[0])), rng.sample(rows, len(rows))):
        jobs, _ = decode_claim(columns(listed))
        assert [j.id for j in jobs] == claim_order(rows)
        assert [j.run_at.timestamp() for j in jobs] == [r[2] for r in sorted(rows, key=lambda r: (-r[1], r[2], r[0]))]


def test_a_claimed_job_without_headers_has_a_dict_of_its_own_like_a_built_one() -> None:
    rows: list[Row] = [(1, 0, 5.0), (2, 0, 6.0)]
    cols = columns(rows)
    cols[3][1] = json.dumps({"i": 2, HEADERS_KEY: {"traceparent": "00-1-2-01"}})
    first, second = decode_claim(cols)[0]
    built = Job(1, "default", "t", {"i": 1}, 0, 1, 25, first.run_at, first.created_at)
    assert first == built and repr(first) == repr(built)
    assert first.headers == {} and second.headers == {"traceparent": "00-1-2-01"}
    first.headers["k"] = "v"  # a job's own dict: another job's stays empty
    assert first.headers == {"k": "v"} and decode_claim(columns(rows))[0][0].headers == {}
    assert dataclasses.replace(first, attempt=2).headers == {"k": "v"}
    assert pickle.loads(pickle.dumps(first)) == first
