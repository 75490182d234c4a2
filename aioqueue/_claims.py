"""The jobs one worker holds, each identified by its claim: the job id and the attempt number.

A claim is held from the moment the producer claims it until its outcome is written (or its
lease is found lost). While held, the heartbeat renews its lease and the cancel watch asks about
it; while its handler has not finished it also takes one of the worker's slots. Keying by
``(id, attempt)`` keeps two attempts of one job apart: after a reaper returns a job to pending,
this very worker may claim it again while the old attempt still runs here. It never talks to the
database.

Who changes it: the producer takes claims (:meth:`Claims.take`); the worker's runners free a
slot (:meth:`Claims.finished`) when a handler ends or an unstarted job is given back; claims are
released by the completer once their outcomes are written (:meth:`Claims.release_written`) and
by the heartbeat when it finds a lease lost (:meth:`Claims.release`). The executor, the cancel
watch and the producer's capacity only read it.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
from collections.abc import Callable, Collection, Sequence
from typing import TypeAlias

from ._job import Job
from ._signal import Flag

ClaimKey: TypeAlias = tuple[int, int]
"""A claim: ``(job id, attempt)``, the fence every finishing write checks."""


claim_of: Callable[[Job], ClaimKey] = operator.attrgetter("id", "attempt")
"""The claim under which a job runs: ``claim_of(job)``, made in C."""

_id_of: Callable[[Job], int] = operator.attrgetter("id")
_queue_of: Callable[[Job], str] = operator.attrgetter("queue")
_id_of_claim: Callable[[ClaimKey], int] = operator.itemgetter(0)


class Claims:
    """Held claims, and how many handlers are active per queue; wakes waiters when a slot frees."""

    def __init__(self) -> None:
        # The held claims, as the attempt held of each job: at most one, since a newer claim
        # supersedes older ones. A dict of ints rather than a set of (id, attempt) tuples: a
        # claim's thousand tuples, made at once and alive until their outcomes are written,
        # would be objects the collector counts (and walks) for every held job.
        self._attempt_of: dict[int, int] = {}
        self.active = 0
        """Handlers claimed and not yet finished (an attribute, not a property: the runners
        read it after every job)."""
        # A plain dict, not a Counter: a Counter's item assignment goes through a Python-level
        # slot (it defines __delitem__), about three times a dict's, twice per job.
        self._active_by_queue: dict[str, int] = {}
        self.finished_total = 0
        """Handlers finished so far: the producer's measure of how fast jobs finish."""
        self.busy_total = 0.0
        """Seconds the handlers finished so far took, in all: its measure of how long one takes."""
        self.first_begun = math.inf
        """When (``time.perf_counter``) the earliest handler finished since the last claim's jobs
        were taken began (inf: none yet), and when the latest ended: the producer's measure of
        the time that claim's jobs took to run, not counting waits for a busy event loop before
        and after (see ``Prefetch.idle``)."""
        self.last_ended = 0.0
        self.freed = Flag()
        """Raised whenever a handler finishes (a slot freed)."""
        self.idle = Flag()
        """Raised while no handler is active."""
        self.idle.set()

    # -- claiming and finishing ----------------------------------------------------------------

    def take(self, jobs: Sequence[Job]) -> list[ClaimKey]:
        """Hold ``jobs``, each taking a slot; return older claims of the same jobs still held here,
        whose leases these new claims prove lost (the job was reaped and claimed again)."""
        if not jobs:
            return []
        self.idle.clear()
        self.first_begun = math.inf  # this claim's jobs' run starts
        attempt_of = self._attempt_of
        if not attempt_of.keys().isdisjoint(map(_id_of, jobs)):
            return self._take_each(jobs)  # a job held already under another attempt: one by one
        # The common case, a claim of jobs none of which is held, in C rather than a loop of
        # bytecodes a job: the worker's own CPU per job is what bounds many short handlers.
        # Each claim's tuple is freed as soon as the dict has taken its two ints.
        attempt_of.update(map(claim_of, jobs))
        self.active += len(jobs)
        by_queue = self._active_by_queue
        for queue, n in collections.Counter(map(_queue_of, jobs)).items():
            by_queue[queue] = by_queue.get(queue, 0) + n
        return []

    def _take_each(self, jobs: Sequence[Job]) -> list[ClaimKey]:
        superseded: list[ClaimKey] = []
        by_queue = self._active_by_queue
        for job in jobs:
            older = self._attempt_of.get(job.id)
            if older is not None and older < job.attempt:
                superseded.append((job.id, older))  # its lease is lost: nothing to renew or write
            self._attempt_of[job.id] = job.attempt
            self.active += 1
            by_queue[job.queue] = by_queue.get(job.queue, 0) + 1
        return superseded

    def finished(self, job: Job, took: float = 0.0, begun: float = 0.0) -> None:
        """``job``'s handler, begun at ``begun`` (0: it never began), is done after ``took``
        seconds (its outcome may still be unwritten): free its slot."""
        if begun:
            self.last_ended = begun + took
            if begun < self.first_begun:
                self.first_begun = begun
        self.active -= 1
        self._active_by_queue[job.queue] -= 1
        self.finished_total += 1
        self.busy_total += took
        if not self.freed.raised:  # most often raised already: no call then (a job each)
            self.freed.set()
        if not self.active:
            self.idle.set()

    def release(self, claims: Collection[ClaimKey]) -> None:
        """Stop holding ``claims`` (their outcome is written, or their lease is lost)."""
        # In C rather than a loop of bytecodes a claim (see take): a job's entry goes exactly
        # when its held attempt is one of these.
        attempt_of = self._attempt_of
        collections.deque(map(attempt_of.pop, map(_id_of_claim, attempt_of.items() & claims)), maxlen=0)

    def release_written(self, ids: list[int], attempts: list[int]) -> None:
        """Stop holding the claims ``zip(ids, attempts)``, whose outcomes are written."""
        attempt_of = self._attempt_of
        if list(map(attempt_of.get, ids)) == attempts:
            # Every one held under that attempt, the common case: no tuple a claim, all in C.
            # A claim may come twice (the server forgot the first, so its job was claimed again
            # under the same attempt): its id then goes once.
            collections.deque(map(attempt_of.pop, ids, itertools.repeat(None)), maxlen=0)
        else:
            self.release(list(zip(ids, attempts, strict=True)))

    # -- reading -------------------------------------------------------------------------------

    def active_in(self, queue: str) -> int:
        """Handlers of ``queue`` claimed and not yet finished."""
        return self._active_by_queue.get(queue, 0)

    def held(self) -> list[ClaimKey]:
        """Every claim held now (a copy)."""
        return list(self._attempt_of.items())

    def holds(self, claim: ClaimKey) -> bool:
        """Whether ``claim`` is held."""
        return self._attempt_of.get(claim[0]) == claim[1]

    def __len__(self) -> int:
        return len(self._attempt_of)
