"""What ties a new job into a workflow: the jobs it waits for (``after=``) and the group it joins
(``group=``), checked at the enqueue call, and the statement that records them in the same
transaction as the job (see migration 0014, ``add_dependencies``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._connections import sqlstate_of
from ._errors import ConfigurationError, DependencyError
from ._statements import Bound

if TYPE_CHECKING:
    from ._database import Database
    from ._enqueuer import Enqueuer
    from ._job import JobRef
    from ._task import NamedTask, Task


@dataclasses.dataclass(frozen=True, slots=True)
class Dependency:
    """A job to wait for, with how its dependant reads its result and treats its failure.

    ``job``: its id (a :class:`~aioqueue.JobRef` or an int). ``name``: the key the dependant's
    :meth:`~aioqueue.Queue.upstream` results answer to (besides its position). ``may_fail``: the
    dependant runs even if this job goes dead or is cancelled (by default it is cancelled).
    """

    job: int
    name: str | None = None
    may_fail: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A call of a task, to enqueue later: ``task.s(**kwargs)``, as Celery writes a signature.
    A step of :func:`~aioqueue.chain`, a member of :func:`~aioqueue.group`, or a callback."""

    task: Task[Any, Any] | NamedTask
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    def enqueuer(self, **options: Any) -> Enqueuer[Any, Any]:
        """The task's enqueuer with these :meth:`~aioqueue.Task.options`."""
        return self.task.options(**options)

    async def enqueue(self, **options: Any) -> JobRef:
        """Enqueue this call now, with these options (``conn``, ``after``, ``group``, ...)."""
        return await self.enqueuer(**options).enqueue(*self.args, **self.kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class Links:
    """The checked ``after``/``group`` of one enqueue call."""

    deps: tuple[int, ...] = ()
    names: tuple[str | None, ...] = ()
    may_fail: tuple[bool, ...] = ()
    group: int | None = None

    def bound(self, db: Database, ids: list[int]) -> Bound:
        return db.statements.link(
            ids=ids, deps=self.deps, names=self.names, may_fail=self.may_fail, group=self.group
        )


def _job_id(task: str, value: object, db: Database | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"task {task!r}: after= takes job ids (positive ints or JobRefs), got {value!r}")
    queue = getattr(value, "queue", None)
    other = getattr(queue, "database", None)
    if db is not None and other is not None and other is not db and (
        other.schema != db.schema or other.dsn != db.dsn
    ):
        raise DependencyError(
            f"task {task!r}: dependency {int(value)} is a job of another database or schema "
            f"({other.schema!r}): a job can only wait for jobs of its own queue's database"
        )
    return int(value)


def links_of(task: str, after: object, group: object, db: Database | None) -> Links | None:
    """Check ``after`` (job ids, :class:`Dependency` objects, or a mapping of names to either) and
    ``group`` (a group or its id); None when neither is given."""
    if after is None and group is None:
        return None
    deps: list[Dependency] = []
    if isinstance(after, Mapping):
        for name, value in after.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"task {task!r}: after= names must be non-empty strings, got {name!r}")
            dep = value if isinstance(value, Dependency) else Dependency(value)
            deps.append(dataclasses.replace(dep, name=name))
    elif after is not None:
        if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
            raise ConfigurationError(
                f"task {task!r}: after= takes a list of job ids or a mapping of names to job ids, got {after!r}"
            )
        deps = [value if isinstance(value, Dependency) else Dependency(value) for value in after]
    for dep in deps:
        if dep.name is not None and (not isinstance(dep.name, str) or not dep.name):
            raise ConfigurationError(f"task {task!r}: a dependency's name is a non-empty str or None, got {dep.name!r}")
        if not isinstance(dep.may_fail, bool):
            raise ConfigurationError(f"task {task!r}: a dependency's may_fail is a bool, got {dep.may_fail!r}")
    ids = [_job_id(task, dep.job, db) for dep in deps]
    if len(set(ids)) < len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise ConfigurationError(f"task {task!r}: after= names job {twice} twice")
    gid: int | None = None
    if group is not None:
        group_id: object = getattr(group, "id", group)  # a Group or its id
        if isinstance(group_id, bool) or not isinstance(group_id, int) or group_id < 1:
            raise ConfigurationError(f"task {task!r}: group= takes a Group or its id, got {group!r}")
        gid = group_id
    return Links(tuple(ids), tuple(d.name for d in deps), tuple(bool(d.may_fail) for d in deps), gid)


def refused(task: str, exc: BaseException) -> DependencyError | None:
    """The error to raise for a refusal by ``add_dependencies`` (None: not one)."""
    text = str(getattr(exc, "orig", None) or exc)
    if sqlstate_of(exc) == "22023" and "aioqueue: " in text:
        reason = text[text.index("aioqueue: ") + len("aioqueue: "):].splitlines()[0]
        return DependencyError(f"task {task!r}: {reason}; nothing was written")
    return None

