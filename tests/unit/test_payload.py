"""Job arguments and results as JSON (``aioqueue._payload``), with no database: what is refused
names its culprit, what is stored reads back, and what cannot be read back says so."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import aioqueue
from aioqueue._payload import (
    MAX_DEPTH,
    UndecodableValue,
    check_json,
    decode,
    decode_shown,
    dumps,
    encode_args,
    encode_args_array,
    encode_result,
)


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1.5, "x", None, True], "c": {"d": "é"}}, [], {}, "text", 0, -1.25, None, "ünïcødé ✓",
])
def test_dumps_writes_what_json_dumps_writes_compactly(value: Any) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert dumps(value) == expected
    assert json.loads(dumps(value)) == value


@pytest.mark.parametrize(("args", "named"), [
    ({"x": math.nan}, "'x'"),
    ({"x": [1, math.inf]}, "'x'"),
    ({"x": "a\x00b"}, "'x'"),
    ({"when": object()}, "'when'"),
    ({"deep": nested(MAX_DEPTH + 5)}, "'deep'"),
    ({"raw": b"bytes"}, "'raw'"),
])
def test_encode_args_refuses_naming_the_task_and_argument(args: dict[str, Any], named: str) -> None:
    with pytest.raises(aioqueue.JobArgumentsError) as caught:
        encode_args("send", args, 1_000_000)
    assert "'send'" in str(caught.value) and named in str(caught.value), caught.value


def test_encode_args_refuses_arguments_over_the_size_limit_with_their_size() -> None:
    text = encode_args("t", {"s": "x" * 100}, 1000)
    assert json.loads(text) == {"s": "x" * 100}
    too_large = r"'t': arguments are 1008 bytes as JSON, over the limit of 1000"
    with pytest.raises(aioqueue.PayloadTooLargeError, match=too_large):
        encode_args("t", {"s": "x" * 1000}, 1000)
    # The limit counts UTF-8 bytes, not characters.
    with pytest.raises(aioqueue.PayloadTooLargeError, match="over the limit"):
        encode_args("t", {"s": "é" * 400}, 500)


def test_encode_args_array_is_each_job_encoded_alone() -> None:
    calls = [{"n": i, "s": "é" * i, "l": nested(3)} for i in range(5)]
    assert encode_args_array("t", calls, 10_000, "enqueue_many") == "[" + ",".join(
        encode_args("t", c, 10_000) for c in calls
    ) + "]"


def test_encode_args_array_names_the_bad_item_counted_from_one_of_the_total() -> None:
    calls: list[dict[str, Any]] = [{"n": 1}, {"n": 2}, {"n": math.nan}]
    with pytest.raises(aioqueue.JobArgumentsError) as caught:
        encode_args_array("t", calls, 10_000, "enqueue_many", first=10, total=20)
    message = str(caught.value)
    assert "enqueue_many" in message and "13" in message and "20" in message and "'n'" in message, message


def test_encode_args_array_finds_a_deep_job_among_shallow_ones() -> None:
    calls: list[dict[str, Any]] = [{"n": i} for i in range(10)]
    calls.append({"deep": nested(MAX_DEPTH + 1)})
    with pytest.raises(aioqueue.JobArgumentsError, match="'deep'"):
        encode_args_array("t", calls, 10**9, "enqueue_many")


def test_encode_result_stores_what_it_can_and_null_for_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    assert encode_result(None) is None
    assert encode_result({"ok": [1, 2]}) == '{"ok":[1,2]}'
    assert encode_result(math.nan, "job 7") is None
    assert "job 7" in caplog.text and "stored as NULL" in caplog.text


def test_check_json_returns_the_value_or_names_its_path() -> None:
    value = {"a": [1, "b"]}
    assert check_json(value, "filter") is value
    with pytest.raises(aioqueue.ConfigurationError, match="filter"):
        check_json({"a": [math.nan]}, "filter")


def test_decode_reads_back_and_marks_what_python_cannot_decode() -> None:
    assert decode('{"a":[1,2.5,"x"]}') == {"a": [1, 2.5, "x"]}
    too_deep = "[" * 100_000 + "]" * 100_000
    bad = decode(too_deep, "result")
    assert isinstance(bad, UndecodableValue)
    assert bad.error.startswith("UndecodableResult: the stored result cannot be decoded")
    assert str(bad).startswith("undecodable: ")
    assert isinstance(decode(too_deep), UndecodableValue) and "UndecodableArguments" in decode(too_deep).error


def test_decode_shown_marks_what_aioqueue_never_writes() -> None:
    assert decode_shown(None, "result") is None
    assert decode_shown('{"a":1}', "arguments") == {"a": 1}
    past_floats = decode_shown('{"x":' + "9" * 400 + ".5}", "arguments")
    assert isinstance(past_floats, UndecodableValue) and "cannot be shown" in past_floats.error
    deep = decode_shown(dumps(nested(MAX_DEPTH + 2)), "result")
    assert isinstance(deep, UndecodableValue) and "UndecodableResult" in deep.error
