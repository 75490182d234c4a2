"""Rows written behind aioqueue's back (by SQL, by another client), as every operator view shows
them: arguments or results Python cannot decode (nesting 5,000 levels deep, a number of 5,000
digits) or that nest deeper than aioqueue writes are shown as undecodable, with the reason, by
the Python calls, the ``aioqueue`` command and the dashboard, and the other jobs list as usual."""

from __future__ import annotations

import html
import json

import asyncpg
import pytest

import aioqueue
from aioqueue._admin import JobFilter
from aioqueue.dashboard import create_app
from tests.support.cli_tools import aioqueue_cli
from tests.support.dashboard_tools import client_for


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Each dead job's arguments as SQL stores them, and how the views say why they are not shown.
BAD_ARGS = {
    "deep": ("('{\"n\":' || repeat('[', 5000) || repeat(']', 5000) || '}')::jsonb",
             "they nest lists and objects deeper than Python's json can decode"),
    "huge": ("('{\"n\":' || repeat('9', 5000) || '}')::jsonb", "Exceeds the limit (4300 digits)"),
    "deeper than aioqueue writes": (f"'{{\"n\": {_nested(600)}}}'::jsonb", "more than 256 levels deep"),
    "a float no float holds": ("('{\"n\":' || repeat('9', 400) || '.5}')::jsonb", "which JSON cannot hold"),
}


async def _stored(db: asyncpg.Connection) -> tuple[int, dict[str, int], int]:
    """Dead jobs written by SQL: a good one first and last, the bad ones between; and an archived
    success whose result nests 5,000 levels. Return (newest id, the others' ids by name, the
    archived id)."""
    good = await db.fetchval(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, last_error) "
        "VALUES ('default', 'ping', '{\"n\": 1}', 'dead', 'boom') RETURNING id"
    )
    bad = {}
    for name, (sql, _why) in BAD_ARGS.items():
        bad[name] = await db.fetchval(
            f"INSERT INTO aioqueue.jobs (queue, task, args, status, last_error) "
            f"VALUES ('default', 'ping', {sql}, 'dead', 'boom') RETURNING id"
        )
    newest = await db.fetchval(
        "INSERT INTO aioqueue.jobs (queue, task, args, status, last_error) "
        "VALUES ('default', 'ping', '{\"n\": 2}', 'dead', 'boom') RETURNING id"
    )
    archived = await db.fetchval(
        "INSERT INTO aioqueue.jobs_done (id, queue, task, args, status, priority, attempts, result, created_at) "
        "VALUES (1000000, 'default', 'ping', '{\"n\": 3}', 'succeeded', 0, 1, "
        "(repeat('[', 5000) || repeat(']', 5000))::jsonb, now()) RETURNING id"
    )
    return newest, {"good": good, **bad}, archived


def _why(name: str) -> str:
    return BAD_ARGS[name][1]


async def test_python_views_show_undecodable_arguments_and_list_the_rest(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    newest, ids, archived = await _stored(db)
    dead = await q.list_dead()
    assert [j.id for j in dead] == [newest, *reversed(ids.values())]  # every job, newest first
    by_id = {j.id: j for j in dead}
    assert by_id[newest].args == {"n": 2} and by_id[ids["good"]].args == {"n": 1}
    for name in BAD_ARGS:
        args = by_id[ids[name]].args
        assert isinstance(args, aioqueue.UndecodableValue), name
        assert args.error.startswith("UndecodableArguments: the stored arguments cannot be "), args
        assert _why(name) in args.error, args
        info = await q.get_job(ids[name])
        assert info is not None and info.args == args
        assert info.to_dict()["args"] is None and info.to_dict()["undecodable"] == {"args": args.error}
        detail = await q.admin.job_detail(ids[name])
        assert detail is not None and detail["args"] == args
    assert "undecodable" not in by_id[newest].to_dict()

    page = await q.admin.list_jobs(JobFilter(status="dead"))
    assert [j["id"] for j in page.jobs] == [j.id for j in dead]
    assert {j["id"]: j["args"] for j in page.jobs} == {j.id: j.args for j in dead}

    info = await q.get_job(archived)
    assert info is not None and info.args == {"n": 3}
    assert isinstance(info.result, aioqueue.UndecodableValue)
    assert info.result.error.startswith("UndecodableResult: the stored result cannot be decoded: it nests")
    detail = await q.admin.job_detail(archived)
    assert detail is not None and detail["result"] == info.result
    page = await q.admin.list_jobs(JobFilter(status="succeeded"))
    assert [j["id"] for j in page.jobs] == [archived]
    with pytest.raises(aioqueue.ResultUnavailable, match="its result cannot be read back: UndecodableResult"):
        await q.wait_result(archived, timeout=5)


async def test_the_command_lists_undecodable_arguments_with_the_reason(dsn: str, db: asyncpg.Connection) -> None:
    newest, ids, _archived = await _stored(db)
    status, out, err = await aioqueue_cli("dead", "list", "--json", dsn=dsn)
    assert status == 0, err
    listed = {job["id"]: job for job in json.loads(out)}
    assert list(listed) == [newest, *reversed(ids.values())]
    assert listed[newest]["args"] == {"n": 2} and "undecodable" not in listed[newest]
    for name in BAD_ARGS:
        job = listed[ids[name]]
        assert job["args"] is None and _why(name) in job["undecodable"]["args"], job

    status, out, err = await aioqueue_cli("dead", "list", dsn=dsn)
    assert status == 0, err
    assert all(str(job_id) in out for job_id in listed)


async def test_the_dashboard_shows_undecodable_arguments_and_results(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    newest, ids, archived = await _stored(db)
    async with client_for(create_app(q)) as client:
        for page in ("/dead", "/jobs?status=dead"):
            response = await client.get(page, follow_redirects=True)
            assert response.status_code == 200, response.text
            for job_id in [newest, *ids.values()]:
                assert f'href="/jobs/{job_id}"' in response.text, (page, job_id)
            assert response.text.count("undecodable: UndecodableArguments") == len(BAD_ARGS)
        for name in BAD_ARGS:
            response = await client.get(f"/jobs/{ids[name]}")
            assert response.status_code == 200, response.text
            text = html.unescape(response.text)
            assert "undecodable: UndecodableArguments" in text and _why(name) in text
        response = await client.get(f"/jobs/{archived}")
        assert response.status_code == 200, response.text
        assert "undecodable: UndecodableResult: the stored result cannot be decoded" in response.text
        response = await client.get("/jobs?status=succeeded")
        assert response.status_code == 200 and f'href="/jobs/{archived}"' in response.text
