"""The completer's buffer: job outcomes handed over and not yet written, kept by kind (successes,
failures, reschedules, cancels, suspends) in the order they came. It holds, splits and merges
them and never writes: :mod:`aioqueue._completer` writes each kind with one statement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator

from ._claims import ClaimKey
from ._retry import Backoff

#: The backoff a buried job's failure carries: never used, since the job is dead at once.
NO_RETRY = Backoff(base=0.0, factor=1.0, max_delay=0.0, jitter=0.0)


@dataclasses.dataclass(slots=True)
class Failure:
    """A failed attempt, to be retried after ``delay`` (None: by ``retry``) or dead."""

    job_id: int
    attempt: int
    error: str
    delay: float | None
    dead: bool
    retry: Backoff


@dataclasses.dataclass(slots=True)
class Batch:
    """Outcomes of one or more claims, a list per kind; successes as three parallel lists."""

    done_ids: list[int] = dataclasses.field(default_factory=list)
    done_attempts: list[int] = dataclasses.field(default_factory=list)
    done_results: list[str | None] = dataclasses.field(default_factory=list)
    failures: list[Failure] = dataclasses.field(default_factory=list)
    reschedules: list[tuple[int, int, float, str | None]] = dataclasses.field(default_factory=list)
    cancels: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    suspends: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.done_ids) + len(self.failures) + len(self.reschedules) + len(self.cancels) + len(self.suspends)

    def split(self, n: int) -> tuple[Batch, Batch]:
        """The first ``n`` outcomes (successes first, then failures, reschedules, cancels,
        suspends), and the rest."""
        if len(self) <= n:
            return self, Batch()
        k = min(n, len(self.done_ids))
        head = Batch(self.done_ids[:k], self.done_attempts[:k], self.done_results[:k])
        rest = Batch(self.done_ids[k:], self.done_attempts[k:], self.done_results[k:])
        n -= k
        k = min(n, len(self.failures))
        head.failures, rest.failures = self.failures[:k], self.failures[k:]
        n -= k
        k = min(n, len(self.reschedules))
        head.reschedules, rest.reschedules = self.reschedules[:k], self.reschedules[k:]
        n -= k
        k = min(n, len(self.cancels))
        head.cancels, rest.cancels = self.cancels[:k], self.cancels[k:]
        n -= k
        head.suspends, rest.suspends = self.suspends[:n], self.suspends[n:]
        return head, rest

    def claims(self) -> list[ClaimKey]:
        """The (job id, attempt) of every outcome in the batch."""
        return [*zip(self.done_ids, self.done_attempts, strict=True), *self.others()]

    def others(self) -> list[ClaimKey]:
        """The (job id, attempt) of every outcome in the batch but its successes."""
        return [
            *((f.job_id, f.attempt) for f in self.failures),
            *((r[0], r[1]) for r in self.reschedules),
            *self.cancels,
            *self.suspends,
        ]

    def extend(self, later: Batch) -> None:
        """Append ``later``'s outcomes to this batch's, kind by kind."""
        self.done_ids += later.done_ids
        self.done_attempts += later.done_attempts
        self.done_results += later.done_results
        self.failures += later.failures
        self.reschedules += later.reschedules
        self.cancels += later.cancels
        self.suspends += later.suspends


class Writing(Collection[ClaimKey]):
    """The claims whose outcomes the completer is writing now: the heartbeat reads it (their
    rows may be gone under the write, and they are not lost). Kept as the parts each batch being
    written started with (its successes' ids and attempts, the claims of its other outcomes),
    not as a set of claims: a tuple a success, alive across the write, would be one more object
    a job for the collector to walk. The set is made only when asked, which is rare."""

    def __init__(self) -> None:
        self._parts: list[tuple[list[int], list[int], list[ClaimKey]]] = []
        self._set: set[ClaimKey] | None = None

    def add(self, ids: list[int], attempts: list[int], others: list[ClaimKey]) -> object:
        """Add the claims of a batch about to be written; return the token :meth:`discard` takes."""
        part = (ids, attempts, others)
        self._parts.append(part)
        self._set = None
        return part

    def discard(self, token: object) -> None:
        """Remove the claims :meth:`add` returned ``token`` for (their write has ended)."""
        self._parts = [part for part in self._parts if part is not token]
        self._set = None

    def _claims(self) -> set[ClaimKey]:
        if self._set is None:
            parts = self._parts
            self._set = {c for ids, attempts, others in parts for c in (*zip(ids, attempts, strict=True), *others)}
        return self._set

    def __contains__(self, claim: object) -> bool:
        return claim in self._claims()

    def __iter__(self) -> Iterator[ClaimKey]:
        return iter(self._claims())

    def __len__(self) -> int:
        return len(self._claims())
