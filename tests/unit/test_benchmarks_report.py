"""The benchmark's reports: BENCHMARKS.md and the README's table are what the stored runs make
(never edited by hand), a stored run carries its date, commit, machine and command, and the
console report leads with its summary and prints every number one way."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, Any]]:
    """The benchmark's modules, imported as bench.py imports them (from its own directory)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in ("common", "report", "results")}
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_benchmarks_md_and_the_readme_table_are_made_from_the_stored_runs(bench: dict[str, Any]) -> None:
    results = bench["results"]
    runs = results.load()
    assert runs, "no stored run in benchmarks/results/"
    assert results.BENCHMARKS_MD.read_text() == results.render_benchmarks(runs), (
        "BENCHMARKS.md differs from the stored runs: run python benchmarks/bench.py report"
    )
    readme = results.README.read_text()
    assert readme == results.with_readme_table(readme, results.render_readme_table(runs)), (
        "the README's benchmark table differs from the stored runs: run python benchmarks/bench.py report"
    )
    assert results.main(["--check"]) == 0


def _run(bench: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A small run's results (the kind of figures that used to print as 6.08e+04)."""
    common = bench["common"]
    res = common.Results()
    for system, values in (("aioqueue (defaults)", [60_800.0, 66_443.2, 71_600.0]),
                           ("reference", [65_350.0, 65_876.0, 66_280.0]),
                           ("pgqueuer", [3_638.0, 3_679.0, 3_725.0])):
        for v in values:
            res.add("drain", system, "1 process, concurrency 10", v, "jobs/s", higher_is_better=True)
    for v in (0.3219, 0.325, 0.3379):
        res.add("latency", "aioqueue", "commit seen -> handler start, p50", v, "ms", higher_is_better=False)
    env = {"python": "3.11", "event_loop": "uvloop", "postgresql": "15", "server": "local",
           "synchronous_commit": "on", "fsync": "on", "shared_buffers": "128MB", "cpus": 2, "cpu": "a CPU",
           "platform": "Linux", "max_connections": "100", "asyncpg": "0.30", "aioqueue": "0.1.0"}
    return res, env


def test_the_console_report_leads_with_its_summary_and_prints_numbers_one_way(bench: dict[str, Any]) -> None:
    res, env = _run(bench)
    text = bench["report"].render(env, res, ["pgqueuer"], 3, ["--repeat", "3"])
    lines = text.splitlines()
    goals = next(i for i, line in enumerate(lines) if line.startswith("goals"))
    against = next(i for i, line in enumerate(lines) if line.startswith("aioqueue against"))
    table = next(i for i, line in enumerate(lines) if line.startswith("scenario"))
    assert goals < table and against < table
    assert not re.search(r"\de[+-]\d", text), text
    assert "66,443" in text and "60,800..71,600" in text and "0.325" in text and "0.322..0.338" in text
    assert "1.01x" in text and "18.06x" in text


def test_a_saved_run_keeps_date_commit_machine_and_command(bench: dict[str, Any], tmp_path: Path) -> None:
    results, res, env = bench["results"], *_run(bench)
    payload = {
        "command": ["python", "benchmarks/bench.py", "--repeat", "3", "--save", "--note", "quiet machine"],
        "environment": env, "sizes": {},
        "results": [vars(r) | {"median": r.median} for r in res.items.values()],
        "ratios": [], "targets": [],
    }
    path = results.save(payload, "quiet machine", tmp_path)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d{6}Z-[0-9a-f]{12}\.json", path.name), path.name
    stored = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", stored["commit"]) and stored["date"].endswith("Z")
    [run] = results.load(tmp_path)
    page = results.render_benchmarks([run])
    assert f"`benchmarks/results/{path.name}`" in page
    assert "- command: `python benchmarks/bench.py --repeat 3`" in page  # --save and --note keep, not measure
    assert "2 CPUs (a CPU)" in page and "- note: quiet machine" in page
    assert "| drain | 1 process, concurrency 10 | aioqueue (defaults) | reference lane | 1.01x |" in page
    table = results.render_readme_table([run])
    assert "| drain, 1 process, concurrency 10 | 1.01x | 18.06x |" in table
