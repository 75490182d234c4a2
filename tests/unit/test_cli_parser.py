"""The ``aioqueue`` command line's parser, with no database: every command parses its flags to
the values the commands read, and bad values are refused at parse time naming the flag."""

from __future__ import annotations

import argparse

import pytest

from aioqueue._version import __version__
from aioqueue.cli import build_parser
from aioqueue.cli._worker import worker_options


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return build_parser()


def test_common_options_go_before_or_after_the_command(parser: argparse.ArgumentParser) -> None:
    before = parser.parse_args(["--dsn", "postgresql://a/b", "--schema", "jobs", "status"])
    after = parser.parse_args(["status", "--dsn", "postgresql://a/b", "--schema", "jobs"])
    assert (before.dsn, before.schema) == (after.dsn, after.schema) == ("postgresql://a/b", "jobs")
    # Unset after the command: the value given before it stays.
    assert parser.parse_args(["--dsn", "x", "worker", "app:q"]).dsn == "x"


def test_worker_flags_parse_to_its_options(parser: argparse.ArgumentParser) -> None:
    args = parser.parse_args(["worker", "app:q", "other:q", "-c", "20", "--lease", "45", "--no-listen",
                              "--queues", "a=3,b=1", "-p", "2", "--metrics-port", "9100"])
    assert args.target == ["app:q", "other:q"]
    assert (args.processes, args.metrics_port, args.metrics_addr) == (2, 9100, "127.0.0.1")
    assert worker_options(args) == {"concurrency": 20, "lease": 45.0, "listen": False, "queues": {"a": 3, "b": 1}}
    assert parser.parse_args(["worker", "app:q", "-q", "a, b"]).queues == ["a", "b"]


@pytest.mark.parametrize(("argv", "error"), [
    (["worker", "app:q", "-p", "0"], "must be at least 1"),
    (["worker", "app:q", "--metrics-port", "70000"], "must be a TCP port"),
    (["worker", "app:q", "--lease", "-1"], "must be a number of seconds >= 0"),
    (["worker", "app:q", "--lease", "inf"], "must be a number of seconds >= 0"),
    (["worker", "app:q", "--queues", ","], "name at least one queue"),
    (["worker", "app:q", "--queues", "a=1,b"], "write every queue as NAME=SLOTS, got 'b'"),
    (["dead", "retry", "0"], "a job id is an integer from 1"),
    (["dead", "list", "--limit", "0"], "must be at least 1"),
    (["dashboard", "--port", "0"], "must be a TCP port"),
    (["worker"], "the following arguments are required: MODULE:ATTR"),
    ([], "the following arguments are required: COMMAND"),
])
def test_bad_values_are_refused_naming_what_was_wrong(
    parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(argv)
    assert caught.value.code == 2
    assert error in capsys.readouterr().err


def test_operator_commands_parse(parser: argparse.ArgumentParser) -> None:
    retry = parser.parse_args(["dead", "retry", "3", "5", "--queue", "mail"])
    assert (retry.command, retry.dead_command, retry.ids) == ("dead", "retry", [3, 5])
    assert (retry.queue, retry.all) == ("mail", False)
    listing = parser.parse_args(["dead", "list", "--json"])
    assert (listing.limit, listing.json, listing.queue) == (100, True, None)
    assert parser.parse_args(["migrate", "--dry-run"]).sql is True
    board = parser.parse_args(["dashboard", "--read-only", "--app", "app:q"])
    assert (board.host, board.port, board.read_only, board.app) == ("127.0.0.1", 8080, True, "app:q")


def test_version_names_the_package_version(parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parser.parse_args(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"aioqueue {__version__}"
