"""The worker's configuration: one frozen, typed object, validated once when it is made.

``WorkerOptions`` is the typed keyword set that ``Queue.worker``, ``Worker``,
``BackgroundWorker`` and the web integrations accept (a misspelt option is a type error and a
:class:`~aioqueue.ConfigurationError` naming it); ``WorkerConfig`` holds the validated values,
derives the defaults that depend on others (heartbeat and reap intervals, claim batch size), and
travels as JSON to the supervisor's children. The ``aioqueue worker`` flags are generated from the
same fields. It never touches the database.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from ._checks import MAX_CONCURRENCY, MAX_NAME_LENGTH, check_concurrency, check_name, check_queue_names
from ._errors import ConfigurationError
from ._prefetch import Prefetch

MAX_PREFETCH = 100_000
MAX_SECONDS = 366 * 86400.0
#: A queue table's dead rows past which a worker VACUUMs it. A job leaves about two dead rows in
#: ``jobs`` (its claim's update and its delete), so this is some thousands of jobs: often under
#: a flood, VACUUMing little each time, and rarely when the queue is quiet.
DEFAULT_VACUUM_THRESHOLD = 10_000


class WorkerOptions(TypedDict, total=False):
    """The keyword options of a worker; see :class:`WorkerConfig` for each one's meaning."""

    concurrency: int
    queues: Sequence[str] | Mapping[str, int] | None
    poll_interval: float
    lease: float
    grace_period: float
    heartbeat_interval: float | None
    reap_interval: float | None
    archive_retention: float | None
    vacuum_threshold: int
    batch_size: int | None
    prefetch: int | None
    completion_batch: int
    completion_interval: float
    listen: bool
    durable_claims: bool
    ping_interval: float
    name: str | None
    install_signal_handlers: bool
    health_port: int | None
    health_addr: str
    unready_after: float


def _cli(help: str, flag: str | None = None) -> dict[str, Any]:
    """Field metadata: the option's help text, and its ``aioqueue worker`` flag (None: none)."""
    return {"help": help, "flag": flag}


def _int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(f"worker option {name} must be an int from {low} to {high}, got {value!r}")
    return value


def _seconds(name: str, value: object, *, low: float, inclusive: bool = False, high: float = MAX_SECONDS) -> float:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= low if inclusive else value > low)
        and value <= high
    )
    if not ok:
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        raise ConfigurationError(
            f"worker option {name} must be a number of seconds {bound} and <= {high:g}, got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """Everything a worker is told, validated; build one with ``WorkerConfig(**options)``.

    Derived values (``heartbeat_interval``, ``reap_interval``, ``batch_size``) are resolved here,
    so the object a worker holds is complete.
    """

    concurrency: int = dataclasses.field(
        default=10, metadata=_cli(f"jobs run at once, per process (1 to {MAX_CONCURRENCY})", "--concurrency")
    )
    queues: tuple[str, ...] | None = dataclasses.field(
        default=None, metadata=_cli("queues to work (default: every queue a registered task uses)")
    )
    queue_slots: tuple[tuple[str, int], ...] | None = dataclasses.field(
        default=None, metadata=_cli("per-queue caps on this worker's slots, from queues={queue: slots}")
    )
    poll_interval: float = dataclasses.field(
        default=1.0, metadata=_cli("look for jobs at least this often without a notification", "--poll-interval")
    )
    lease: float = dataclasses.field(
        default=300.0, metadata=_cli("how long a claimed job is ours without a heartbeat", "--lease")
    )
    grace_period: float = dataclasses.field(
        default=30.0, metadata=_cli("how long running jobs may finish after a stop", "--grace-period")
    )
    heartbeat_interval: float | None = dataclasses.field(
        default=None, metadata=_cli("how often leases are extended (default: lease/3, at most 30)",
                                    "--heartbeat-interval")
    )
    reap_interval: float | None = dataclasses.field(
        default=None, metadata=_cli("how often expired leases are reaped (default: lease/2, at most 60)",
                                    "--reap-interval")
    )
    archive_retention: float | None = dataclasses.field(
        default=7 * 86400.0, metadata=_cli("seconds archived jobs are kept (None: forever)", "--archive-retention")
    )
    vacuum_threshold: int = dataclasses.field(
        default=DEFAULT_VACUUM_THRESHOLD,
        metadata=_cli("VACUUM a queue table once it has this many dead rows (and a fifth of its live "
                      "rows), one worker at a time (0: never; leave it to autovacuum)", "--vacuum-threshold"),
    )
    batch_size: int | None = dataclasses.field(
        default=None, metadata=_cli("most jobs one claim takes (default: concurrency + prefetch)", "--batch-size")
    )
    prefetch: int | None = dataclasses.field(
        default=None,
        metadata=_cli("most jobs claimed ahead of free slots (adaptive: about one claim round trip's worth "
                      "at the rate jobs finish; 0: off; default: 1000, and with more than 100 slots "
                      "two claims more, 1000 + 2 x min(concurrency, 1000))", "--prefetch"),
    )
    completion_batch: int = dataclasses.field(
        default=1000, metadata=_cli("most outcomes written in one statement", "--completion-batch")
    )
    completion_interval: float = dataclasses.field(
        default=0.002, metadata=_cli("how long outcomes gather before a write, while handlers run",
                                    "--completion-interval")
    )
    listen: bool = dataclasses.field(
        default=True, metadata=_cli("wake on LISTEN/NOTIFY (off: poll only)", "--listen")
    )
    durable_claims: bool = dataclasses.field(
        default=False,
        metadata=_cli("claims and outcomes wait for their WAL flush (off: a server crash may repeat a few "
                      "jobs, never lose one; enqueues are always durable)", "--durable-claims"),
    )
    ping_interval: float = dataclasses.field(
        default=5.0, metadata=_cli("how often the LISTEN connection is pinged", "--ping-interval")
    )
    name: str | None = dataclasses.field(
        default=None, metadata=_cli("the worker's name in locked_by and logs (default: host:pid:random)")
    )
    install_signal_handlers: bool = dataclasses.field(
        default=True, metadata=_cli("stop on SIGINT/SIGTERM (main thread only)")
    )
    health_port: int | None = dataclasses.field(
        default=None, metadata=_cli("serve /live and /ready probes on this port (0: any free port; "
                                    "process i of N: PORT+i)", "--health-port")
    )
    health_addr: str = dataclasses.field(
        default="0.0.0.0", metadata=_cli("the address health probes are served on", "--health-addr")
    )
    unready_after: float = dataclasses.field(
        default=10.0, metadata=_cli("report unready once the database has not answered for this long",
                                    "--unready-after")
    )

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_concurrency(self.concurrency)
        put(self, "prefetch", _int("prefetch", self.prefetch_cap, 0, MAX_PREFETCH))
        if self.queues is not None:
            put(self, "queues", tuple(check_queue_names(self.queues)))
        if self.queue_slots is not None:
            put(self, "queue_slots", tuple(
                (check_name("queue name", q), _int(f"concurrency of queue {q!r}", n, 1, MAX_CONCURRENCY))
                for q, n in self.queue_slots
            ))
        poll = _seconds("poll_interval", self.poll_interval, low=0.0, high=3600.0)
        put(self, "poll_interval", poll)
        lease = _seconds("lease", self.lease, low=0.1)
        put(self, "lease", lease)
        put(self, "grace_period", _seconds("grace_period", self.grace_period, low=0.0, inclusive=True))
        beat = min(lease / 3, 30.0) if self.heartbeat_interval is None else self.heartbeat_interval
        beat = _seconds("heartbeat_interval", beat, low=0.0)
        if beat >= lease:
            raise ConfigurationError(
                f"worker option heartbeat_interval ({beat:g}s) must be shorter than the lease ({lease:g}s)"
            )
        put(self, "heartbeat_interval", beat)
        reap = min(lease / 2, 60.0) if self.reap_interval is None else self.reap_interval
        put(self, "reap_interval", _seconds("reap_interval", reap, low=0.0))
        if self.archive_retention is not None:
            put(self, "archive_retention", _seconds("archive_retention", self.archive_retention, low=0.0,
                                                    inclusive=True, high=100 * 366 * 86400.0))
        _int("vacuum_threshold", self.vacuum_threshold, 0, 2**62)
        put(self, "batch_size", _int("batch_size", self.claim_batch, 1, MAX_CONCURRENCY + MAX_PREFETCH))
        _int("completion_batch", self.completion_batch, 1, 100_000)
        put(self, "completion_interval",
            _seconds("completion_interval", self.completion_interval, low=0.0, inclusive=True, high=10.0))
        if not isinstance(self.listen, bool):
            raise ConfigurationError(f"worker option listen must be True or False, got {self.listen!r}")
        if not isinstance(self.durable_claims, bool):
            raise ConfigurationError(
                f"worker option durable_claims must be True or False, got {self.durable_claims!r}"
            )
        put(self, "ping_interval", _seconds("ping_interval", self.ping_interval, low=0.0, high=3600.0))
        if not isinstance(self.install_signal_handlers, bool):
            raise ConfigurationError(
                f"worker option install_signal_handlers must be True or False, got {self.install_signal_handlers!r}"
            )
        if self.health_port is not None:
            _int("health_port", self.health_port, 0, 65535)
        if not isinstance(self.health_addr, str) or not self.health_addr or len(self.health_addr) > 255:
            raise ConfigurationError(f"worker option health_addr must be a host or address, got {self.health_addr!r}")
        put(self, "unready_after", _seconds("unready_after", self.unready_after, low=0.0, high=3600.0))
        if self.name is None:
            put(self, "name", f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
        else:
            check_name("worker name", self.name, MAX_NAME_LENGTH)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], base: WorkerConfig | None = None) -> WorkerConfig:
        """Build from keyword options (as :class:`WorkerOptions`), over ``base`` if given.

        An unknown option is a :class:`~aioqueue.ConfigurationError` that names it.
        """
        known = set(WorkerOptions.__annotations__)
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown worker option(s) {', '.join(map(repr, unknown))}; the options are: "
                + ", ".join(sorted(known))
            )
        values: dict[str, Any] = {} if base is None else base.changes()
        for key, value in options.items():
            if key == "queues":
                values.pop("queue_slots", None)
                if isinstance(value, Mapping):
                    values["queues"] = tuple(value)
                    values["queue_slots"] = tuple(value.items())
                else:
                    values["queues"] = value
            else:
                values[key] = value
        return cls(**values)

    @property
    def prefetch_cap(self) -> int:
        """``prefetch`` as resolved: the cap of the worker's prefetch buffer."""
        return Prefetch.default_cap(self.concurrency) if self.prefetch is None else self.prefetch

    @property
    def claim_batch(self) -> int:
        """``batch_size`` as resolved: the most jobs one claim takes."""
        return self.concurrency + self.prefetch_cap if self.batch_size is None else self.batch_size

    @property
    def commit_mode(self) -> str | None:
        """The ``synchronous_commit`` of claims and outcomes: 'off', or None (the session's)."""
        return None if self.durable_claims else "off"

    def changes(self) -> dict[str, Any]:
        """The fields as keyword arguments that rebuild this config (derived values included)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def slots_by_queue(self) -> dict[str, int] | None:
        """``queue_slots`` as a dict, or None when queues share every slot."""
        return None if self.queue_slots is None else dict(self.queue_slots)

    def to_json(self) -> str:
        """Serialise for a child process (see :meth:`from_json`); the name is not carried."""
        data = self.changes()
        data.pop("name")
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """Rebuild a config that :meth:`to_json` wrote."""
        data = json.loads(text)
        for key in ("queues", "queue_slots"):
            if data.get(key) is not None:
                data[key] = tuple(tuple(v) if isinstance(v, list) else v for v in data[key])
        return cls(**data)


def worker_flags() -> list[tuple[str, dataclasses.Field[Any]]]:
    """The ``aioqueue worker`` flags generated from the config's fields: (flag, field)."""
    return [(f.metadata["flag"], f) for f in dataclasses.fields(WorkerConfig) if f.metadata.get("flag")]
