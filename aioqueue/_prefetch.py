"""How many jobs a worker claims ahead of its free slots (the adaptive prefetch buffer), and
how many one claim of a worker with many slots takes.

The producer asks :class:`Prefetch` for the buffer before each claim and tells it what it sees:
jobs finished and the time their handlers took (the rate, and the most it could be), claims
made (the round trip) and handed over (full or not), and the moments no handler runs. It never
talks to the database and never claims anything itself.
"""

from __future__ import annotations

import math
import time


class Prefetch:
    """How many jobs to claim ahead of free slots: enough to keep the handlers busy across one
    claim round trip at the rate jobs are finishing, times a small margin, never more than
    ``cap`` (0: never claim ahead).

    Short jobs are so claimed in large batches; jobs that take longer than a round trip (a 1-s
    job against a 1-ms claim) round down to a buffer of 0, so a worker never hoards work that
    other workers could start now. The rate is an exponentially weighted average of the finished
    count, quick to rise and slower to fall. Jobs started together finish together, so over a
    few milliseconds the finishing count of long jobs can read as a rate many times what their
    handlers could reach: the rate the buffer follows is capped at ``slots`` handlers' pace
    (slots over the time a handler takes), by Little's law the most they can finish.

    While the buffer is too small the rate understates what the handlers could do: they finish
    a claim's jobs and then wait for the next claim, so the rate is the claims', not theirs. A
    burst would then be claimed in small batches for its first tens of milliseconds. So the
    buffer also starts small and grows fast, as TCP's window does: when every job of a claim
    that got all it asked for (so more are ready) is finished within a round trip of its
    hand-over, or ran within one (see :meth:`idle`), and the handlers wait for the next claim,
    that claim may take as many as the handlers would finish in ``MARGIN`` round trips at the
    pace they finished it: ``MARGIN`` times as many if they took the whole round trip, up to
    ``MARGIN`` squared times if they took a quarter of it or less (no-op jobs reach the cap at
    their third claim rather than their fifth). That floor fades with the rate's falling time
    constant unless the handlers run dry again, and is dropped once a claim finds fewer jobs
    than it asked for. A job still running, or jobs that took longer than that, keep it from
    growing: long jobs never fill a buffer.

    While handlers run, the rate the buffer follows is also at least their pace now: the
    handlers running over the time one takes (Little's law again), which the finishing count
    reaches only after a few of its time constants. A burst of 10 ms jobs at 1,000 slots read
    a few thousand jobs a second for its first 30 ms, every slot busy, and was claimed slot by
    slot as they freed (claims of 1 to 186 jobs) until the rate caught up. Not under a per-key
    limit (``keyed``), whose buffer grows by claims that fill (see ``keyed_cap``).
    """

    DEFAULT = 1000
    """The cap (the ``prefetch`` option) of a worker with at most ``FIRST`` slots, unless set
    (see :meth:`default_cap`)."""
    FIRST = 100
    """The most jobs the first claim of a burst takes, in a worker with more slots than this
    (see :meth:`most`)."""
    LARGEST = 1000
    """The most jobs any later claim of such a worker takes (see :meth:`most`)."""
    MARGIN = 4.0
    """Buffer this many round trips' worth of work: the estimates are noisy and claims vary.
    Also the least factor by which the buffer grows while the handlers run dry (its square the
    most)."""
    KEYED = 100
    """The most jobs buffered at first while the worker claims a queue with a per-key
    concurrency limit (see ``keyed``)."""
    KEYED_STEP = 25
    """How much that most grows with each claim that got all it asked for."""
    KEYED_LEAST = 20
    """The least it shrinks to (halving with each claim that got fewer)."""
    SAMPLE = 0.01
    """Shortest span (seconds) of one rate sample."""
    RISE = 0.02
    FALL = 0.5
    """Time constants (seconds) of the rate's average when it rises and when it falls (and of
    the fading of the floor)."""

    __slots__ = ("_at", "_bursting", "_busy", "_finished", "_floor", "_floor_at", "_full", "_short_at", "cap",
                 "handler_time", "keyed", "keyed_cap", "rate", "round_trip", "running", "slots")

    @classmethod
    def default_cap(cls, slots: int) -> int:
        """The cap of a worker of ``slots`` when ``prefetch`` is not set: ``DEFAULT``, and with
        more than ``FIRST`` slots two claims more (of at most ``LARGEST`` each). Its claims
        bring jobs in waves that start together and end together: when every slot is busy,
        one wave waits for the slots and the next claim must already be on its way, or the
        slots run dry until it is back. With a cap of ``DEFAULT`` at 1,000 slots and 10 ms
        handlers the claims stood still every other round trip and the slots half of it."""
        return cls.DEFAULT + (2 * min(slots, cls.LARGEST) if slots > cls.FIRST else 0)

    def __init__(self, cap: int, slots: int) -> None:
        self.cap = cap
        self.slots = slots
        """Handlers that run at once: they cap the rate, and size a claim (see ``most``)."""
        self.keyed = False
        """Whether the worker claims a queue with a per-key concurrency limit (the producer sets
        it). A buffered job holds its key's slot, which no other worker can then fill: with a
        large buffer, the workers' claims walk past the keys the others hold, each claim slower
        than the last, and a slower claim sizes a larger buffer. So the buffer stays at most
        ``keyed_cap`` jobs."""
        self.keyed_cap = min(cap, self.KEYED)
        """The most jobs buffered while ``keyed``, found the way TCP finds its window: it grows
        by ``KEYED_STEP`` with each claim that got all it asked for (keys with room were left
        over), and halves, down to ``KEYED_LEAST``, with each that got fewer (its walk went
        round every key and found too few with room: the buffers, each job holding its key,
        are part of why). So the workers' buffers together stay about as large as the keys
        allow. Claims of a hundred jobs rather than fifty, where keys are plenty, halve each
        job's share of a claim's fixed cost (a keyed claim's turn, its statements, the worker's
        round trip)."""
        self.rate = 0.0
        """Jobs finished per second (estimate)."""
        self.handler_time = 0.0
        """Seconds a handler takes (estimate; the first jobs finished set it), quick to rise and
        slower to fall."""
        self.round_trip = 0.0
        """Seconds one claim takes (estimate)."""
        self.running = 0
        """Handlers running now, at most ``slots`` (the producer sets it before it asks for the
        buffer): over ``handler_time``, the least rate the buffer follows."""
        self._at = time.monotonic()
        self._finished = 0
        self._busy = 0.0
        self._floor = 0
        self._floor_at = self._at
        self._full: tuple[int, float] | None = None  # the last claim's size and hand-over, if full
        self._bursting = False  # the last claim got all it asked for: a burst is being claimed
        self._short_at: float | None = None  # since when a keyed refill has been held back (see too_small)

    def finished(self, total: int, now: float, busy: float = 0.0) -> None:
        """Jobs finished so far were ``total`` at ``now``, their handlers having taken ``busy``
        seconds in all: update the rate and the handler time."""
        span = now - self._at
        if span < self.SAMPLE:
            return
        done = total - self._finished
        sample = done / span
        tau = self.RISE if sample > self.rate else self.FALL
        self.rate += (1.0 - math.exp(-span / tau)) * (sample - self.rate)
        if done > 0:
            took = (busy - self._busy) / done  # the mean of the jobs finished since the last sample
            if not self.handler_time:
                self.handler_time = took
            else:
                tau = self.RISE if took > self.handler_time else self.FALL
                self.handler_time += (1.0 - math.exp(-span / tau)) * (took - self.handler_time)
        self._at, self._finished, self._busy = now, total, busy

    def claimed(self, seconds: float) -> None:
        """A claim took ``seconds``: update the round trip."""
        self.round_trip = seconds if not self.round_trip else self.round_trip + 0.2 * (seconds - self.round_trip)

    def handed_over(self, jobs: int, full: bool, now: float) -> None:
        """A claim handed ``jobs`` to the runners at ``now``; ``full``: all it asked for (more
        may be ready). One that found fewer ends the burst: the floor is dropped (and, while
        ``keyed``, the buffer's most is halved; a full one grows it: see ``keyed_cap``)."""
        self._full = (jobs, now) if full else None
        self._bursting = full
        self._short_at = None
        if not full:
            self._floor = 0
        if self.keyed:
            grown = self.keyed_cap + self.KEYED_STEP if full else self.keyed_cap // 2
            self.keyed_cap = min(self.cap, max(self.KEYED_LEAST, grown))

    def idle(self, now: float, ran: float = math.inf) -> None:
        """No handler is running at ``now``; ``ran``: seconds from the start of the first
        handler since the last claim's hand-over to the end of the last (negative: none ran).
        If every job of the last claim, a full one, was done within a round trip of its
        hand-over, or ran within one (jobs quicker than a claim, with more ready), let the
        next claim take what the handlers would finish in ``MARGIN`` round trips at that pace:
        ``MARGIN`` to ``MARGIN`` squared times as many.

        The event loop can be busy with the worker's own start (its second connection's
        connect took 3 to 8 ms on a loaded benchmark machine) before any handler runs and
        before the producer sees them done; 10 no-op jobs then read as slower than a 2 ms
        claim, and a burst stalled at claims of 10 for tens of milliseconds. The time the jobs
        ran is still counted whole, however long they are or however much CPU they spend one
        after another: long jobs never fill a buffer."""
        if self._full is None:
            return
        jobs, at = self._full
        self._full = None
        took = now - at
        if 0.0 <= ran < took:
            took = ran
        if took <= self.round_trip:
            growth = self.MARGIN * min(self.MARGIN, self.round_trip / max(took, 1e-9))
            self._floor = min(self.cap, max(self.floor(now), int(jobs * growth)))
            self._floor_at = now

    def too_small(self, free: int, active: int, now: float, batch: int = LARGEST) -> bool:
        """Whether a claim of ``free`` jobs, with ``active`` handlers still running, is too
        small for a claim under a per-key limit (``keyed``) and should wait for more room: less
        than ``KEYED_LEAST`` (or :meth:`most`, or ``batch``, if fewer). Every such claim takes the
        queue's turn, which the other workers' claims wait for, and a turn costs about as much
        for 4 jobs as for 40 (its statement's own share, and the plans of a connection's first
        claims). It waits only while the jobs are quicker than a claim (or not yet timed), and a
        round trip at most from the first time it was held back: slots that free more slowly
        (long jobs) are refilled as they free."""
        if (not self.keyed or not active or self.handler_time > self.round_trip
                or free >= min(self.KEYED_LEAST, self.most(now), batch)):
            self._short_at = None
            return False
        if self._short_at is None:
            self._short_at = now
        return now - self._short_at < self.round_trip

    def short_wait(self, now: float) -> float:
        """Seconds left of the wait :meth:`too_small` allows (0 when none is under way)."""
        return 0.0 if self._short_at is None else max(0.0, self._short_at + self.round_trip - now)

    def floor(self, now: float) -> int:
        """The buffer the handlers running dry asked for, faded since."""
        if not self._floor:
            return 0
        return int(self._floor * math.exp(-max(0.0, now - self._floor_at) / self.FALL))

    def target(self, now: float | None = None) -> int:
        """Jobs to hold beyond the free slots now."""
        if not self.cap:
            return 0
        rate = self.rate
        if self.handler_time > 0.0:
            if not self.keyed:
                rate = max(rate, self.running / self.handler_time)
            rate = min(rate, self.slots / self.handler_time)
        by_rate = int(rate * self.round_trip * self.MARGIN)
        cap = self.keyed_cap if self.keyed else self.cap
        return min(cap, max(by_rate, self.floor(time.monotonic() if now is None else now)))

    def most(self, now: float | None = None) -> int:
        """The most jobs one claim of the worker may take now. At most ``FIRST``
        slots: its slots and buffer. More: ``FIRST`` for the first claim of a burst, so its
        first handlers start after a claim of a hundred rows rather than one of every slot;
        after that, half its slots and buffer, so the next claim is sent while this one's jobs
        start rather than once half of them are done (a claim's cost is nearly all per row:
        two halves take about as long as the whole); and never more than ``LARGEST``. A larger
        claim is no cheaper a row, and it starts its jobs in one wave: at 5,000 slots, claims
        of 3,000 left most runners parked between them and the collector walking thousands of
        handlers at once (17 to 19 us of CPU a 10 ms job, against 14 to 16 in claims of 1,000)."""
        slots = self.slots
        budget = slots + self.target(now)
        if slots <= self.FIRST:
            return budget
        if not self._bursting:
            return self.FIRST
        return max(self.FIRST, min(self.LARGEST, budget // 2))
