"""Load the named SQL statements of ``queries.sql`` for one schema.

Every statement aioqueue sends lives in ``queries.sql``; this module only parses that file and
puts the validated schema name in place. It never builds SQL from values: those are ``$n``
parameters, bound by the driver.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources

from ._errors import ConfigurationError

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# A fragment's use: `{name}`, or `{name($3)}` to put the parameter $3 where it says `{arg}`,
# or `{name(word)}` a word of queries.sql itself (never a value: those are parameters).
_USE = re.compile(r"\{(\w+)(?:\((\$\d+|[a-z_]+)\))?\}")
_BLOCK = re.compile(r"^-- (name|fragment): (\w+)\n", re.MULTILINE)


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case SQL identifier, else raise."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} is not a plain identifier: use lower-case letters, digits "
            "and underscores, starting with a letter or underscore, at most 63 characters"
        )
    return schema


@dataclasses.dataclass(frozen=True, slots=True)
class Queries:
    """The statements of ``queries.sql``, each rendered for one schema."""

    create_schema: str
    create_migrations_table: str
    migration_lock: str
    function_checks: str
    schema_exists: str
    schema_version: str
    record_migration: str
    notify: str
    ping: str
    database_identity: str
    enqueue: str
    enqueue_many: str
    enqueue_many_keyed: str
    claim: str
    claim_unlimited: str
    claim_unlimited_timed: str
    claim_keyed_timed: str
    claim_timed: str
    next_wakeup: str
    ready_jobs: str
    lock_queues: str
    limited_queues: str
    limited_queues_at_version: str
    set_paused: str
    set_limits: str
    queue_settings: str
    set_key_limits: str
    cancel: str
    cancel_requests: str
    finish_cancelled: str
    database_now: str
    periodic_last_slot: str
    periodic_record_slot: str
    complete: str
    fail: str
    reschedule: str
    write_progress: str
    extend_leases: str
    reap_expired: str
    prune_archive: str
    vacuum_candidates: str
    vacuum_table: str
    archive_partitions: str
    get_job: str
    list_dead: str
    retry_dead: str
    purge_dead: str
    queue_status: str
    prune_queue_stats: str
    prune_key_starts: str
    register_worker: str
    unregister_worker: str
    list_workers: str
    list_periodic: str
    without_jit: str
    queue_overview: str
    queue_throughput: str
    list_jobs: str
    list_running_jobs: str
    list_archived_jobs: str
    get_job_detail: str
    cancel_jobs: str
    delete_jobs: str
    find_jobs: str
    clock_state: str
    set_clock: str
    redefine_clock: str
    wake_due: str
    publish_events: str
    relay_read: str
    relay_ack: str
    relay_release: str
    outbox_status: str
    drop_schema: str
    add_dependencies: str
    open_group: str
    close_group: str
    settle_group: str
    group_counts: str
    list_groups: str
    upstream_results: str
    workflow_of: str
    release_stranded: str
    load_steps: str
    record_step: str
    settle_step: str
    suspend: str
    send_event: str
    list_waits: str
    prune_steps: str
    index_reads_only: str
    busiest_keys: str
    workflow_status: str


def parse(text: str) -> dict[str, str]:
    """Split ``queries.sql`` into ``{name: statement}``, comments and trailing ``;`` removed.

    A ``-- fragment: NAME`` block is not a statement: its text replaces ``{NAME}`` in the
    statements, so that SQL two statements share is written once.
    """
    parts = _BLOCK.split(text)
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";").strip()
        into = statements if kind == "name" else fragments
        if name in statements or name in fragments:
            raise ValueError(f"queries.sql names {name!r} twice")
        into[name] = sql
    def expand(match: re.Match[str]) -> str:
        name, argument = match[1], match[2]
        if name not in fragments:
            return match[0]  # not a fragment: `{schema}`, filled in later
        body = fragments[name] if argument is None else fragments[name].replace("{arg}", argument)
        return _USE.sub(expand, body)  # a fragment may use fragments

    return {name: _USE.sub(expand, sql) for name, sql in statements.items()}


@functools.cache
def _raw() -> dict[str, str]:
    return parse(resources.files(__package__).joinpath("queries.sql").read_text("utf-8"))


@functools.cache
def for_schema(schema: str) -> Queries:
    """Return every statement rendered for ``schema`` (validated here)."""
    validate_schema(schema)
    return Queries(**{name: sql.replace("{schema}", schema) for name, sql in _raw().items()})
