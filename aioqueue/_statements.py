"""The worker's hot-path statements as typed calls: one method per statement of ``queries.sql``
that claims, finishes, renews or enqueues jobs, taking its values by keyword and returning the
statement with its ``$n`` parameters in order, ready for the driver.

The statements' SQL lives in ``queries.sql``; this module only binds it, with the schema's
NOTIFY channels where a statement takes one. It sends nothing itself, so the same bound
statement serves asyncpg and the callers' drivers alike, and a test checks, without a database,
that every method binds exactly its statement's ``$1``..``$n``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from ._queries import Queries, for_schema


@dataclasses.dataclass(frozen=True, slots=True)
class Channels:
    """The LISTEN/NOTIFY channels of one schema; payloads stay tiny (a queue name or a job id)."""

    jobs: str
    """Jobs became ready in a queue (payload: the queue name)."""
    cancel: str
    """A running job was asked to stop (payload: its id)."""
    done: str
    """Jobs reached a final state that ``result()`` waits for (payload: empty)."""
    due: str
    """A job will be due later (payload: ``'seconds queue'``): workers wake for it on time."""
    outbox: str
    """Events were committed to an outbox stream (payload: its name): relays wake."""

    @classmethod
    def for_schema(cls, schema: str) -> Channels:
        return cls(jobs=f"{schema}_jobs", cancel=f"{schema}_cancel", done=f"{schema}_done", due=f"{schema}_due",
                   outbox=f"{schema}_outbox")


class Bound(NamedTuple):
    """A statement and its parameters, ``$1`` first: ``conn.fetch(bound.sql, *bound.args)``."""

    sql: str
    args: tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Statements:
    """The hot-path statements of one schema, bound by keyword."""

    queries: Queries
    channels: Channels

    @classmethod
    def for_schema(cls, schema: str) -> Statements:
        return cls(for_schema(schema), Channels.for_schema(schema))

    # -- claiming --------------------------------------------------------------------------

    def claim(
        self,
        *,
        queues: Sequence[str],
        wants: Sequence[int],
        worker: str,
        lease: float,
        limit: int,
        commit_mode: str | None,
        limited: bool,
        timed: bool = False,
        keyed_only: bool = False,
    ) -> Bound:
        """Claim up to ``wants[i]`` jobs of ``queues[i]``, ``limit`` in all, for ``worker`` under a
        lease of ``lease`` seconds; ``limited``: some of the queues have a global limit (the
        caller has locked their settings rows) or per-key settings, else the cheaper
        ``claim_unlimited``. ``timed``: the worker's claim, one row of the jobs' columns as arrays
        and the claim's database time in ``claimed_at`` (``claim_timed``,
        ``claim_unlimited_timed``: see ``decode_claim``). ``keyed_only``: the limited queues have
        per-key settings and none a global limit, so a timed claim is the cheaper
        ``claim_keyed_timed``."""
        q = self.queries
        if limited and timed and keyed_only:
            sql = q.claim_keyed_timed
        elif limited:
            sql = q.claim_timed if timed else q.claim
        else:
            sql = q.claim_unlimited_timed if timed else q.claim_unlimited
        return Bound(sql, (queues, wants, worker, lease, limit, commit_mode))

    def extend_leases(self, *, ids: Sequence[int], attempts: Sequence[int], lease: float) -> Bound:
        """Renew for ``lease`` seconds the leases of the claims ``(ids[i], attempts[i])``."""
        return Bound(self.queries.extend_leases, (int_array(ids), int_array(attempts), lease))

    def cancel_requests(self, *, ids: Sequence[int], attempts: Sequence[int]) -> Bound:
        """Which of the claims ``(ids[i], attempts[i])`` have a cancel request."""
        return Bound(self.queries.cancel_requests, (int_array(ids), int_array(attempts)))

    # -- finishing (the completer's) -------------------------------------------------------

    def complete(
        self, *, ids: Sequence[int], attempts: Sequence[int], results: Sequence[str | None], commit_mode: str | None
    ) -> Bound:
        """Finish succeeded claims, each with its JSON result (kept where the job is archived).
        No result at all (handlers that return None) is sent as NULL rather than an array of
        NULLs: see :func:`int_array`."""
        ch = self.channels
        sent = None if results.count(None) == len(results) else results
        return Bound(self.queries.complete, (int_array(ids), int_array(attempts), sent, ch.done, ch.jobs, commit_mode))

    def fail(
        self,
        *,
        ids: Sequence[int],
        attempts: Sequence[int],
        errors: Sequence[str],
        delays: Sequence[float | None],
        dead: Sequence[bool],
        base: Sequence[float],
        factor: Sequence[float],
        max_delay: Sequence[float],
        jitter: Sequence[float],
        commit_mode: str | None,
    ) -> Bound:
        """Record failed attempts: retried after ``delays[i]`` (None: the backoff of ``base``,
        ``factor``, ``max_delay``, ``jitter``), or dead where ``dead[i]`` or attempts are spent."""
        ch = self.channels
        return Bound(
            self.queries.fail,
            (int_array(ids), int_array(attempts), errors, delays, dead, base, factor, max_delay, jitter, ch.jobs,
             ch.due, ch.done, commit_mode),
        )

    def reschedule(
        self,
        *,
        ids: Sequence[int],
        attempts: Sequence[int],
        delays: Sequence[float],
        notes: Sequence[str | None],
        commit_mode: str | None,
    ) -> Bound:
        """Put claims back to pending after ``delays[i]`` without spending an attempt; a note, if
        any, becomes the job's last error."""
        ch = self.channels
        return Bound(
            self.queries.reschedule, (int_array(ids), int_array(attempts), delays, notes, ch.jobs, ch.due, commit_mode)
        )

    def suspend(self, *, ids: Sequence[int], attempts: Sequence[int], commit_mode: str | None) -> Bound:
        """Put back to pending, due when they wake, the claims whose handlers stopped at a sleep
        or an event wait (``suspend_jobs()`` of the steps migration)."""
        return Bound(self.queries.suspend, (int_array(ids), int_array(attempts), commit_mode))

    def write_progress(
        self, *, ids: Sequence[int], attempts: Sequence[int], values: Sequence[str], commit_mode: str | None
    ) -> Bound:
        """Store for each claim ``(ids[i], attempts[i])`` the progress its handler reported last,
        ``values[i]`` (a JSON object), if the claim still holds its job."""
        return Bound(self.queries.write_progress, (int_array(ids), int_array(attempts), values, commit_mode))

    def finish_cancelled(self, *, ids: Sequence[int], attempts: Sequence[int], commit_mode: str | None) -> Bound:
        """Archive as cancelled the claims whose handlers were cancelled on request."""
        ch = self.channels
        return Bound(
            self.queries.finish_cancelled, (int_array(ids), int_array(attempts), ch.jobs, ch.done, commit_mode)
        )

    # -- enqueueing ------------------------------------------------------------------------

    def enqueue_one(self, *, jobs: NewJobs, args: str, key: str | None, group: int | None) -> Bound:
        """Write one job with its JSON ``args``, returning the live job of ``key`` instead when
        there is one; ``group``: the workflow group it joins, or None."""
        ch = self.channels
        return Bound(self.queries.enqueue, (*jobs.columns(), args, key, ch.jobs, ch.due, group, jobs.partition_key))

    def enqueue_batch(
        self, *, jobs: NewJobs, args: str, keys: Sequence[str | None] | None, group: int | None
    ) -> Bound:
        """Write the jobs of one JSON array of arguments ``args``; with ``keys`` (one per
        element, or None), the keyed statement, which returns a key's live job instead;
        ``group``: the workflow group they join, or None."""
        ch = self.channels
        if keys is None:
            return Bound(self.queries.enqueue_many, (*jobs.columns(), args, ch.jobs, ch.due, group, jobs.partition_key))
        return Bound(
            self.queries.enqueue_many_keyed, (*jobs.columns(), args, ch.jobs, ch.due, keys, group, jobs.partition_key)
        )

    def link(
        self, *, ids: Sequence[int], deps: Sequence[int], names: Sequence[str | None], may_fail: Sequence[bool],
        group: int | None,
    ) -> Bound:
        """Make the jobs ``ids``, just written in this transaction, wait for ``deps`` and join
        ``group`` (workflows)."""
        return Bound(self.queries.add_dependencies, (ids, deps, names, may_fail, group))

    # -- the outbox ------------------------------------------------------------------------

    def publish_events(self, *, stream: str, keys: Sequence[str], payloads: Sequence[str]) -> Bound:
        """Write events of ``stream`` in the caller's transaction: ``keys[i]`` with the JSON text
        ``payloads[i]``; one row (the event's id) per event, in order."""
        return Bound(self.queries.publish_events, (stream, keys, payloads))


def int_array(values: Sequence[int]) -> str:
    """``values`` as a PostgreSQL array literal (``{1,2,3}``): how the statements that take
    claims receive their ids and attempts, as text they cast to ``bigint[]`` and ``int[]``.
    asyncpg checks every element of an array parameter with ``isinstance`` against
    ``collections.abc.Iterable``, a call into Python each, three an outcome: a share of a
    worker's CPU per job that many slots of short handlers see. Joined here, in C, they cost
    a small part of that."""
    return "{" + ",".join(map(str, values)) + "}"


@dataclasses.dataclass(frozen=True, slots=True)
class NewJobs:
    """What every job of one enqueue call shares: the enqueue statements' first parameters,
    ``$1``..``$7`` in this order, and ``partition_key``, which each binds last."""

    queue: str | None
    """None: the task's recorded queue (see ``queue_of`` in queries.sql)."""
    task: str
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    archive: bool
    partition_key: str | None = None
    """The key that per-key limits and fair claims go by (None: no key)."""

    def columns(self) -> tuple[Any, ...]:
        """The fields in parameter order."""
        return (self.queue, self.task, self.priority, self.run_at, self.delay, self.max_attempts, self.archive)
