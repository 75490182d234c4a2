"""The commands on durable steps and events: ``steps JOB_ID`` (a job's stored steps, sleeps
and waits), ``waits`` (the jobs sleeping or waiting for an event) and ``send-event NAME``,
thin shells over the operator calls (:class:`~aioqueue._step_admin.StepAdmin`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._common import EXIT_OK, UsageError, admin_queue, job_id, positive_int
from ._operate import format_table

COMMANDS = ("steps", "waits", "send-event")


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``steps``, ``waits`` and ``send-event`` to the command line's subcommands."""
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
        if args.command == "steps":
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


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def _short(value: Any, limit: int = 60) -> str:
    text = "" if value is None else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
