"""Progress while a job runs (aioqueue.set_progress): visible through get_job while the handler
runs and after it ends, written in batches (few writes for many calls), the last value always
before the outcome, fenced by the claim, kept across attempts only when asked, refused at the
call when bad; shown by the CLI and the dashboard's job page."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue._completer import Completer
from aioqueue._progress import Reported
from aioqueue.dashboard import create_app
from aioqueue.testing import drain
from tests.support.cli_tools import aioqueue_cli
from tests.support.dashboard_tools import SERVED, client_for
from tests.support.helpers import eventually, noop_task, running

HOSTILE = '<script>alert("x")</script>'


async def _stored(db: asyncpg.Connection, job_id: int) -> dict[str, Any] | None:
    text = await db.fetchval("SELECT progress::text FROM aioqueue.jobs WHERE id = $1", job_id)
    return None if text is None else dict(json.loads(text))


async def test_progress_shows_while_the_job_runs_and_after_it_ends(q: aioqueue.Queue) -> None:
    release = anyio.Event()

    @q.task(archive=True)
    async def export(rows: int) -> int:
        aioqueue.set_progress(0.25, "a quarter", data={"rows": rows // 4})
        await release.wait()
        # Reported just before the outcome: written with it, first, or the archive would lack it.
        aioqueue.set_progress(1.0, "done")
        return rows

    ref = await export.enqueue(rows=100)
    async with running(q.worker(poll_interval=0.05)):

        async def reported() -> bool:
            info = await q.get_job(ref)
            return info is not None and info.progress is not None

        await eventually(reported, timeout=10, what="the progress to be written")
        info = await q.get_job(ref)
        assert info is not None and info.status == "running" and info.progress is not None
        p = info.progress
        assert (p.fraction, p.message, p.data, p.attempt, p.keep) == (0.25, "a quarter", {"rows": 25}, 1, False)
        assert p.updated_at is not None and p.updated_at >= info.created_at
        assert await ref.progress() == p
        assert info.to_dict()["progress"]["data"] == {"rows": 25}
        release.set()
        assert await ref.result(timeout=10) == 100
    done = await q.get_job(ref)
    assert done is not None and done.status == "succeeded" and done.progress is not None
    assert (done.progress.fraction, done.progress.message, done.progress.data) == (1.0, "done", None)


async def test_a_dead_job_keeps_its_last_progress_and_a_job_without_any_has_none(q: aioqueue.Queue) -> None:
    @q.task(max_attempts=1)
    async def broken(report: bool) -> None:
        if report:
            aioqueue.set_progress(message="gave up at row 7", data={"row": 7})
        raise aioqueue.Abort("bad row")

    dead = await broken.enqueue(report=True)
    silent = await broken.enqueue(report=False)
    await drain(q)
    info = await q.get_job(dead)
    assert info is not None and info.status == "dead" and info.progress is not None
    assert (info.progress.fraction, info.progress.message, info.progress.data) == (None, "gave up at row 7", {"row": 7})
    quiet = await q.get_job(silent)
    assert quiet is not None and quiet.status == "dead" and quiet.progress is None


async def test_many_calls_make_few_writes_and_the_last_value_wins(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    # Every write of the column, counted by the server itself.
    await db.execute("""
        CREATE TABLE progress_writes (n int NOT NULL);
        INSERT INTO progress_writes VALUES (0);
        CREATE FUNCTION count_progress_write() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN UPDATE progress_writes SET n = n + 1; RETURN NULL; END $$;
        CREATE TRIGGER progress_written AFTER UPDATE OF progress ON aioqueue.jobs
            FOR EACH ROW EXECUTE FUNCTION count_progress_write();
    """)
    release = anyio.Event()
    calls: list[int] = []
    elapsed: list[float] = []

    @q.task
    async def busy() -> None:
        started = time.monotonic()
        while time.monotonic() - started < 1.2:
            calls.append(len(calls))
            aioqueue.set_progress(message=f"step {len(calls)}", data={"n": len(calls)})
            await anyio.sleep(0.001)
        elapsed.append(time.monotonic() - started)
        await release.wait()

    ref = await busy.enqueue()
    async with running(q.worker(poll_interval=0.05)) as worker:

        async def settled() -> bool:
            stored = await _stored(db, ref)
            return stored is not None and stored["data"] == {"n": len(calls)} and bool(elapsed)

        await eventually(settled, timeout=10, what="the last value to be written")
        writes = await db.fetchval("SELECT n FROM progress_writes")
        assert worker.executor is not None
        statements = worker.executor.completer.progress_writes
        release.set()
    # About one write per half second of reporting (one per interval, plus the first and the
    # last); never one per call.
    assert len(calls) >= 100, len(calls)
    bound = math.ceil(elapsed[0] / 0.5) + 2
    assert 1 <= writes <= bound, (writes, bound, len(calls))
    assert writes == statements


async def test_a_lost_claim_cannot_overwrite_the_new_attempts_progress(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    ref = await noop_task(q, "job").enqueue()
    # The job as a reaped first attempt left it, claimed again: attempt 2 now holds it.
    await db.execute(
        "UPDATE aioqueue.jobs SET status = 'running', attempts = 2, lease_expires_at = now() + interval '1 hour',"
        " locked_at = now(), locked_by = 'other' WHERE id = $1", ref,
    )
    completer = Completer(q.database)
    completer.progress_reported((ref, 2), Reported(None, "new", None, False))
    await completer.flush_progress()
    completer.progress_reported((ref, 1), Reported(None, "stale", None, True))
    await completer.flush_progress()
    stored = await _stored(db, ref)
    assert stored is not None and stored["message"] == "new"
    info = await q.get_job(ref)
    assert info is not None and info.progress is not None and info.progress.message == "new"
    # Once the job is finished under its claim, no late value of that claim lands either.
    await db.execute("UPDATE aioqueue.jobs SET status = 'pending' WHERE id = $1", ref)
    completer.progress_reported((ref, 2), Reported(None, "late", None, False))
    await completer.flush_progress()
    stored = await _stored(db, ref)
    assert stored is not None and stored["message"] == "new"


async def test_progress_survives_a_retry_only_when_kept(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    seen: dict[tuple[bool, int], aioqueue.Progress | None] = {}

    @q.task(max_attempts=2, archive=True)
    async def flaky(keep: bool) -> None:
        job = aioqueue.current_job()
        info = await q.get_job(job.id)
        assert info is not None
        seen[keep, job.attempt] = info.progress
        if job.attempt == 1:
            aioqueue.set_progress(0.5, "halfway", keep=keep)
            raise RuntimeError("transient")

    kept = await flaky.enqueue(keep=True)
    dropped = await flaky.enqueue(keep=False)
    await drain(q)
    # Between the attempts (pending, attempts still 1), the failed attempt's progress shows.
    for ref in (kept, dropped):
        info = await q.get_job(ref)
        assert info is not None and info.status == "pending"
        assert info.progress is not None and info.progress.message == "halfway"
    await db.execute("UPDATE aioqueue.jobs SET run_at = now()")  # past the backoff
    await drain(q)
    assert seen[True, 1] is None and seen[False, 1] is None
    carried = seen[True, 2]
    assert carried is not None and (carried.fraction, carried.attempt, carried.keep) == (0.5, 1, True)
    assert seen[False, 2] is None
    # The second attempt reported nothing: in the archive, the kept value shows; the other is
    # stored there too, but not shown, since the attempt that finished did not report it.
    done = {ref: await q.get_job(ref) for ref in (kept, dropped)}
    assert all(info is not None and info.status == "succeeded" for info in done.values())
    shown = done[kept]
    assert shown is not None and shown.progress is not None and shown.progress.message == "halfway"
    hidden = done[dropped]
    assert hidden is not None and hidden.progress is None
    archived = await db.fetchval("SELECT progress->>'attempt' FROM aioqueue.jobs_done WHERE id = $1", dropped)
    assert archived == "1"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"fraction": math.nan}, "fraction must be a number from 0.0 to 1.0, got nan"),
        ({"fraction": -0.1}, "fraction must be a number from 0.0 to 1.0, got -0.1"),
        ({"fraction": 1.5}, "fraction must be a number from 0.0 to 1.0, got 1.5"),
        ({"fraction": True}, "fraction must be a number from 0.0 to 1.0, got True"),
        ({"fraction": "0.5"}, "fraction must be a number from 0.0 to 1.0, got '0.5'"),
        ({"message": "x" * 501}, "message is 501 characters long, more than 500"),
        ({"message": 5}, "message must be a string, got int"),
        ({"message": "a\x00b"}, "message contains a NUL character"),
        ({"data": {"blob": "x" * 9000}}, "data is 9011 bytes as JSON, more than 8192"),
        ({"data": {"when": object()}}, "data['when']"),
        ({"data": {"x": math.inf}}, "which JSON cannot hold"),
        ({}, "give a fraction, a message or data"),
        ({"fraction": 0.5, "keep": "yes"}, "keep must be True or False"),
    ],
)
async def test_bad_progress_is_refused_at_the_call(
    q: aioqueue.Queue, db: asyncpg.Connection, kwargs: dict[str, Any], error: str
) -> None:
    raised: list[BaseException] = []

    @q.task
    async def job() -> None:
        try:
            aioqueue.set_progress(**kwargs)
        except aioqueue.ConfigurationError as exc:
            raised.append(exc)
        raise aioqueue.Abort("keeps the row to look at")

    ref = await job.enqueue()
    await drain(q)
    assert len(raised) == 1 and error in str(raised[0]), raised
    assert await _stored(db, ref) is None


async def test_set_progress_outside_a_handler_is_refused() -> None:
    with pytest.raises(aioqueue.AioqueueError, match="from inside a running handler only"):
        aioqueue.set_progress(0.5)


async def test_the_cli_and_the_dashboard_show_progress(q: aioqueue.Queue, dsn: str) -> None:
    release = anyio.Event()

    @q.task
    async def job() -> None:
        aioqueue.set_progress(0.4, HOSTILE, data={"k": HOSTILE})
        await release.wait()

    ref = await job.enqueue()
    other = await job.enqueue()
    async with running(q.worker(poll_interval=0.05, concurrency=1)):

        async def reported() -> bool:
            return await ref.progress() is not None

        await eventually(reported, timeout=10, what="the progress to be written")
        status, out, err = await aioqueue_cli("job", str(ref), dsn=dsn)
        assert status == 0, err
        assert "40%" in out and HOSTILE in out and "running" in out, out
        status, out, err = await aioqueue_cli("job", str(ref), "--json", dsn=dsn)
        assert status == 0, err
        shown = json.loads(out)
        assert shown["progress"]["fraction"] == 0.4 and shown["progress"]["data"] == {"k": HOSTILE}
        async with client_for(create_app(q), SERVED, origin=SERVED) as client:
            text = (await client.get(f"/jobs/{ref}")).text
            assert 'id="job-progress"' not in (await client.get(f"/jobs/{other}")).text
        release.set()
    assert 'id="job-progress"' in text and 'value="0.4"' in text and "40%" in text
    assert "<script>alert" not in text and "&lt;script&gt;" in text
