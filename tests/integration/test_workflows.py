"""Workflows: jobs that wait for others, results downstream, groups and their callbacks, failure
policy, and refusals at enqueue (migration 0014)."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

import aioqueue
from aioqueue import Dependency, DependencyError, Workflow, chain, chord, group
from aioqueue._maintenance import Maintenance
from aioqueue.dashboard import create_app
from tests.support.cli_tools import aioqueue_cli
from tests.support.dashboard_tools import client_for
from tests.support.helpers import eventually, noop_task


def recorder(q: aioqueue.Queue, name: str) -> tuple[aioqueue.Task[..., None], list[str]]:
    """Register a task called ``name`` that records its ``label``; return it and the labels
    recorded, in the order its jobs ran."""
    ran: list[str] = []

    async def record(label: str) -> None:
        ran.append(label)

    return q.task(name=name)(record), ran


async def test_a_dependant_waits_outside_the_ready_index_and_runs_after(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    order: list[str] = []

    @q.task
    async def step(label: str) -> str:
        order.append(label)
        return label.upper()

    @q.task(archive=True)
    async def last() -> list[Any]:
        up = await q.upstream()
        order.append("last")
        return [up[0], up["b"], list(up)]

    a = await step.enqueue(label="a")
    b = await step.enqueue(label="b")
    c = await last.options(after={"a": a, "b": b}).enqueue()
    assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", c) == "waiting"
    assert await db.fetchval("SELECT waiting_for FROM aioqueue.jobs WHERE id = $1", c) == 2
    # The claim reads only the ready index: a worker given only the dependant finds nothing.
    stats = await q.worker(queues=["default"], concurrency=1).run_until_empty()
    assert order == ["a", "b", "last"]
    assert stats.succeeded == 3
    assert await c.result(timeout=10) == ["A", "B", ["A", "B"]]


async def test_a_graph_commits_or_vanishes_with_the_callers_transaction(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    noop = noop_task(q, "noop")
    async with q.connection() as conn:
        tr = conn.transaction()
        await tr.start()
        a = await noop.options(conn=conn).enqueue()
        await noop.options(conn=conn, after=[a]).enqueue()
        await tr.rollback()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    assert await db.fetchval("SELECT count(*) FROM aioqueue.job_deps") == 0


async def test_chain_passes_results_down_in_one_transaction(q: aioqueue.Queue) -> None:
    @q.task(archive=True)
    async def add(x: int = 0) -> int:
        up = await q.upstream()
        return x + (up[0] if len(up) else 0)

    refs = await chain(add.s(x=1), add.s(x=10), add.s(x=100)).enqueue()
    await q.worker(concurrency=4).run_until_empty()
    assert [await r.result(timeout=10) for r in refs] == [1, 11, 111]


async def test_chord_callback_runs_once_with_every_members_result(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    totals: list[int] = []

    @q.task
    async def square(n: int) -> int:
        return n * n

    @q.task
    async def total() -> None:
        totals.append(sum(await q.upstream()))

    g = await chord([square.s(n=i) for i in range(20)], total.s()).enqueue()
    await q.worker(concurrency=8).run_until_empty()
    assert totals == [sum(i * i for i in range(20))]
    counts = await g.counts()
    assert (counts.total, counts.succeeded, counts.pending, counts.running, counts.done) == (20, 20, 0, 0, True)
    assert list(counts.callbacks) == ["on_success"]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.group_callbacks") == 1


async def test_an_open_group_takes_members_until_closed(q: aioqueue.Queue) -> None:
    done, seen = recorder(q, "done")

    @q.task
    async def member() -> None:
        pass

    g = await q.open_group(on_success=done.s(label="success"), on_complete=done.s(label="complete"), name="batch")
    await member.options(group=g).enqueue_many([{}] * 5)
    await q.worker(concurrency=4).run_until_empty()
    assert seen == []  # open: more may come
    await member.options(group=g).enqueue()
    await g.close()
    await q.worker(concurrency=4).run_until_empty()
    assert sorted(seen) == ["complete", "success"]
    assert (await g.counts()).total == 6
    with pytest.raises(DependencyError, match="closed"):
        await member.options(group=g).enqueue()


async def test_a_failed_member_sends_on_failure_not_on_success(q: aioqueue.Queue) -> None:
    done, seen = recorder(q, "done")

    @q.task(max_attempts=1)
    async def member(fail: bool) -> None:
        if fail:
            raise RuntimeError("boom")

    g = await group(member.s(fail=False), member.s(fail=True)).enqueue(
        on_success=done.s(label="success"), on_failure=done.s(label="failure"), on_complete=done.s(label="complete")
    )
    await q.worker(concurrency=2).run_until_empty()
    assert sorted(seen) == ["complete", "failure"]
    counts = await g.counts()
    assert (counts.succeeded, counts.failed) == (1, 1)


async def test_a_dead_dependency_cancels_its_dependants_down_the_graph_with_the_reason(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    step, ran = recorder(q, "step")

    @q.task(max_attempts=1)
    async def fails() -> None:
        raise RuntimeError("boom")

    a = await fails.enqueue()
    b = await step.options(after=[a]).enqueue(label="b")
    c = await step.options(after=[b]).enqueue(label="c")
    d = await step.options(after=[Dependency(a, may_fail=True)]).enqueue(label="d")
    await q.worker(concurrency=2).run_until_empty()
    assert ran == ["d"]
    rows = await db.fetch("SELECT id, status, reason FROM aioqueue.jobs_done WHERE id = ANY($1) ORDER BY id", [b, c])
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("cancelled", f"dependency {a} did not succeed"), ("cancelled", f"dependency {b} did not succeed")]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE id = ANY($1)", [b, c, d]) == 0


async def test_cancelling_a_workflow_cancels_what_has_not_run(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task
    async def step() -> None:
        pass

    refs = await chain(step.s(), step.s(), step.s()).enqueue()
    outcome = await q.cancel_workflow(refs[1])
    assert outcome == {refs[0]: "cancelled", refs[1]: "cancelled", refs[2]: "cancelled"}
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs") == 0
    nodes = await q.workflow(refs[2])
    assert [n["status"] for n in nodes] == ["cancelled"] * 3
    assert nodes[2]["depends_on"] == [refs[1]]


async def test_cancelling_a_workflow_from_one_branch_cancels_the_whole_diamond(q: aioqueue.Queue) -> None:
    @q.task
    async def step() -> None:
        pass

    refs = await (
        Workflow()
        .add("start", step.s())
        .add("left", step.s(), after=["start"])
        .add("right", step.s(), after=["start"])
        .add("merge", step.s(), after=["left", "right"])
        .enqueue()
    )
    ids = sorted(refs.values())
    assert [n["id"] for n in await q.workflow(refs["left"])] == ids
    assert await q.cancel_workflow(refs["left"]) == dict.fromkeys(ids, "cancelled")
    assert [n["status"] for n in await q.workflow(refs["right"])] == ["cancelled"] * 4


async def test_a_result_waiter_wakes_when_its_workflow_is_cancelled(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    @q.task(archive=True)
    async def step() -> None:
        pass

    refs = await chain(step.s(), step.s()).enqueue()
    outcome: list[str] = []

    async def wait() -> None:
        try:  # a poll of a minute cannot explain a quick wake: the NOTIFY of the cancel must
            await q.wait_result(refs[1], timeout=10, poll_interval=60)
        except aioqueue.JobCancelled as exc:
            outcome.append(str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await eventually(
            lambda: db.fetchval("SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN%'"),
            what="the waiter listening",
        )
        assert await q.cancel_workflow(refs[0]) == dict.fromkeys(refs, "cancelled")
    assert outcome == [f"job {refs[1]} was cancelled"]


async def test_refusals_name_what_was_wrong_and_write_nothing(
    q: aioqueue.Queue, db: asyncpg.Connection, other_dsn: str
) -> None:
    @q.task(max_attempts=1)
    async def step() -> None:
        raise RuntimeError("dies")

    @q.task
    async def plain() -> None:
        pass

    with pytest.raises(DependencyError, match=r"dependency 999999 does not exist or is gone.*nothing was written"):
        await plain.options(after=[999999]).enqueue()
    gone = await plain.enqueue()  # not archived: gone once it succeeds
    dead = await step.enqueue()
    await q.worker().run_until_empty()
    with pytest.raises(DependencyError, match=f"dependency {gone} does not exist or is gone"):
        await plain.options(after=[gone]).enqueue()
    with pytest.raises(DependencyError, match=f"dependency {dead} is dead"):
        await plain.options(after=[dead]).enqueue_many([{}, {}])
    other = aioqueue.Queue(other_dsn)
    async with other:
        await other.migrate()
        foreign = await other.by_name("plain").options(queue="default").enqueue()
    with pytest.raises(DependencyError, match=f"dependency {foreign} is a job of another database"):
        await plain.options(after=[foreign]).enqueue()
    wf = Workflow().add("a", plain.s(), after=["c"]).add("b", plain.s(), after=["a"]).add("c", plain.s(), after=["b"])
    with pytest.raises(DependencyError, match=r"cycle: a -> c -> b -> a"):
        await wf.enqueue()
    with pytest.raises(DependencyError, match="waits for 'x', which is no step"):
        await Workflow().add("a", plain.s(), after=["x"]).enqueue()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs WHERE status <> 'dead'") == 0
    assert await db.fetchval("SELECT count(*) FROM aioqueue.job_deps") == 0


async def test_a_cancelled_dependency_or_a_missing_group_is_refused_and_a_cancelled_member_fails_its_group(
    q: aioqueue.Queue,
) -> None:
    done, seen = recorder(q, "done")

    @q.task
    async def plain() -> None:
        pass

    cancelled = await plain.enqueue()
    assert await q.cancel(cancelled) == "cancelled"
    with pytest.raises(DependencyError, match=f"dependency {cancelled} "):
        await plain.options(after=[cancelled]).enqueue()
    with pytest.raises(DependencyError, match="group 999999"):
        await plain.options(group=999999).enqueue()
    with pytest.raises(aioqueue.ConfigurationError, match="group 999999 does not exist"):
        await q.close_group(999999)
    with pytest.raises(aioqueue.ConfigurationError, match="name is a non-empty str or None, got 5"):
        plain.options(after=[Dependency(cancelled, name=5)])  # type: ignore[arg-type]
    with pytest.raises(aioqueue.ConfigurationError, match="name is a non-empty str or None, got ''"):
        plain.options(after=[Dependency(cancelled, name="")])
    with pytest.raises(aioqueue.ConfigurationError, match="may_fail is a bool, got 'no'"):
        plain.options(after=[Dependency(cancelled, may_fail="no")])  # type: ignore[arg-type]
    for links in ({"after": [cancelled]}, {"group": 999999}):  # checked before the database is asked
        with pytest.raises(aioqueue.ConfigurationError, match=r"dedup keys? cannot be given with after= or group="):
            await plain.options(**links).enqueue_many([{}], keys=["k"])
        with pytest.raises(aioqueue.ConfigurationError, match=r"dedup keys? cannot be given with after= or group="):
            plain.options(key="k", **links)
    g = await q.open_group(on_success=done.s(label="success"), on_failure=done.s(label="failure"))
    member = await plain.options(group=g).enqueue()
    await plain.options(group=g).enqueue()
    assert await q.cancel(member) == "cancelled"
    await g.close()
    await q.worker().run_until_empty()
    assert seen == ["failure"]
    counts = await g.counts()
    assert (counts.total, counts.succeeded, counts.cancelled, counts.done) == (2, 1, 1, True)
    assert set(counts.callbacks) == {"on_failure"}
    assert counts.callback_tasks == {"on_success": "done", "on_failure": "done"}


async def test_a_refusal_inside_the_callers_transaction_leaves_it_usable(q: aioqueue.Queue) -> None:
    @q.task
    async def plain() -> None:
        pass

    async with q.connection() as conn, conn.transaction():
        kept = await plain.options(conn=conn).enqueue()
        with pytest.raises(DependencyError):
            await plain.options(conn=conn, after=[kept + 1000]).enqueue()
        await plain.options(conn=conn, after=[kept]).enqueue()
    assert (await q.group_counts(1)) is None
    assert len(await q.workflow(kept)) == 2


async def test_a_workflow_by_step_names(q: aioqueue.Queue) -> None:
    @q.task
    async def fetch(url: str) -> str:
        return f"<{url}>"

    @q.task(archive=True)
    async def merge() -> str:
        up = await q.upstream()
        return str(up["left"]) + str(up["right"])

    refs = await (
        Workflow()
        .add("merge", merge.s(), after=["left", "right"])
        .add("left", fetch.s(url="l"))
        .add("right", fetch.s(url="r"))
        .enqueue()
    )
    await q.worker(concurrency=3).run_until_empty()
    assert await refs["merge"].result(timeout=10) == "<l><r>"


async def test_a_workflow_step_named_only_in_may_fail_is_waited_for(q: aioqueue.Queue) -> None:
    @q.task(max_attempts=1)
    async def flaky() -> None:
        raise RuntimeError("down")

    @q.task(archive=True)
    async def report() -> list[str]:
        up = await q.upstream()
        return [*up.names, *up.statuses]  # type: ignore[list-item]

    refs = await Workflow().add("flaky", flaky.s()).add("report", report.s(), may_fail=["flaky"]).enqueue()
    assert (await refs["report"].info()).status == "waiting"  # type: ignore[union-attr]
    await q.worker().run_until_empty()
    assert await refs["report"].result(timeout=10) == ["flaky", "dead"]
    with pytest.raises(aioqueue.ConfigurationError, match=r"after= takes a list of step names, got 'flaky'"):
        Workflow().add("flaky", flaky.s()).add("report", report.s(), after="flaky")


async def test_members_finishing_on_eight_workers_at_once_send_one_callback(q: aioqueue.Queue) -> None:
    """1,000 groups of 8 members, each group's members claimed by 8 workers at once: every
    callback is enqueued exactly once, no deadlock, no lost wake-up."""
    calls: list[int] = []

    @q.task
    async def member(g: int) -> None:
        pass

    @q.task
    async def done(g: int) -> None:
        calls.append(g)

    rounds = 1000
    async with q.connection() as conn, conn.transaction():
        for r in range(rounds):
            g = await q.open_group(on_complete=done.s(g=r), conn=conn)
            await member.options(conn=conn, group=g).enqueue_many([{"g": r}] * 8)
            await g.close(conn=conn)
    workers = [q.worker(concurrency=1, name=f"w{i}") for i in range(8)]
    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            for w in workers:
                tg.start_soon(w.run_until_empty)
        await q.worker(concurrency=8).run_until_empty()  # the callbacks enqueued last
    assert sorted(calls) == list(range(rounds))


async def test_a_dependency_finished_by_an_older_release_is_released_by_maintenance(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """Workers of the release before workflows finish jobs with the old statements, which do not
    call jobs_finished(): the maintenance pass makes the stranded dependant ready."""

    @q.task
    async def noop() -> None:
        pass

    a = await noop.enqueue()
    b = await noop.options(after=[a]).enqueue()
    # The old `complete`: delete and archive, nothing else.
    await db.execute(
        "WITH f AS (DELETE FROM aioqueue.jobs WHERE id = $1 RETURNING *) INSERT INTO aioqueue.jobs_done "
        "(id, queue, task, args, status, priority, attempts, created_at) "
        "SELECT id, queue, task, args, 'succeeded', priority, attempts, created_at FROM f", a)
    assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", b) == "waiting"
    maintenance = Maintenance(q.database, reap_interval=1.0, archive_retention=None)
    assert await maintenance.release_stranded() == 1
    assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", b) == "pending"
    assert await maintenance.release_stranded() == 0  # not again before its interval


async def test_the_commands_show_and_steer_workflows_and_groups(q: aioqueue.Queue, dsn: str) -> None:
    @q.task
    async def step() -> None:
        pass

    refs = await chain(step.s(), step.s()).enqueue()
    g = await q.open_group(on_complete=step.s(), name="nightly")
    await step.options(group=g).enqueue_many([{}, {}])
    status, out, _ = await aioqueue_cli("workflow", "show", str(refs[1]), dsn=dsn)
    assert status == 0 and f"{refs[1]}  step  waiting  {refs[0]}" in out
    status, out, _ = await aioqueue_cli("group", "list", dsn=dsn)
    assert status == 0 and "nightly" in out and "open" in out
    status, out, _ = await aioqueue_cli("group", "close", str(g.id), dsn=dsn)
    assert status == 0 and (await g.counts()).closed
    status, out, _ = await aioqueue_cli("group", "show", str(g.id), "--json", dsn=dsn)
    assert status == 0 and '"pending": 2' in out and '"on_complete": "step"' in out
    status, out, _ = await aioqueue_cli("workflow", "cancel", str(refs[0]), dsn=dsn)
    assert status == 0 and "cancelled 2 job(s)" in out
    status, _, err = await aioqueue_cli("group", "show", "999", dsn=dsn)
    assert status == 1 and "no group with id 999" in err


async def test_the_dashboard_shows_groups_and_the_graph_with_links(q: aioqueue.Queue) -> None:
    @q.task
    async def step() -> None:
        pass

    refs = await chain(step.s(), step.s()).enqueue()
    g = await q.open_group(on_success=step.s(), name="nightly<b>")
    await step.options(group=g).enqueue()
    await g.close()
    async with client_for(create_app(q)) as client:
        groups = await client.get("/groups")
        assert groups.status_code == 200 and f'href="/groups/{g.id}"' in groups.text
        assert "nightly&lt;b&gt;" in groups.text and "<b>" not in groups.text.split("<h1>")[1]
        page = await client.get(f"/groups/{g.id}")
        assert page.status_code == 200 and "not enqueued" in page.text and ">1</dd>" in page.text
        graph = await client.get(f"/workflows/{refs[1]}")
        assert graph.status_code == 200
        assert f'href="/jobs/{refs[0]}"' in graph.text and "status-waiting" in graph.text
        assert (await client.get("/groups/999")).status_code == 404
        assert 'href="/workflows/' in (await client.get(f"/jobs/{refs[0]}")).text
    await q.worker(concurrency=2).run_until_empty()
    async with client_for(create_app(q)) as client:
        page = await client.get(f"/groups/{g.id}")
        counts = await g.counts()
        assert f'href="/jobs/{counts.callbacks["on_success"]}"' in page.text


async def test_retrying_a_dead_job_resumes_its_workflow(q: aioqueue.Queue, db: asyncpg.Connection) -> None:
    """The dependants a dead job cancelled (and theirs) wait again when it is retried, and run."""
    step, ran = recorder(q, "step")
    broken = {"yes": True}

    @q.task(max_attempts=1)
    async def flaky() -> None:
        if broken["yes"]:
            raise RuntimeError("down")

    a = await flaky.enqueue()
    b = await step.options(after=[a]).enqueue(label="b")
    c = await step.options(after=[b]).enqueue(label="c")
    await q.worker().run_until_empty()
    assert ran == []
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE status = 'cancelled'") == 2
    broken["yes"] = False
    assert await q.retry_dead([a]) == [a]
    assert [await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", j) for j in (b, c)] == [
        "waiting", "waiting"]
    await q.worker().run_until_empty()
    assert ran == ["b", "c"]
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE status = 'cancelled'") == 0


async def test_retrying_a_dead_member_reopens_its_settled_group_for_its_success_path(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """A group settled with a dead member (and a member its death cancelled): retrying the dead
    one takes both out of the failed and cancelled counts and reopens the group; once they
    succeed, on_success is enqueued, and on_failure and on_complete, enqueued already, are not
    enqueued again."""
    done, seen = recorder(q, "done")
    broken = {"yes": True}

    @q.task(max_attempts=1)
    async def member(fail: bool) -> None:
        if fail and broken["yes"]:
            raise RuntimeError("down")

    g = await q.open_group(on_success=done.s(label="success"), on_failure=done.s(label="failure"),
                           on_complete=done.s(label="complete"))
    await member.options(group=g).enqueue(fail=False)
    dies = await member.options(group=g).enqueue(fail=True)
    await member.options(group=g, after=[dies]).enqueue(fail=False)
    await g.close()
    await q.worker(concurrency=2).run_until_empty()
    assert sorted(seen) == ["complete", "failure"]
    settled = await g.counts()
    assert (settled.succeeded, settled.failed, settled.cancelled, settled.done) == (1, 1, 1, True)

    broken["yes"] = False
    assert await q.retry_dead([dies]) == [dies]
    reopened = await g.counts()
    assert (reopened.succeeded, reopened.failed, reopened.cancelled, reopened.done) == (1, 0, 0, False)
    assert set(reopened.callbacks) == {"on_failure", "on_complete"}
    await q.worker(concurrency=2).run_until_empty()
    assert sorted(seen) == ["complete", "failure", "success"]
    final = await g.counts()
    assert (final.succeeded, final.failed, final.cancelled, final.done) == (3, 0, 0, True)
    assert set(final.callbacks) == {"on_success", "on_failure", "on_complete"}
    assert await db.fetchval("SELECT count(*) FROM aioqueue.group_callbacks WHERE group_id = $1", g.id) == 3


async def test_dependants_resumed_by_a_retry_keep_their_max_attempts_and_key(
    q: aioqueue.Queue, db: asyncpg.Connection
) -> None:
    """A dependant cancelled by its dependency's death and restored by the retry comes back with
    the max_attempts and partition key it was enqueued with (not the defaults)."""

    @q.task(max_attempts=1)
    async def flaky() -> None:
        raise RuntimeError("down")

    @q.task(max_attempts=9)
    async def step() -> None:
        pass

    a = await flaky.enqueue()
    b = await step.options(after=[a], max_attempts=2, partition_key="tenant-7").enqueue()
    c = await step.options(after=[b]).enqueue()
    await q.worker().run_until_empty()
    assert await db.fetchval("SELECT count(*) FROM aioqueue.jobs_done WHERE status = 'cancelled'") == 2
    await q.retry_dead([a])
    rows = await db.fetch(
        "SELECT id, status, max_attempts, partition_key FROM aioqueue.jobs WHERE id = ANY($1) ORDER BY id", [b, c])
    assert [tuple(r) for r in rows] == [(b, "waiting", 2, "tenant-7"), (c, "waiting", 9, None)]


async def test_joining_a_group_after_a_member_does_not_deadlock_with_that_members_finish(
    q: aioqueue.Queue, db: asyncpg.Connection, dsn: str
) -> None:
    """Lock order: an enqueue that joins group g and waits for member d takes d's row before
    g's row, as the statements that finish d do (d's row, then jobs_finished() counts it in
    g), so the two wait for each other in a line, never in a circle. Here the finish is held
    between its two steps (its row locked; then counted) while the enqueue runs."""

    @q.task
    async def member() -> None:
        pass

    g = await q.open_group()
    d = await member.options(group=g).enqueue()
    finisher = await asyncpg.connect(dsn)
    joined: list[int] = []

    async def join() -> None:
        joined.append(await member.options(group=g, after=[d]).enqueue())

    try:
        async with anyio.create_task_group() as tg, finisher.transaction():
            await finisher.execute("SELECT FROM aioqueue.jobs WHERE id = $1 FOR UPDATE", d)  # d's row, as complete
            tg.start_soon(join)
            await eventually(lambda: _waits_for_a_row(db), timeout=10, what="the enqueue to wait for d's row")
            # The rest of d's finish: counted in its group (the group row), as complete does.
            with anyio.fail_after(20):
                await finisher.fetchval(
                    "SELECT aioqueue.jobs_finished(ARRAY[$1::bigint], ARRAY['succeeded'], ARRAY[$2::bigint],"
                    " ARRAY[false])", d, g.id)
    finally:
        await finisher.close()
    assert len(joined) == 1
    counts = await g.counts()
    assert (counts.total, counts.succeeded) == (2, 1)
    assert await db.fetchval("SELECT status FROM aioqueue.jobs WHERE id = $1", joined[0]) == "waiting"


async def _waits_for_a_row(db: asyncpg.Connection) -> bool:
    return bool(await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))
