"""The progress value a call leaves for the completer becomes, when written, the JSON object
readers parse: every field as given, nothing else but the attempt and the keep flag."""

from __future__ import annotations

import json

import pytest

from aioqueue._progress import Reported


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        (Reported(0.5, None, None, False), {"fraction": 0.5, "attempt": 3, "keep": False}),
        (Reported(1e-05, None, None, True), {"fraction": 1e-05, "attempt": 3, "keep": True}),
        (Reported(0.0, 'é "q" \\ \n', None, False), {"fraction": 0.0, "message": 'é "q" \\ \n', "attempt": 3,
                                                     "keep": False}),
        (Reported(None, None, '{"rows":[1,2]}', False), {"data": {"rows": [1, 2]}, "attempt": 3, "keep": False}),
        (Reported(1.0, "done", "null", False), {"fraction": 1.0, "message": "done", "data": None, "attempt": 3,
                                                "keep": False}),
    ],
)
def test_a_reported_value_is_stored_as_one_json_object(reported: Reported, expected: dict[str, object]) -> None:
    assert json.loads(reported.document(3)) == expected
