"""The goals aioqueue is built to reach, as data, and the check of a run's medians against
them. A goal is absolute (a rate, a latency, a size) or a ratio to a baseline measured in the
same run: another queue on the same metric, or aioqueue on another metric."""

from __future__ import annotations

import dataclasses
import fnmatch
import operator
from collections.abc import Callable
from typing import Any, Literal

from common import Result, Results, figure

Comparison = Literal[">=", "<=", "<", ">"]

_COMPARE: dict[Comparison, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "<": operator.lt,
    ">": operator.gt,
}
_SHOWN: dict[Comparison, str] = {">=": "≥", "<=": "≤", "<": "<", ">": ">"}


@dataclasses.dataclass(frozen=True)
class Target:
    """One goal: ``metric`` (a glob: sizes are part of some metrics' names) of ``system`` in
    ``scenario`` compared with ``value``. ``system`` ``aioqueue`` stands for every aioqueue
    worker setting, each checked on its own. With ``vs_system`` or ``vs_metric`` the measured
    figure is a ratio: the median over the baseline's (same system or metric when not given);
    with ``or_vs`` too, over the lower of that baseline and this other one (system, metric).
    With ``only_where`` the goal applies only where that system's median on the same metric
    meets it too (a rate a slower machine cannot give anyone); elsewhere it is not applicable."""

    scenario: str
    system: str
    metric: str
    comparison: Comparison
    value: float
    description: str
    vs_system: str | None = None
    vs_metric: str | None = None
    or_vs: tuple[str | None, str | None] | None = None
    only_where: str | None = None

    @property
    def relative(self) -> bool:
        return self.vs_system is not None or self.vs_metric is not None


TARGETS: tuple[Target, ...] = (
    Target("drain", "aioqueue (defaults)", "1 process, concurrency 10", ">=", 0.85,
           "drain against the reference lane, concurrency 10", vs_system="reference"),
    Target("drain", "aioqueue (tuned)", "1 process, concurrency 10", ">=", 1.0,
           "drain against the reference lane, concurrency 10", vs_system="reference"),
    Target("drain", "aioqueue", "1 process, concurrency 10", ">=", 50_000,
           "drain, one process, concurrency 10 (where the reference lane reaches it too)", only_where="reference"),
    Target("drain", "aioqueue (defaults)", "1 process, concurrency 10", ">=", 10,
           "drain against pgqueuer, concurrency 10", vs_system="pgqueuer"),
    Target("drain-states", "aioqueue (defaults)", "concurrency 10, stale", ">=", 0.9,
           "drain after a burst with stale statistics, against analysed", vs_metric="concurrency 10, analyzed"),
    Target("enqueue", "aioqueue", "bulk, * per call", ">=", 100_000, "bulk enqueue"),
    Target("sustained", "aioqueue (defaults)", "enqueue and work, 1 worker process, * producer processes", ">=", 0.5,
           "enqueue and work together, against the drain alone", vs_metric="drain alone, 1 worker process"),
    Target("enqueue", "aioqueue", "bulk, * per call", ">=", 1.2, "bulk enqueue against the reference lane",
           vs_system="reference"),
    Target("latency", "aioqueue", "commit seen -> handler start, p50", "<=", 1.0, "idle wake-up p50, from the commit"),
    Target("latency", "aioqueue", "commit seen -> handler start, p99", "<=", 5.0, "idle wake-up p99, from the commit"),
    Target("claim", "aioqueue", "claim_unlimited 10, * archived + * dead: server execution", "<=", 1.2,
           "claim_unlimited beside a deep history, against an empty one",
           vs_metric="claim_unlimited 10, empty history: server execution"),
    Target("claim", "aioqueue", "claim 10, * archived + * dead: server execution", "<=", 1.2,
           "claim beside a deep history, against an empty one",
           vs_metric="claim 10, empty history: server execution"),
    Target("memory", "aioqueue", "peak RSS, *", "<", 150, "worker memory with a deep backlog"),
    *(Target("io-bound", "aioqueue", f"no-op, concurrency {c}", ">=", 0.9,
             f"no-op drain at concurrency {c} against concurrency 10", vs_metric="no-op, concurrency 10")
      for c in (100, 1000)),
    Target("io-bound", "aioqueue", "no-op, concurrency 1000: CPU per job", "<=", 1.1,
           "CPU per no-op job at concurrency 1000 against concurrency 10",
           vs_metric="no-op, concurrency 10: CPU per job"),
    # The worker cannot outrun its own no-op drain, nor the loop its handlers: the lower of the two.
    Target("io-bound", "aioqueue", "sleep 10 ms, concurrency 1000", ">=", 0.8,
           "10 ms handlers at concurrency 1000 against the lower of the bare loop and the no-op drain at 10",
           vs_system="bare asyncio loop", or_vs=(None, "no-op, concurrency 10")),
    Target("io-bound", "aioqueue", "sleep 10 ms, concurrency 5000", ">", 1.0,
           "10 ms handlers at concurrency 5000 against 1000", vs_metric="sleep 10 ms, concurrency 1000"),
    Target("io-bound", "aioqueue", "RSS, * slots busy", "<", 300, "worker memory with every slot busy"),
    Target("per-key", "aioqueue (fair)", "flood of * + * keys x *", ">=", 0.8,
           "flood drain with keys in turn, against first in, first out", vs_system="aioqueue (first in, first out)"),
    Target("per-key", "aioqueue (fair)", "small key's first start, flood of *, p99", "<=", 1000.0,
           "a small key's first job under a flood, p99"),
    Target("per-key", "aioqueue (per-key limit 1)", "* keys x *, 4 processes", ">=", 0.7,
           "per-key limit 1 drain, against no limit", vs_system="aioqueue (no per-key limit)"),
    Target("per-key", "aioqueue (per-key limit 1)", "* keys x *, 4 processes: jobs of one key running together",
           "<=", 0.0, "jobs of one key running together under a limit of 1"),
)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One target checked against one measured system."""

    target: Target
    system: str
    measured: float
    unit: str
    met: bool
    applies: bool = True
    """False where the goal's ``only_where`` system did not reach it either."""
    baseline: float | None = None
    """The ``only_where`` system's median, when the goal has one."""

    def line(self) -> str:
        """``drain, one process, concurrency 10, defaults: 6,398 jobs/s (goal ≥ 40,000) NOT met``"""
        setting = self.system.partition(" (")[2].rstrip(")")
        who = f"{self.target.description}, {setting}" if setting else self.target.description
        goal = f"goal {_SHOWN[self.target.comparison]} {_figure(self.target.value, self.unit, goal=True)}"
        if not self.applies:
            assert self.baseline is not None
            verdict = f"not applicable ({self.target.only_where}: {_figure(self.baseline, self.unit)} here)"
        else:
            verdict = "met" if self.met else "NOT met"
        return f"{who}: {_figure(self.measured, self.unit)} ({goal}) {verdict}"

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.target), "system": self.system, "measured": self.measured,
                "unit": self.unit, "met": self.met, "applies": self.applies, "baseline": self.baseline}


def check(results: Results, targets: tuple[Target, ...] = TARGETS) -> list[Verdict]:
    """Every target that this run measured, checked against the medians."""
    verdicts: list[Verdict] = []
    for target in targets:
        for result in results.items.values():
            if not _measures(target, result):
                continue
            measured, unit = result.median, result.unit
            if target.relative:
                baseline = _baseline(results, target, result)
                if baseline is None:
                    continue
                measured, unit = measured / baseline.median, "x"
            met = _COMPARE[target.comparison](measured, target.value)
            applies, reached = True, None
            if target.only_where is not None:
                gate = results.get(result.scenario, target.only_where, result.metric)
                if gate is None or not gate.values:
                    continue
                reached = gate.median
                applies = _COMPARE[target.comparison](reached, target.value)
            verdicts.append(Verdict(target, result.system, measured, unit, met, applies, reached))
    return verdicts


def _measures(target: Target, result: Result) -> bool:
    own_system = result.system == target.system or result.system.startswith(f"{target.system} (")
    return (result.scenario == target.scenario and own_system and bool(result.values)
            and fnmatch.fnmatchcase(result.metric, target.metric))


def _baseline(results: Results, target: Target, result: Result) -> Result | None:
    pairs = [(target.vs_system, target.vs_metric)] + ([target.or_vs] if target.or_vs is not None else [])
    found = [results.get(result.scenario, system or result.system, metric or result.metric) for system, metric in pairs]
    if any(b is None or not b.values for b in found):
        return None
    return min((b for b in found if b is not None), key=lambda b: b.median)


def _figure(value: float, unit: str, *, goal: bool = False) -> str:
    if goal:  # as written in TARGETS: 40,000 jobs/s, 1 ms, 1.2x
        return f"{value:,g}x" if unit == "x" else f"{value:,g} {unit}"
    return f"{figure(value, unit)}x" if unit == "x" else f"{figure(value, unit)} {unit}"
