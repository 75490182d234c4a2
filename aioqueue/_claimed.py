"""Turn a worker's claim into jobs: the claim's columns decoded in claim order, each job built
without a call through the frozen dataclass, and the rows whose arguments Python cannot decode
set apart (the worker makes those dead at once). Importing it also makes a claimed job's lazily
filled fields (``run_at``, ``created_at``, ``headers``) read as a plain ``Job``'s.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ._job import HEADERS_KEY, Job
from ._payload import UndecodableValue, decode

_MIN = datetime.datetime.min.replace(tzinfo=datetime.UTC)
_MAX = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def from_epoch(seconds: float) -> datetime.datetime:
    """The UTC datetime ``seconds`` after the epoch, as a claim sends timestamps (exact to the
    microsecond); an infinite one as asyncpg gives it, the least or the greatest datetime."""
    try:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return _MAX if seconds > 0 else _MIN


class _Filled:
    """A ``Job`` field read through its own slot, which a claim fills with a cheaper stand-in,
    turned into the field's value (and kept in the slot) at the first read. Every read goes
    through here (equality, repr, copies, pickles), so a claimed job is a plain ``Job``:

    - ``run_at`` and ``created_at``: epoch seconds (a float; most handlers never read them),
      turned into the datetime;
    - ``headers``: None for a job without headers (most have none), turned into a dict of the
      job's own, as ``Job()`` would have made. A dict a job made with the claim's other
      thousand-odd objects at once would count towards the collector's next young collection:
      a claim's objects, alive until their handlers end, are what sets off most of them at many
      slots."""

    __slots__ = ("fill", "slot")

    def __init__(self, slot: Any, fill: Callable[[Any], Any]) -> None:
        self.slot = slot
        self.fill = fill  # the value for what the slot holds (the same object if nothing to do)

    def __get__(self, job: Job | None, owner: type | None = None) -> Any:
        if job is None:
            return self.slot  # the class's attribute as the dataclass made it
        value = self.slot.__get__(job)
        if (filled := self.fill(value)) is not value:
            self.slot.__set__(job, filled)
        return filled

    def __set__(self, job: Job, value: Any) -> None:
        self.slot.__set__(job, value)


def _datetime(value: Any) -> Any:
    return from_epoch(value) if type(value) is float else value


def _own_dict(value: Any) -> Any:
    return {} if value is None else value


for _field in ("run_at", "created_at"):
    setattr(Job, _field, _Filled(vars(Job)[_field], _datetime))
Job.headers = _Filled(vars(Job)["headers"], _own_dict)  # type: ignore[assignment,misc]


class _Unfrozen:
    """A ``Job``'s slots without its freezing: a claimed job is built as one, its fields set by
    plain attribute stores, then made a ``Job`` by assigning its class (the same slots, so the
    same layout: Python allows it). A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, and the slots' own setters cost as much (a call through a wrapper
    each, about a microsecond for the ten): a visible share of a worker's own CPU per short job."""

    __slots__ = Job.__slots__


def _claimed_job(
    id: int, queue: str, task: str, args: dict[str, Any], priority: int, attempt: int, max_attempts: int,
    run_at: float, created_at: float, headers: dict[str, str] | None,
) -> Job:
    """``Job(...)`` for a claimed row, built more cheaply (see :class:`_Unfrozen`): the same
    immutable object, its timestamps (epoch seconds) left to be built when read (see
    :class:`_Filled`)."""
    job: Any = _Unfrozen()  # its slots are Job's: set by name, as Job() would
    job.id = id
    job.queue = queue
    job.task = task
    job.args = args
    job.priority = priority
    job.attempt = attempt
    job.max_attempts = max_attempts
    job.run_at = run_at
    job.created_at = created_at
    job.headers = headers or None  # none stored: a dict of its own when first read (see _Filled)
    job.__class__ = Job
    made: Job = job
    return made


# A field added to Job (and not here), or a layout Python no longer lets a class be swapped
# for, fails here, at import, rather than in a worker's first claim.
_probe = _claimed_job(0, "", "", {}, 0, 0, 0, 0.0, 0.0, None)
if type(_probe) is not Job or not all(hasattr(_probe, name) for name in Job.__slots__) or _probe.headers != {}:
    raise RuntimeError("aioqueue._job: _claimed_job no longer builds a Job")


@dataclasses.dataclass(frozen=True, slots=True)
class Undecodable:
    """A claimed row whose arguments Python cannot decode: ``(id, attempt)`` fences the write
    that makes it dead; ``error`` says why."""

    id: int
    attempt: int
    error: str


def decode_claim(columns: Sequence[Any]) -> tuple[list[Job], list[Undecodable]]:
    """Build the jobs of one claim from its columns (the first nine of ``claimed_arrays`` of
    queries.sql, a worker's claim as one row: each column an array over the jobs, NULL if
    none), in claim order, and set apart those whose arguments cannot be decoded.

    Claim order is priority, then run_at, then id (the arrays come in no particular order).
    The arguments (jsonb as text, so valid JSON) are parsed as one JSON array: cheaper per job
    than a json.loads each. If that fails (nesting past Python's recursion limit, an int over
    its digit limit), each job's are decoded on its own, so one bad job never takes its
    batch-mates with it.
    """
    ids, queues, tasks, texts, priorities, attempts, most, run_ats, created_ats = map(columns.__getitem__, range(9))
    if not ids:
        return [], []
    in_order: Iterable[Iterable[Any]]
    order: Sequence[int]
    if priorities.count(priorities[0]) == len(ids) and run_ats == sorted(run_ats) and ids == sorted(ids):
        # Most often the rows come in claim order already (one priority, the order the claim
        # locked them in): seen in C without a call a job, and taken as they are.
        order = range(len(ids))
        in_order = (ids, queues, tasks, priorities, attempts, most, run_ats, created_ats)
        joined = ",".join(texts)
    else:
        # Positions in claim order, in C, by stable sorts on one column each: a key of two
        # columns would be a tuple a job, thousands at once that the collector counts.
        order = sorted(range(len(ids)), key=ids.__getitem__)
        order.sort(key=run_ats.__getitem__)
        order.sort(key=priorities.__getitem__, reverse=True)
        in_order = (map(c.__getitem__, order) for c in (ids, queues, tasks, priorities, attempts, most, run_ats,
                                                         created_ats))
        joined = ",".join(map(texts.__getitem__, order))
    try:
        args = json.loads("[" + joined + "]")
    except (ValueError, RecursionError):
        args = None
    if args is not None and {*map(type, args)} <= {dict}:
        # Column by column, each job built by one call: no bytecodes of ours a job but its own.
        o_ids, o_queues, o_tasks, o_priorities, o_attempts, o_most, o_run_ats, o_created_ats = in_order
        headers = map(dict.pop, args, itertools.repeat(HEADERS_KEY), itertools.repeat(None))
        return list(map(
            _claimed_job, o_ids, o_queues, o_tasks, args, o_priorities, o_attempts, o_most, o_run_ats, o_created_ats,
            headers,
        )), []
    jobs: list[Job] = []
    bad: list[Undecodable] = []
    for i in order:
        job_args = decode(texts[i])
        if isinstance(job_args, UndecodableValue):
            bad.append(Undecodable(ids[i], attempts[i], job_args.error))
        elif type(job_args) is not dict:
            kind = type(job_args).__name__
            error = f"TypeError: the stored arguments are a JSON {kind}, not an object of keyword arguments"
            bad.append(Undecodable(ids[i], attempts[i], error))
        else:
            jobs.append(_claimed_job(
                ids[i], queues[i], tasks[i], job_args, priorities[i], attempts[i], most[i], run_ats[i],
                created_ats[i], job_args.pop(HEADERS_KEY, None),
            ))
    return jobs, bad
