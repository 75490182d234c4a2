"""Worker configuration: one validated object, a clear error naming each bad option, the same
definition behind Queue.worker, BackgroundWorker and the CLI flags."""

from __future__ import annotations

from typing import Any

import pytest

import aioqueue
from aioqueue._config import WorkerConfig, worker_flags
from aioqueue.cli import build_parser
from aioqueue.cli._worker import worker_options

# (option, refused values, an accepted edge value)
BOUNDS: list[tuple[str, list[Any], Any]] = [
    ("concurrency", [0, -1, 10_001, 1.5, True, "10", None], 10_000),
    ("queues", ["email", b"email", [], ["a", "a"], [""], 5], ["email"]),
    ("poll_interval", [0, -1, float("inf"), float("nan"), 3601, "1", True], 3600),
    ("lease", [0.1, 0, -5, float("inf"), "300", 367 * 86400], 0.11),
    ("grace_period", [-0.001, float("nan"), "30", 366 * 86400 + 1], 366 * 86400),
    ("heartbeat_interval", [0, -1, 300, 301, "1"], 299.9),
    ("reap_interval", [0, -1, float("inf"), "60", 366 * 86400 + 1], 0.01),
    ("archive_retention", [-1, float("inf"), "7d", 100 * 366 * 86400 + 1], 0),
    ("vacuum_threshold", [-1, 1.5, True, "10000", None, 2**62 + 1], 0),
    ("batch_size", [0, -1, 110_001, 1.0, True], 110_000),
    ("prefetch", [-1, 100_001, 1.5, True, "10"], 100_000),
    ("completion_batch", [0, 100_001, 1.5, True], 100_000),
    ("completion_interval", [-0.1, 10.1, float("nan"), "0"], 0),
    ("listen", [1, "yes", None], False),
    ("durable_claims", [1, "yes", None], True),
    ("ping_interval", [0, -1, 3601, "5"], 3600),
    ("name", ["", "x" * 256, "a\x00b", 5], "worker-1"),
    ("install_signal_handlers", [1, "no", None], False),
    ("health_port", [-1, 65536, 80.0, True, "8080"], 65535),
    ("health_addr", ["", None, 5, "x" * 256], "::"),
    ("unready_after", [0, -1, 3601, float("nan"), "10"], 3600),
]


def test_every_option_has_a_bounds_case() -> None:
    assert {name for name, _, _ in BOUNDS} == set(aioqueue.WorkerOptions.__annotations__)


@pytest.mark.parametrize(("option", "refused", "accepted"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_option_is_checked_naming_it(option: str, refused: list[Any], accepted: Any) -> None:
    for value in refused:
        with pytest.raises(aioqueue.ConfigurationError, match=option.rstrip("s") if option == "queues" else option):
            WorkerConfig.from_options({option: value})
    config = WorkerConfig.from_options({option: accepted})
    expected = tuple(accepted) if option == "queues" else accepted
    assert getattr(config, option) == expected


def test_derived_defaults_are_resolved_once() -> None:
    config = WorkerConfig(lease=90, concurrency=4, prefetch=6)
    assert (config.heartbeat_interval, config.reap_interval, config.batch_size) == (30.0, 45.0, 10)
    long = WorkerConfig(lease=3600)
    assert (long.heartbeat_interval, long.reap_interval) == (30.0, 60.0)
    assert config.name and config.name != WorkerConfig().name  # host:pid:random, unique per worker


def test_the_default_prefetch_holds_two_claims_more_with_many_slots() -> None:
    assert WorkerConfig().prefetch == 1000  # the defaults (10 slots), as before
    assert WorkerConfig(concurrency=100).prefetch == 1000
    assert WorkerConfig(concurrency=101).prefetch == 1000 + 2 * 101
    assert WorkerConfig(concurrency=1000).prefetch == 3000
    assert WorkerConfig(concurrency=5000).prefetch == 3000  # claims take at most 1,000
    assert WorkerConfig(concurrency=1000, prefetch=1000).prefetch == 1000  # a setting stands
    assert WorkerConfig(concurrency=1000, prefetch=0).prefetch == 0
    assert WorkerConfig(concurrency=1000).batch_size == 4000


def test_the_resolved_prefetch_and_batch_are_typed_ints() -> None:
    config = WorkerConfig(concurrency=101)
    cap: int = config.prefetch_cap  # typed int (prefetch is int | None): no `or 0` where it is used
    batch: int = config.claim_batch
    assert (cap, batch) == (config.prefetch, config.batch_size) == (1202, 1303)
    assert (WorkerConfig(prefetch=0).prefetch_cap, WorkerConfig(prefetch=0).claim_batch) == (0, 10)
    assert WorkerConfig(concurrency=4, prefetch=6, batch_size=3).claim_batch == 3


def test_queues_mapping_caps_slots_and_round_trips_through_json() -> None:
    config = WorkerConfig.from_options({"queues": {"mail": 2, "reports": 1}, "concurrency": 3})
    assert config.queues == ("mail", "reports")
    assert config.slots_by_queue == {"mail": 2, "reports": 1}
    again = WorkerConfig.from_json(config.to_json())
    assert again.changes() | {"name": None} == config.changes() | {"name": None}
    with pytest.raises(aioqueue.ConfigurationError, match="concurrency of queue 'mail'"):
        WorkerConfig.from_options({"queues": {"mail": 0}})


def test_cli_flags_come_from_the_config_fields() -> None:
    parser = build_parser()
    flags = {flag for flag, _ in worker_flags()}
    assert {"--concurrency", "--poll-interval", "--lease", "--grace-period", "--prefetch",
            "--batch-size", "--completion-batch", "--completion-interval", "--ping-interval",
            "--heartbeat-interval", "--reap-interval", "--archive-retention", "--listen"} <= flags
    args = parser.parse_args(["worker", "app:q", "-c", "7", "--prefetch", "50", "--no-listen", "-q", "a=2,b=1"])
    options = worker_options(args)
    assert options == {"concurrency": 7, "prefetch": 50, "listen": False, "queues": {"a": 2, "b": 1}}
    config = WorkerConfig.from_options(options)
    assert (config.concurrency, config.prefetch, config.listen) == (7, 50, False)
    assert config.slots_by_queue == {"a": 2, "b": 1}
    assert worker_options(parser.parse_args(["worker", "app:q"])) == {}  # unset flags: the config's defaults

