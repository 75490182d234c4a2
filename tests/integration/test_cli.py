"""The ``aioqueue`` command through its real entry point (``python -m aioqueue`` in a
subprocess) against PostgreSQL: migrate, status, dead, worker, and the multi-process
supervisor."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import anyio
import asyncpg
import psutil  # type: ignore[import-untyped]

import aioqueue
from tests.support.cli_tools import aioqueue_cli, app_task, cli_env, cli_process
from tests.support.helpers import eventually, noop_task


async def test_no_database_is_a_clear_error() -> None:
    status, _out, err = await aioqueue_cli("status", dsn=None)
    assert status == 2
    assert "--dsn" in err and "AIOQUEUE_DSN" in err and "DATABASE_URL" in err
    assert "Traceback" not in err


async def test_console_script_is_the_same_command(dsn: str) -> None:
    script = Path(sys.executable).parent / "aioqueue"
    # The README's `pip install -e ".[test]"` installs it: missing, it fails rather than skips.
    assert script.exists(), f"no console script at {script}: install the package (pip install -e .)"
    with anyio.fail_after(20):
        result = await anyio.run_process([str(script), "status", "--json"], env=cli_env(dsn), check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == []


async def test_migrate_prints_sql_then_applies(empty_dsn: str) -> None:
    status, out, err = await aioqueue_cli("migrate", "--sql", dsn=empty_dsn)
    assert status == 0, err
    assert "CREATE TABLE aioqueue.jobs" in out and "version 0 ->" in out
    async with aioqueue.Queue(empty_dsn) as queue:
        async with queue.connection() as conn:
            assert await conn.fetchval("SELECT to_regclass('aioqueue.jobs')") is None  # ran nothing

        status, out, err = await aioqueue_cli("migrate", dsn=empty_dsn)
        assert status == 0, err
        assert "applied 0001" in out
        await queue.check_schema()

        status, out, err = await aioqueue_cli("migrate", "--dry-run", dsn=empty_dsn)
        assert status == 0 and "nothing to run" in out, (out, err)
        status, out, err = await aioqueue_cli("migrate", dsn=empty_dsn)
        assert status == 0 and "up to date" in out, (out, err)

    # --schema, given after the command, and the DSN by flag rather than environment.
    status, out, err = await aioqueue_cli("migrate", "--schema", "jobs_b", "--dsn", empty_dsn, dsn=None)
    assert status == 0, err
    async with aioqueue.Queue(empty_dsn, schema="jobs_b") as other:
        await other.check_schema()


async def test_migrate_against_an_unreachable_server_fails_cleanly() -> None:
    status, _out, err = await aioqueue_cli(
        "migrate", "--dsn", "postgresql://nobody@127.0.0.1:1/none", dsn=None
    )
    assert status == 1
    assert "cannot connect" in err and "127.0.0.1:1" in err and "Traceback" not in err


async def test_status_table_and_json(q: aioqueue.Queue, dsn: str, db: asyncpg.Connection) -> None:
    send = noop_task(q, "send", queue="mail")
    encode = noop_task(q, "encode", queue="video")

    await send.enqueue_many([{"n": i} for i in range(3)])
    await q.worker(concurrency=3).run_until_empty()  # three succeeded this minute
    await send.enqueue_many([{"n": i} for i in range(4)])
    await send.options(delay=3600).enqueue(n=99)
    dead_id = await encode.enqueue(n=1)
    await db.execute(
        "UPDATE aioqueue.jobs SET status = 'dead', last_error = 'boom' WHERE id = $1", dead_id
    )

    status, out, err = await aioqueue_cli("status", "--json", dsn=dsn)
    assert status == 0, err
    rows = {r["queue"]: r for r in json.loads(out)}
    mail, video = rows["mail"], rows["video"]
    assert (mail["pending"], mail["ready"], mail["scheduled"], mail["running"], mail["dead"]) == (5, 4, 1, 0, 0)
    assert mail["completed_last_minute"] == 3
    assert mail["oldest_ready_age"] >= 0
    assert (video["pending"], video["dead"], video["oldest_ready_age"]) == (0, 1, None)

    status, out, err = await aioqueue_cli("status", dsn=dsn)
    assert status == 0, err
    header, *lines = out.splitlines()
    assert header.split() == ["QUEUE", "PENDING", "READY", "SCHEDULED", "RUNNING", "DEAD", "OLDEST",
                              "READY", "DONE/MIN"]
    cells = {line.split()[0]: line.split() for line in lines}
    assert cells["mail"][1:6] == ["5", "4", "1", "0", "0"] and cells["mail"][-1] == "3"
    assert cells["video"][6] == "-"


async def test_dead_list_retry_purge(q: aioqueue.Queue, dsn: str, db: asyncpg.Connection) -> None:
    flaky = noop_task(q, "flaky", queue="a")
    other = noop_task(q, "other", queue="b")

    ids = [await flaky.enqueue(n=i) for i in range(3)] + [await other.enqueue(n=9)]
    await db.execute(
        "UPDATE aioqueue.jobs SET status = 'dead', attempts = 5, last_error = 'ValueError: bad ' || id"
    )

    status, out, err = await aioqueue_cli("dead", "list", dsn=dsn)
    assert status == 0, err
    assert out.splitlines()[0].split() == ["ID", "QUEUE", "TASK", "ATTEMPTS", "LAST", "ERROR"]
    assert f"ValueError: bad {ids[0]}" in out and "5/5" in out
    status, out, err = await aioqueue_cli("dead", "list", "--queue", "b", "--json", dsn=dsn)
    assert status == 0, err
    assert [j["id"] for j in json.loads(out)] == [ids[3]]

    status, out, err = await aioqueue_cli("dead", "retry", str(ids[0]), str(ids[1]), dsn=dsn)
    assert status == 0, err
    assert f"retried 2 dead job(s): {ids[0]}, {ids[1]}" in out
    statuses = {r["id"]: r["status"] for r in await db.fetch("SELECT id, status FROM aioqueue.jobs")}
    assert [statuses[i] for i in ids] == ["pending", "pending", "dead", "dead"]

    status, out, err = await aioqueue_cli("dead", "purge", "--queue", "b", dsn=dsn)
    assert status == 0 and f"purged 1 dead job(s): {ids[3]}" in out, (out, err)
    status, out, err = await aioqueue_cli("dead", "retry", "--all", dsn=dsn)
    assert status == 0 and f"retried 1 dead job(s): {ids[2]}" in out, (out, err)
    status, out, err = await aioqueue_cli("dead", "purge", "--all", dsn=dsn)
    assert status == 0 and "nothing purged" in out, (out, err)
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status = 'pending'") == 3

    status, out, err = await aioqueue_cli("dead", "purge", dsn=dsn)  # names nothing
    assert status == 2 and "--all" in err


async def test_worker_runs_jobs_and_drains_on_sigterm(dsn: str, app_dir: Path, db: asyncpg.Connection) -> None:
    args = ["worker", "cli_app:queue", "--concurrency", "4", "--poll-interval", "0.2", "--grace-period", "10"]
    async with cli_process(args, dsn, app_dir) as (process, output):
        await output.wait_for("started: queues=cli concurrency=4")
        async with aioqueue.Queue(dsn) as queue:
            record = app_task(queue, "record", "cli")
            await record.enqueue(n=1)
            await eventually(lambda: _seen(db, 1), what="the worker to run job 1")
            await record.enqueue(n=2, sleep=0.5)
            await eventually(lambda: _begun(db, 2), what="job 2's handler to start")
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            assert await process.wait() == 0
    assert sorted(r["n"] for r in await db.fetch("SELECT n FROM seen")) == [1, 2]  # drained, not cut
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    assert "stopping gracefully" in output.text


async def test_worker_second_signal_interrupts_running_jobs(
    dsn: str, app_dir: Path, db: asyncpg.Connection
) -> None:
    args = ["worker", "cli_app:queue", "--poll-interval", "0.2", "--grace-period", "60"]
    async with cli_process(args, dsn, app_dir) as (process, output):
        await output.wait_for("started: queues=cli")
        async with aioqueue.Queue(dsn) as queue:
            job_id = await app_task(queue, "stuck", "cli").enqueue()
        await eventually(lambda: _begun(db, -1), what="the stuck job's handler to start")
        process.send_signal(signal.SIGTERM)
        await output.wait_for("stopping gracefully")
        assert process.returncode is None  # still draining: the grace period is a minute
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            assert await process.wait() == 0
    row = await db.fetchrow("SELECT status, attempts, last_error FROM aioqueue.jobs WHERE id = $1", job_id)
    assert row is not None and row["status"] == "pending" and "Interrupted" in row["last_error"]


async def test_worker_target_errors(dsn: str, app_dir: Path) -> None:
    for target, message in [
        ("cli_app", "MODULE:ATTR"),
        ("no_such_module:queue", "cannot import 'no_such_module'"),
        ("cli_app:nothing", "no attribute 'nothing'"),
        ("cli_app:record", "is a Task, not an aioqueue.Queue"),
    ]:
        status, _out, err = await aioqueue_cli("worker", target, dsn=dsn, cwd=app_dir)
        assert status == 2 and message in err, (target, err)


async def test_worker_on_an_unmigrated_database_says_to_migrate(empty_dsn: str, app_dir: Path) -> None:
    for processes in ("1", "2"):
        status, _out, err = await aioqueue_cli(
            "worker", "cli_app:queue", "--processes", processes, dsn=empty_dsn, cwd=app_dir
        )
        assert status == 1 and "aioqueue migrate" in err, err


async def test_processes_share_the_load_and_crashed_ones_restart(
    dsn: str, app_dir: Path, db: asyncpg.Connection
) -> None:
    args = ["worker", "cli_app:queue", "--processes", "2", "--concurrency", "1", "--poll-interval", "0.2",
            "--grace-period", "10"]
    async with cli_process(args, dsn, app_dir) as (process, output):
        await output.wait_for("started: queues=cli concurrency=1", count=2)
        children = psutil.Process(process.pid).children()
        assert len(children) == 2
        async with aioqueue.Queue(dsn) as queue:
            await app_task(queue, "record", "cli").enqueue_many([{"n": n, "sleep": 0.2} for n in range(6)])
        await eventually(lambda: _seen(db, 6), what="six jobs to run")
        pids = {r["pid"] for r in await db.fetch("SELECT pid FROM seen")}
        assert pids == {c.pid for c in children}, "both processes should have taken jobs"

        children[0].kill()
        await output.wait_for("was killed by SIGKILL; restarting")
        await output.wait_for("started: queues=cli concurrency=1", count=3)
        now = psutil.Process(process.pid).children()
        assert len(now) == 2 and children[0].pid not in {c.pid for c in now}

        # SIGTERM to the supervisor: the children drain the job they are running, then exit.
        async with aioqueue.Queue(dsn) as queue:
            await app_task(queue, "record", "cli").enqueue(n=100, sleep=0.5)
        await eventually(lambda: _begun(db, 100), what="the last job's handler to start")
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            assert await process.wait() == 0
        assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in now)
    assert await db.fetchval("SELECT count(*) FROM seen WHERE n = 100") == 1
    # Nothing is left but what the SIGKILLed child held with its outcome unwritten: that job
    # stays running under the dead child's lease until the reaper returns it (at-least-once).
    left = await db.fetch("SELECT status, locked_by FROM aioqueue.jobs")
    killed = f":{children[0].pid}:"
    assert all(r["status"] == "running" and killed in r["locked_by"] for r in left), left
    assert "all 2 worker processes stopped" in output.text


async def _seen(db: asyncpg.Connection, count: int) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM seen") >= count)


async def _begun(db: asyncpg.Connection, n: int) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM begun WHERE n = $1", n))



async def test_bad_values_are_one_line_usage_errors(dsn: str, app_dir: Path) -> None:
    for args, message in [
        (["status", "--schema", ""], "schema name '' is not a plain identifier"),
        (["dead", "purge", "1180591620717411303424"], "a job id is an integer from 1 to 2**63-1"),
        (["worker", "cli_app:queue", "--metrics-port", "70000"], "must be a TCP port from 1 to 65535"),
        (["worker", "cli_app:queue", "--concurrency", "0"], "concurrency must be an int from 1 to 10000"),
        (["worker", "cli_app:queue", "--queues", "a=x"], "write every queue as NAME=SLOTS"),
        (["worker", "cli_app:queue", "--lease", "1", "--heartbeat-interval", "2"], "shorter than the lease"),
    ]:
        status, _out, err = await aioqueue_cli(*args, dsn=dsn, cwd=app_dir)
        assert status == 2, (args, status, err)
        assert message in err, (args, err)
        assert "Traceback" not in err, (args, err)
