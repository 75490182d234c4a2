"""The benchmark's scenarios, registered in one place: name -> the function that lines up its
measurements on a run. ``--scenarios`` picks among these names; the runner runs them in this
order."""

from __future__ import annotations

from collections.abc import Callable

from common import Run

from . import (
    claim,
    dashboard,
    drain,
    drain_states,
    enqueue,
    io_bound,
    latency,
    memory,
    outbox,
    per_key,
    progress,
    scaling,
    steps,
    sustained,
    workflows,
)

#: Lines up a scenario's measurements on the run (``run.step``); measures nothing itself.
Scenario = Callable[[Run], None]

SCENARIOS: dict[str, Scenario] = {
    "drain": drain.plan,
    "drain-states": drain_states.plan,
    "enqueue": enqueue.plan,
    "latency": latency.plan,
    "claim": claim.plan,
    "memory": memory.plan,
    "dashboard": dashboard.plan,
    "scaling": scaling.plan,
    "outbox": outbox.plan,
    "io-bound": io_bound.plan,
    "workflows": workflows.plan,
    "steps": steps.plan,
    "per-key": per_key.plan,
    "progress": progress.plan,
    "sustained": sustained.plan,
}

#: Scenarios that run only when named with ``--scenarios`` (they take many minutes).
ON_REQUEST = frozenset({"sustained"})

__all__ = ["ON_REQUEST", "SCENARIOS", "Scenario"]
