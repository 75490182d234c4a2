"""Claims: holding, superseding and releasing claims, and the active counts, without a database."""

from __future__ import annotations

import datetime

from aioqueue._claims import Claims, claim_of
from aioqueue._job import Job

_T = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def job(job_id: int, attempt: int = 1, queue: str = "default") -> Job:
    return Job(job_id, queue, "t", {}, 0, attempt, 25, _T, _T)


def test_a_claim_is_held_until_released_and_counts_once_per_queue() -> None:
    claims = Claims()
    jobs = [job(1), job(2, queue="other"), job(3)]
    assert claims.take(jobs) == []
    assert claims.held() == [(1, 1), (2, 1), (3, 1)] and len(claims) == 3
    assert claims.active == 3
    assert (claims.active_in("default"), claims.active_in("other"), claims.active_in("x")) == (2, 1, 0)
    assert not claims.idle.is_set()
    claims.finished(jobs[1])
    assert (claims.active, claims.active_in("other")) == (2, 0)
    claims.release([(2, 1), (9, 1)])  # one held, one never was
    assert claims.held() == [(1, 1), (3, 1)] and claims.holds((1, 1)) and not claims.holds((2, 1))
    claims.release([claim_of(jobs[0]), claim_of(jobs[2])])
    assert claims.held() == []


def test_a_newer_attempt_supersedes_the_one_held_and_the_old_release_keeps_it() -> None:
    claims = Claims()
    assert claims.take([job(1), job(2)]) == []
    # Job 1 was reaped and claimed again by this very worker: the old claim's lease is lost.
    assert claims.take([job(1, attempt=2), job(4)]) == [(1, 1)]
    assert sorted(claims.held()) == [(1, 2), (2, 1), (4, 1)]
    claims.release([(1, 1)])  # the old attempt's outcome written, or found lost: the new one stays
    assert sorted(claims.held()) == [(1, 2), (2, 1), (4, 1)]
    assert claims.take([job(1, attempt=3)]) == [(1, 2)]
    claims.release([(1, 3), (2, 1), (4, 1)])
    assert claims.held() == []
    # Nothing of job 1 is held any more: a later attempt supersedes nothing.
    assert claims.take([job(1, attempt=4)]) == []
    assert claims.held() == [(1, 4)]


def test_written_claims_are_released_by_ids_and_attempts_only_where_the_attempt_is_held() -> None:
    claims = Claims()
    claims.take([job(1), job(2), job(3)])
    claims.release_written([1, 3], [1, 1])  # the common case: every one held under that attempt
    assert claims.held() == [(2, 1)]
    claims.take([job(2, attempt=2), job(5)])  # job 2 reaped and claimed again here
    claims.release_written([2, 5, 9], [1, 1, 1])  # the old attempt of 2, and a claim never held
    assert sorted(claims.held()) == [(2, 2)]


def test_a_claim_written_twice_in_one_batch_is_released_once() -> None:
    # A crash forgot a claim: its job was claimed again under the same attempt, by this same
    # worker, and both runs' outcomes are written together.
    claims = Claims()
    claims.take([job(1), job(2)])
    claims.take([job(1)])
    claims.release_written([1, 2, 1], [1, 1, 1])
    assert claims.held() == []
