"""The commands on a job's run: ``job JOB_ID`` (the job as stored, with the progress its handler
reported), ``steps JOB_ID`` (its stored steps, sleeps and waits), ``waits`` (the jobs sleeping
or waiting for an event) and ``send-event NAME``, thin shells over the operator calls
(``get_job``, :class:`~aioqueue._step_admin.StepAdmin`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._job import JobInfo
from ._common import EXIT_ERROR, EXIT_OK, UsageError, admin_queue, job_id, positive_int
from ._operate import format_table

COMMANDS = ("job", "steps", "waits", "send-event")


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``job``, ``steps``, ``waits`` and ``send-event`` to the command line's subcommands."""
    job = commands.add_parser(
        "job", parents=[common], help="show a job, with the progress its handler reported",
        description="A job by id, live or archived: its state, and the progress its handler reported "
        "(aioqueue.set_progress), while it runs and after.",
    )
    job.add_argument("id", type=job_id, metavar="ID", help="the job's id")
    job.add_argument("--json", action="store_true", help="print JSON (get_job's fields)")

    steps = commands.add_parser(
        "steps", parents=[common], help="show a job's durable steps, sleeps and event waits",
        description="A job's stored steps (aioqueue.step), sleeps and event waits, first reached first.",
    )
    steps.add_argument("id", type=job_id, metavar="ID", help="the job's id")
    steps.add_argument("--json", action="store_true", help="print JSON instead of a table")

    waits = commands.add_parser(
        "waits", parents=[common], help="list the jobs sleeping or waiting for an event",
        description="Jobs sleeping (aioqueue.sleep) or waiting for an event (aioqueue.wait_for_event), "
        "soonest to wake first.",
    )
    waits.add_argument("--event", default=None, help="only the waits for this event")
    waits.add_argument("--limit", type=positive_int, default=100, help="at most this many (default: 100)")
    waits.add_argument("--json", action="store_true", help="print JSON instead of a table")

    send = commands.add_parser(
        "send-event", parents=[common], help="send an event to the jobs waiting for it",
        description="Send an event (and its JSON payload) to the jobs waiting for it in aioqueue.wait_for_event; "
        "print how many waits it reached.",
    )
    send.add_argument("name", help="the event's name")
    send.add_argument("--key", default=None, help="the event's key (waits with this key only)")
    send.add_argument("--payload", default="null", help="the payload, as JSON (default: null)")


async def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names."""
    async with admin_queue(args) as queue:
        if args.command == "job":
            info = await queue.get_job(args.id)
            if info is None:
                print(f"aioqueue: error: no job with id {args.id}", file=sys.stderr)
                return EXIT_ERROR
            print(json.dumps(info.to_dict(), indent=2) if args.json else _job_fields(info))
        elif args.command == "steps":
            steps = await queue.job_steps(args.id)
            if args.json:
                print(json.dumps([s.to_dict() for s in steps], indent=2))
            elif not steps:
                print(f"job {args.id} has no stored steps")
            else:
                rows = [[s.name, str(s.occurrence), s.kind, s.state, _when(s.wake_at), _short(s.result)] for s in steps]
                print(format_table(["STEP", "#", "KIND", "STATE", "WAKES (UTC)", "RESULT"], rows, "lrllll"))
        elif args.command == "waits":
            waits = await queue.list_waits(event=args.event, limit=args.limit)
            if args.json:
                print(json.dumps(waits, indent=2, default=str))
            elif not waits:
                print("no job sleeps or waits for an event")
            else:
                rows = [[str(w["job_id"]), w["queue"] or "", w["task"] or "", w["kind"], w["event"] or "",
                         w["event_key"] or "", w["state"], _when(w["wake_at"])] for w in waits]
                print(format_table(["JOB", "QUEUE", "TASK", "KIND", "EVENT", "KEY", "STATE", "WAKES (UTC)"],
                                   rows, "rlllllll"))
        else:
            try:
                payload = json.loads(args.payload)
            except ValueError as exc:
                raise UsageError(f"send-event: --payload is not JSON: {exc}") from exc
            reached = await queue.send_event(args.name, payload, key=args.key)
            print(f"event {args.name!r} reached {reached} waiting job(s)")
    return EXIT_OK


def _job_fields(info: JobInfo) -> str:
    """A job as ``field  value`` lines: what ``job`` prints."""
    fields = [
        ("job", str(info.id)), ("queue", info.queue), ("task", info.task), ("status", info.status),
        ("attempts", f"{info.attempts}/{info.max_attempts}"), ("created (UTC)", _when(info.created_at)),
    ]
    if info.finished_at is not None:
        fields.append(("finished (UTC)", _when(info.finished_at)))
    p = info.progress
    if p is not None:
        done = "" if p.fraction is None else f"{p.fraction:.0%}"
        fields.append(("progress", " ".join(x for x in (done, p.message or "") if x)))
        if p.data is not None:
            fields.append(("progress data", json.dumps(p.data, default=str)))
        kept = ", kept" if p.keep else ""
        fields.append(("reported", f"{_when(p.updated_at)} by attempt {p.attempt}{kept}"))
    if info.last_error:
        fields.append(("last error", info.last_error.splitlines()[0]))
    width = max(len(name) for name, _ in fields)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in fields)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def _short(value: Any, limit: int = 60) -> str:
    text = "" if value is None else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
