"""Adaptive prefetch's arithmetic (``aioqueue._prefetch.Prefetch``), with no worker and no
database: the buffer follows the finishing rate times the claim round trip, within the cap."""

from __future__ import annotations

import datetime

import pytest

import aioqueue
from aioqueue._claims import Claims
from aioqueue._prefetch import Prefetch


def test_buffer_follows_rate_times_round_trip_within_the_cap() -> None:
    pace = Prefetch(cap=1000, slots=10)
    assert pace.target() == 0  # nothing finished yet: claim only for free slots
    pace.claimed(0.001)
    # 1-s jobs on 10 slots: 10 jobs/s x 1 ms is far below one job: buffer nothing.
    for second in range(1, 30):
        pace.finished(10 * second, pace._at + 1.0)
    assert 9 < pace.rate < 11
    assert pace.target() == 0
    # No-op jobs at 50,000/s: 50 jobs per 1-ms round trip, times the margin.
    fast = Prefetch(cap=1000, slots=10)
    fast.claimed(0.001)
    for step in range(1, 50):  # samples of 20 ms (above SAMPLE even after float rounding)
        fast.finished(1000 * step, fast._at + 0.02)
    assert 50 * Prefetch.MARGIN * 0.9 <= fast.target() <= 50 * Prefetch.MARGIN
    fast.claimed(0.5)  # a slow round trip: the buffer would be 50,000, but the cap holds
    assert fast.target() == 1000
    assert Prefetch(cap=0, slots=10).target() == 0


def test_the_rate_rises_quickly_and_falls_slowly() -> None:
    pace = Prefetch(cap=100, slots=10)
    pace.finished(1000, pace._at + 0.1)  # a burst: 10,000/s over 100 ms
    risen = pace.rate
    assert risen > 9000
    pace.finished(1000, pace._at + 0.1)  # then nothing finishes for 100 ms
    assert risen * 0.7 < pace.rate < risen  # falls, but slowly (time constant FALL)


def test_samples_shorter_than_the_shortest_span_are_ignored() -> None:
    pace = Prefetch(cap=100, slots=10)
    at = pace._at
    pace.finished(500, at + Prefetch.SAMPLE / 2)
    assert pace.rate == 0.0 and pace._at == at


def test_the_round_trip_is_a_running_average_of_claims() -> None:
    pace = Prefetch(cap=100, slots=10)
    pace.claimed(0.010)
    assert pace.round_trip == 0.010  # the first claim sets it
    pace.claimed(0.020)
    assert abs(pace.round_trip - 0.012) < 1e-12  # later ones move it a fifth of the way


def test_a_burst_grows_the_buffer_by_the_pace_of_its_handlers_up_to_the_cap() -> None:
    rtt = 2.0**-8  # about 4 ms; powers of two keep the clock's sums exact

    def claims(took: float) -> list[int]:
        """The claims of a burst whose claims' jobs are all done ``took`` after hand-over."""
        pace = Prefetch(cap=1000, slots=10)
        pace.claimed(rtt)
        now, claim = 1.0, 10
        made: list[int] = []
        while claim < 1000 + 10 and len(made) < 10:
            pace.handed_over(claim, True, now)
            now += took  # every job of it done within the round trip, and more are ready
            pace.idle(now)
            made.append(claim)
            claim = 10 + pace.target(now)
        assert pace.target(now) == 1000
        return made

    # Jobs done in a quarter of the round trip or less: MARGIN squared times the claim before.
    assert claims(rtt / 64) == claims(rtt / 4) == [10, 170]
    # In half of it: what they would finish in MARGIN round trips, eight times as many.
    assert claims(rtt / 2) == [10, 90, 730]
    # In the whole round trip: MARGIN times the claim before, plus the slots.
    assert claims(rtt) == [10, 50, 210, 850]


def test_jobs_slower_than_a_round_trip_never_grow_it() -> None:
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.002)
    pace.handed_over(10, True, 100.0)
    pace.idle(100.0 + 0.3)  # all done together, but 0.3 s after their claim: long jobs
    assert pace.target(100.3) == 0
    pace.handed_over(10, True, 101.0)
    pace.idle(101.0 + 0.002 * 1.5)  # a round trip and a half
    assert pace.target(101.1) == 0


def test_a_claim_whose_jobs_ran_quickly_but_late_grows_it() -> None:
    # The event loop, busy with the worker's start, ran the jobs 3 ms after their hand-over and
    # saw them done later still: their 0.1 ms run, not those waits, sizes the next claim.
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.002)
    pace.handed_over(10, True, 100.0)
    pace.idle(100.005, 0.0001)
    assert pace.target(100.005) == 160
    # The run counts whole: jobs that ran longer than a round trip still never grow it.
    slow = Prefetch(cap=1000, slots=10)
    slow.claimed(0.002)
    slow.handed_over(10, True, 100.0)
    slow.idle(100.005, 0.003)
    assert slow.target(100.005) == 0
    slow.handed_over(10, True, 101.0)
    slow.idle(101.005, -float("inf"))  # no handler ran (the producer's measure when none did)
    assert slow.target(101.005) == 0


def test_claims_measure_the_run_of_a_claims_jobs() -> None:
    at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    jobs = [aioqueue.Job(id=i, queue="default", task="t", args={}, priority=0, attempt=1,
                         max_attempts=3, run_at=at, created_at=at) for i in range(3)]
    claims = Claims()
    claims.take(jobs[:1])
    claims.finished(jobs[0], 0.5, 10.0)
    claims.take(jobs[1:])  # a new claim: its own jobs' run
    claims.finished(jobs[1], 0.002, 20.001)
    claims.finished(jobs[2], 0.0)  # never began (given back): no part of the run
    assert abs(claims.last_ended - claims.first_begun - 0.002) < 1e-9
    assert not claims.active


def test_only_a_full_claim_whose_jobs_are_all_done_grows_it_once() -> None:
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.002)
    pace.idle(100.0)  # no claim yet
    assert pace.target(100.0) == 0
    pace.handed_over(5, False, 100.0)  # found fewer than it asked for: nothing more is ready
    pace.idle(100.001)
    assert pace.target(100.001) == 0
    pace.handed_over(10, True, 100.002)
    pace.idle(100.0039)  # done in a little less than the round trip: MARGIN times as many, and a bit
    assert pace.target(100.0039) == 42
    pace.idle(100.0039)  # the same claim counts once
    assert pace.target(100.0039) == 42


def test_the_floor_fades_and_a_short_claim_drops_it() -> None:
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.002)
    pace.handed_over(100, True, 100.0)
    pace.idle(100.001)  # done in half the round trip: eight times as many
    assert 799 <= pace.target(100.001) <= 800  # (half, as the clock's floats add up)
    assert 800 / 2.72 - 2 <= pace.target(100.001 + Prefetch.FALL) <= 800 / 2.71 + 1  # fades as the rate falls
    pace.handed_over(3, False, 100.002)  # the burst is over
    assert pace.target(100.002) == 0
    assert Prefetch(cap=0, slots=10).target(0.0) == 0


def test_a_large_worker_claims_a_burst_in_a_short_first_claim_then_in_halves() -> None:
    large, small = Prefetch(cap=1000, slots=1000), Prefetch(cap=1000, slots=10)
    # Few slots: its slots and buffer, whatever the burst (the defaults claim as they did).
    assert small.most(100.0) == 10
    # Many slots: a short first claim, so the first handlers start soon.
    assert large.most(100.0) == Prefetch.FIRST
    for pace in (large, small):
        pace.handed_over(Prefetch.FIRST, True, 100.0)  # it got all it asked for: a burst
    # Then half its slots and buffer: the next claim can be sent as this one's jobs start.
    assert large.most(100.0) == 500
    for pace in (large, small):
        pace.claimed(0.5)
        pace.finished(100_000, pace._at + 1.0)  # a rate that asks for the whole buffer
        assert pace.target(pace._at) == 1000
    assert large.most(large._at) == 1000
    assert small.most(small._at) == 1010
    large.handed_over(20, False, 101.0)  # a claim found fewer than it asked for: the burst is over
    assert large.most(101.0) == Prefetch.FIRST


def test_a_very_large_worker_claims_at_most_a_thousand_at_once() -> None:
    pace, below = Prefetch(cap=1000, slots=5000), Prefetch(cap=1000, slots=1000)
    assert pace.most(100.0) == Prefetch.FIRST
    for p in (pace, below):
        p.handed_over(Prefetch.FIRST, True, 100.0)
    # Half of 5,000 slots would be 2,500 a claim: no cheaper a row, and one wave of handlers.
    assert pace.most(100.0) == Prefetch.LARGEST == 1000
    assert below.most(100.0) == 500  # below it, halves as before


def test_long_jobs_finishing_together_are_not_read_as_a_fast_rate() -> None:
    # Two 1-s jobs on two slots, started together, finishing 25 ms apart: the second finish
    # alone reads as 40 jobs/s, but two handlers of 1 s finish at most 2 a second.
    def after_two_finishes(slots: int) -> int:
        pace = Prefetch(cap=1000, slots=slots)
        pace.claimed(0.011)  # a round trip of a loaded machine
        start = pace._at
        pace.finished(1, start + 1.0, busy=1.0)
        pace.finished(2, start + 1.025, busy=2.0)
        assert 0.99 < pace.handler_time <= 1.0
        return pace.target(start + 1.025)

    assert after_two_finishes(1_000_000) >= 1  # slots too many to cap it: the rate alone holds a 1-s job back
    assert after_two_finishes(2) == 0


def test_the_handlers_pace_caps_only_a_rate_beyond_it() -> None:
    # No-op jobs at 50,000/s on 10 slots, 20 us each: far below their pace, the rate stands.
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.001)
    for step in range(1, 50):
        pace.finished(1000 * step, pace._at + 0.02, busy=0.02 * step)
    assert 50 * Prefetch.MARGIN * 0.9 <= pace.target() <= 50 * Prefetch.MARGIN
    # 10-ms jobs on 10 slots finish 1,000 a second at most, whatever a short sample reads.
    slow = Prefetch(cap=1000, slots=10)
    slow.claimed(0.05)
    slow.finished(40, slow._at + 0.02, busy=0.4)  # forty finishing together
    assert slow.rate > 1000
    assert slow.target() == int(1000 * 0.05 * Prefetch.MARGIN)


def test_while_handlers_run_the_buffer_follows_their_pace_before_the_rate_catches_up() -> None:
    # 1,000 slots of 10-ms jobs, every slot busy, the first hundred just finished: the
    # finishing count reads under 4,000 a second; the handlers running finish 100,000.
    def first_wave(running: int, keyed: bool = False) -> int:
        pace = Prefetch(cap=3000, slots=1000)
        pace.keyed = keyed
        pace.claimed(0.005)
        pace.finished(100, pace._at + 0.011, busy=1.0)
        pace.running = running
        return pace.target(pace._at)

    assert first_wave(0) < 100  # the rate alone: a refill of the slots that freed, no more
    assert 1990 <= first_wave(1000) <= int(100_000 * 0.005 * Prefetch.MARGIN)  # a round trip's worth, x4
    assert first_wave(10) == first_wave(0)  # ten handlers' pace is below the rate: it stands
    # Under a per-key limit the buffer grows by claims that fill, not by the handlers' pace.
    assert first_wave(1000, keyed=True) == first_wave(0, keyed=True)
    # Long jobs still buffer nothing: ten 1-s handlers running against a 5-ms claim.
    slow = Prefetch(cap=1000, slots=10)
    slow.claimed(0.005)
    slow.finished(10, slow._at + 1.0, busy=10.0)
    slow.running = 10
    assert slow.target(slow._at) == 0


def test_under_a_per_key_limit_the_buffer_stays_small() -> None:
    # No-op jobs at 50,000/s and a slow round trip: a 1,000-job buffer, unless a queue the worker
    # claims has a per-key concurrency limit, where each buffered job holds its key's slot.
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.05)
    for step in range(1, 50):
        pace.finished(1000 * step, pace._at + 0.02, busy=0.02 * step)
    assert pace.target() == 1000
    pace.keyed = True
    assert pace.target() == Prefetch.KEYED
    assert pace.most(10) == 10 + Prefetch.KEYED
    assert Prefetch(cap=20, slots=10).target() <= 20  # a smaller cap still holds


def test_under_a_per_key_limit_the_buffer_grows_while_claims_fill_and_halves_when_one_falls_short() -> None:
    # The same fast jobs: every claim that gets all it asked for lets the buffer grow a step
    # (keys with room were left over); one that gets fewer (its walk found too few keys with
    # room) halves it, never under KEYED_LEAST nor over the cap.
    pace = Prefetch(cap=1000, slots=10)
    pace.keyed = True
    pace.claimed(0.05)
    for step in range(1, 50):
        pace.finished(1000 * step, pace._at + 0.02, busy=0.02 * step)
    now = pace._at
    for _ in range(4):
        pace.handed_over(pace.most(now), True, now)
    assert pace.target(now) == Prefetch.KEYED + 4 * Prefetch.KEYED_STEP
    pace.handed_over(30, False, now)
    assert pace.target(now) == (Prefetch.KEYED + 4 * Prefetch.KEYED_STEP) // 2
    for _ in range(10):
        pace.handed_over(0, False, now)
    assert pace.target(now) == Prefetch.KEYED_LEAST
    for _ in range(100):
        pace.handed_over(pace.most(now), True, now)
    assert pace.target(now) == 1000
    # Without a per-key limit, claims leave it alone.
    plain = Prefetch(cap=1000, slots=10)
    plain.handed_over(5, False, now)
    assert plain.keyed_cap == Prefetch.KEYED
    small = Prefetch(cap=50, slots=10)  # a smaller cap still holds
    small.keyed = True
    small.handed_over(60, True, now)
    assert small.keyed_cap == 50
    small.handed_over(3, False, now)
    small.handed_over(3, False, now)
    assert small.keyed_cap == Prefetch.KEYED_LEAST
    tiny = Prefetch(cap=10, slots=10)  # and the least is never more than the cap
    tiny.keyed = True
    tiny.handed_over(3, False, now)
    assert tiny.keyed_cap == 10
    none = Prefetch(cap=0, slots=10)
    none.keyed = True
    none.handed_over(10, True, now)
    assert none.target(now) == 0


def test_under_a_per_key_limit_a_claim_too_small_for_a_turn_waits_a_round_trip_at_most() -> None:
    # Every keyed claim takes the queue's turn, which the other workers' claims wait for: while
    # handlers run, a refill of fewer than KEYED_LEAST jobs (or the slots and buffer, if fewer)
    # waits for more room, but never more than a round trip from the first time it waited.
    pace = Prefetch(cap=1000, slots=10)
    pace.claimed(0.02)
    now = pace._at
    assert not pace.too_small(4, active=6, now=now)  # no per-key limit: claim what is free
    pace.keyed = True
    assert not pace.too_small(4, active=0, now=now)  # nothing running: nothing to wait for
    assert pace.too_small(4, active=6, now=now)  # the slots and buffer: 10
    assert pace.short_wait(now + 0.005) == pytest.approx(0.015)
    assert pace.too_small(7, active=3, now=now + 0.015)
    assert not pace.too_small(7, active=3, now=now + 0.021)  # a round trip: claim the 7
    assert pace.short_wait(now + 0.021) == 0.0
    assert not pace.too_small(10, active=3, now=now)  # room for the slots and buffer
    assert pace.too_small(9, active=3, now=now, batch=10)
    assert not pace.too_small(5, active=3, now=now, batch=5)  # the most a claim may take
    # With a buffer (fast jobs), KEYED_LEAST is the least worth a turn.
    for step in range(1, 50):
        pace.finished(1000 * step, pace._at + 0.02, busy=0.02 * step)
    now = pace._at
    assert pace.target(now) == Prefetch.KEYED
    assert pace.too_small(Prefetch.KEYED_LEAST - 1, active=50, now=now)
    assert not pace.too_small(Prefetch.KEYED_LEAST, active=50, now=now)
    # Jobs longer than a claim: their slots free no sooner for waiting.
    slow = Prefetch(cap=1000, slots=10)
    slow.keyed = True
    slow.claimed(0.02)
    slow.finished(0, slow._at)
    slow.finished(5, slow._at + 1.0, busy=5.0)  # 1-s jobs
    assert not slow.too_small(5, active=5, now=slow._at)
    # A claim handed over starts the clock again.
    pace.too_small(5, active=50, now=now)
    pace.handed_over(5, False, now + 0.01)
    assert pace.short_wait(now + 0.01) == 0.0
    assert pace.too_small(5, active=50, now=now + 0.03)
