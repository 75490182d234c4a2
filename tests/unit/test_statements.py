"""The typed statement layer binds exactly what its statements take: each method's keywords and
channels fill ``$1``..``$n`` of its statement in ``queries.sql``, each once, in the order the
statement reads them. No database: the statements are only bound, never sent."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from aioqueue._queries import for_schema
from aioqueue._statements import Channels, NewJobs, Statements, int_array

#: Channels named apart, so that each bound channel tells which it is.
CHANNELS = Channels(jobs="channel jobs", cancel="channel cancel", done="channel done", due="channel due",
                    outbox="channel outbox")
STATEMENTS = Statements(for_schema("aioqueue"), CHANNELS)

#: What every enqueued job shares, bound first by both enqueue statements (a NewJobs).
JOB_COLUMNS = ("jobs.queue", "jobs.task", "jobs.priority", "jobs.run_at", "jobs.delay", "jobs.max_attempts",
               "jobs.archive")

#: Each method's statement(s), and what it binds to $1, $2, ... in order: a keyword of the
#: method, or a channel (``channel.NAME``). The orders are the statements' own, as their
#: comments in queries.sql describe them.
ORDER: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "claim": (("claim", "claim_timed", "claim_keyed_timed", "claim_unlimited"),
              ("queues", "wants", "worker", "lease", "limit", "commit_mode")),
    "extend_leases": (("extend_leases",), ("ids", "attempts", "lease")),
    "cancel_requests": (("cancel_requests",), ("ids", "attempts")),
    "complete": (("complete",), ("ids", "attempts", "results", "channel.done", "channel.jobs", "commit_mode")),
    "fail": (("fail",), (
        "ids", "attempts", "errors", "delays", "dead", "base", "factor", "max_delay", "jitter",
        "channel.jobs", "channel.due", "channel.done", "commit_mode",
    )),
    "reschedule": (("reschedule",), (
        "ids", "attempts", "delays", "notes", "channel.jobs", "channel.due", "commit_mode",
    )),
    "finish_cancelled": (("finish_cancelled",), ("ids", "attempts", "channel.jobs", "channel.done", "commit_mode")),
    "suspend": (("suspend",), ("ids", "attempts", "commit_mode")),
    "write_progress": (("write_progress",), ("ids", "attempts", "values", "commit_mode")),
    "enqueue_one": (("enqueue",), (*JOB_COLUMNS, "args", "key", "channel.jobs", "channel.due", "group",
                                   "jobs.partition_key")),
    "enqueue_batch": (("enqueue_many", "enqueue_many_keyed"), (
        *JOB_COLUMNS, "args", "channel.jobs", "channel.due", "keys", "group", "jobs.partition_key",
    )),
    "publish_events": (("publish_events",), ("stream", "keys", "payloads")),
    "link": (("add_dependencies",), ("ids", "deps", "names", "may_fail", "group")),
}


#: The methods whose claims, ``ids`` and ``attempts``, go as array literals in text (see
#: ``int_array``): each is bound as the literal of the list given.
AS_TEXT = {"extend_leases", "cancel_requests", "complete", "fail", "reschedule", "finish_cancelled", "suspend",
           "write_progress"}


def _placeholders(sql: str) -> set[int]:
    """The ``$n`` a statement reads (outside string literals, where there are none of the form)."""
    return {int(n) for n in re.findall(r"\$(\d+)", sql)}


def _keywords(method: Any) -> list[str]:
    params = inspect.signature(method).parameters.values()
    assert all(p.kind is p.KEYWORD_ONLY for p in params), f"{method.__name__} takes keyword arguments only"
    return [p.name for p in params]


def _bind(name: str, **overrides: Any) -> tuple[str, tuple[Any, ...], dict[str, object]]:
    """Call method ``name`` with a distinct marker for each keyword; return the SQL, the bound
    values and the markers."""
    method = getattr(STATEMENTS, name)
    markers: dict[str, object] = {kw: object() for kw in _keywords(method)}
    markers.update(overrides)
    if "jobs" in markers:  # the parameter object: a marker per field
        fields = {f"jobs.{f}": object() for f in NewJobs.__dataclass_fields__}
        markers["jobs"] = NewJobs(**{f.removeprefix("jobs."): v for f, v in fields.items()})  # type: ignore[arg-type]
        markers.update(fields)
    bound = method(**{k: v for k, v in markers.items() if "." not in k})
    return bound.sql, bound.args, markers


def test_every_hot_path_statement_has_a_method() -> None:
    public = {name for name, _ in inspect.getmembers(Statements, inspect.isfunction) if not name.startswith("_")}
    assert public == set(ORDER)


@pytest.mark.parametrize("name", sorted(ORDER))
def test_a_method_binds_each_placeholder_of_its_statement_once_in_order(name: str) -> None:
    statements, order = ORDER[name]
    variants: list[dict[str, Any]] = [{}]
    if name == "claim":
        choices = ((True, False, False), (True, True, False), (True, True, True), (False, False, False))
        variants = [{"limited": limited, "timed": timed, "keyed_only": keyed_only}
                    for limited, timed, keyed_only in choices]
    elif name == "enqueue_batch":
        variants = [{"keys": None}, {}]
    if name in AS_TEXT:
        variants = [{**v, "ids": [11, 12], "attempts": [21, 22]} for v in variants]
    if name == "complete":
        variants = [{**v, "results": ["31", None]} for v in variants]
    seen_sql = set()
    for overrides in variants:
        sql, args, markers = _bind(name, **overrides)
        [statement] = [s for s in statements if getattr(STATEMENTS.queries, s) == sql]
        seen_sql.add(statement)
        # keys: the keyed statement's $11 only
        expected = order if statement != "enqueue_many" else tuple(w for w in order if w != "keys")
        # The statement reads exactly $1..$n, and the method binds n values.
        assert _placeholders(sql) == set(range(1, len(expected) + 1)), statement
        assert len(args) == len(expected), statement
        for position, (value, what) in enumerate(zip(args, expected, strict=True), start=1):
            if what.startswith("channel."):
                assert value == getattr(CHANNELS, what.removeprefix("channel.")), f"{statement} ${position}: {what}"
            elif name in AS_TEXT and what in ("ids", "attempts"):
                assert value == int_array(markers[what]), f"{statement} ${position} should be {what}"  # type: ignore[arg-type]
            else:
                assert value is markers[what], f"{statement} ${position} should be {what}"
    assert seen_sql == set(statements)


@pytest.mark.parametrize("name", sorted(ORDER))
def test_every_keyword_of_a_method_is_bound(name: str) -> None:
    _, order = ORDER[name]
    bound = {what.partition(".")[0] if what.startswith("jobs.") else what
             for what in order if not what.startswith("channel.")}
    chooses = {"limited", "timed", "keyed_only"}  # pick one of the method's statements instead of binding a value
    assert set(_keywords(getattr(STATEMENTS, name))) - chooses == bound


def test_claims_go_as_array_literals_and_no_results_as_null() -> None:
    assert int_array([]) == "{}"
    assert int_array([1, 2**40, -3]) == "{1,1099511627776,-3}"
    _, args = STATEMENTS.complete(ids=[1, 2], attempts=[1, 3], results=[None, None], commit_mode="off")
    assert args[:3] == ("{1,2}", "{1,3}", None)  # every result None: one NULL, not an array of them
    _, args = STATEMENTS.complete(ids=[1, 2], attempts=[1, 3], results=[None, "[1]"], commit_mode="off")
    assert args[2] == [None, "[1]"]
