"""The workflow commands: ``workflow show|cancel ID`` (the graph around a job) and ``group
list|show|close``, thin shells over the Queue's workflow calls that print tables or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ._common import EXIT_ERROR, EXIT_OK, admin_queue, job_id, positive_int
from ._operate import format_table


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``workflow`` and ``group`` to the command line's subcommands."""
    workflow = commands.add_parser("workflow", parents=[common], help="show or cancel the workflow around a job")
    actions = workflow.add_subparsers(dest="workflow_command", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show", parents=[common], help="every job the job waits for and that waits for it, with status")
    show.add_argument("id", type=job_id, metavar="ID", help="a job of the workflow")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cancel = actions.add_parser(
        "cancel", parents=[common], help="cancel every job of the workflow that has not finished")
    cancel.add_argument("id", type=job_id, metavar="ID", help="a job of the workflow")

    group = commands.add_parser("group", parents=[common], help="list, show or close groups of jobs")
    group_actions = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    listing = group_actions.add_parser("list", parents=[common], help="groups, newest first")
    listing.add_argument("--limit", type=positive_int, default=50, help="at most this many (default: 50)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    one = group_actions.add_parser("show", parents=[common], help="a group's counts and callbacks")
    one.add_argument("id", type=job_id, metavar="ID", help="the group's id")
    one.add_argument("--json", action="store_true", help="print JSON instead of a table")
    close = group_actions.add_parser(
        "close", parents=[common], help="close a group: no more members; its callbacks go once all finished")
    close.add_argument("id", type=job_id, metavar="ID", help="the group's id")


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


async def run(args: argparse.Namespace) -> int:
    """Run the ``workflow`` or ``group`` command ``args`` names."""
    async with admin_queue(args) as queue:
        if args.command == "workflow":
            if args.workflow_command == "cancel":
                outcome = await queue.cancel_workflow(args.id)
                print(f"cancelled {sum(v == 'cancelled' for v in outcome.values())} job(s), "
                      f"asked {sum(v == 'requested' for v in outcome.values())} running job(s) to stop")
                return EXIT_OK
            nodes = await queue.workflow(args.id)
            if args.json:
                print(_json(nodes))
                return EXIT_OK
            rows = [[str(n["id"]), n["task"] or "", n["status"], ",".join(map(str, n["depends_on"])),
                     "" if n["group_id"] is None else str(n["group_id"]), n["reason"] or ""] for n in nodes]
            print(format_table(["ID", "TASK", "STATUS", "WAITS FOR", "GROUP", "REASON"], rows, "rlllrl"))
            return EXIT_OK
        if args.group_command == "list":
            groups = await queue.list_groups(limit=args.limit)
            if args.json:
                print(_json(groups))
            elif not groups:
                print("no groups")
            else:
                rows = [[str(g["id"]), g["name"] or "", str(g["total"]), str(g["succeeded"]), str(g["failed"]),
                         str(g["cancelled"]), "done" if g["done_at"] else ("closed" if g["closed"] else "open")]
                        for g in groups]
                print(format_table(["ID", "NAME", "TOTAL", "SUCCEEDED", "FAILED", "CANCELLED", "STATE"], rows,
                                   "rlrrrrl"))
            return EXIT_OK
        if args.group_command == "close":
            await queue.close_group(args.id)
            print(f"group {args.id} closed")
            return EXIT_OK
        counts = await queue.group_counts(args.id)
        if counts is None:
            print(f"aioqueue: error: no group with id {args.id}", file=sys.stderr)
            return EXIT_ERROR
        if args.json:
            print(_json(dataclasses.asdict(counts)))
        else:
            fields = ("total", "pending", "running", "succeeded", "failed", "cancelled", "closed", "done")
            print(format_table(["GROUP", *(f.upper() for f in fields)],
                               [[str(counts.id), *(str(getattr(counts, f)) for f in fields)]], "r" * 9))
            for kind, task in counts.callback_tasks.items():
                enqueued = counts.callbacks.get(kind)
                print(f"{kind}: {task}" + (f" (job {enqueued})" if enqueued else " (not yet)"))
        return EXIT_OK
