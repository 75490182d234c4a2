"""Enqueue hooks: code the user wraps around every enqueue call, which may attach headers to
the jobs it writes (OpenTelemetry's trace context, see :mod:`aioqueue.integrations.otel`).

A hook is a callable that takes the task and how many jobs the call writes and returns a
context manager yielding a mapping of string headers. The call enters every hook of the queue
(first registered outermost) around its write; the headers ride in the job's stored arguments
under a reserved key and reach the worker as :attr:`Job.headers`, never as a handler argument.
With no hook registered an enqueue costs nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from ._task import NamedTask, Task

EnqueueHook: TypeAlias = "Callable[[Task[Any, Any] | NamedTask, int], AbstractContextManager[Mapping[str, str]]]"
"""A callable ``(task, count)`` returning a context manager that yields headers."""


@contextlib.contextmanager
def entered(hooks: Sequence[EnqueueHook], task: Task[Any, Any] | NamedTask, count: int) -> Iterator[dict[str, str]]:
    """Enter every hook around an enqueue of ``count`` jobs of ``task``; yield their headers."""
    if not hooks:
        yield {}
        return
    headers: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            headers.update(stack.enter_context(hook(task, count)))
        yield headers
