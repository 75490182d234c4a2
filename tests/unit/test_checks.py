"""The validators of ``aioqueue.checks``: each accepts exactly what it documents and refuses
the rest with a ConfigurationError naming the value and what is allowed."""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest

from aioqueue import ConfigurationError
from aioqueue import _checks as checks
from aioqueue import _task as task


def test_validators_are_importable_from_task_as_before() -> None:
    for name in ("check_name", "check_int", "check_seconds", "check_run_at", "MAX_DELAY_SECONDS"):
        assert getattr(task, name) is getattr(checks, name)


@pytest.mark.parametrize("value", [1, 2**63 - 1, 12])
def test_job_id_accepts_bigint_ids(value: int) -> None:
    assert checks.check_job_id(value) == value


@pytest.mark.parametrize("value", [0, -1, 2**63, 2**70, "1", "1 OR 1=1", 1.0, 1.5, True, False, None, b"1"])
def test_job_id_refuses_what_is_not_a_bigint_id(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"a job id must be an int from 1 to 9223372036854775807") as info:
        checks.check_job_id(value)
    assert repr(value) in str(info.value)


def test_job_ids_take_an_iterable_of_ids_only() -> None:
    assert checks.check_job_ids([1, 2, 3]) == [1, 2, 3]
    assert checks.check_job_ids(i for i in (5, 6)) == [5, 6]
    assert checks.check_job_ids([]) == []
    for text in ("12", b"12"):
        with pytest.raises(ConfigurationError, match="must be a list"):
            checks.check_job_ids(text)
    with pytest.raises(ConfigurationError, match=r"the single 7; pass \[7\]"):
        checks.check_job_ids(7)
    for bad in ([1.5], [True], ["1"], [2**70], [1, 0]):
        with pytest.raises(ConfigurationError, match="a job id must be an int"):
            checks.check_job_ids(bad)
    with pytest.raises(ConfigurationError, match="must be a list"):
        checks.check_job_ids(None)


def test_limit_is_an_int_within_its_bounds() -> None:
    assert checks.check_limit("limit", 5, 1, 10) == 5
    for bad in ("5", -1, 0, 11, 5.0, True, None):
        with pytest.raises(ConfigurationError, match=r"limit must be an int from 1 to 10, got"):
            checks.check_limit("limit", bad, 1, 10)


def test_rate_is_exactly_a_pair() -> None:
    assert checks.check_rate((10, 1)) == (10, 1.0)
    assert checks.check_rate([3, 0.5]) == (3, 0.5)
    for bad in ((1, 2, 3), (1,), (), "12", 5, None, {1: 2}):
        with pytest.raises(ConfigurationError, match=r"rate must be a pair \(count, seconds\)"):
            checks.check_rate(bad)
    with pytest.raises(ConfigurationError, match="rate count"):
        checks.check_rate((-1, 1))
    with pytest.raises(ConfigurationError, match="rate period"):
        checks.check_rate((1, 0))


def test_queue_names_are_a_list_of_distinct_names() -> None:
    assert checks.check_queue_names(["email", "sms"]) == ["email", "sms"]
    assert checks.check_queue_names(("a",)) == ["a"]
    with pytest.raises(ConfigurationError, match=r"got the str 'email'; pass \['email'\]"):
        checks.check_queue_names("email")
    with pytest.raises(ConfigurationError, match="at least one queue"):
        checks.check_queue_names([])
    with pytest.raises(ConfigurationError, match=r"more than once: \['a'\]"):
        checks.check_queue_names(["a", "b", "a"])
    with pytest.raises(ConfigurationError, match="queue name must be a non-empty str"):
        checks.check_queue_names(["a", ""])
    for bad in (5, None, b"email"):
        with pytest.raises(ConfigurationError, match="must be a list of queue names"):
            checks.check_queue_names(bad)


def test_concurrency_is_1_to_10000() -> None:
    assert checks.check_concurrency(1) == 1
    assert checks.check_concurrency(10_000) == 10_000
    for bad in (0, -1, 10_001, 10**6, 1.0, True, "4", None):
        with pytest.raises(ConfigurationError, match="concurrency must be an int from 1 to 10000"):
            checks.check_concurrency(bad)


@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1024, math.inf, math.nan, -1, -0.1, True, "1"])
def test_seconds_refuse_without_leaking_overflow(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="to ten years in seconds"):
        checks.check_seconds("delay", value)


def test_run_at_range_is_the_utc_years_1_to_9999() -> None:
    east = datetime.timezone(datetime.timedelta(hours=14))
    west = datetime.timezone(datetime.timedelta(hours=-11, minutes=-30))
    for ok in (checks.MIN_RUN_AT, checks.MAX_RUN_AT, datetime.datetime(1, 1, 1, 14, tzinfo=east),
               datetime.datetime(9999, 12, 31, 12, 29, tzinfo=west)):
        assert checks.check_run_at(ok) is ok
    for bad in (datetime.datetime(9999, 12, 31, 23, tzinfo=west), datetime.datetime(1, 1, 1, 0, 30, tzinfo=east)):
        with pytest.raises(ConfigurationError, match="outside the supported range: its instant in UTC must lie "
                           r"from 0001-01-01T00:00:00\+00:00 to 9999-12-31T23:59:59.999999\+00:00"):
            checks.check_run_at(bad)
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        checks.check_run_at(datetime.datetime(2000, 1, 1))
